"""Users' interactions as the models read them: CSR rows of item positions, each user's in time order."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pyarrow as pa
import scipy.sparse as sp

from precompute.jobs.recs.history.interactions import INDEX, SECONDS, USER, WEIGHT


class Seen(NamedTuple):
    """Users' interactions as CSR: user u's item positions are items[offsets[u]:offsets[u + 1]]."""

    offsets: np.ndarray
    items: np.ndarray
    weights: np.ndarray
    ids: np.ndarray | None = None
    """User u's id (str): what a model with its own user tower looks the user up by."""
    visits: np.ndarray | None = None
    """Each interaction's visit, counted from the user's first: interactions at one time are one
    visit (an order's lines, a session's clicks); what repeats are timed by (jobs/recs/topk/repeat.py).
    None: each interaction is a visit of its own."""

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
        visit_numbers(offsets, good[SECONDS].to_numpy(zero_copy_only=False)),
    )


def visit_numbers(offsets: np.ndarray, seconds: np.ndarray) -> np.ndarray:
    """Each row's visit (Seen.visits) from its time, rows grouped by user in time order: a new
    visit where the user or the time changes (a row without a time, NaN, is a visit of its own)."""
    new = np.ones(len(seconds), bool)
    new[1:] = seconds[1:] != seconds[:-1]
    new[offsets[:-1][offsets[:-1] < len(new)]] = True
    counted = np.cumsum(new)
    first = counted[offsets[:-1].clip(max=max(len(new) - 1, 0))] if len(new) else counted
    lengths = np.diff(offsets)
    return (counted - np.repeat(first[: len(lengths)], lengths)).astype(np.int64)

def users_subset(seen: Seen, users: np.ndarray) -> Seen:
    """The rows of `users` (positions, ascending), in that order."""
    lengths = np.diff(seen.offsets)[users]
    offsets = np.zeros(len(users) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    rows = ranges(seen.offsets[users], lengths)
    ids = None if seen.ids is None else seen.ids[users]
    return Seen(offsets, seen.items[rows], seen.weights[rows], ids, None if seen.visits is None else seen.visits[rows])

def ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The positions starts[i] .. starts[i] + lengths[i] - 1 of every i, in order."""
    ends = np.cumsum(lengths)
    return np.repeat(starts - ends + lengths, lengths) + np.arange(ends[-1] if len(ends) else 0)

def pair_keys(offsets: np.ndarray, items: np.ndarray, catalogue: int) -> np.ndarray:
    """user * catalogue + item of every row of a CSR (its rows from offsets[0] on): one integer per
    (user, item) pair, for set operations over many users at once."""
    rows = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    return rows * catalogue + items[offsets[0] : offsets[-1]]


def user_ids(ids: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """User ids as the numpy strings OwnTowers searches."""
    return np.asarray(ids.to_pylist(), dtype=str)

def interaction_matrix(seen: Seen, items: int) -> sp.csr_matrix:
    return sp.csr_matrix((seen.weights, seen.items, seen.offsets), shape=(len(seen.offsets) - 1, items))
