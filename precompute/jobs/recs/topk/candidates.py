"""Top-k for large catalogues: candidates from an inverted-file index over the item vectors
(jobs/recs/topk/item_lists.py, inner product), at the fewest probed lists whose top k keeps `min_recall`
of the exact top k on a sample of users.

Exact top-k (jobs/recs/topk/exact.py) scores every user against every item: users x items, which grows as
N² when both grow with the input. The index clusters the items into about √items lists (k-means
on a sample); a user is scored against the lists' centroids, then against the items of its
`nprobe` best lists: about (1 + nprobe)·√items dot products, so ranking grows as users·√items
(N^1.5), and so does the build, which places each item in the list of its best centroid. A
list is scored from the item matrix itself, so a candidate's score is its exact one. The score
u . v + prior is an inner product with one coordinate more (item: its prior, user: 1), so the
index serves every model whose score is two towers' dot product, blends included.

It replaced an inner-product HNSW graph (faiss IndexHNSWFlat, 32 links an item), whose build
dominated the stage: on synthetic items (clustered towers, a content part, a prior) the graph
took an order of magnitude longer to build than the lists, and kept less of the exact top 10 at
efSearch 512 than the lists kept probing 8. Where the collaborative part is nearly isotropic
both fell short of 0.99 at any depth the ladder tries, the lists still at a small fraction of
the graph's build. The search: `precompute bench topk`; the stage at growing sizes, with the
method chosen and the recall curve: `precompute bench scale`.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Literal

import faiss
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from precompute.jobs.recs.history.seen import Seen, users_subset
from precompute.jobs.recs.topk.exact import BlockedTopK
from precompute.jobs.recs.topk.item_lists import ItemLists, build_lists, ceilings, search_by_list
from precompute.jobs.recs.topk.kept_check import CheckLists, carried_check, fresh_check, saved_check
from precompute.jobs.recs.topk.kept_index import KeptIndex
from precompute.jobs.recs.towers import Towers

IVF_MIN_ITEMS = 50_000
"""auto ranks by the index past this many items on CPUs. Below it exact scoring costs little
per user and the index saves less than its recall check costs (`precompute bench scale`)."""
INDEX_BUILD_USERS = 2_000
"""auto scores exactly when at most this many users are ranked and no earlier night's index is
kept: the build costs a fixed time per item, and the recall check it brings the exact scores
of at least MIN_CHECK_USERS users; exact scoring costs a fixed time per user-item, so a build
repays itself past a number of users that does not depend on the catalogue, near this one
(`precompute bench topk` reports the build, `precompute bench recs` exact scoring's speed).
With a kept index (jobs/recs/topk/kept_index.py) only the recall check's exact scores must be
repaid (check_users)."""
NPROBE_LADDER = (8, 16, 32, 64, 128, 256)
"""Lists probed, tried in turn on the sample; the first that keeps min_recall serves."""
CHECK_USERS = 500
"""Most users (a seeded sample) whose top k from the index is compared with their exact top k.
A fixed ceiling keeps the check's exact scores linear in the items once the users pass 10,000:
a larger sample's exact scores were a sizeable share of the stage at a million items, and grew
it as users x items (`precompute bench scale`; its 100,000 rows check 500)."""
CHECK_SHARE, MIN_CHECK_USERS = 0.05, 250
"""The check's sample is CHECK_SHARE of the users ranked, within MIN_CHECK_USERS-CHECK_USERS, so
that its exact scores cost a twentieth of ranking every user exactly: a fixed 1,000 users made
much of an incremental night's top-k (`precompute bench scale`, its 1% rerun). 250 users' top
10 measure a recall near 0.99 to about ±0.004, 500 users' to ±0.003 (two standard errors,
misses independent)."""
SEARCH_BYTES = 256 << 20
"""Query vectors the index ranks per call (149,500 users of 449 dims): a list's matrix multiply
grows with the users who probe it (search_by_list)."""
DEPTH_MARGIN = 32
"""Candidates asked for beyond k: a user's own seen items come back among them and are dropped."""


@dataclass(frozen=True)
class Ranking:
    """How the top-k actors rank, and what the sample measured."""

    method: Literal["exact", "ivf"]
    reason: str
    nprobe: int = 0
    recall: float | None = None
    """Mean share of the sample users' exact top k that the served ranking keeps."""
    curve: list[dict[str, float]] = field(default_factory=list)
    """Each nprobe tried: its recall and its search time per sample user (ms)."""
    sample_users: int = 0
    build_s: float = 0.0
    """Seconds to build the index, or to fill a kept one with tonight's vectors."""
    kept_from: str | None = None
    """The version whose run built the index, when it was kept (jobs/recs/topk/kept_index.py)."""
    moved: int = 0
    """A kept index's items moved since its build, placed again in tonight's best list."""
    carried: int = 0
    """Sample users whose exact best items were carried from the kept check (jobs/recs/topk/kept_check.py),
    not scored against every item."""
    lists: ItemLists | None = field(default=None, repr=False)
    """The lists the users are ranked from (no vectors: a top-k actor's come with its towers)."""
    ceiling: np.ndarray | None = field(default=None, repr=False)
    """The lists' ceilings over tonight's vectors (item_lists.ceilings): computed once for the
    recall check's ladder and every ranker, not by each (a pass over every item's vector a time)."""
    check: CheckLists | None = field(default=None, repr=False)
    """The sample the lists were checked on, kept for the next night with them."""

    def users_per_call(self, users_per_block: int, dims: int) -> int:
        """Users a ranker takes per call: exact, `users_per_block` (its score buffer's rows); the
        index, as many as SEARCH_BYTES of query vectors hold, so that each list meets many users
        at once (search_by_list)."""
        return users_per_block if self.method == "exact" else max(users_per_block, SEARCH_BYTES // (4 * dims))

    def report(self) -> dict[str, object]:
        return {
            "method": self.method,
            "reason": self.reason,
            "nprobe": self.nprobe,
            "recall": self.recall,
            "curve": self.curve,
            "sample_users": self.sample_users,
            "build_s": self.build_s,
            "kept_from": self.kept_from,
            "moved": self.moved,
            "carried": self.carried,
        }


class CandidateTopK:
    """Top-k of user . item + prior, the user's seen items excluded, from the items of the
    `nprobe` lists whose centroids score best for the user. A user whose candidates run short of
    k unseen items (a long history) is searched again 4x deeper in 4x as many lists, up to every
    item of every list: an exact scan. `ceiling`: the lists' ceilings over `item_vectors` and
    `prior` (item_lists.ceilings). `prior`: searched as the items' last coordinate (index_data),
    which a user's query meets with a 1."""

    def __init__(
        self,
        lists: ItemLists,
        ceiling: np.ndarray,
        item_vectors: np.ndarray,
        k: int,
        prior: np.ndarray | None,
        nprobe: int,
    ) -> None:
        faiss.omp_set_num_threads(len(os.sched_getaffinity(0)))  # Ray sets OMP_NUM_THREADS=1
        self.lists, self.quantizer, self.nprobe = lists, lists.quantizer(), nprobe
        self.item_vectors, self.prior, self.items = item_vectors, prior, len(item_vectors)
        self.ceiling = ceiling
        self.with_prior = prior is not None
        self.k = min(k, self.items)

    def __call__(self, user_vectors: torch.Tensor, seen: Seen) -> tuple[np.ndarray, np.ndarray]:
        """(indices, scores) as BlockedTopK gives them."""
        users = np.ascontiguousarray(user_vectors.numpy(), np.float32)
        if self.with_prior:
            users = np.hstack([users, np.ones((len(users), 1), np.float32)])
        indices = np.full((len(users), self.k), -1, np.int64)
        scores = np.full((len(users), self.k), -np.inf, np.float32)
        todo, depth, nprobe = np.arange(len(users)), min(self.items, self.k + DEPTH_MARGIN), self.nprobe
        while len(todo):
            exhaustive = depth == self.items  # every list's every item: the unseen ones are all there are
            probes = self.lists.nlist if exhaustive else min(self.lists.nlist, nprobe)
            found, found_scores, short = self._search(users[todo], users_subset(seen, todo), depth, probes)
            short &= not exhaustive
            indices[todo[~short]], scores[todo[~short]] = found[~short], found_scores[~short]
            todo = todo[short]
            depth, nprobe = min(self.items, 4 * depth), 4 * nprobe
        return indices, scores

    def _search(
        self, users: np.ndarray, seen: Seen, depth: int, nprobe: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The top k of the `depth` best items of the `nprobe` lists, seen ones dropped: (indices,
        scores, short), short where fewer than k of them are unseen."""
        found_scores, found = search_by_list(
            self.lists, self.quantizer, self.item_vectors, self.prior, self.ceiling, users, depth, nprobe
        )
        # (user, item) keys looked up in a hash set of the users' seen ones (Arrow's is_in), then
        # each user's unseen items ranked in the order found, best first (`place`, by one running
        # count over every row), cheaper than numpy's isin, which sorts every key, and an argsort
        # of the scores; the same items and scores.
        rows = np.repeat(np.arange(len(users)), np.diff(seen.offsets))
        seen_keys = pa.array(rows * self.items + seen.items)
        keys = pa.array((np.arange(len(users))[:, None] * self.items + found).ravel())
        seen_found = pc.is_in(keys, value_set=seen_keys).to_numpy(zero_copy_only=False).reshape(found.shape)
        unseen = (found >= 0) & ~seen_found
        counted = np.cumsum(unseen.ravel()).reshape(found.shape)
        place = counted - np.concatenate([[0], counted[:-1, -1]])[:, None] - 1
        short = place[:, -1] + 1 < self.k
        taken = unseen & (place < self.k)
        top = np.full((len(users), self.k), -1, np.int64)
        top_scores = np.full((len(users), self.k), -np.inf, np.float32)
        at = np.nonzero(taken)[0], place[taken]
        top[at], top_scores[at] = found[taken], found_scores[taken]
        return top, top_scores, short


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


def checked_sample(
    kept: KeptIndex | None, towers: Towers, prior: np.ndarray | None, histories: Seen, users: int, k: int, block: int
) -> tuple[Seen, CheckLists, int]:
    """The recall check's users, their exact best items, and how many of them were carried: the
    kept lists' check carried to tonight (jobs/recs/topk/kept_check.py) while MIN_CHECK_USERS of its users
    are left (all of them, in a smaller user base), else a fresh sample of check_users(users),
    every item scored."""
    moved = np.empty(0, np.int64) if kept is None else kept.moved
    if kept is not None and (saved := saved_check(kept.state)) is not None:
        carried = carried_check(saved, towers, prior, histories, k, block, moved)
        if carried is not None and len(carried[1].users) >= min(MIN_CHECK_USERS, len(histories.offsets) - 1):
            return carried
    sample = sample_users(histories, check_users(users))
    return sample, fresh_check(towers, prior, sample, k, block, moved), 0


def choose_ranking(
    method: Literal["auto", "exact", "ivf"],
    towers: Towers,
    prior: np.ndarray | None,
    k: int,
    block: int,
    histories: Seen,
    min_recall: float,
    gpus: bool,
    users: int,
    kept: KeptIndex | None = None,
) -> Ranking:
    """How `users` users are ranked (in the top-k actors or the driver): exact, or by the index
    (`kept`, else built tonight) at the first nprobe of NPROBE_LADDER whose top k keeps
    min_recall of the exact top k on check_users(users) users sampled from `histories` (every
    user's; exact if none does)."""
    items = len(towers.items)
    if not users:
        return Ranking("exact", "exact: no user to rank")
    if method == "auto" and gpus:
        return Ranking("exact", "exact: a GPU scores")
    if method == "auto" and items <= IVF_MIN_ITEMS:
        return Ranking("exact", f"exact: {items:,} items")
    if method == "auto" and kept is None and users <= INDEX_BUILD_USERS:
        return Ranking("exact", f"exact: {users:,} users to rank, too few to repay an index's build")
    if method == "auto" and 2 * check_users(users) > users:
        return Ranking("exact", f"exact: {users:,} users to rank, too few to repay the index's recall check")
    if method == "exact":
        return Ranking("exact", "exact: asked for")
    start = time.perf_counter()
    lists = build_lists(towers.items, prior) if kept is None else kept.over(towers.items, prior)
    build_s = round(time.perf_counter() - start, 2)
    ceiling = ceilings(lists, towers.items, prior)
    built = "" if kept is None else f", the index kept from {kept.version} ({len(kept.moved):,} moved since)"
    sample, check, carried = checked_sample(kept, towers, prior, histories, users, k, block)
    vectors, truth = torch.from_numpy(check.vectors), check.truth(k)
    curve = []
    for nprobe in NPROBE_LADDER:
        start = time.perf_counter()
        found, _ = CandidateTopK(lists, ceiling, towers.items, k, prior, nprobe)(vectors, sample)
        per_user_ms = 1e3 * (time.perf_counter() - start) / max(len(truth), 1)
        curve.append({"nprobe": nprobe, "recall": round(recall(found, truth), 4), "ms_per_user": round(per_user_ms, 3)})
        if curve[-1]["recall"] >= min_recall:
            return Ranking(
                "ivf",
                f"ivf: {items:,} items in {lists.nlist:,} lists{built}; {nprobe} probed keep "
                f"{curve[-1]['recall']:.4f} of the exact top {k}",
                nprobe,
                curve[-1]["recall"],
                curve,
                len(truth),
                build_s,
                None if kept is None else kept.version,
                0 if kept is None else len(kept.moved),
                carried,
                lists,
                ceiling,
                check,
            )
    return Ranking(
        "exact",
        f"exact: the index kept {curve[-1]['recall']:.4f} of the exact top {k} at most, under {min_recall}",
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
    assert ranking.lists is not None and ranking.ceiling is not None  # choose_ranking keeps what it chose
    return CandidateTopK(ranking.lists, ranking.ceiling, item_vectors, k, prior, ranking.nprobe)
