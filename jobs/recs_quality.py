"""Leave-one-out quality of the recommendations: does the job beat the trivial baselines?

For every user with two or more items, one item (picked by a seeded generator) is held out
and the rest are the user's history; a hit is the held-out item in the user's top-k, seen
items excluded. Three rankers on the same split: ours (content + popularity prior), content
only, and most-popular (interaction counts of the training part). It runs on the driver, in
memory, over a seeded sample of at most MAX_USERS users: scoring is O(users x items), and a
sample of a few thousand measures a hit-rate to about +-0.01 whatever the user count.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads

from jobs.recommend import (
    INDEX,
    USER,
    WEIGHT,
    BlockedTopK,
    Seen,
    clean,
    column_renames,
    popularity_prior,
    tag_rejects,
)
from jobs.validate import REASON
from precompute.pipeline import InteractionsInput

MAX_USERS = 5000


@dataclass(frozen=True)
class RecsQuality:
    users: int
    """Users evaluated: those of the sample with two or more valid interactions."""
    sampled_from: int
    """Users with a valid interaction; the sample is at most MAX_USERS of them."""
    k: int
    popularity_weight: float
    ours: float
    content_only: float
    most_popular: float


def seen_of_table(table: pa.Table, item_ids: list[str]) -> Seen:
    """The contract's valid interactions as CSR, users in id order; rejected rows are left out."""
    tagged = tag_rejects(table, {item: i for i, item in enumerate(item_ids)})
    good = clean(tagged.filter(pc.is_null(tagged[REASON]))).sort_by([(USER, "ascending")])
    users = good[USER].combine_chunks().dictionary_encode().indices.to_numpy()
    offsets = np.zeros(users.max(initial=-1) + 2, np.int64)
    np.cumsum(np.bincount(users, minlength=len(offsets) - 1), out=offsets[1:])
    return Seen(
        offsets=offsets,
        items=good[INDEX].to_numpy().astype(np.int64),
        weights=good[WEIGHT].to_numpy().astype(np.float32),
    )


def read_seen(interactions: InteractionsInput, item_ids: list[str]) -> Seen:
    table = pads.dataset(interactions.path, format="parquet").to_table()
    renames = column_renames(interactions, table.column_names)
    return seen_of_table(table.rename_columns([renames.get(c, c) for c in table.column_names]), item_ids)


def hold_out(seen: Seen, seed: int) -> tuple[Seen, np.ndarray]:
    """(training part, held-out item per user or -1 for users with fewer than two items)."""
    lengths = np.diff(seen.offsets)
    eligible = np.flatnonzero(lengths >= 2)
    rng = np.random.default_rng(seed)
    held = seen.offsets[eligible] + (rng.random(len(eligible)) * lengths[eligible]).astype(np.int64)
    targets = np.full(len(lengths), -1, np.int64)
    targets[eligible] = seen.items[held]
    keep = np.ones(len(seen.items), bool)
    keep[held] = False
    offsets = np.zeros_like(seen.offsets)
    np.cumsum(lengths - (lengths >= 2), out=offsets[1:])
    return Seen(offsets, seen.items[keep], seen.weights[keep]), targets


def sample_users(seen: Seen, most: int, seed: int) -> Seen:
    """At most `most` users drawn by a seeded generator, in their order; all when there are no more."""
    lengths = np.diff(seen.offsets)
    if len(lengths) <= most:
        return seen
    chosen = np.sort(np.random.default_rng(seed).choice(len(lengths), size=most, replace=False))
    offsets = np.zeros(most + 1, np.int64)
    np.cumsum(lengths[chosen], out=offsets[1:])
    rows = np.repeat(seen.offsets[chosen] - offsets[:-1], lengths[chosen]) + np.arange(offsets[-1])
    return Seen(offsets, seen.items[rows], seen.weights[rows])


def leave_one_out(
    seen: Seen,
    item_vectors: np.ndarray,
    popularity_weight: float,
    k: int = 10,
    seed: int = 0,
    block: int = 512,
    max_users: int = MAX_USERS,
) -> RecsQuality:
    population = len(seen.offsets) - 1
    seen = sample_users(seen, max_users, seed)
    train, targets = hold_out(seen, seed)
    evaluated = targets >= 0
    if not evaluated.any():
        raise ValueError("no user has two or more valid interactions: leave-one-out has nothing to evaluate")
    counts = np.bincount(train.items, minlength=len(item_vectors)).astype(np.float32)

    def hit_rate(content: bool, prior: np.ndarray | None) -> float:
        ranker = BlockedTopK(item_vectors, k, block, prior)
        users = ranker.user_vectors(train)
        if not content:
            users.zero_()
        indices, _ = ranker(users, train)
        return float((indices[evaluated] == targets[evaluated, None]).any(axis=1).mean())

    return RecsQuality(
        users=int(evaluated.sum()),
        sampled_from=population,
        k=k,
        popularity_weight=popularity_weight,
        ours=hit_rate(True, popularity_prior(counts, popularity_weight)),
        content_only=hit_rate(True, None),
        most_popular=hit_rate(False, counts),
    )
