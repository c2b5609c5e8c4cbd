"""The accuracy gate: a quantized engine is used only if it agrees with FP32 on held-out texts."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class GateResult:
    """One precision's agreement with the FP32 reference; `reason` says why it failed."""

    precision: str
    mean_cosine: float
    min_cosine: float
    passed: bool
    reason: str


def row_cosine(embeddings: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Cosine of each row with its reference row."""
    return np.sum(embeddings * reference, axis=1) / (
        np.linalg.norm(embeddings, axis=1) * np.linalg.norm(reference, axis=1)
    )


def cosine_gate(
    precision: str, cosine: np.ndarray, mean_threshold: float, min_threshold: float
) -> GateResult:
    """Both the mean and the worst text's cosine to FP32 must reach their thresholds."""
    mean, worst = float(cosine.mean()), float(cosine.min())
    failures = []
    if not mean >= mean_threshold:  # `not >=` also fails NaN
        failures.append(f"mean cosine {mean:.4f} < {mean_threshold}")
    if not worst >= min_threshold:
        failures.append(f"min cosine {worst:.4f} < {min_threshold}")
    return GateResult(precision, mean, worst, not failures, "; ".join(failures))
