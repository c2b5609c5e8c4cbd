"""The items' inverted lists, apart from the item vectors: which list each item is in, and the
search that ranks users list by list by gathering a probed list's rows from the item matrix,
skipping a list for a user whose best so far its ceiling cannot beat.

faiss's IVF index holds each list's vectors itself, a second copy of the item matrix (516 MB at
1M items of 129 dims), and a night that keeps the lists refilled that copy with tonight's
vectors (adding them, after appending the prior column): much of an incremental night's top-k
(`precompute bench scale`, its 1% rerun). Here the lists are only item positions, list by list (a
CSR: `order` and `bounds`); a search copies a probed list's rows into a buffer as it scores them
(little against the scoring itself). faiss still trains the centroids (k-means),
places the items (the quantizer's inner products) and keeps each user's best items (its heaps);
torch scores a list's users (one matrix product).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import faiss
import numpy as np
import torch

POINTS_PER_LIST, TRAIN_ITERATIONS = 64, 10
"""k-means of the lists' centroids: on a sample of this many items a list, this many rounds
(faiss's defaults, 256 items a list and 25 rounds, are ten times the work; `precompute bench
topk` reports the build)."""
PLACE_ROWS = 65_536
"""Items placed in their lists per quantizer call: their rows with the prior are copied into one
buffer first (34 MB at 129 dims), where a copy of every item's was 516 MB at 1M items, each of
its fresh pages faulted in as it was written."""
PRODUCT_SCORES = 1 << 22
"""Most scores one matrix product makes (16 MB): a list probed by many users (a deep nprobe) is
scored a block of its users at a time."""


def index_data(
    item_vectors: np.ndarray, prior: np.ndarray | None, rows: np.ndarray | slice = slice(None),
    out: np.ndarray | None = None,
) -> np.ndarray:
    """What the lists are searched over for the items at `rows`: their vectors, the prior as one
    more coordinate (a user's query meets it with a 1). Into `out` where given (a search's buffer)."""
    picked = item_vectors[rows] if isinstance(rows, slice) else None
    count = len(picked) if picked is not None else len(rows)
    dims = item_vectors.shape[1] + (prior is not None)
    data = np.empty((count, dims), np.float32) if out is None else out[:count]
    if picked is not None:
        data[:, : item_vectors.shape[1]] = picked
    else:
        np.take(item_vectors, rows, axis=0, out=data[:, : item_vectors.shape[1]])
    if prior is not None:
        data[:, -1] = prior[rows]
    return data


@dataclass(frozen=True)
class ItemLists:
    """Centroids, and each list's item positions: list l holds order[bounds[l]:bounds[l + 1]]."""

    centroids: np.ndarray
    """[lists, dims] float32, in index_data's columns."""
    order: np.ndarray
    """Item positions, list by list (int64)."""
    bounds: np.ndarray
    """[lists + 1]: where each list starts in `order`."""

    @classmethod
    def of(cls, centroids: np.ndarray, assignment: np.ndarray) -> ItemLists:
        """The lists from each item's list number (`assignment`, in item order)."""
        small = assignment.astype(np.uint16) if len(centroids) < 1 << 16 else assignment
        order = np.argsort(small, kind="stable")  # 16-bit: numpy's stable sort is a radix sort, faster than int32's
        bounds = np.searchsorted(small[order], np.arange(len(centroids) + 1))
        return cls(np.ascontiguousarray(centroids, np.float32), order.astype(np.int64), bounds)

    @property
    def nlist(self) -> int:
        return len(self.centroids)

    def assignment(self) -> np.ndarray:
        """Each item's list number, in item order (what the lists are kept as)."""
        lists = np.empty(len(self.order), np.int32)
        lists[self.order] = np.repeat(np.arange(self.nlist, dtype=np.int32), np.diff(self.bounds))
        return lists

    def quantizer(self) -> faiss.IndexFlatIP:
        return quantizer_of(self.centroids)


def quantizer_of(centroids: np.ndarray) -> faiss.IndexFlatIP:
    """The centroids as an inner-product index: what places items and probes users."""
    quantizer = faiss.IndexFlatIP(centroids.shape[1])
    quantizer.add(np.ascontiguousarray(centroids, np.float32))
    return quantizer


def place(
    quantizer: faiss.IndexFlatIP, item_vectors: np.ndarray, prior: np.ndarray | None, rows: np.ndarray | None = None
) -> np.ndarray:
    """The list of the best centroid for each item at `rows` (every item where None), PLACE_ROWS
    at a time through one buffer: no copy of the item matrix with its prior column."""
    count = len(item_vectors) if rows is None else len(rows)
    lists = np.empty(count, np.int32)
    buffer = np.empty((min(count, PLACE_ROWS), quantizer.d), np.float32)
    for start in range(0, count, PLACE_ROWS):
        picked = slice(start, min(start + PLACE_ROWS, count)) if rows is None else rows[start : start + PLACE_ROWS]
        block = index_data(item_vectors, prior, picked, buffer)
        lists[start : start + len(block)] = quantizer.assign(block, 1)[:, 0]
    return lists


def training_rows(items: int, sample: int, seed: int) -> np.ndarray | slice:
    """The rows faiss's k-means trains on when given `items` rows for `sample` points: the first
    `sample` of faiss.rand_perm(items, seed), in that order (its Clustering's subsample), or every
    row. Passing faiss these rows alone trains the very centroids it trains from every row."""
    if items <= sample:
        return slice(None)
    order = np.empty(items, np.int32)
    faiss.rand_perm(faiss.swig_ptr(order), items, seed)
    return order[:sample]


def build_lists(item_vectors: np.ndarray, prior: np.ndarray | None) -> ItemLists:
    """About √items lists, trained as faiss trains an inner-product IVF index (k-means with unit
    centroids on POINTS_PER_LIST items a list, faiss's own sample and seed), every item placed in
    the list of its best centroid: the lists faiss's IndexIVFFlat holds, without its copy of the
    vectors. The same training matters: on bench scale's 1M items, whose most popular ones have
    ALS vectors of norm 55-87 and every user's top 10 among them, k-means on a sample of our own
    put three of them in a list most users ranked 265th, and 8 to 256 probed lists kept 0.77 of
    the exact top 10, where faiss's lists kept 0.991 at 8."""
    faiss.omp_set_num_threads(len(os.sched_getaffinity(0)))  # Ray sets OMP_NUM_THREADS=1
    items, dims = len(item_vectors), item_vectors.shape[1] + (prior is not None)
    nlist = max(1, round(math.sqrt(items)))
    index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dims), dims, nlist, faiss.METRIC_INNER_PRODUCT)
    index.cp.max_points_per_centroid, index.cp.niter = POINTS_PER_LIST, TRAIN_ITERATIONS
    # trains the quantizer alone (nothing is added to the lists) on faiss's own sample
    index.train(index_data(item_vectors, prior, training_rows(items, nlist * POINTS_PER_LIST, index.cp.seed)))
    return ItemLists.of(index.quantizer.reconstruct_n(0, nlist), place(index.quantizer, item_vectors, prior))


def ceilings(lists: ItemLists, item_vectors: np.ndarray, prior: np.ndarray | None) -> np.ndarray:
    """[lists, 2]: each list's largest item norm and largest prior (0 without one). No item of
    list l scores above |u| · norm_l + prior_l for a user u (Cauchy-Schwarz): what lets the
    search skip a list for a user whose heap already holds `depth` better scores. Tonight's
    vectors (a kept index's lists hold last night's positions only): one pass over the items."""
    out = np.zeros((lists.nlist, 2), np.float32)
    filled = np.flatnonzero(np.diff(lists.bounds))
    if not len(filled):
        return out
    norms = np.sqrt(np.einsum("ij,ij->i", item_vectors, item_vectors))
    out[filled, 0] = np.maximum.reduceat(norms[lists.order], lists.bounds[filled])
    if prior is not None:
        out[filled, 1] = np.maximum.reduceat(prior[lists.order], lists.bounds[filled])
    return out


def probers(quantizer: faiss.IndexFlatIP, users: np.ndarray, lists: int, nprobe: int) -> tuple[np.ndarray, np.ndarray]:
    """The users who probe each list, by their `nprobe` best centroids: list l's are
    users[bounds[l]:bounds[l + 1]] (positions in `users`, ascending)."""
    _, probes = quantizer.search(users, min(nprobe, lists))
    order = np.argsort(probes, axis=None, kind="stable")
    bounds = np.searchsorted(probes.ravel()[order], np.arange(lists + 1))
    return order // probes.shape[1], bounds


def search_by_list(
    lists: ItemLists,
    quantizer: faiss.IndexFlatIP,
    item_vectors: np.ndarray,
    prior: np.ndarray | None,
    ceiling: np.ndarray,
    users: np.ndarray,
    depth: int,
    nprobe: int,
) -> tuple[np.ndarray, np.ndarray]:
    """(scores, item positions) of each user's `depth` best items in its `nprobe` best lists,
    best first (-1 past the items there are), as an IVF index's search gives them, found list by
    list: the users who probe a list are scored against its rows in one matrix product, and every
    score goes straight into the user's heap of its best so far (faiss.ResultHeap), which keeps
    only those that beat its worst. faiss's IVF search scans each probed list once per user, and
    faiss.knn, which takes a list's users at once, keeps a heap of its own per user and list: most
    of its time (keeping one best instead takes a fraction of it). Faster than list by list by
    faiss.knn, with the same items, on synthetic items (`precompute bench topk`) as on bench
    scale's item tower (ALS + content + prior). It pays in large calls (Ranking.users_per_call).
    `users`: with
    a prior, their vectors with a last coordinate of 1 (index_data's columns).

    A list is skipped for a user whose `depth`-th best so far beats the list's `ceiling`
    (ceilings(): nothing in it can enter the heap), and the lists go highest ceiling first for
    the call's mean user, so that heaps fill early with the scores that skip the rest. Exact: the
    same items. Where a popularity prior dominates, every user probes the lists of the popular
    items, most of which are barely popular: skipping lists makes the search several times
    faster at the prior weight bench scale ranks by (10), and still faster at the default
    (0.4). With no prior it skips little and costs little (`precompute bench topk`, and its
    --prior-weight)."""
    probing_users, bounds = probers(quantizer, users, lists.nlist, nprobe)
    heap = faiss.ResultHeap(len(users), depth, keep_max=True)
    sizes = np.diff(lists.bounds)
    buffer = np.empty((int(sizes.max(initial=0)), users.shape[1]), np.float32)
    towers = users[:, : item_vectors.shape[1]]  # without the prior's 1
    norms = np.sqrt(np.einsum("ij,ij->i", towers, towers))
    # float32 products may round a score past its exact ceiling: a margin far above their error
    # (where |u| x norm is near 0, a skipped item could differ from the best so far by a rounding).
    reach = ceiling[:, 0] * (1 + 1e-4)
    visits = np.argsort(-((float(norms.mean()) if len(norms) else 0.0) * reach + ceiling[:, 1]), kind="stable")
    threads = faiss.omp_get_max_threads()
    try:
        for number in visits[(np.diff(bounds) * sizes)[visits] > 0]:
            probing = probing_users[bounds[number] : bounds[number + 1]]
            probing = probing[norms[probing] * reach[number] + ceiling[number, 1] >= heap.D[probing, 0]]
            if not len(probing):
                continue
            rows = lists.order[lists.bounds[number] : lists.bounds[number + 1]]
            data = torch.from_numpy(index_data(item_vectors, prior, rows, buffer))
            block = max(1, PRODUCT_SCORES // len(rows))
            for start in range(0, len(probing), block):
                subset = probing[start : start + block]
                # torch's product on every thread, the heaps' updates on one. faiss's threads on the
                # heaps, spinning between products, made the search much slower. Held to one for
                # the whole search, they held torch's products to one thread too, where faiss's
                # setting reaches torch's OpenMP runtime, which slowed it again: hence the setting
                # around each product (`precompute bench topk`).
                faiss.omp_set_num_threads(threads)
                scores = (torch.from_numpy(users[subset]) @ data.T).numpy()
                faiss.omp_set_num_threads(1)
                heap.add_result_subset(subset, scores, rows)
    finally:
        faiss.omp_set_num_threads(threads)
    heap.finalize()
    return heap.D, heap.I
