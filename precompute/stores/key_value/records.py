"""Binary record values for key lookups: fixed-width little-endian pairs, no pickle or JSON.

A value is a ranked list of (index, score) pairs, best first; the index points into the
version's vocabulary (label names for labels, item ids for recommendations), which is
kept once in the version's metadata. Six bytes a pair keep a top-10 within Redis's
default listpack value limit (64 bytes), which is what keeps the hash layout compact.
"""

from __future__ import annotations

import numpy as np

RANKED = np.dtype([("index", "<u4"), ("score", "<f2")])


def encode_ranked(indices: np.ndarray, scores: np.ndarray, given: np.ndarray | None = None) -> list[bytes]:
    """One value per row of `indices` and `scores` ([rows, k] each, best first); with `given`
    (booleans of that shape), each row's given pairs alone (an abstaining row's value is empty)."""
    if indices.shape != scores.shape or indices.ndim != 2:
        raise ValueError(
            f"indices and scores must be [rows, k] of one shape: {indices.shape}, {scores.shape}"
        )
    pairs = np.empty(indices.shape, RANKED)
    pairs["index"] = indices
    pairs["score"] = scores
    if given is None:
        return [row.tobytes() for row in pairs]
    return [row[keep].tobytes() for row, keep in zip(pairs, given, strict=True)]


def decode_ranked(value: bytes) -> tuple[np.ndarray, np.ndarray]:
    """(indices, scores) of one value written by `encode_ranked`."""
    if len(value) % RANKED.itemsize:
        raise ValueError(f"a ranked value is a multiple of {RANKED.itemsize} bytes, got {len(value)}")
    pairs = np.frombuffer(value, RANKED)
    return pairs["index"].astype(np.int64), pairs["score"].astype(np.float32)
