"""What the quality check holds out of each user's history, and how a ranked list is scored on it.

Target: each user's last basket where the input names a basket column (an order, a session, a
visit: what a shop serves a list for), else their last interaction. Last by the input's time
column, or a seeded random order without one. A user is held out when something remains to
train on (a second basket, a second interaction).

Metrics at EVAL_K over the held-out items (one item: hit rate and recall are the same, and NDCG
is 1 / log2(rank + 2)): hit rate (any of them in the top EVAL_K), recall (the share of them
there), NDCG (ideal: every held-out item first), catalogue coverage, and for cold users
(COLD_HISTORY or fewer training interactions) the share served a ranked list; and on the items
new to the user (held out, never in their training history), NDCG and hit rate of the model's
ranking of the items the user has not had: what a "new for you" shelf shows, and whether a
model finds new items at all, whichever way it treats repeats.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from precompute.jobs.recs.history.interactions import BASKET, SECONDS
from precompute.jobs.recs.history.seen import GROUPED_ORDER, Seen, as_seen, pair_keys, users_subset

EVAL_K = 10
COLD_HISTORY = 2


class Held(NamedTuple):
    """Each user's held-out items as CSR (none for a user not held out)."""

    offsets: np.ndarray
    items: np.ndarray

    def subset(self, users: np.ndarray) -> Held:
        part = users_subset(Seen(self.offsets, self.items, np.zeros(len(self.items), np.float32)), users)
        return Held(part.offsets, part.items)

    def users(self) -> np.ndarray:
        """The users with a held-out item."""
        return np.flatnonzero(np.diff(self.offsets) > 0)


@dataclass(frozen=True)
class ModelQuality:
    hit_rate: float
    ndcg: float
    coverage: float
    cold_served: float | None
    """None when the sample holds no cold user."""
    recall: float | None = None
    """None in a quality measured before baskets (jobs/recs/state.py keeps it with the version)."""
    new_item_ndcg: float | None = None
    """None when no sampled user's held-out items hold one new to them."""
    new_item_hit_rate: float | None = None


@dataclass(frozen=True)
class Split:
    train: Seen
    """Every user's training part, users in id order."""
    held: Held
    name: str
    """"temporal" (by the time column) or "random" (a seeded order: no time column)."""
    target: str
    """"basket" (each user's last) or "interaction"."""


def hold_out(good: pa.Table, seed: int) -> Split:
    """Each user's last basket (or interaction) held out, where something remains to train on."""
    split = "temporal" if good.num_rows and not good[SECONDS].null_count else "random"
    if split == "random":
        order = np.random.default_rng(seed).random(good.num_rows)
        good = good.set_column(good.schema.get_field_index(SECONDS), SECONDS, pa.array(order))
    return split_rows(good.sort_by(GROUPED_ORDER), split)[0]


def split_rows(ordered: pa.Table, name: str) -> tuple[Split, np.ndarray]:
    """(the split of rows sorted by GROUPED_ORDER, which of them it holds out)."""
    seen = as_seen(ordered)
    held, target = held_rows(ordered, seen)
    users = np.repeat(np.arange(len(seen.offsets) - 1), np.diff(seen.offsets))
    offsets_held, offsets_kept = np.zeros_like(seen.offsets), np.zeros_like(seen.offsets)
    np.cumsum(np.bincount(users[held], minlength=len(seen.offsets) - 1), out=offsets_held[1:])
    np.cumsum(np.bincount(users[~held], minlength=len(seen.offsets) - 1), out=offsets_kept[1:])
    visits = None if seen.visits is None else seen.visits[~held]
    train = Seen(offsets_kept, seen.items[~held], seen.weights[~held], seen.ids, visits)
    return Split(train, Held(offsets_held, seen.items[held]), name, target), held


def held_rows(ordered: pa.Table, seen: Seen) -> tuple[np.ndarray, str]:
    """(which of the rows, sorted by GROUPED_ORDER as `seen` was made from them, are held out;
    the target's name): each user's last basket, or last row, unless nothing else is left."""
    lengths = np.diff(seen.offsets)
    users = np.repeat(np.arange(len(lengths)), lengths)
    last = seen.offsets[1:] - 1
    baskets = ordered[BASKET] if BASKET in ordered.column_names else None
    target = "basket" if baskets is not None and baskets.null_count < len(baskets) else "interaction"
    if target == "basket":
        codes = pc.dictionary_encode(baskets.combine_chunks()).indices.to_numpy()
        held = codes == codes[last][users]
    else:
        held = np.zeros(len(seen.items), bool)
        held[last[lengths > 0]] = True
    kept_per_user = np.bincount(users[~held], minlength=len(lengths))
    return held & (kept_per_user[users] > 0), target


def scored(
    indices: np.ndarray, scores: np.ndarray, sample: Seen, held: Held, items: int, explore: np.ndarray
) -> ModelQuality:
    """Metrics of ranked lists (`indices`, `scores`: [users, k], -1 and -inf past a list's end)
    over the held-out items; `explore`: the same model's lists of unseen items alone (the same
    lists where it excludes seen items), for the new-item metrics."""
    users, k = indices.shape
    own = pair_keys(sample.offsets, sample.items, items)
    wanted = np.unique(pair_keys(held.offsets, held.items, items))
    new = wanted[~np.isin(wanted, own)]
    hits, ideal = relevant(indices, wanted, items), np.bincount(wanted // items, minlength=users)
    ndcg = dcg(hits) / ideal_dcg(ideal, k)
    fresh, new_count = relevant(explore, new, items), np.bincount(new // items, minlength=users)
    with_new = new_count > 0
    cold = np.diff(sample.offsets) <= COLD_HISTORY
    served = np.isfinite(scores[:, 0]) & (scores[:, 0] > scores[:, -1])
    return ModelQuality(
        hit_rate=rounded(hits.any(axis=1).mean()),
        ndcg=rounded(ndcg.mean()),
        coverage=rounded(len(np.unique(indices[indices >= 0])) / items),
        cold_served=rounded(served[cold].mean()) if cold.any() else None,
        recall=rounded((hits.sum(axis=1) / np.maximum(ideal, 1)).mean()),
        new_item_ndcg=rounded((dcg(fresh) / ideal_dcg(new_count, k))[with_new].mean()) if with_new.any() else None,
        new_item_hit_rate=rounded(fresh.any(axis=1)[with_new].mean()) if with_new.any() else None,
    )


def relevant(indices: np.ndarray, wanted: np.ndarray, items: int) -> np.ndarray:
    """[users, k] bool: whether each listed item is one of its user's `wanted` keys."""
    listed = np.arange(len(indices))[:, None] * items + indices
    return np.isin(listed, wanted) & (indices >= 0)


def dcg(hits: np.ndarray) -> np.ndarray:
    return (hits / np.log2(np.arange(hits.shape[1]) + 2)).sum(axis=1)


def ideal_dcg(relevant_count: np.ndarray, k: int) -> np.ndarray:
    """The DCG of a list with each user's relevant items first (at least 1: a user with none scores 0)."""
    gains = np.concatenate([[0.0], np.cumsum(1 / np.log2(np.arange(k) + 2))])
    return np.maximum(gains[np.minimum(relevant_count, k)], 1e-12)


def rounded(value: float) -> float:
    return round(float(value), 4)
