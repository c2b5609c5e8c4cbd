"""The top-k's recall check carried from night to night with the kept lists: its sample users'
exact best items, updated with the items that moved instead of scored against every item again.

A night that ranks from the items' lists measures them first: a sample of users' top k from the
lists against their exact top k (jobs/recs/topk/candidates.py choose_ranking). Exact means every item
scored: a few hundred users against a large catalogue are a large share of an incremental
night's top-k (`precompute bench scale`, its 1% rerun). Under the model fingerprint that kept the lists (jobs/recs/topk/kept_index.py), an item's score
for a user moves only with the item's vector (its content key) or its prior, and with the user's
vector and history. So the check keeps (CHECK_FILE, beside the lists) each sample user's vector,
their history's fingerprint, and their DEPTH best unseen items with the scores they had, under the
prior they had; the next night scores only the items that moved since against the users that did
not, and scores every item again only for a user who moved, or whose kept items no longer hold
their k best (more of them moved below the rest than DEPTH - k).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from precompute.jobs.recs.history.seen import Seen, users_subset
from precompute.jobs.recs.history.user_histories import fingerprints
from precompute.jobs.recs.state import CHECK_FILE
from precompute.jobs.recs.topk.exact import BlockedTopK
from precompute.jobs.recs.towers import Towers, rows_of
from precompute.jobs.work_dir import WorkPath

MARGIN = 2
"""A user's kept items are DEPTH = MARGIN x k: room for k of them to move below the rest."""
MOVED_SHARE = 0.05
"""Past this share of the items moved since the check was kept, every sample user is scored again
(a prior rescaled by a new most popular item moves them all)."""


@dataclass(frozen=True)
class CheckLists:
    """The check's sample users and what is known of their exact best unseen items."""

    users: np.ndarray
    """Their ids (str)."""
    vectors: np.ndarray
    """[users, dims] float32: their vectors (the user tower's; the prior's 1 is the ranker's)."""
    histories: np.ndarray
    """[users] their histories' fingerprints (jobs/recs/history/user_histories.py)."""
    items: np.ndarray
    """[users, DEPTH] item positions, best first; -1 past the unseen items there are."""
    scores: np.ndarray
    """[users, DEPTH] float32, -inf where items is -1."""
    bound: np.ndarray
    """[users] float32: no item outside a row scores above it (-inf: the row holds every unseen item)."""
    prior: np.ndarray
    """[items] float32: the prior the scores include (empty: none)."""
    moved: np.ndarray
    """Positions of the items whose content key differed from the lists' build that night."""

    def truth(self, k: int) -> np.ndarray:
        return self.items[:, :k]

    def save(self, state: WorkPath) -> None:
        with (state / CHECK_FILE).writer() as out:
            np.savez(out, **{name: getattr(self, name) for name in self.__dataclass_fields__})


def saved_check(state: WorkPath) -> CheckLists | None:
    """The check a night kept in its recs `state`, if it kept one."""
    if not (state / CHECK_FILE).is_file():
        return None
    with state.fs.open_input_file((state / CHECK_FILE).path) as file, np.load(file) as arrays:
        return CheckLists(**{name: arrays[name] for name in CheckLists.__dataclass_fields__})


def exact_lists(
    towers: Towers, prior: np.ndarray | None, seen: Seen, vectors: np.ndarray, depth: int, block: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(items, scores, bound) of the users in `seen` (their `vectors`): every item scored."""
    items, scores = BlockedTopK(towers.items, depth, block, prior)(torch.from_numpy(vectors), seen)
    bound = scores[:, -1] if scores.shape[1] == depth else np.full(len(scores), -np.inf, np.float32)
    return items, scores, np.where(items[:, -1] < 0, -np.inf, bound).astype(np.float32)


def fresh_check(
    towers: Towers, prior: np.ndarray | None, sample: Seen, k: int, block: int, moved: np.ndarray
) -> CheckLists:
    """The check of `sample` (with ids), every item scored."""
    vectors = towers.users(sample)
    items, scores, bound = exact_lists(towers, prior, sample, vectors, MARGIN * k, block)
    ids = np.asarray([] if sample.ids is None else sample.ids, str)
    none = np.empty(0, np.float32)
    return CheckLists(ids, vectors, fingerprints(sample), items, scores, bound, none if prior is None else prior, moved)


def carried_check(
    kept: CheckLists, towers: Towers, prior: np.ndarray | None, histories: Seen, k: int, block: int, moved: np.ndarray
) -> tuple[Seen, CheckLists, int] | None:
    """Tonight's check of `kept`'s users still among `histories` (every user's, by id): their
    sample and lists, the items `moved` since the lists' build and those whose prior moved
    scored again. None where it cannot stand for a sample (too few users left, another depth or
    prior, too many items moved): choose_ranking then draws one afresh. The last of the three:
    how many users' lists were carried rather than scored against every item again."""
    depth = kept.items.shape[1]
    if histories.ids is None or depth != MARGIN * k or (prior is None) != (len(kept.prior) == 0):
        return None
    found, at = rows_of(histories.ids, kept.users)
    sample = users_subset(histories, at[found])
    changed = np.union1d(moved, kept.moved)
    if prior is not None:
        if len(prior) != len(kept.prior):
            return None
        changed = np.union1d(changed, np.flatnonzero(prior != kept.prior))
    if len(changed) > MOVED_SHARE * len(towers.items):
        return None
    vectors = towers.users(sample)
    if vectors.shape[1] != kept.vectors.shape[1]:
        return None
    histories_now = fingerprints(sample)
    still = (vectors == kept.vectors[found]).all(axis=1) & (histories_now == kept.histories[found])
    items, scores, bound = kept.items[found].copy(), kept.scores[found].copy(), kept.bound[found].copy()
    known = still & updated(items, scores, bound, vectors, towers.items, prior, changed, sample, k)
    again = np.flatnonzero(~known)
    if len(again):
        redo = users_subset(sample, again)
        items[again], scores[again], bound[again] = exact_lists(towers, prior, redo, vectors[again], depth, block)
    lists = CheckLists(
        sample.ids, vectors, histories_now, items, scores, bound, kept.prior if prior is None else prior, moved
    )
    return sample, lists, len(items) - len(again)


def updated(
    items: np.ndarray,
    scores: np.ndarray,
    bound: np.ndarray,
    vectors: np.ndarray,
    item_vectors: np.ndarray,
    prior: np.ndarray | None,
    changed: np.ndarray,
    seen: Seen,
    k: int,
) -> np.ndarray:
    """Each user's kept lists (`items`, `scores`, in place) with the `changed` items scored again:
    an item outside a list scored at most its `bound` and, unchanged, still does. Whether each
    list still holds its user's k best."""
    rescored = vectors @ item_vectors[changed].T
    if prior is not None:
        rescored += prior[changed]
    moved = np.zeros(len(item_vectors), bool)
    moved[changed] = True
    known, depth = np.zeros(len(items), bool), items.shape[1]
    for user, row in enumerate(rescored):
        fresh = np.flatnonzero(row >= bound[user])
        fresh = fresh[~np.isin(changed[fresh], seen.items[seen.offsets[user] : seen.offsets[user + 1]])]
        stays = (items[user] >= 0) & ~moved[items[user]]
        merged_items = np.concatenate([items[user][stays], changed[fresh]])
        merged_scores = np.concatenate([scores[user][stays], row[fresh]])
        order = np.argsort(-merged_scores, kind="stable")
        if len(order) > depth:  # what falls off the end scores at most the last one kept
            bound[user] = max(bound[user], merged_scores[order[depth - 1]])
            order = order[:depth]
        items[user], scores[user] = -1, -np.inf
        items[user, : len(order)], scores[user, : len(order)] = merged_items[order], merged_scores[order]
        known[user] = len(order) >= k or bound[user] == -np.inf
    return known
