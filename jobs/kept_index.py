"""The items' index kept from the night that built it: what lets an incremental night rank its
few users from the index instead of scoring each of them against every item.

Building the index costs about 5 µs an item (jobs/candidate_topk.py INDEX_BUILD_USERS), most of
it placing each item in the list of its best centroid. Under the same model fingerprint
(jobs/recs_state.py: vocabulary, trained item tower, weights) only the items whose content key
changed have moved, so the run folder keeps the lists' centroids, each item's list and the
content keys it was built over (20 bytes an item; the vectors are tonight's). A later night under
the same fingerprint fills those lists with tonight's vectors and prior, each moved item placed
in the list of its best centroid tonight, and measures recall as for a new index. Past
MOVED_SHARE moved items the index is built again.
"""

from __future__ import annotations

from dataclasses import dataclass

import faiss
import numpy as np

from precompute.jobs.nights import Previous, copy_files
from precompute.jobs.recs_state import INDEX_FILE, STATE
from precompute.jobs.work_dir import WorkPath

FILL_ROWS = 65_536
"""Items copied into the lists per call: one [items, dims + 1] matrix of 1M blended items and their
prior first took 1.0 s of bench scale's 1M rerun's top-k and the fill 0.7 s (AMD EPYC); by blocks
the fill took 0.47 s against 1.59 s (by hand, 1M items of 129 dims, Xeon)."""
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

    def over(self, item_vectors: np.ndarray, prior: np.ndarray | None) -> faiss.IndexIVFFlat:
        """The kept lists holding tonight's items and prior (index_data's rows), FILL_ROWS at a
        time: the lists copy them in, so no [items, dims + 1] matrix is made first."""
        centroids, lists = saved(self.state, "centroids", "lists")
        dims = centroids.shape[1]
        quantizer = faiss.IndexFlatIP(dims)
        quantizer.add(centroids)
        index = faiss.IndexIVFFlat(quantizer, dims, len(centroids), faiss.METRIC_INNER_PRODUCT)
        index.is_trained = True
        lists = lists.astype(np.int64)
        if len(self.moved):
            lists[self.moved] = quantizer.assign(index_data(item_vectors, prior, self.moved), 1)[:, 0]
        for start in range(0, len(item_vectors), FILL_ROWS):
            rows = slice(start, start + FILL_ROWS)
            block = index_data(item_vectors, prior, rows)
            index.add_core(len(block), faiss.swig_ptr(block), None, faiss.swig_ptr(lists[rows]))
        return index


def index_data(
    item_vectors: np.ndarray, prior: np.ndarray | None, rows: np.ndarray | slice = slice(None)
) -> np.ndarray:
    """What the index holds of the items at `rows`: their vectors, the prior as one more coordinate."""
    data = np.asarray(item_vectors[rows], np.float32)
    if prior is not None:
        data = np.hstack([data, prior[rows][:, None].astype(np.float32)])
    return np.ascontiguousarray(data)


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
    moved = np.flatnonzero(built != keys)
    if len(moved) > MOVED_SHARE * len(keys):
        return None
    return KeptIndex(previous.version, state, moved)


def item_lists(index: faiss.IndexIVF) -> np.ndarray:
    """Each item's list in `index`."""
    lists = np.empty(index.ntotal, np.int32)
    for number in range(index.nlist):
        size = index.invlists.list_size(number)
        lists[faiss.rev_swig_ptr(index.invlists.get_ids(number), size)] = number
    return lists


def keep_index(state: WorkPath, index: faiss.IndexIVF, keys: np.ndarray, kept: KeptIndex | None) -> None:
    """The index tonight's ranking used, left in tonight's state for the next night: the kept
    one's file copied as it is (its build's keys and lists with it), or a new index's centroids,
    lists and `keys`."""
    if kept is not None:
        copy_files(kept.state, state, [INDEX_FILE])
        return
    centroids = index.quantizer.reconstruct_n(0, index.nlist)
    with (state / INDEX_FILE).writer() as out:
        np.savez(out, centroids=centroids, lists=item_lists(index), keys=keys)
