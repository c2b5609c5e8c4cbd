"""`precompute bench topk`: the recommendations' index search (jobs/recs/topk/item_lists.py) against faiss's
own IVF search, on synthetic clustered items.

Items: unit vectors around 200 random centres (128 dims) and the job's popularity prior over
Zipf counts (one more coordinate; at the job's default weight unless --prior-weight); users:
noisy copies of random items, a tenth as many, as bench scale has. One set of lists
(build_lists: √items lists, faiss's k-means) serves four searches of every user's best k + 32
in 8 probed lists, taking turns in each repeat:
- faiss's IndexIVFFlat over the same lists (its vectors added), searched user by user: what a
  user of faiss would run;
- list by list with faiss.knn: a list's users scored against its rows at once (faiss's matrix
  products from 16 users), each user's best of the list merged into a faiss.ResultHeap;
- search_by_list with no list skipped: torch's products fed straight into the users' heaps;
- search_by_list as the job runs it: the same, skipping a list for a user its ceiling cannot
  serve (ceilings).
Medians of the repeats, their ratios, and how much of each user's result the four share.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import faiss
import numpy as np

from precompute.bench.records import Figure, write_record
from precompute.bench.scale.data import zipf_items
from precompute.jobs.recs.spec import RecsSpec
from precompute.jobs.recs.topk.exact import popularity_prior
from precompute.jobs.recs.topk.item_lists import (
    ItemLists,
    build_lists,
    ceilings,
    index_data,
    probers,
    search_by_list,
)
from precompute.models.hardware import device_fingerprint

CENTRES, DIMS, K, NPROBE = 200, 128, 10, 8
def synthetic(items: int, users: int, prior_weight: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(item vectors, prior, user queries with the prior's coordinate of 1)."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((CENTRES, DIMS)).astype(np.float32)
    vectors = centres[rng.integers(0, CENTRES, items)] + 0.5 * rng.standard_normal((items, DIMS), np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    counts = np.bincount(zipf_items(5 * users, items, rng), minlength=items)
    prior = popularity_prior(counts, prior_weight)
    queries = vectors[rng.integers(0, items, users)] + 0.3 * rng.standard_normal((users, DIMS), np.float32)
    return vectors, prior, np.hstack([queries, np.ones((users, 1), np.float32)])


def knn_by_list(
    lists: ItemLists, quantizer: faiss.IndexFlatIP, vectors: np.ndarray, prior: np.ndarray, queries: np.ndarray, depth: int
) -> np.ndarray:
    """Each user's `depth` best items in its NPROBE best lists, list by list with faiss.knn."""
    faiss.cvar.distance_compute_blas_threshold = 16 * queries.shape[1]  # faiss's own switch: 128,000 users x dims
    probing_users, bounds = probers(quantizer, queries, lists.nlist, NPROBE)
    heap = faiss.ResultHeap(len(queries), depth, keep_max=True)
    for number in np.flatnonzero(np.diff(bounds) * np.diff(lists.bounds)):
        probing = probing_users[bounds[number] : bounds[number + 1]]
        rows = lists.order[lists.bounds[number] : lists.bounds[number + 1]]
        data = index_data(vectors, prior, rows)
        scores, found = faiss.knn(queries[probing], data, min(depth, len(rows)), faiss.METRIC_INNER_PRODUCT)
        heap.add_result_subset(probing, scores, rows[found])
    heap.finalize()
    return heap.I


def shared(found: np.ndarray, reference: np.ndarray) -> float:
    """Mean share of each user's reference items that `found` holds too."""
    return float(np.mean([len(set(a) & set(b)) / len(b) for a, b in zip(found, reference, strict=True)]))


def main(items: int = 1_000_000, repeats: int = 3, prior_weight: float | None = None) -> dict[str, Any]:
    """prior_weight: the popularity prior's (None: the job's default; bench scale ranks by 10)."""
    faiss.omp_set_num_threads(len(os.sched_getaffinity(0)))
    users, depth = max(1, items // 10), K + 32
    prior_weight = RecsSpec().popularity_weight if prior_weight is None else prior_weight
    vectors, prior, queries = synthetic(items, users, prior_weight)
    start = time.perf_counter()
    lists = build_lists(vectors, prior)
    build_s = time.perf_counter() - start
    quantizer = lists.quantizer()
    ivf = faiss.IndexIVFFlat(quantizer, queries.shape[1], lists.nlist, faiss.METRIC_INNER_PRODUCT)
    ivf.add(index_data(vectors, prior))  # placed by the same centroids: the same lists
    ivf.nprobe = NPROBE
    ceiling, unbounded = ceilings(lists, vectors, prior), np.full((lists.nlist, 2), np.inf, np.float32)

    searches: dict[str, Callable[[], np.ndarray]] = {
        "faiss IndexIVFFlat.search": lambda: ivf.search(queries, depth)[1],
        "list by list, faiss.knn": lambda: knn_by_list(lists, quantizer, vectors, prior, queries, depth),
        "search_by_list, no list skipped": lambda: search_by_list(lists, quantizer, vectors, prior, unbounded, queries, depth, NPROBE)[1],
        "search_by_list (ours)": lambda: search_by_list(lists, quantizer, vectors, prior, ceiling, queries, depth, NPROBE)[1],
    }
    times: dict[str, list[float]] = {name: [] for name in searches}
    found: dict[str, np.ndarray] = {}
    for _ in range(repeats):
        for name, search in searches.items():
            start = time.perf_counter()
            found[name] = search()
            times[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(seconds) for name, seconds in times.items()}
    reference, *_, ours = searches
    result = {
        "bench": "topk",
        "machine": device_fingerprint("cpu"),
        "cpus": len(os.sched_getaffinity(0)),
        "faiss": faiss.__version__,
        "items": items,
        "users": users,
        "prior_weight": prior_weight,
        "lists": lists.nlist,
        "build_s": round(build_s, 2),
        "median_s": {name: round(value, 3) for name, value in medians.items()},
        "runs_s": {name: [round(value, 3) for value in seconds] for name, seconds in times.items()},
        "speedup_of_ours": {name: round(value / medians[ours], 2) for name, value in medians.items()},
        "share_of_faiss_results": {name: round(shared(ids, found[reference]), 4) for name, ids in found.items()},
    }
    print(f"{result['machine']}, {result['cpus']} CPUs, faiss {result['faiss']}")
    print(
        f"{items:,} items in {lists.nlist:,} lists (built in {build_s:.2f} s), prior weight {prior_weight}; "
        f"{users:,} users, best {depth} of {NPROBE} lists"
    )
    for name in searches:
        print(
            f"  {name}: median {medians[name]:.3f} s of {repeats}; ours is {result['speedup_of_ours'][name]}x as fast; "
            f"shares {result['share_of_faiss_results'][name]:.4f} of faiss's results"
        )
    print(json.dumps(result))
    write_record(
        "topk",
        result,
        dataset=f"synthetic: {items:,} clustered items ({DIMS} dims), {users:,} users",
        ours=Figure(f"{ours}: each user's best {depth} in {NPROBE} probed lists", result["median_s"][ours], "s"),
        baseline=Figure(f"{reference}, same lists", result["median_s"][reference], "s"),
        ratio=result["speedup_of_ours"][reference],
        higher_is_better=False,
    )
    return result
