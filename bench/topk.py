"""`precompute bench topk`: the recommendations' index search (jobs/item_lists.py) against faiss's
own IVF search, on synthetic clustered items.

Items: unit vectors around 200 random centres (128 dims) and a popularity prior, as the job
searches them (one more coordinate); users: noisy copies of random items, a tenth as many, as
bench scale has. One set of lists (build_lists: √items lists, faiss's k-means) serves three
searches of every user's best k + 32 in 8 probed lists, taking turns in each repeat:
- faiss's IndexIVFFlat over the same lists (its vectors added), searched user by user: what a
  user of faiss would run;
- search_by_list with faiss's own switch to matrix products (distance_compute_blas_threshold,
  128,000 users x dims);
- search_by_list as the job runs it (score_lists_by_products: from PRODUCT_USERS users).
Medians of the repeats, their ratios, and how much of each user's result the three share.
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

from precompute.jobs.item_lists import (
    PRODUCT_USERS,
    build_lists,
    index_data,
    score_lists_by_products,
    search_by_list,
)
from precompute.models.hardware import device_fingerprint

CENTRES, DIMS, K, NPROBE = 200, 128, 10, 8
FAISS_DEFAULT = 128_000
"""faiss's distance_compute_blas_threshold since 1.15 (users x dims)."""


def synthetic(items: int, users: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(item vectors, prior, user queries with the prior's coordinate of 1)."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((CENTRES, DIMS)).astype(np.float32)
    vectors = centres[rng.integers(0, CENTRES, items)] + 0.5 * rng.standard_normal((items, DIMS), np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    prior = (0.1 * rng.random(items)).astype(np.float32)
    queries = vectors[rng.integers(0, items, users)] + 0.3 * rng.standard_normal((users, DIMS), np.float32)
    return vectors, prior, np.hstack([queries, np.ones((users, 1), np.float32)])


def shared(found: np.ndarray, reference: np.ndarray) -> float:
    """Mean share of each user's reference items that `found` holds too."""
    return float(np.mean([len(set(a) & set(b)) / len(b) for a, b in zip(found, reference, strict=True)]))


def main(items: int = 1_000_000, repeats: int = 3) -> dict[str, Any]:
    faiss.omp_set_num_threads(len(os.sched_getaffinity(0)))
    users, depth = max(1, items // 10), K + 32
    vectors, prior, queries = synthetic(items, users)
    start = time.perf_counter()
    lists = build_lists(vectors, prior)
    build_s = time.perf_counter() - start
    quantizer = lists.quantizer()
    ivf = faiss.IndexIVFFlat(quantizer, queries.shape[1], lists.nlist, faiss.METRIC_INNER_PRODUCT)
    ivf.add(index_data(vectors, prior))  # placed by the same centroids: the same lists
    ivf.nprobe = NPROBE

    def by_list(threshold: Callable[[], None]) -> Callable[[], np.ndarray]:
        def run() -> np.ndarray:
            threshold()
            return search_by_list(lists, quantizer, vectors, prior, queries, depth, NPROBE)[1]

        return run

    def faiss_default() -> None:
        faiss.cvar.distance_compute_blas_threshold = FAISS_DEFAULT

    searches: dict[str, Callable[[], np.ndarray]] = {
        "faiss IndexIVFFlat.search": lambda: ivf.search(queries, depth)[1],
        "search_by_list, faiss's switch": by_list(faiss_default),
        f"search_by_list, products from {PRODUCT_USERS} users (ours)": by_list(lambda: score_lists_by_products(queries.shape[1])),
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
        "lists": lists.nlist,
        "build_s": round(build_s, 2),
        "median_s": {name: round(value, 3) for name, value in medians.items()},
        "runs_s": {name: [round(value, 3) for value in seconds] for name, seconds in times.items()},
        "speedup_of_ours": {name: round(value / medians[ours], 2) for name, value in medians.items()},
        "share_of_faiss_results": {name: round(shared(ids, found[reference]), 4) for name, ids in found.items()},
    }
    print(f"{result['machine']}, {result['cpus']} CPUs, faiss {result['faiss']}")
    print(f"{items:,} items in {lists.nlist:,} lists (built in {build_s:.2f} s); {users:,} users, best {depth} of {NPROBE} lists")
    for name in searches:
        print(
            f"  {name}: median {medians[name]:.3f} s of {repeats}; ours is {result['speedup_of_ours'][name]}x as fast; "
            f"shares {result['share_of_faiss_results'][name]:.4f} of faiss's results"
        )
    print(json.dumps(result))
    return result
