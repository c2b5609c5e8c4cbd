"""The accuracy gate: a quantized engine is used only if it agrees with FP32 on held-out inputs.

Encoders are gated on the cosine of each text's vector to FP32's and on what search users see:
the top-10 neighbours of each held-out text among the others, against FP32's (a mean cosine of
0.993 still moved one neighbour in ten); classifiers and label heads
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
    """Classifiers and labelers: share of texts whose top label is FP32's."""
    recheck_margin: float | None = None
    """Labelers: texts whose top-2 probability margin is under this were labelled again at FP32
    (None: none were)."""
    rechecked: float | None = None
    """Labelers: the share of the gate's texts that were."""
    overlap: float | None = None
    """Towers: mean share of a user's top TOP_K items that are FP32's. Encoders: of each held-out
    text's TOP_K nearest other held-out texts."""
    seconds: float | None = None
    """Towers: the best of three runs over the gate's rows, both towers; what `auto` compares."""
    texts_from: str = ""
    """The input the held-out texts were drawn from."""
    texts: int | None = None
    """How many held-out texts it rests on."""
    note: str = ""
    """Set when the figures rest on fewer texts than asked (a small input): read them with care."""
    cosine_histogram: list[int] | None = None
    """Texts per bin of COSINE_BINS (the first bin also holds everything below it): the run
    report draws it, since a mean can hide a tail of poor texts."""


def few_texts(texts: int, asked: int) -> str:
    """GateResult.note: what a reader of the report should know about a gate on a small input."""
    if texts >= asked:
        return ""
    return f"rests on {texts} held-out texts, {asked} asked: the input has few rows"


FEW_HELD_OUT = 100
"""Below this many held-out rows, a quality figure carries a note: its error is over +-0.05."""


def few_held_out(count: int, noun: str) -> str:
    """A note for a held-out rate (accuracy, hit-rate) measured on few rows: a binomial rate's
    standard error is at most 0.5 / sqrt(count), so on 20 rows it moves by +-0.11."""
    if count >= FEW_HELD_OUT:
        return ""
    return f"rests on {count} held-out {noun}: a rate on so few moves by up to +-{0.5 / max(count, 1) ** 0.5:.2f}"


TOP_K = 10
"""The list length whose overlap is gated: the results a search page or a product page shows."""
TIE = 1e-4
"""Cosines closer than this are a tie for the neighbour overlap: FP32 engines differ by ~1e-6."""

COSINE_BINS = [round(0.9 + 0.005 * i, 3) for i in range(21)]
"""Bin edges from 0.90 to 1.00."""


def row_cosine(embeddings: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Cosine of each row with its reference row."""
    return np.sum(embeddings * reference, axis=1) / (
        np.linalg.norm(embeddings, axis=1) * np.linalg.norm(reference, axis=1)
    )


def neighbour_overlap(embeddings: np.ndarray, reference: np.ndarray) -> float:
    """Mean share of each row's TOP_K nearest other rows (cosine) that are the reference's. A
    neighbour counts when its reference cosine reaches the reference's K-th best less TIE: rows
    the reference ties (a random model's near-equal vectors) are not misses in either order."""
    k = min(TOP_K, len(embeddings) - 1)
    if k < 1:
        return 1.0

    def scores(vectors: np.ndarray) -> np.ndarray:
        unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
        cosine = unit @ unit.T
        np.fill_diagonal(cosine, -np.inf)
        return cosine

    ours, theirs = scores(embeddings), scores(reference)
    kth = -np.partition(-theirs, k - 1, axis=1)[:, k - 1 : k]
    top = np.argpartition(-ours, k - 1, axis=1)[:, :k]
    return float(np.mean(np.take_along_axis(theirs, top, axis=1) >= kth - TIE))


def cosine_gate(
    precision: str,
    embeddings: np.ndarray,
    reference: np.ndarray,
    thresholds: tuple[float, float, float],
    texts_from: str = "",
) -> GateResult:
    """The mean and the worst text's cosine to FP32, and the neighbour overlap, must each reach
    its threshold (mean cosine, min cosine, overlap)."""
    cosine = row_cosine(embeddings, reference)
    mean, worst, overlap = float(cosine.mean()), float(cosine.min()), neighbour_overlap(embeddings, reference)
    failures = []
    if not mean >= thresholds[0]:  # `not >=` also fails NaN
        failures.append(f"mean cosine {mean:.4f} < {thresholds[0]}")
    if not worst >= thresholds[1]:
        failures.append(f"min cosine {worst:.4f} < {thresholds[1]}")
    if not overlap >= thresholds[2]:
        failures.append(f"top-{TOP_K} neighbour overlap {overlap:.4f} < {thresholds[2]}")
    return GateResult(
        precision,
        not failures,
        "; ".join(failures),
        mean_cosine=mean,
        min_cosine=worst,
        overlap=round(overlap, 4),
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
