"""The accuracy gate: a quantized engine is used only if it agrees with FP32 on held-out inputs.

Encoders are gated on the cosine of each text's vector to FP32's; classifiers and label heads
on the share of texts whose top label is FP32's (a probability vector can be close in cosine
and still name another label); recommendation towers on the overlap of users' top items (what
a user would see).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class GateResult:
    """One precision's agreement with the FP32 reference; `reason` says why it failed."""

    precision: str
    passed: bool
    reason: str
    mean_cosine: float | None = None
    min_cosine: float | None = None
    agreement: float | None = None
    """Classifiers: share of texts whose top label is FP32's."""
    overlap: float | None = None
    """Towers: mean share of a user's top TOP_K items that are FP32's."""
    seconds: float | None = None
    """Towers: the best of three runs over the gate's rows, both towers; what `auto` compares."""
    texts_from: str = ""
    """The input the held-out texts were drawn from."""
    cosine_histogram: list[int] | None = None
    """Texts per bin of COSINE_BINS (the first bin also holds everything below it): the run
    report draws it, since a mean can hide a tail of poor texts."""


COSINE_BINS = [round(0.9 + 0.005 * i, 3) for i in range(21)]
"""Bin edges from 0.90 to 1.00."""


def row_cosine(embeddings: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Cosine of each row with its reference row."""
    return np.sum(embeddings * reference, axis=1) / (
        np.linalg.norm(embeddings, axis=1) * np.linalg.norm(reference, axis=1)
    )


def cosine_gate(
    precision: str, cosine: np.ndarray, mean_threshold: float, min_threshold: float, texts_from: str = ""
) -> GateResult:
    """Both the mean and the worst text's cosine to FP32 must reach their thresholds."""
    mean, worst = float(cosine.mean()), float(cosine.min())
    failures = []
    if not mean >= mean_threshold:  # `not >=` also fails NaN
        failures.append(f"mean cosine {mean:.4f} < {mean_threshold}")
    if not worst >= min_threshold:
        failures.append(f"min cosine {worst:.4f} < {min_threshold}")
    return GateResult(
        precision,
        not failures,
        "; ".join(failures),
        mean_cosine=mean,
        min_cosine=worst,
        texts_from=texts_from,
        cosine_histogram=np.histogram(np.clip(cosine, COSINE_BINS[0], COSINE_BINS[-1]), COSINE_BINS)[
            0
        ].tolist(),
    )


def agreement_gate(
    precision: str, outputs: np.ndarray, reference: np.ndarray, threshold: float, texts_from: str = ""
) -> GateResult:
    """The top label of at least `threshold` of the texts must be FP32's."""
    agreement = float(np.mean(np.argmax(outputs, axis=1) == np.argmax(reference, axis=1)))
    passed = agreement >= threshold
    reason = "" if passed else f"top-label agreement {agreement:.4f} < {threshold}"
    return GateResult(precision, passed, reason, agreement=agreement, texts_from=texts_from)


TOP_K = 10
"""Towers: the list length whose overlap is gated (the recommendations a product page shows)."""


def top_overlap(
    users: np.ndarray, items: np.ndarray, reference_users: np.ndarray, reference_items: np.ndarray
) -> float:
    """Mean share of each user's top TOP_K items (by dot product) that are also the reference's."""
    k = min(TOP_K, len(items))
    ours = np.argpartition(-(users @ items.T), k - 1, axis=1)[:, :k]
    theirs = np.argpartition(-(reference_users @ reference_items.T), k - 1, axis=1)[:, :k]
    return float(np.mean([len(np.intersect1d(a, b)) / k for a, b in zip(ours, theirs, strict=True)]))


def overlap_gate(precision: str, overlap: float, threshold: float, seconds: float) -> GateResult:
    """Users' top items under this precision must share at least `threshold` with FP32's."""
    passed = overlap >= threshold
    reason = "" if passed else f"top-{TOP_K} overlap {overlap:.4f} < {threshold}"
    return GateResult(precision, passed, reason, overlap=round(overlap, 4), seconds=round(seconds, 5))
