"""The top-k's recall check carried from night to night (jobs/recs/topk/kept_check.py): the sample users'
exact best items after items, the prior, histories and users moved, against every item scored."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from precompute.jobs.recs.history.interactions import INDEX, SECONDS, USER, WEIGHT
from precompute.jobs.recs.history.seen import Seen, seen_by_user, users_subset
from precompute.jobs.recs.topk.exact import BlockedTopK
from precompute.jobs.recs.topk.kept_check import MARGIN, carried_check, fresh_check, saved_check
from precompute.jobs.work_dir import WorkPath
from tests.jobs.recs.topk.test_candidates import DIM, ITEMS, USERS, K, clustered, interactions


class ByUser:
    """Towers whose user vectors are looked up by id (as the pipeline's own towers are), so a
    user's vector stays while items move."""

    name = "by-user"

    def __init__(self, items: np.ndarray, vectors: dict[str, np.ndarray]) -> None:
        self.items, self.vectors = items, vectors

    def users(self, seen: Seen) -> np.ndarray:
        return np.stack([self.vectors[user] for user in seen.ids]).astype(np.float32)


def night(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, pa.Table, dict[str, np.ndarray]]:
    centres = rng.normal(size=(20, DIM))
    items, prior = clustered(rng, ITEMS, centres), rng.uniform(0, 2, ITEMS).astype(np.float32)
    table = interactions(rng)
    users = {f"u{u:04d}": vector for u, vector in enumerate(clustered(rng, USERS, centres))}
    return items, prior, table, users


def exact(towers: ByUser, prior: np.ndarray, sample: Seen) -> tuple[np.ndarray, np.ndarray]:
    return BlockedTopK(towers.items, K, 64, prior)(torch.from_numpy(towers.users(sample)), sample)


def test_a_carried_check_knows_each_users_exact_top_k_after_items_the_prior_and_histories_moved(
    tmp_path: Path,
) -> None:
    rng = np.random.default_rng(11)
    items, prior, table, users = night(rng)
    histories = seen_by_user(table)
    sample = users_subset(histories, np.arange(0, len(histories.ids), 2))
    gone, grown, sinking = sample.ids[1:4]
    fresh_check(ByUser(items, users), prior, sample, K, 64, np.empty(0, np.int64)).save(WorkPath.of(tmp_path))
    kept = saved_check(WorkPath.of(tmp_path))
    assert kept is not None and kept.items.shape == (len(sample.ids), MARGIN * K)

    # The night after: 1% of the items have new vectors, 2% a new prior; one user is gone; one
    # interacted with one more item; one's whole kept list sank below every other item.
    moved = np.sort(rng.choice(ITEMS, ITEMS // 100, replace=False))
    tonight = items.copy()
    tonight[moved] = clustered(rng, len(moved), rng.normal(size=(20, DIM)))
    sunk = kept.items[list(kept.users).index(sinking)]
    tonight[sunk] = -10 * np.abs(tonight[sunk])
    moved = np.union1d(moved, sunk)
    prior = prior.copy()
    prior[rng.choice(ITEMS, ITEMS // 50, replace=False)] += 0.5
    held = set(table.filter(pc.equal(table[USER], grown))[INDEX].to_pylist())
    extra = pa.table(
        {USER: [grown], INDEX: [next(i for i in range(ITEMS) if i not in held)], WEIGHT: [1.0], SECONDS: [10**9]},
        table.schema,
    )
    table = pa.concat_tables([table.filter(pc.not_equal(table[USER], gone)), extra])
    towers = ByUser(tonight, users)

    carried = carried_check(kept, towers, prior, seen_by_user(table), K, 64, moved)

    assert carried is not None
    sample, lists, kept_lists = carried
    assert gone not in sample.ids and len(sample.ids) == len(kept.users) - 1
    assert 0 < kept_lists <= len(sample.ids) - 2  # the new history and the sunk list scored again
    found, scores = exact(towers, prior, sample)
    np.testing.assert_allclose(lists.scores[:, :K], scores, rtol=1e-5, atol=1e-5)
    assert (lists.truth(K) == found).mean() > 0.99  # the same items, but for exact ties
    assert (lists.bound <= lists.scores[:, K - 1]).all()


def test_a_check_is_drawn_afresh_when_the_prior_moved_for_every_item(tmp_path: Path) -> None:
    """A new most popular item rescales the whole prior: every item's score moves."""
    rng = np.random.default_rng(12)
    items, prior, table, users = night(rng)
    histories = seen_by_user(table)
    towers = ByUser(items, users)
    fresh_check(towers, prior, users_subset(histories, np.arange(20)), K, 64, np.empty(0, np.int64)).save(
        WorkPath.of(tmp_path)
    )
    kept = saved_check(WorkPath.of(tmp_path))
    assert kept is not None

    assert carried_check(kept, towers, 1.1 * prior, histories, K, 64, np.empty(0, np.int64)) is None
    assert carried_check(kept, towers, None, histories, K, 64, np.empty(0, np.int64)) is None  # no prior now
    assert carried_check(kept, towers, prior, histories, 2 * K, 64, np.empty(0, np.int64)) is None  # another k
    same = carried_check(kept, towers, prior, histories, K, 64, np.empty(0, np.int64))
    assert same is not None and same[2] == 20  # nothing moved: every list carried as it was
    np.testing.assert_array_equal(same[1].items, kept.items)
