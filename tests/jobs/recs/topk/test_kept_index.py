"""The items' index kept from the night that built it (jobs/recs/topk/kept_index.py): its lists searched
over the next nights' vectors, the items moved since its build placed again, rebuilt past
MOVED_SHARE."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from precompute.jobs.nights import Previous
from precompute.jobs.recs.history.seen import Seen, seen_by_user
from precompute.jobs.recs.state import STATE
from precompute.jobs.recs.topk.candidates import (
    INDEX_BUILD_USERS,
    IVF_MIN_ITEMS,
    MIN_CHECK_USERS,
    CandidateTopK,
    choose_ranking,
    ranker_of,
    recall,
)
from precompute.jobs.recs.topk.exact import BlockedTopK
from precompute.jobs.recs.topk.item_lists import build_lists, ceilings
from precompute.jobs.recs.topk.kept_index import MOVED_SHARE, KeptIndex, keep_index, kept_index
from precompute.jobs.recs.towers import ContentTowers
from precompute.jobs.work_dir import WorkPath
from tests.jobs.recs.topk.test_candidates import DIM, ITEMS, USERS, K, clustered, interactions


def keys_of(count: int, edited: np.ndarray | None = None) -> np.ndarray:
    """Content keys of `count` items, those at `edited` changed."""
    keys = [f"key-{item:011d}".encode() for item in range(count)]
    for item in [] if edited is None else edited:
        keys[item] = f"new-{item:011d}".encode()
    return np.array(keys, "S16")


def published(run_dir: Path, version: str) -> Previous:
    return Previous(version, WorkPath.of(run_dir), range(10**6))


def test_a_kept_index_ranks_the_next_nights_vectors_at_the_recall_the_gate_asks(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    centres = rng.normal(size=(20, DIM))
    items, prior = clustered(rng, ITEMS, centres), rng.uniform(0, 2, ITEMS).astype(np.float32)
    histories = seen_by_user(interactions(rng))
    first = choose_ranking("ivf", ContentTowers(items), prior, K, 128, histories, 0.99, False, USERS)
    assert first.kept_from is None and first.lists is not None
    keep_index(WorkPath.of(tmp_path / "first" / STATE), first.lists, keys_of(ITEMS), None, first.check)

    # The night after: 1% of the items have new texts, the prior of 2% moved with the interactions.
    edited = rng.choice(ITEMS, ITEMS // 100, replace=False)
    tonight = items.copy()
    tonight[edited] = clustered(rng, len(edited), centres)
    prior = prior.copy()
    prior[rng.choice(ITEMS, ITEMS // 50, replace=False)] *= 1.1
    kept = kept_index(published(tmp_path / "first", "v1"), keys_of(ITEMS, edited), DIM + 1)
    assert kept is not None and kept.version == "v1" and sorted(kept.moved) == sorted(edited)

    towers = ContentTowers(tonight)
    second = choose_ranking("ivf", towers, prior, K, 128, histories, 0.99, False, USERS, kept)

    assert second.method == "ivf" and second.kept_from == "v1" and second.recall >= 0.99
    # Its recall was measured on the first night's sample, those users whose history holds no
    # edited item carried, not scored against every item: the same recall as scoring them all.
    assert second.sample_users == first.sample_users and 0 < second.carried < second.sample_users
    vectors = torch.from_numpy(towers.users(histories))
    truth, _ = BlockedTopK(tonight, K, 128, prior)(vectors, histories)
    found, _ = ranker_of(tonight, K, 128, prior, second)(vectors, histories)
    at = np.searchsorted(histories.ids, second.check.users)
    assert second.recall == round(recall(found[at], truth[at]), 4)
    assert f"the index kept from v1 ({len(edited)} moved since)" in second.reason
    assert second.report()["moved"] == len(edited)
    # Carried on as built: the night after that still compares with the first night's keys.
    keep_index(WorkPath.of(tmp_path / "second" / STATE), second.lists, keys_of(ITEMS), kept, second.check)
    again = kept_index(published(tmp_path / "second", "v2"), keys_of(ITEMS, edited), DIM + 1)
    assert again is not None and sorted(again.moved) == sorted(edited)

    # Past MOVED_SHARE, or over other columns (no prior), it is built again.
    many = rng.choice(ITEMS, int(MOVED_SHARE * ITEMS) + 1, replace=False)
    assert kept_index(published(tmp_path / "first", "v1"), keys_of(ITEMS, many), DIM + 1) is None
    assert kept_index(published(tmp_path / "first", "v1"), keys_of(ITEMS), DIM) is None
    assert kept_index(published(tmp_path / "nothing", "v0"), keys_of(ITEMS), DIM + 1) is None
    assert kept_index(None, keys_of(ITEMS), DIM + 1) is None


def test_an_item_moved_since_the_build_is_found_in_tonights_list_not_its_old_one(tmp_path: Path) -> None:
    """Item 7 was built into the index as the opposite of what the user wants, so into a list the
    user's search does not probe; tonight it is the user's best. Left in its old list it is
    missed; placed again as moved, it is the user's first, with its score tonight."""
    rng = np.random.default_rng(8)
    items = clustered(rng, ITEMS, rng.normal(size=(20, DIM)))
    user = rng.normal(size=(1, DIM)).astype(np.float32)
    direction = user[0] / np.linalg.norm(user)
    items[7] = 1.05 * float((items @ direction).max()) * direction  # best, though not of largest norm
    built = items.copy()
    built[7] = -items[7]
    keep_index(WorkPath.of(tmp_path / STATE), build_lists(built, None), keys_of(ITEMS), None, None)
    seen = Seen(np.array([0, 0]), np.zeros(0, np.int64), np.zeros(0, np.float32))

    def top(moved: list[int]) -> tuple[np.ndarray, np.ndarray]:
        lists = KeptIndex("v1", WorkPath.of(tmp_path / STATE), np.array(moved, np.int64)).over(items, None)
        return CandidateTopK(lists, ceilings(lists, items, None), items, K, None, 4)(torch.from_numpy(user), seen)

    (blind, _), (found, scores) = top([]), top([7])

    assert 7 not in blind[0]
    assert found[0, 0] == 7
    np.testing.assert_allclose(scores[0], items[found[0]] @ user[0], rtol=1e-5)  # each one's exact score


def test_auto_searches_a_kept_index_for_few_users_but_not_fewer_than_its_check(tmp_path: Path) -> None:
    """Without a kept index, an incremental night's few users are scored exactly (a build costs
    as much as INDEX_BUILD_USERS users); with one, only the check's exact scores must be repaid,
    a twentieth of the users' and at least MIN_CHECK_USERS: under twice that, all are exact."""
    rng = np.random.default_rng(9)
    histories = seen_by_user(interactions(rng))
    items = clustered(rng, IVF_MIN_ITEMS + 1, rng.normal(size=(20, 8)))
    towers = ContentTowers(items)
    keep_index(WorkPath.of(tmp_path / STATE), build_lists(items, None), keys_of(len(items)), None, None)
    kept = kept_index(published(tmp_path, "v1"), keys_of(len(items)), 8)

    few = choose_ranking("auto", towers, None, K, 128, histories, 0.9, False, INDEX_BUILD_USERS, kept)
    assert few.method == "ivf" and few.kept_from == "v1"
    fewer = choose_ranking("auto", towers, None, K, 128, histories, 0.9, False, 2 * MIN_CHECK_USERS - 1, kept)
    assert fewer.method == "exact" and "too few to repay the index's recall check" in fewer.reason
    unkept = choose_ranking("auto", towers, None, K, 128, histories, 0.9, False, INDEX_BUILD_USERS)
    assert unkept.method == "exact" and "too few to repay an index's build" in unkept.reason



def test_auto_with_a_kept_index_scores_exactly_when_the_recall_check_would_cost_more_than_it_saves(tmp_path: Path) -> None:
    """Past IVF_MIN_ITEMS items with an index kept from an earlier night (no build to repay), a
    night that ranks fewer users than twice the recall check's sample scores them exactly: the
    check alone would score as many exactly. One user more than that uses the kept index; a
    GPU scores every night exactly, and is never asked to build or check an index."""
    rng = np.random.default_rng(11)
    items = clustered(rng, IVF_MIN_ITEMS + 1, rng.normal(size=(20, 8)))
    histories = seen_by_user(interactions(rng))
    built = choose_ranking("ivf", ContentTowers(items), None, K, 128, histories, 0.9, False, USERS)
    keep_index(WorkPath.of(tmp_path / "first" / STATE), built.lists, keys_of(len(items)), None, built.check)

    def tonight(users: int, gpus: bool = False) -> object:
        kept = kept_index(published(tmp_path / "first", "v1"), keys_of(len(items)), built.lists.centroids.shape[1])
        assert kept is not None
        return choose_ranking("auto", ContentTowers(items), None, K, 128, histories, 0.9, gpus, users, kept)

    few = tonight(2 * MIN_CHECK_USERS - 1)
    assert (few.method, few.lists) == ("exact", None) and "too few to repay the index's recall check" in few.reason
    enough = tonight(2 * MIN_CHECK_USERS)
    assert enough.method == "ivf" and enough.kept_from == "v1"
    on_gpu = tonight(INDEX_BUILD_USERS * 10, gpus=True)
    assert (on_gpu.method, on_gpu.reason, on_gpu.lists) == ("exact", "exact: a GPU scores", None)
