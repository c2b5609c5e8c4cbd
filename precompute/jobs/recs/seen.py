"""Users' interactions as the models read them: CSR rows of item positions, each user's in time order."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pyarrow as pa
import scipy.sparse as sp

from precompute.jobs.recs.interactions import INDEX, SECONDS, USER, WEIGHT


class Seen(NamedTuple):
    """Users' interactions as CSR: user u's item positions are items[offsets[u]:offsets[u + 1]]."""

    offsets: np.ndarray
    items: np.ndarray
    weights: np.ndarray
    ids: np.ndarray | None = None
    """User u's id (str): what a model with its own user tower looks the user up by."""

HISTORY_ORDER = [(SECONDS, "ascending"), (INDEX, "ascending"), (WEIGHT, "ascending")]
"""A user's history in time order; ties at one time (and no time at all) by item, then weight:
the same order in every run, whatever order the rows arrive in."""

GROUPED_ORDER = [(USER, "ascending"), *HISTORY_ORDER]

def seen_by_user(good: pa.Table) -> Seen:
    """Clean rows (any order) -> CSR, users in id order, each user's items in HISTORY_ORDER: a
    model's training data."""
    return as_seen(good.sort_by(GROUPED_ORDER))

def as_seen(good: pa.Table) -> Seen:
    """Clean rows sorted by GROUPED_ORDER -> CSR."""
    encoded = good[USER].combine_chunks().dictionary_encode()
    users = encoded.indices.to_numpy()
    offsets = np.zeros(users.max(initial=-1) + 2, np.int64)
    np.cumsum(np.bincount(users, minlength=len(offsets) - 1), out=offsets[1:])
    return Seen(
        offsets,
        good[INDEX].to_numpy().astype(np.int64),
        good[WEIGHT].to_numpy().astype(np.float32),
        user_ids(encoded.dictionary),  # in order of first appearance: sorted
    )

def users_subset(seen: Seen, users: np.ndarray) -> Seen:
    """The rows of `users` (positions, ascending), in that order."""
    lengths = np.diff(seen.offsets)[users]
    offsets = np.zeros(len(users) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    rows = ranges(seen.offsets[users], lengths)
    return Seen(offsets, seen.items[rows], seen.weights[rows], None if seen.ids is None else seen.ids[users])

def ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The positions starts[i] .. starts[i] + lengths[i] - 1 of every i, in order."""
    ends = np.cumsum(lengths)
    return np.repeat(starts - ends + lengths, lengths) + np.arange(ends[-1] if len(ends) else 0)

def user_ids(ids: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """User ids as the numpy strings OwnTowers searches."""
    return np.asarray(ids.to_pylist(), dtype=str)

def interaction_matrix(seen: Seen, items: int) -> sp.csr_matrix:
    return sp.csr_matrix((seen.weights, seen.items, seen.offsets), shape=(len(seen.offsets) - 1, items))
