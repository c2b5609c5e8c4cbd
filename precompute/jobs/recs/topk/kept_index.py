"""The items' index kept from the night that built it: what lets an incremental night rank its
few users from the index instead of scoring each of them against every item.

Building the index costs a fixed time per item (jobs/recs/topk/candidates.py INDEX_BUILD_USERS), much
of it placing each item in the list of its best centroid. Under the same model fingerprint
(jobs/recs/state.py: vocabulary, trained item tower, weights) only the items whose content key
changed have moved, so the run folder keeps the lists' centroids, each item's list and the
content keys it was built over (20 bytes an item; the vectors are tonight's). A later night under
the same fingerprint searches those lists over tonight's item matrix and prior, each moved item
placed in the list of its best centroid tonight, and measures recall as for a new index. Past
MOVED_SHARE moved items the index is built again.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from precompute.jobs.nights import Previous, copy_files
from precompute.jobs.recs.state import INDEX_FILE, STATE
from precompute.jobs.recs.topk.item_lists import ItemLists, place, quantizer_of
from precompute.jobs.recs.topk.kept_check import CheckLists
from precompute.jobs.text.content_cache import differ
from precompute.jobs.work_dir import WorkPath

MOVED_SHARE = 0.05
"""Items moved since the build, as a share of the catalogue, past which the index is built again:
the centroids were trained on the items as they were."""


@dataclass(frozen=True)
class KeptIndex:
    version: str
    """The published version whose run kept the index."""
    state: WorkPath
    """That run's recs state folder, which holds it."""
    moved: np.ndarray
    """Positions of the items whose content key changed since the index was built."""

    def over(self, item_vectors: np.ndarray, prior: np.ndarray | None) -> ItemLists:
        """The kept lists, each moved item placed again in the list of tonight's best centroid
        for it (its vector and prior tonight): the vectors stay in the item matrix."""
        centroids, lists = saved(self.state, "centroids", "lists")
        if len(self.moved):
            lists[self.moved] = place(quantizer_of(centroids), item_vectors, prior, self.moved)
        return ItemLists.of(centroids, lists)


def saved(state: WorkPath, *names: str) -> list[np.ndarray]:
    """The index file's arrays `names`."""
    with state.fs.open_input_file((state / INDEX_FILE).path) as file, np.load(file) as arrays:
        return [arrays[name] for name in names]


def kept_index(previous: Previous | None, keys: np.ndarray, dims: int) -> KeptIndex | None:
    """The index the published version's run kept, when it has one over `dims` columns and at
    most MOVED_SHARE of `keys` (tonight's content keys, in the vocabulary's order) moved since
    it was built. `previous`: the published version whose model tonight's is (recs_state.plan),
    also on a night that rescores every user because a copy would not hold them; None when the
    model changed, whose item vectors the index was not built over."""
    if previous is None or not ((state := previous.run_dir / STATE) / INDEX_FILE).is_file():
        return None
    built, centroids = saved(state, "keys", "centroids")
    if len(built) != len(keys) or centroids.shape[1] != dims:
        return None
    moved = np.flatnonzero(differ(built, keys))
    if len(moved) > MOVED_SHARE * len(keys):
        return None
    return KeptIndex(previous.version, state, moved)


def keep_index(
    state: WorkPath, lists: ItemLists, keys: np.ndarray, kept: KeptIndex | None, check: CheckLists | None
) -> None:
    """The lists tonight's ranking used, left in tonight's state for the next night with the
    `check` they passed: the kept ones' file copied as it is (its build's keys and lists with
    it), or new lists' centroids, each item's list and `keys`."""
    if check is not None:
        check.save(state)
    if kept is not None:
        copy_files(kept.state, state, [INDEX_FILE])
        return
    with (state / INDEX_FILE).writer() as out:
        np.savez(out, centroids=lists.centroids, lists=lists.assignment(), keys=keys)
