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


# A session's recommendations, from the related lists of the items it holds (a related output's
# records): each list's scores are its model's for a history of that one item, so lists of one
# model add up.
SESSION_DECAY = 0.7
"""The weight of the session's t-th latest item is this**t: the latest item says most about what
comes next (jobs/recs/related.py measures a related output's held-out quality through this merge: what
it measured is what the service answers)."""


def merge_ranked(
    lists: list[bytes | None], k: int, exclude: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(indices, scores) of the top k of the session's merged lists, best first; `lists`: the
    related values of the session's items, oldest first (None: an item with no list); `exclude`:
    item positions never answered (the session's own, unless the output allows them)."""
    pairs = [(np.frombuffer(value, RANKED), SESSION_DECAY ** (len(lists) - 1 - t)) for t, value in enumerate(lists) if value]
    if not pairs:
        return np.zeros(0, np.int64), np.zeros(0, np.float32)
    indices = np.concatenate([p["index"] for p, _ in pairs]).astype(np.int64)
    scores = np.concatenate([p["score"].astype(np.float64) * weight for p, weight in pairs])
    items, at = np.unique(indices, return_inverse=True)
    totals = np.bincount(at.reshape(-1), weights=scores, minlength=len(items))
    if exclude is not None and len(exclude):
        keep = ~np.isin(items, exclude)
        items, totals = items[keep], totals[keep]
    best = np.lexsort((items, -totals))[:k]
    return items[best], totals[best].astype(np.float32)
