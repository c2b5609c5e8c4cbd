"""Candidates from an IVF index (jobs/recs/topk/candidates.py) against exact top-k, and the recall gate
that decides which of the two the actors use."""

from __future__ import annotations

import os
import tracemalloc
from collections.abc import Callable

import faiss
import numpy as np
import psutil
import pyarrow as pa
import pytest
import torch

from precompute.jobs.recs.history.interactions import INDEX, SECONDS, USER, WEIGHT
from precompute.jobs.recs.history.seen import Seen, seen_by_user
from precompute.jobs.recs.topk import item_lists
from precompute.jobs.recs.topk.candidates import (
    INDEX_BUILD_USERS,
    IVF_MIN_ITEMS,
    NPROBE_LADDER,
    CandidateTopK,
    Ranking,
    check_users,
    choose_ranking,
    ranker_of,
    recall,
    sample_users,
)
from precompute.jobs.recs.topk.exact import BlockedTopK, popularity_prior
from precompute.jobs.recs.topk.item_lists import (
    ItemLists,
    build_lists,
    ceilings,
    index_data,
    search_by_list,
)
from precompute.jobs.recs.towers import ContentTowers

ITEMS, DIM, USERS, K = 3000, 32, 300, 10


def clustered(rng: np.random.Generator, rows: int, centres: np.ndarray) -> np.ndarray:
    """Vectors near one of a few centres, as trained item and user towers lie."""
    near = centres[rng.integers(0, len(centres), rows)] + 0.5 * rng.normal(size=(rows, centres.shape[1]))
    return near.astype(np.float32)


def interactions(rng: np.random.Generator) -> pa.Table:
    """USERS users, the first of whom has seen all but three items, the rest 0-150 each."""
    counts = rng.integers(0, 150, USERS)
    counts[0] = ITEMS - 3
    users = np.repeat([f"u{u:04d}" for u in range(USERS)], counts)
    items = np.concatenate([rng.choice(ITEMS, count, replace=False) for count in counts])
    return pa.table(
        {
            USER: pa.array(users, pa.string()),
            INDEX: pa.array(items, pa.int64()),
            WEIGHT: pa.array(np.ones(len(items)), pa.float32()),
            SECONDS: pa.array(np.arange(len(items)), pa.int64()),
        }
    )


def test_the_indexs_top_k_is_the_exact_one_at_the_recall_the_gate_chose() -> None:
    rng = np.random.default_rng(3)
    centres = rng.normal(size=(20, DIM))
    items, prior = clustered(rng, ITEMS, centres), rng.uniform(0, 2, ITEMS).astype(np.float32)
    histories = seen_by_user(interactions(rng))
    towers = ContentTowers(items)

    ranking = choose_ranking("ivf", towers, prior, K, 128, histories, 0.99, False, USERS)

    assert ranking.method == "ivf" and ranking.recall >= 0.99 and ranking.sample_users == check_users(USERS)
    # The ladder was walked: a first rung under the bar, then the one chosen (the fewest lists that pass).
    assert len(ranking.curve) >= 2 and ranking.curve[-1]["nprobe"] == ranking.nprobe
    assert all(step["recall"] < 0.99 for step in ranking.curve[:-1])
    seen = sample_users(histories, USERS)
    vectors = torch.from_numpy(towers.users(seen))
    found, scores = ranker_of(towers.items, K, 128, prior, ranking)(vectors, seen)
    truth, _ = BlockedTopK(items, K, 128, prior)(vectors, seen)
    assert recall(found, truth) >= 0.99
    for user in range(USERS):
        history = set(seen.items[seen.offsets[user] : seen.offsets[user + 1]].tolist())
        assert not set(found[user][found[user] >= 0].tolist()) & history
        real = found[user] >= 0
        # Each returned item carries its exact score, best first.
        expected = vectors[user].numpy() @ items[found[user][real]].T + prior[found[user][real]]
        np.testing.assert_allclose(scores[user][real], expected, rtol=1e-4, atol=1e-4)
        assert (np.diff(scores[user][real]) <= 0).all()
    long_history = int(np.flatnonzero(np.diff(seen.offsets) == ITEMS - 3)[0])
    # Three unseen items: the search deepens to every item of every list, an exact scan.
    assert found[long_history].tolist() == truth[long_history].tolist()
    assert (found[long_history] >= 0).sum() == 3


def test_an_index_that_misses_the_bar_is_not_used_and_auto_stays_exact_on_small_catalogues() -> None:
    rng = np.random.default_rng(4)
    histories = seen_by_user(interactions(rng))
    towers = ContentTowers(clustered(rng, ITEMS, rng.normal(size=(20, DIM))))

    missed = choose_ranking("ivf", towers, None, K, 128, histories, 1.01, False, USERS)  # above any recall
    assert missed.method == "exact" and missed.lists is None
    assert [step["nprobe"] for step in missed.curve] == list(NPROBE_LADDER)
    assert "under 1.01" in missed.reason

    assert choose_ranking("auto", towers, None, K, 128, histories, 0.99, False, USERS).reason == "exact: 3,000 items"
    assert choose_ranking("exact", towers, None, K, 128, histories, 0.99, False, USERS).reason == "exact: asked for"


@pytest.mark.slow
def test_auto_builds_an_index_only_for_enough_users_to_repay_it() -> None:
    """Past IVF_MIN_ITEMS items, a night that ranks few users (an incremental one) scores them
    exactly: the index's build costs as much as scoring INDEX_BUILD_USERS users."""
    rng = np.random.default_rng(6)
    histories = seen_by_user(interactions(rng))
    towers = ContentTowers(clustered(rng, IVF_MIN_ITEMS + 1, rng.normal(size=(20, 8))))

    few = choose_ranking("auto", towers, None, K, 128, histories, 0.99, False, INDEX_BUILD_USERS)
    assert (few.method, few.lists) == ("exact", None) and "too few to repay" in few.reason
    many = choose_ranking("auto", towers, None, K, 128, histories, 0.9, False, INDEX_BUILD_USERS + 1)
    assert many.method == "ivf" and many.lists is not None
    assert choose_ranking("ivf", towers, None, K, 128, histories, 0.99, False, 0).reason == "exact: no user to rank"


def test_candidates_are_searched_deeper_for_a_user_whose_history_crowds_them_out() -> None:
    """A user whose best items are all seen: the first search returns only seen items."""
    rng = np.random.default_rng(5)
    items = clustered(rng, ITEMS, rng.normal(size=(20, DIM)))
    user = items[:1] * 3
    best = np.argsort(-(items @ user[0]))
    history = np.sort(best[:200])
    seen = Seen(np.array([0, 200]), history.astype(np.int64), np.ones(200, np.float32))

    lists = build_lists(items, None)
    found, _ = CandidateTopK(lists, ceilings(lists, items, None), items, K, None, 8)(torch.from_numpy(user), seen)

    assert found[0].tolist() == best[200:210].tolist()


def faiss_ivf(lists: ItemLists, data: np.ndarray) -> faiss.IndexIVFFlat:
    """faiss's own IVF index holding `data` (index_data's rows) in the same lists."""
    quantizer = lists.quantizer()
    index = faiss.IndexIVFFlat(quantizer, data.shape[1], lists.nlist, faiss.METRIC_INNER_PRODUCT)
    index.referenced_objects = [quantizer]  # faiss does not own it
    index.is_trained = True
    assignment = lists.assignment().astype(np.int64)
    index.add_core(len(data), faiss.swig_ptr(data), None, faiss.swig_ptr(assignment))
    return index


@pytest.mark.parametrize("scores", [item_lists.PRODUCT_SCORES, 1], ids=["a list at once", "a user at a time"])
@pytest.mark.parametrize("with_prior", [False, True])
def test_users_are_searched_list_by_list_as_faiss_searches_them_one_by_one(with_prior: bool, scores: int, monkeypatch) -> None:
    """The lists' search gathers each probed list's rows from the item matrix and prior, scores
    its users by matrix products (PRODUCT_SCORES at most each), and finds what faiss's IVF index
    holding those rows finds. Deeper than some lists are long: a list's missing places stay -1,
    never another id."""
    monkeypatch.setattr(item_lists, "PRODUCT_SCORES", scores)
    rng = np.random.default_rng(7)
    items = clustered(rng, ITEMS, rng.normal(size=(20, DIM)))
    prior = rng.uniform(0, 2, ITEMS).astype(np.float32) if with_prior else None
    lists, users = build_lists(items, prior), clustered(rng, 400, rng.normal(size=(20, DIM)))
    if with_prior:
        users = np.hstack([users, np.ones((len(users), 1), np.float32)])
    index = faiss_ivf(lists, index_data(items, prior))
    depth = 2 * int(np.diff(lists.bounds).max())
    ceiling = ceilings(lists, items, prior)
    for nprobe in (1, 3):
        scores, found = search_by_list(lists, lists.quantizer(), items, prior, ceiling, users, depth, nprobe)
        expected_scores, expected = index.search(users, depth, params=faiss.SearchParametersIVF(nprobe=nprobe))
        np.testing.assert_array_equal(found >= 0, expected >= 0)
        np.testing.assert_allclose(scores[found >= 0], expected_scores[expected >= 0], rtol=1e-5, atol=1e-5)
        assert np.mean(found != expected) < 1e-4  # a product rounds otherwise than one user's dot products: near-ties may swap
    assert (found == -1).any()
    assert sorted(lists.order.tolist()) == list(range(ITEMS))  # every item in exactly one list


def test_a_list_that_cannot_serve_a_user_is_skipped_for_that_user_and_the_search_stays_exact(monkeypatch) -> None:
    """A popularity prior ten times the vectors' scale, over Zipf counts (bench scale's ranking):
    every user probes the lists of the popular items, most of which are barely popular. A list
    whose ceiling (its largest item norm x the user's norm, plus its largest prior) cannot beat
    the user's depth-th best so far is skipped for that user: fewer scores are made than with no
    list skipped, and what is found is what faiss's IVF search finds."""
    rng = np.random.default_rng(11)
    items = clustered(rng, ITEMS, rng.normal(size=(20, DIM)))
    items /= np.linalg.norm(items, axis=1, keepdims=True)
    counts = np.bincount(np.minimum(rng.zipf(1.5, 20 * ITEMS), ITEMS) - 1, minlength=ITEMS)
    prior = popularity_prior(rng.permutation(counts), 10.0)
    lists = build_lists(items, prior)
    users = clustered(rng, 400, rng.normal(size=(20, DIM)))
    users = np.hstack([users / np.linalg.norm(users, axis=1, keepdims=True), np.ones((400, 1), np.float32)])
    index = faiss_ivf(lists, index_data(items, prior))
    scored: list[int] = []

    class Counted(faiss.ResultHeap):
        def add_result_subset(self, subset: np.ndarray, scores: np.ndarray, ids: np.ndarray) -> None:
            scored.append(scores.size)
            super().add_result_subset(subset, scores, ids)

    monkeypatch.setattr(faiss, "ResultHeap", Counted)
    depth, nprobe = K + 32, 8
    expected_scores, expected = index.search(users, depth, params=faiss.SearchParametersIVF(nprobe=nprobe))
    made = {}
    for name, ceiling in [("none skipped", np.full((lists.nlist, 2), np.inf, np.float32)), ("ceilings", ceilings(lists, items, prior))]:
        scored.clear()
        scores, found = search_by_list(lists, lists.quantizer(), items, prior, ceiling, users, depth, nprobe)
        np.testing.assert_allclose(scores, expected_scores, rtol=1e-5, atol=1e-5)
        assert np.mean(found != expected) < 1e-3  # near-ties may swap
        made[name] = sum(scored)
    assert made["ceilings"] < 0.75 * made["none skipped"]  # 58% of them with this seed


def test_the_products_keep_every_thread_and_the_heaps_take_one(monkeypatch) -> None:
    """faiss's heaps are updated on one OpenMP thread (on more, its threads spin against torch's
    products), torch's products on every thread. Where faiss's setting reaches torch's OpenMP
    runtime, holding faiss to one thread for the whole search held the products to one too."""
    cores = len(os.sched_getaffinity(0))
    if cores < 2:  # both would run on one thread whatever the code did: nothing to tell apart
        pytest.skip("one core: the products' threads and the heaps' cannot differ")
    # Both libraries' thread counts are process-wide: the worker's later tests get theirs back.
    was = faiss.omp_get_max_threads(), torch.get_num_threads()
    faiss.omp_set_num_threads(cores)
    torch.set_num_threads(cores)
    # torch sets its threads into OpenMP once per thread, at its first call that asks: a night's
    # driver thread has trained and scored before it searches.
    assert torch.get_num_threads() == cores
    products: list[int] = []
    heaps: list[int] = []

    class ProductThreads(torch.overrides.TorchFunctionMode):
        def __torch_function__(
            self, func: Callable[..., object], types: object, args: tuple = (), kwargs: dict | None = None
        ) -> object:
            if func is torch.Tensor.matmul:
                products.append(torch.get_num_threads())
            return func(*args, **(kwargs or {}))

    class HeapThreads(faiss.ResultHeap):
        def add_result_subset(self, subset: np.ndarray, scores: np.ndarray, ids: np.ndarray) -> None:
            heaps.append(faiss.omp_get_max_threads())
            super().add_result_subset(subset, scores, ids)

    monkeypatch.setattr(faiss, "ResultHeap", HeapThreads)
    rng = np.random.default_rng(5)
    items = clustered(rng, ITEMS, rng.normal(size=(20, DIM)))
    lists, users = build_lists(items, None), clustered(rng, 400, rng.normal(size=(20, DIM)))
    try:
        with ProductThreads():
            search_by_list(lists, lists.quantizer(), items, None, ceilings(lists, items, None), users, K, 4)
        after = faiss.omp_get_max_threads()
    finally:
        faiss.omp_set_num_threads(was[0])
        torch.set_num_threads(was[1])
    assert products and set(products) == {cores}
    assert set(heaps) == {1}
    assert after == cores  # given back after the search


def private_growth(make: Callable[..., object], *args: object) -> tuple[object, int]:
    """What `make(*args)` returns, and the bytes of this process's own memory (USS) it added."""
    process = psutil.Process()
    before = process.memory_full_info().uss
    made = make(*args)
    return made, process.memory_full_info().uss - before


def test_the_lists_are_those_faiss_trains_for_an_inner_product_index() -> None:
    """With a prior ten times the vectors' scale, as bench scale ranks: k-means trained otherwise
    (centroids of any norm, or another sample) can strand the few items every user wants in a
    list few users probe. The lists hold each item where faiss's own IVF index puts it."""
    rng = np.random.default_rng(8)
    items = clustered(rng, 20 * ITEMS, rng.normal(size=(20, DIM)))
    prior = 10 * rng.random(len(items)).astype(np.float32)
    lists, data = build_lists(items, prior), index_data(items, prior)
    quantizer = faiss.IndexFlatIP(data.shape[1])
    index = faiss.IndexIVFFlat(quantizer, data.shape[1], lists.nlist, faiss.METRIC_INNER_PRODUCT)
    index.cp.max_points_per_centroid, index.cp.niter = 64, 10
    index.train(data)
    index.add(data)
    faiss_lists = np.empty(len(items), np.int64)
    for number in range(index.nlist):
        size = index.invlists.list_size(number)
        faiss_lists[faiss.rev_swig_ptr(index.invlists.get_ids(number), size)] = number
    np.testing.assert_array_equal(lists.assignment(), faiss_lists)


def test_the_lists_are_built_without_a_copy_of_the_item_matrix() -> None:
    """k-means trains on faiss's own sample and the items are placed a block at a time, so the
    build's arrays never hold the item matrix again with its prior column (516 MB at bench
    scale's 1M items, whose fresh pages took 1.0-1.9 s to write there)."""
    rng = np.random.default_rng(9)
    items = clustered(rng, 300_000, rng.normal(size=(20, 64)))
    prior = rng.random(len(items)).astype(np.float32)
    # Python's allocations (tracemalloc) and the process's own memory (USS: numpy's and faiss's
    # native buffers too, which tracemalloc does not see) both stay under half the item matrix.
    tracemalloc.start()
    try:
        _, grown = private_growth(build_lists, items, prior)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 0.5 * items.nbytes, f"{peak / 1e6:.1f} MB at the peak for {items.nbytes / 1e6:.1f} MB of items"
    assert grown < 0.5 * items.nbytes, f"{grown / 1e6:.1f} MB kept for {items.nbytes / 1e6:.1f} MB of items"


def test_the_lists_ranker_scores_the_item_matrix_where_it_lies() -> None:
    """The lists hold item positions, not vectors: a top-k actor's ranker searches the item matrix
    Ray's object store hands it (read-only, shared by the node's actors) and copies none of it."""
    rng = np.random.default_rng(5)
    items = clustered(rng, 60_000, rng.normal(size=(20, DIM)))
    lists = build_lists(items, None)
    items.setflags(write=False)  # as Ray's object store hands it out
    ranker, grown = private_growth(ranker_of, items, K, 128, None, Ranking("ivf", "", nprobe=8, lists=lists, ceiling=ceilings(lists, items, None)))
    assert grown < 0.1 * items.nbytes, f"{grown / 1e6:.1f} MB private for {items.nbytes / 1e6:.1f} MB of items"
    queries = clustered(rng, 50, rng.normal(size=(20, DIM)))
    expected = faiss_ivf(lists, items).search(queries, K, params=faiss.SearchParametersIVF(nprobe=8))[1]
    seen = Seen(np.zeros(51, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32))
    np.testing.assert_array_equal(ranker(torch.from_numpy(queries), seen)[0], expected)


def test_the_exact_ranker_scores_the_item_matrix_where_it_lies() -> None:
    """Read-only, as Ray's object store hands it to a top-k actor: a copy would be private to each."""
    rng = np.random.default_rng(6)
    items = clustered(rng, 200_000, rng.normal(size=(20, DIM)))
    items.setflags(write=False)
    ranker, grown = private_growth(ranker_of, items, K, 128, None, Ranking("exact", ""))
    assert grown < 0.1 * items.nbytes, f"{grown / 1e6:.1f} MB private for {items.nbytes / 1e6:.1f} MB of items"
    histories = seen_by_user(interactions(rng))
    seen = sample_users(histories, USERS)
    vectors = torch.from_numpy(clustered(rng, len(seen.ids), rng.normal(size=(20, DIM))))
    found, _ = ranker(vectors, seen)
    copied, _ = BlockedTopK(items.copy(), K, 128)(vectors, seen)
    np.testing.assert_array_equal(found, copied)
