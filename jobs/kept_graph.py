"""The items' HNSW graph kept from the night that built it: what lets an incremental night rank
its few users by the graph instead of scoring each of them against every item.

Building the graph costs about 80 µs an item (101 s at 1M items), so a night that rescores 1%
of the users would score them exactly (jobs/candidate_topk.py GRAPH_BUILD_USERS): 25 s at 1M
items, a fifth of the full night's top-k (README, "Scale"). A graph's links depend on the
vectors it was built over. Under the same model fingerprint (jobs/recs_state.py: vocabulary,
trained item tower, weights) only the items whose content key changed have moved, so the run
folder keeps the graph's links without its vectors (faiss IO_FLAG_SKIP_STORAGE: about 270 MB at
1M items against 2 GB with them) and the content keys it was built over. A later night under
the same fingerprint searches those links over tonight's vectors and prior, scores the items
moved since the build exactly for every user beside the candidates (a moved item may sit where
its old links do not lead), and measures recall as for a new graph. Past MOVED_SHARE moved
items the graph is built again.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import faiss
import numpy as np

from precompute.jobs.nights import Previous, copy_files
from precompute.jobs.recs_state import GRAPH_FILE, STATE
from precompute.jobs.work_dir import WorkPath

MOVED_SHARE = 0.05
"""Items moved since the build, as a share of the catalogue, past which the graph is built
again: each moved item is scored for every user, and its stale links serve others less well."""


@dataclass(frozen=True)
class KeptGraph:
    version: str
    """The published version whose run kept the graph."""
    state: WorkPath
    """That run's recs state folder, which holds it."""
    moved: np.ndarray
    """Positions of the items whose content key changed since the graph was built."""

    def over(self, data: np.ndarray) -> faiss.Index:
        """The graph searching `data` (tonight's items, with the prior as a column) as its vectors."""
        (links,) = saved(self.state, "links")
        reader = faiss.ZeroCopyIOReader(faiss.swig_ptr(links), links.nbytes)
        index = faiss.read_index(reader, faiss.IO_FLAG_SKIP_STORAGE)
        storage = faiss.IndexFlatIP(data.shape[1])
        storage.add(np.ascontiguousarray(data, np.float32))
        index.storage, index.own_fields = storage, False
        index.referenced_objects = [storage, links]
        return index


def saved(state: WorkPath, *names: str) -> list[np.ndarray]:
    """The graph file's arrays `names`, read alone: the keys without the links' 270 MB (at 1M items)."""
    with state.fs.open_input_file((state / GRAPH_FILE).path) as file, np.load(file) as arrays:
        return [arrays[name] for name in names]


def kept_graph(previous: Previous | None, keys: list[bytes], dims: int) -> KeptGraph | None:
    """The graph the published version's run kept, when it has one over `dims` columns and at
    most MOVED_SHARE of `keys` (tonight's content keys, in the vocabulary's order) moved since
    it was built. `previous`: the published version whose model tonight's is (recs_state.plan),
    also on a night that rescores every user because a copy would not hold them; None when the
    model changed, whose item vectors the graph was not built over."""
    if previous is None or not ((state := previous.run_dir / STATE) / GRAPH_FILE).is_file():
        return None
    built, built_dims = saved(state, "keys", "dims")
    if len(built) != len(keys) or int(built_dims) != dims:
        return None
    moved = np.flatnonzero(built != np.array(keys, dtype="S16"))
    if len(moved) > MOVED_SHARE * len(keys):
        return None
    return KeptGraph(previous.version, state, moved)


def keep_graph(state: WorkPath, index: faiss.Index, keys: list[bytes], kept: KeptGraph | None) -> None:
    """The graph tonight's ranking used, left in tonight's state for the next night: the kept
    one's file copied as it is (its build's keys with it), or a new graph's links and `keys`."""
    if kept is not None:
        copy_files(kept.state, state, [GRAPH_FILE])
        return
    writer = faiss.VectorIOWriter()
    faiss.write_index(index, writer, faiss.IO_FLAG_SKIP_STORAGE)
    buffer = io.BytesIO()
    np.savez(buffer, links=faiss.vector_to_array(writer.data), keys=np.array(keys, dtype="S16"), dims=index.d)
    (state / GRAPH_FILE).write_bytes(buffer.getbuffer())
