"""Top-k for large catalogues: candidates from an HNSW graph over the item vectors (faiss,
inner product), rescored exactly, at the smallest search depth that keeps `min_recall` of the
exact top k on a sample of users.

Exact top-k (jobs/topk.py) scores every user against every item: users x items, which grows as
N² when both grow with the input. Here a user costs one graph search (a few thousand dot
products, about log N hops) and the exact score of its candidates; building the graph costs
each item once. The score u . v + prior is an inner product with one coordinate more (item:
its prior, user: 1), so the graph serves every model whose score is two towers' dot product,
blends included. faiss's inner-product graph, not the L2 graph of the usual MIPS-to-NN
transform (Bachrach et al., 2014): on 100,000 synthetic items of 449 dims (clustered towers,
a content part and a prior; by hand) the transform's graph found 0.60-0.87 of the exact top 10
at efSearch 64-512, the inner-product graph 0.991-0.9997. What the job measured at scale:
README, "Scale".
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Literal

import faiss
import numpy as np
import torch

from precompute.jobs.kept_graph import KeptGraph
from precompute.jobs.recs_models import Seen, Towers, users_subset
from precompute.jobs.topk import BlockedTopK

HNSW_MIN_ITEMS = 50_000
"""auto ranks by the graph past this many items on CPUs. Exact scoring costs users x items x dim;
the graph costs about 80 µs an item to build and 0.1-0.4 ms a user to search (100,000 items of
449 dims, 2 vCPUs, where exact scoring took 0.84 ms a user)."""
GRAPH_BUILD_USERS = 10_000
"""auto scores exactly when at most this many users are ranked, whatever the catalogue: building
the graph costs about as much as scoring 9,500 users exactly (80 µs an item against 8.4 ns a
user-item, figures above), and both grow with the items. An incremental night that rescores 1%
of 1M users scores them exactly rather than build a graph for them, unless it keeps the graph of
an earlier night (jobs/kept_graph.py); then only the recall check's exact scores must be
repaid (check_users)."""
GRAPH_NEIGHBOURS = 32
"""HNSW's M: links per item in the graph."""
EF_LADDER = (64, 128, 256, 512, 1024)
"""efSearch values tried in turn on the sample; the first that keeps min_recall serves."""
CHECK_USERS = 1000
"""Most users (a seeded sample) whose graph top k is compared with their exact top k."""
CHECK_SHARE, MIN_CHECK_USERS = 0.05, 250
"""The check's sample is CHECK_SHARE of the users ranked, within MIN_CHECK_USERS-CHECK_USERS, so
that its exact scores cost a twentieth of ranking every user exactly: 1,000 users made half of
bench scale's 1M rerun's top-k (5,060 users, the graph kept). 250 users' top 10 measure a recall
near 0.99 to about ±0.004 (two standard errors, misses independent)."""
DEPTH_MARGIN = 32
"""Candidates asked for beyond k: a user's own seen items come back among them and are dropped."""
HEAD_ITEMS = 256
"""The items of largest norm (with the prior: the most popular), scored exactly for every user
beside the graph's candidates. An inner-product graph under-links them: every item's nearest
by inner product are the same few large ones, and HNSW's pruning keeps links to only some of
them. At 100,000 generated items (ALS + content + a dominant prior) the 9th most popular item
was never reached at efSearch 64-1,024, and the graph's top 10 plateaued at 0.90 of the exact."""


@dataclass(frozen=True)
class Ranking:
    """How the top-k actors rank, and what the sample measured."""

    method: Literal["exact", "hnsw"]
    reason: str
    ef: int = 0
    recall: float | None = None
    """Mean share of the sample users' exact top k that the served ranking keeps."""
    curve: list[dict[str, float]] = field(default_factory=list)
    """Each efSearch tried: its recall and its search time per sample user (ms)."""
    sample_users: int = 0
    build_s: float = 0.0
    """Seconds to build the graph, or to give a kept one tonight's vectors."""
    kept_from: str | None = None
    """The version whose run built the graph, when it was kept (jobs/kept_graph.py)."""
    index: np.ndarray | None = field(default=None, repr=False)
    """The graph, serialized (faiss.serialize_index): what the actors search."""
    moved: np.ndarray | None = field(default=None, repr=False)
    """A kept graph's items moved since its build, scored exactly for every user."""

    def report(self) -> dict[str, object]:
        return {
            "method": self.method,
            "reason": self.reason,
            "ef": self.ef,
            "recall": self.recall,
            "curve": self.curve,
            "sample_users": self.sample_users,
            "build_s": self.build_s,
            "kept_from": self.kept_from,
            "moved": 0 if self.moved is None else len(self.moved),
        }


class CandidateTopK:
    """Top-k of user . item + prior, the user's seen items excluded, from the graph's candidates
    and the items scored exactly for every user (the HEAD_ITEMS head, and those `moved` since a
    kept graph was built: jobs/kept_graph.py), rescored exactly. A user whose candidates run
    short of k unseen items (a long history) is searched again 4x deeper, and past the whole
    catalogue scored exactly."""

    def __init__(
        self,
        index: faiss.Index,
        item_vectors: np.ndarray,
        k: int,
        block: int,
        prior: np.ndarray | None,
        ef: int,
        moved: np.ndarray | None = None,
    ) -> None:
        faiss.omp_set_num_threads(len(os.sched_getaffinity(0)))  # Ray sets OMP_NUM_THREADS=1
        self.index, self.ef, self.block = index, ef, block
        self.items = np.asarray(item_vectors, np.float32)
        self.prior = prior
        self.k = min(k, len(self.items))
        norms = np.einsum("ij,ij->i", self.items, self.items) + (0 if prior is None else prior**2)  # no [items, dim] temporary
        head = np.argsort(-norms, kind="stable")[:HEAD_ITEMS]
        self.exact = np.union1d(head, np.zeros(0, np.int64) if moved is None else moved)
        self.column = np.full(len(self.items), -1, np.int64)
        self.column[self.exact] = np.arange(len(self.exact))
        self.exact_items = self.items[self.exact].T  # gathered once, not per block of users
        self.exact_prior = None if prior is None else prior[self.exact]

    def __call__(self, user_vectors: torch.Tensor, seen: Seen) -> tuple[np.ndarray, np.ndarray]:
        """(indices, scores) as BlockedTopK gives them."""
        users = user_vectors.numpy()
        indices = np.full((len(users), self.k), -1, np.int64)
        scores = np.full((len(users), self.k), -np.inf, np.float32)
        todo, depth = np.arange(len(users)), min(len(self.items), self.k + DEPTH_MARGIN)
        while len(todo):
            found, found_scores, short = self._search(users[todo], users_subset(seen, todo), depth)
            done = todo[~short]
            indices[done], scores[done] = found[~short], found_scores[~short]
            todo = todo[short]
            if depth == len(self.items):
                break
            depth = min(len(self.items), 4 * depth)
        if len(todo):  # the graph did not yield k unseen items even at the catalogue's size
            exact = BlockedTopK(self.items, self.k, self.block, self.prior)  # rare: built when needed
            indices[todo], scores[todo] = exact(torch.from_numpy(users[todo]), users_subset(seen, todo))
        return indices, scores

    def _search(self, users: np.ndarray, seen: Seen, depth: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The graph's `depth` candidates rescored, merged with the top k of the items scored
        exactly, seen ones dropped: (indices, scores, short), short where fewer than k of the
        graph's candidates are unseen (its search did not reach past the user's own items)."""
        query = users if self.prior is None else np.hstack([users, np.ones((len(users), 1), np.float32)])
        params = faiss.SearchParametersHNSW(efSearch=max(self.ef, depth))
        _, found = self.index.search(query, depth, params=params)
        rows = np.repeat(np.arange(len(users)), np.diff(seen.offsets))
        seen_keys = rows * len(self.items) + seen.items
        keys = np.arange(len(users))[:, None] * len(self.items) + found
        drop = (found < 0) | np.isin(keys, seen_keys)
        short = (~drop).sum(axis=1) < self.k  # the graph's own, the exactly scored aside
        safe = np.maximum(found, 0)
        drop |= self.column[safe] >= 0  # scored once, with the exactly scored items
        graph_scores = np.matmul(self.items[safe], users[:, :, None])[:, :, 0]
        exact_scores = users @ self.exact_items
        if self.prior is not None:
            graph_scores += self.prior[safe]
            exact_scores += self.exact_prior
        graph_scores[drop] = -np.inf
        columns = self.column[seen.items]
        inside = columns >= 0
        exact_scores[rows[inside], columns[inside]] = -np.inf
        best = np.argpartition(-exact_scores, min(self.k, len(self.exact)) - 1, axis=1)[:, : self.k]
        candidates = np.hstack([found, self.exact[best]])
        candidate_scores = np.hstack([graph_scores, np.take_along_axis(exact_scores, best, 1)])
        order = np.argsort(-candidate_scores, axis=1, kind="stable")[:, : self.k]
        top = np.take_along_axis(candidates, order, 1)
        top_scores = np.take_along_axis(candidate_scores, order, 1)
        top[np.isneginf(top_scores)] = -1
        return top, top_scores, short


def graph_data(item_vectors: np.ndarray, prior: np.ndarray | None) -> np.ndarray:
    """What the graph indexes: the items, the prior as one more coordinate."""
    data = np.asarray(item_vectors, np.float32)
    if prior is not None:
        data = np.hstack([data, prior[:, None].astype(np.float32)])
    return np.ascontiguousarray(data)


def build_graph(item_vectors: np.ndarray, prior: np.ndarray | None) -> faiss.Index:
    """An inner-product HNSW graph over the items, the prior as one more coordinate."""
    data = graph_data(item_vectors, prior)
    faiss.omp_set_num_threads(len(os.sched_getaffinity(0)))
    index = faiss.IndexHNSWFlat(data.shape[1], GRAPH_NEIGHBOURS, faiss.METRIC_INNER_PRODUCT)
    index.add(data)
    return index


def check_users(users: int) -> int:
    """The recall check's sample for a night that ranks `users` users (CHECK_SHARE)."""
    return int(min(CHECK_USERS, max(MIN_CHECK_USERS, CHECK_SHARE * users)))


def sample_users(histories: Seen, users: int, seed: int = 0) -> Seen:
    """A seeded sample of `users` of `histories` (every user's, as the job grouped them)."""
    count = len(histories.offsets) - 1
    rng = np.random.default_rng(seed)
    return users_subset(histories, np.sort(rng.choice(count, min(users, count), replace=False)))


def recall(found: np.ndarray, exact: np.ndarray) -> float:
    """Mean over users of the share of their exact top k (its real items) that `found` holds."""
    shares = [
        len(set(row[row >= 0]) & set(truth[truth >= 0])) / (truth >= 0).sum()
        for row, truth in zip(found, exact, strict=True)
        if (truth >= 0).any()
    ]
    return float(np.mean(shares)) if shares else 1.0


def choose_ranking(
    method: Literal["auto", "exact", "hnsw"],
    towers: Towers,
    prior: np.ndarray | None,
    k: int,
    block: int,
    histories: Seen,
    min_recall: float,
    gpus: bool,
    users: int,
    kept: KeptGraph | None = None,
) -> Ranking:
    """How `users` users are ranked (in the top-k actors or the driver): exact, or by the graph
    (`kept`, else built tonight) at the first efSearch of EF_LADDER whose top k keeps min_recall
    of the exact top k on check_users(users) users sampled from `histories` (every user's; exact
    if none does)."""
    items = len(towers.items)
    if not users:
        return Ranking("exact", "exact: no user to rank")
    if method == "auto" and gpus:
        return Ranking("exact", "exact: a GPU scores")
    if method == "auto" and items <= HNSW_MIN_ITEMS:
        return Ranking("exact", f"exact: {items:,} items")
    if method == "auto" and kept is None and users <= GRAPH_BUILD_USERS:
        return Ranking("exact", f"exact: {users:,} users to rank, too few to repay a graph's build")
    if method == "auto" and 2 * check_users(users) > users:
        return Ranking("exact", f"exact: {users:,} users to rank, too few to repay the graph's recall check")
    if method == "exact":
        return Ranking("exact", "exact: asked for")
    start = time.perf_counter()
    index = build_graph(towers.items, prior) if kept is None else kept.over(graph_data(towers.items, prior))
    build_s = round(time.perf_counter() - start, 2)
    moved = None if kept is None else kept.moved
    graph = "" if kept is None else f", the graph kept from {kept.version} ({len(kept.moved):,} moved since)"
    sample = sample_users(histories, check_users(users))
    vectors = torch.from_numpy(towers.users(sample))
    truth, _ = BlockedTopK(towers.items, k, block, prior)(vectors, sample)
    curve = []
    for ef in EF_LADDER:
        start = time.perf_counter()
        found, _ = CandidateTopK(index, towers.items, k, block, prior, ef, moved)(vectors, sample)
        per_user_ms = 1e3 * (time.perf_counter() - start) / max(len(truth), 1)
        curve.append({"ef": ef, "recall": round(recall(found, truth), 4), "ms_per_user": round(per_user_ms, 3)})
        if curve[-1]["recall"] >= min_recall:
            return Ranking(
                "hnsw",
                f"hnsw: {items:,} items{graph}; efSearch {ef} keeps {curve[-1]['recall']:.4f} "
                f"of the exact top {k}",
                ef,
                curve[-1]["recall"],
                curve,
                len(truth),
                build_s,
                None if kept is None else kept.version,
                faiss.serialize_index(index),
                moved,
            )
    return Ranking(
        "exact",
        f"exact: the graph kept {curve[-1]['recall']:.4f} of the exact top {k} at most, under {min_recall}",
        recall=1.0,
        curve=curve,
        sample_users=len(truth),
        build_s=build_s,
    )


def ranker_of(
    item_vectors: np.ndarray, k: int, block: int, prior: np.ndarray | None, ranking: Ranking
) -> BlockedTopK | CandidateTopK:
    """The ranker an actor holds for `ranking`."""
    if ranking.method == "exact":
        return BlockedTopK(item_vectors, k, block, prior)
    assert ranking.index is not None  # choose_ranking serializes the graph it chose
    index = read_in_place(ranking.index)
    return CandidateTopK(index, item_vectors, k, block, prior, ranking.ef, ranking.moved)


def read_in_place(serialized: np.ndarray) -> faiss.Index:
    """The graph read where its serialized bytes lie (faiss's ZeroCopyIOReader), not copied. In
    a top-k actor they lie in Ray's object store, so a node's actors share one graph and its copy
    of the item vectors: for 200,000 items of 449 dims, 414 MB private per actor deserialized, 3
    MB in place. The index points into `serialized`, so it holds a reference to it."""
    index = faiss.read_index(faiss.ZeroCopyIOReader(faiss.swig_ptr(serialized), serialized.nbytes))
    index.referenced_objects = [serialized]
    return index
