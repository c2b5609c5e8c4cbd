"""Recommending what a user already has: a shop's staples, a pet's food, a favourite album.

With `seen = "exclude"` a user's own items are masked (jobs/recs/topk/). Where repeats are
allowed, the ranker's top k of the user's unseen items is merged with the user's own items,
each scored as the model scores any item (user . item + prior) plus a repeat bonus:

    bonus(u, j) = weight * c(u, j) / max_i c(u, i) * (1 + due * d(u, j))
    c(u, j)     = sum over u's interactions with j of decay**age
    d(u, j)     = exp(-2 (since - gap)**2 / gap**2)   (0 for an item of one visit)

where age counts the user's visits (Seen.visits: an order, a session) since the interaction, 0
for the latest; `gap` is the mean number of visits between the user's purchases of j and
`since` the number from their last one to the visit being recommended for. c is the user's own
items by frequency and recency (personal top-frequency with time decay); d is how due an item
is on its own cycle (bought every third order, last bought two orders ago: due now), the signal
repeat-consumption models add (ReCANet, Ariannezhad et al., SIGIR 2022). Model scores are in units
of their spread (jobs/recs/blend.py), so one grid of weights means the same on every model: the
model plays TIFU-KNN's explorer (Hu et al., SIGIR 2020: the user's own time-decayed items beside
what their neighbours buy, mixed by one weight); weight 0 is the model itself allowed to predict
seen items, PERSONAL_FIRST the user's own items first. The merge is exact: the top k over every
item under these scores lies in the top k unseen items and the seen ones, whatever ranker found
the former.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from precompute.jobs.recs.history.seen import Seen, pair_keys

WEIGHTS = (0.0, 1.0, 4.0, 16.0, 64.0)
"""The repeat weights the quality check tries (jobs/recs/quality.py), in units of model spread."""
DECAYS = (1.0, 0.95, 0.9, 0.8)
"""The decays per visit it tries: 1 counts every purchase alike; 0.8 forgets in a few visits."""
DUES = (0.0, 1.0, 4.0)
"""The weights of being due it tries: 0 ignores cycles."""
PERSONAL_FIRST = 1e9
"""A weight past any model's scores: the user's own items first, by c(u, j)."""
PAIRS_PER_CHUNK = 4096
"""(user, seen item) pairs scored at once: [pairs, dim] float32 of user and item rows each."""


@dataclass(frozen=True)
class Repeat:
    weight: float
    decay: float
    due: float = 0.0

    def describe(self) -> str:
        due = f", due weight {self.due}" if self.due else ""
        if self.weight >= PERSONAL_FIRST:
            return f"the user's own items first (decay {self.decay}{due})"
        return f"repeats weighted {self.weight} (decay {self.decay} a visit{due})"


@dataclass(frozen=True)
class SeenScores:
    """Each user's distinct seen items: the model's score of each, how due it is, and what its
    decayed count is made of."""

    rows: np.ndarray
    """The pair's user, a row of the ranked block."""
    items: np.ndarray
    model: np.ndarray
    """float64: user . item + prior."""
    due: np.ndarray
    """d(u, j) of each pair."""
    ages: np.ndarray
    """Per interaction (in the block's order): its age in visits, and which pair it counts for."""
    pair_of: np.ndarray

    def bonus(self, repeat: Repeat) -> np.ndarray:
        """bonus(u, j) of every pair."""
        counts = np.bincount(self.pair_of, weights=repeat.decay ** self.ages.astype(np.float64), minlength=len(self.rows))
        peak = np.zeros(int(self.rows.max(initial=-1)) + 1)
        np.maximum.at(peak, self.rows, counts)
        shares = counts / np.maximum(peak[self.rows], 1e-300)
        return repeat.weight * shares * (1 + repeat.due * self.due)


def seen_scores(
    user_vectors: np.ndarray, item_vectors: np.ndarray, prior: np.ndarray | None, seen: Seen
) -> SeenScores:
    """The model's scores of the users' own items (their rows of `seen`), and their timing."""
    start, stop = int(seen.offsets[0]), int(seen.offsets[-1])
    lengths = np.diff(seen.offsets)
    rows = np.repeat(np.arange(len(lengths)), lengths)
    positions = np.arange(start, stop) - np.repeat(seen.offsets[:-1], lengths)
    visits = positions if seen.visits is None else seen.visits[start:stop]
    latest = np.zeros(len(lengths), np.int64)
    np.maximum.at(latest, rows, visits)
    ages = latest[rows] - visits
    pairs, pair_of = np.unique(pair_keys(seen.offsets, seen.items, len(item_vectors)), return_inverse=True)
    pair_of = pair_of.reshape(-1)
    pair_rows, pair_items = pairs // len(item_vectors), pairs % len(item_vectors)
    model = np.empty(len(pairs))
    for first in range(0, len(pairs), PAIRS_PER_CHUNK):
        chunk = slice(first, first + PAIRS_PER_CHUNK)
        users, items = user_vectors[pair_rows[chunk]], item_vectors[pair_items[chunk]]
        model[chunk] = np.einsum("ij,ij->i", users, items, dtype=np.float64)
    if prior is not None:
        model += prior[pair_items]
    return SeenScores(pair_rows, pair_items, model, dueness(pair_of, ages, len(pairs)), ages, pair_of)


def dueness(pair_of: np.ndarray, ages: np.ndarray, pairs: int) -> np.ndarray:
    """d(u, j) of each pair, from the ages of its interactions (several in one visit count once)."""
    span = int(ages.max(initial=0)) + 1
    visits = np.unique(pair_of * span + ages)
    pair, age = visits // span, visits % span
    count = np.bincount(pair, minlength=pairs)
    newest = np.full(pairs, np.iinfo(np.int64).max)
    np.minimum.at(newest, pair, age)
    oldest = np.zeros(pairs, np.int64)
    np.maximum.at(oldest, pair, age)
    cycled = count >= 2
    gap = np.where(cycled, (oldest - newest) / np.maximum(count - 1, 1), 1.0)
    since = newest + 1.0
    return np.where(cycled, np.exp(-2 * (since - gap) ** 2 / gap**2), 0.0)


def with_repeats(
    indices: np.ndarray, scores: np.ndarray, seen: SeenScores, repeat: Repeat
) -> tuple[np.ndarray, np.ndarray]:
    """The top k over every item, from a ranker's top k unseen (`indices`, `scores`: -1 and -inf
    past a user's unseen items) and the users' seen items scored with their repeat bonus."""
    users, k = indices.shape
    listed = indices >= 0
    rows = np.concatenate([np.nonzero(listed)[0], seen.rows])
    items = np.concatenate([indices[listed], seen.items])
    values = np.concatenate([scores[listed].astype(np.float64), seen.model + seen.bonus(repeat)])
    order = np.lexsort((-values, rows))
    rows, items, values = rows[order], items[order], values[order]
    starts = np.searchsorted(rows, np.arange(users))
    place = np.arange(len(rows)) - starts[rows]
    taken = place < k
    out_indices = np.full((users, k), -1, np.int64)
    out_scores = np.full((users, k), -np.inf, np.float32)
    out_indices[rows[taken], place[taken]] = items[taken]
    out_scores[rows[taken], place[taken]] = values[taken]
    return out_indices, out_scores
