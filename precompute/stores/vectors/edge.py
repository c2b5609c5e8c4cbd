"""Versions as qdrant-edge shards on local disk, published by an atomic pointer file.

Layout: `<path>/<name>/<version>/` is one edge shard per version, `<version>/.finalized`
marks a finished one, and `<path>/<name>/CURRENT` holds the published version's name.

What qdrant-edge-py 0.9.0 does (its only documentation is `qdrant_edge/__init__.pyi`; each
point below was tried against it, and `precompute bench vectors` measures the store):
- `EdgeShard.create(path, EdgeConfig)` makes a shard, `EdgeShard.load(path)` opens one (no
  config: keep what is on disk), `update(UpdateOperation.upsert_points([...]))` writes,
  `query(QueryRequest(..., filter=Filter(must=[FieldCondition(key, MatchValue(v))])))` reads,
  `optimize()` runs the optimizers in the caller's thread until none is left, `flush()` and
  `close()` finish. Nothing is optimized in the background: HNSW building is deferred
  during the load by construction, and `finalize` is exactly `optimize()`.
- `optimize()` builds HNSW only for segments above `indexing_threshold` (KB; about 10 MB
  by default, so 5,000 x 384 stayed unindexed): we set it to 1 KB so every finalized version
  has its graph. The engine still scans exactly below `full_scan_threshold`
  (VectorStoreSettings.full_scan_threshold_kb).
- Processes: with the WAL on (the default) a second process's `load` fails with "failed
  to open WAL ... WouldBlock"; with `wal_enabled=False` (fixed at create) any number of
  processes open the same shard and query it, and nothing guards concurrent writes. Loading
  rewrites a few small files (edge_config.json, segment.json) by atomic rename with the same
  content: processes loading, querying and closing one shard over and over saw no error and
  changed no file's bytes. Hence: WAL off; a shard is filled, optimized and flushed before it is
  published, then never written: its writer's handle stays open as this process's reader.
- A shard closed while another thread queries it fails that query ("Shard is not
  initialized"); `search` then retries once on the handle that replaced it.
- `MatchValue(True)` is sent as the integer 1 and matches nothing boolean; `np.bool_(True)`
  matches. Filters pass bools as `np.bool_`.
- Loading a shard takes milliseconds, so the first query after a switch pays that.
- Scalar INT8 quantization (`EdgeConfig.quantization_config`) is built by `optimize()` beside
  the FP32 vectors, and a query without `QuantizationSearchParams(rescore=True)` returns the
  quantized scores (a vector's score against itself above 1) in the quantized order; rescoring
  with oversampling gives exact cosines. Search always asks for it, which a shard without
  quantization ignores, so a reader needs no setting to read either kind.

Readers find the published version by re-reading CURRENT (one small file) at most every
`pointer_check_s`, comparing its content rather than its stat, so a reused inode cannot hide
a switch; a changed pointer opens the new shard, then closes the old one.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import qdrant_edge as qe

from precompute.stores.errors import StoreError, StoreUnavailableError, VersionNotFoundError
from precompute.stores.vectors.edge_files import copy_shard
from precompute.stores.vectors.edge_requests import (
    FIELD_SCHEMAS,
    edge_filter,
    edge_params,
    edge_quantization,
    to_hit,
)
from precompute.stores.vectors.settings import Quantization, VectorStoreSettings
from precompute.stores.vectors.store import (
    SEARCH_KEY,
    UPSERT_BATCH,
    Filter,
    GraphParams,
    Hit,
    SearchParams,
    VectorStore,
    check_k,
    check_name,
    check_points,
    note_field_types,
    point_id,
    with_id,
)
from precompute.stores.versions import check_version

POINTER = "CURRENT"
FINALIZED = ".finalized"
META = ".meta.json"
INDEXING_THRESHOLD_KB = 1


@dataclass
class Writing:
    """A version being written: its shard, its payload fields' types (note_field_types), those
    given an index, and the points written since its last graph build."""

    shard: qe.EdgeShard
    fields: dict[str, type | None] = field(default_factory=dict)
    indexed: set[str] = field(default_factory=set)
    unindexed: int = 0


class QdrantEdgeStore(VectorStore):
    """Writer and reader in one class: a process uses whichever half it needs."""

    def __init__(self, settings: VectorStoreSettings, name: str, pointer_check_s: float = 0.5) -> None:
        self.root = settings.path / check_name(name)
        self.where = f"qdrant edge: {name}"
        self.pointer_check_s = pointer_check_s  # how stale a reader's view may be; 0 re-reads it every search
        self.full_scan_threshold_kb = settings.full_scan_threshold_kb
        self.graph_points = settings.graph_points
        self.default_search = SearchParams(settings.hnsw_ef)
        self._search = {}
        self._writing: dict[str, Writing] = {}
        self._readers: dict[str, qe.EdgeShard] = {}
        self._current: str | None = None
        self._next_check = 0.0
        self._lock = threading.RLock()

    # -- writer ---------------------------------------------------------------------------

    def create_version(
        self, version: str, dim: int, meta: Mapping[str, Any] | None = None, quantization: Quantization = "none"
    ) -> None:
        path = self._dir(version)
        if path.exists():
            raise StoreError(f"version {version!r} already exists at {path}")
        self.root.mkdir(parents=True, exist_ok=True)
        graph_kb = max(1, self.graph_points * dim * 4 // 1024)  # two whole graphs never merge
        config = self._config(dim, GraphParams.of(meta or {}), quantization, graph_kb)
        self._writing[version] = Writing(qe.EdgeShard.create(str(path), config))
        (path / META).write_text(json.dumps({**(meta or {}), "dim": dim}))

    def _config(self, dim: int, graph: GraphParams, quantization: Quantization, merged_kb: int) -> qe.EdgeConfig:
        """`merged_kb`: the largest segment a merge may make (max_segment_size)."""
        return qe.EdgeConfig(
            vectors=qe.EdgeVectorParams(size=dim, distance=qe.Distance.Cosine),
            optimizers=qe.EdgeOptimizersConfig(indexing_threshold=INDEXING_THRESHOLD_KB, max_segment_size=merged_kb),
            hnsw_config=qe.HnswIndexConfig(
                m=graph.m, ef_construct=graph.ef_construct, full_scan_threshold=self.full_scan_threshold_kb
            ),
            quantization_config=edge_quantization(quantization),
            wal_enabled=False,
        )

    def copy_version(self, source: str, version: str, meta: Mapping[str, Any]) -> None:
        """The source's files (hard links where no write changes them: qdrant_edge_files.py); the writer's
        upserts go to a new segment that `finalize` indexes alone, and merge only with each other (largest
        merge: half the source's average segment), never into a source segment whose graph would be rebuilt."""
        if not self._finalized(source):
            raise VersionNotFoundError(f"cannot copy version {source!r}: it is not a finalized version")
        path = self._dir(version)
        if path.exists():
            raise StoreError(f"version {version!r} already exists at {path}")
        built = self.meta(source)
        dim = built["dim"]
        copy_shard(self._dir(source), path, skipped=(FINALIZED, META))
        try:
            shape = self._shard(source).info()
            merged_kb = max(1, shape.points_count * dim * 4 // 1024 // (2 * max(shape.segments_count, 1)))
            config = self._config(dim, GraphParams.of(built), built.get("quantization", "none"), merged_kb)
            self._writing[version] = Writing(qe.EdgeShard.load(str(path), config))
        except Exception as e:
            raise StoreError(f"cannot open the copy of version {source!r} as {version!r}: {e}") from e
        (path / META).write_text(json.dumps({**meta, "dim": dim}))

    def record_search(self, version: str, params: SearchParams) -> None:
        meta = {**self.meta(version), SEARCH_KEY: asdict(params)}
        fd, tmp = tempfile.mkstemp(prefix=f"{META}.", dir=self._dir(version))
        with os.fdopen(fd, "w") as f:
            json.dump(meta, f)
        os.replace(tmp, self._dir(version) / META)
        self._search[version] = params

    def meta(self, version: str) -> dict[str, Any]:
        try:
            return json.loads((self._dir(version) / META).read_text())
        except FileNotFoundError:
            raise VersionNotFoundError(f"version {version!r} does not exist") from None

    def upsert(
        self, version: str, ids: Sequence[str], vectors: np.ndarray, payloads: Sequence[Mapping[str, Any]]
    ) -> None:
        check_points(ids, vectors, payloads)
        writing = self._writer(version)
        note_field_types(payloads, writing.fields)
        for start in range(0, len(ids), UPSERT_BATCH):
            stop = start + UPSERT_BATCH
            points = [
                qe.Point(id=point_id(i), vector=v, payload=with_id(i, p))
                for i, v, p in zip(
                    ids[start:stop], vectors[start:stop].tolist(), payloads[start:stop], strict=False
                )
            ]
            try:
                writing.shard.update(qe.UpdateOperation.upsert_points(points))
            except Exception as e:
                raise StoreError(f"upsert into version {version!r} failed: {e}") from e
            writing.unindexed += len(points)
            if writing.unindexed >= self.graph_points:
                self._build_graph(version, writing)

    def delete(self, version: str, ids: Sequence[str]) -> None:
        shard = self._writer(version).shard
        for start in range(0, len(ids), UPSERT_BATCH):
            batch = [point_id(i) for i in ids[start : start + UPSERT_BATCH]]
            try:
                shard.update(qe.UpdateOperation.delete_points(batch))
            except Exception as e:
                raise StoreError(f"delete from version {version!r} failed: {e}") from e

    def finalize(self, version: str) -> None:
        writing = self._writer(version)
        self._build_graph(version, writing)
        try:
            writing.shard.flush()
        except Exception as e:
            raise StoreError(f"finalize of version {version!r} failed: {e}") from e
        (self._dir(version) / FINALIZED).touch()
        with self._lock:
            self._readers[version] = self._writing.pop(version).shard

    def _build_graph(self, version: str, writing: Writing) -> None:
        """Index the payload fields seen so far, then build a graph over the points written since
        the last build (`optimize`). A version past `graph_points` is so built as several graphs
        over bounded parts, and its build grows linearly with its points (one graph over all of
        them grew as N log N and past the CPU caches: `precompute bench vectors`). The payload indexes come
        first: Qdrant adds the links a filtered search needs per value of the fields indexed when
        a graph is built."""
        try:
            for key, kind in writing.fields.items():
                if kind is not None and key not in writing.indexed:
                    writing.shard.update(qe.UpdateOperation.create_field_index(key, FIELD_SCHEMAS[kind]))
                    writing.indexed.add(key)
                elif kind is None and key in writing.indexed:  # its type has varied since: no exact match
                    writing.shard.update(qe.UpdateOperation.delete_field_index(key))
                    writing.indexed.discard(key)
            writing.shard.optimize()
        except Exception as e:
            raise StoreError(f"building the graph of version {version!r} failed: {e}") from e
        writing.unindexed = 0

    def _writer(self, version: str) -> Writing:
        if version in self._writing:
            return self._writing[version]
        if self._finalized(version):
            raise StoreError(f"version {version!r} is finalized: a finalized version is never written again")
        raise VersionNotFoundError(
            f"version {version!r} is not being written by this store; create_version first"
        )

    # -- reader ---------------------------------------------------------------------------

    def count(self, version: str) -> int:
        return self._shard(version).count(qe.CountRequest(exact=True))

    def search(
        self,
        vector: np.ndarray,
        k: int,
        filter: Filter | None = None,
        version: str | None = None,
        params: SearchParams | None = None,
    ) -> list[Hit]:
        check_k(k)
        for retry in (False, True):
            name = version or self._published()
            shard = self._shard(name)
            request = qe.QueryRequest(
                limit=k,
                query=qe.Query.Nearest(vector.reshape(-1).tolist()),
                filter=edge_filter(filter),
                with_payload=True,
                params=edge_params(params or self.searched_with(name)),
            )
            try:
                points = shard.query(request)
                break
            except Exception as e:
                if retry or self._is_open(shard):
                    raise StoreError(f"search in version {name!r} failed: {e}") from e
                # Closed by a concurrent switch: retry once on the handle that replaced it.
        return [to_hit(p) for p in points]

    def _is_open(self, shard: qe.EdgeShard) -> bool:
        writers = (w.shard for w in self._writing.values())
        return any(s is shard for s in (*writers, *self._readers.values()))

    def _published(self) -> str:
        """The published version, re-read from CURRENT at most every pointer_check_s."""
        now = time.monotonic()
        if now >= self._next_check:
            self._next_check = now + self.pointer_check_s
            published = self._read_pointer()
            if published != self._current:
                self._switch(published)
        if self._current is None:
            raise VersionNotFoundError(f"nothing is published under {self.root}")
        return self._current

    def _switch(self, published: str | None) -> None:
        with self._lock:
            if published == self._current:
                return
            if published is not None:
                self._shard(published)  # open the new one before the old one goes
            old, self._current = self._current, published
            shard = self._readers.pop(old, None) if old is not None else None
        if shard is not None:
            shard.close()

    def _shard(self, version: str) -> qe.EdgeShard:
        """The open handle of a version: its writer here, else a cached read-only one."""
        writing = self._writing.get(version)
        shard = writing.shard if writing is not None else self._readers.get(version)
        if shard is not None:
            return shard
        with self._lock:
            if version in self._readers:
                return self._readers[version]
            if not self._finalized(version):
                if not self._dir(version).exists():
                    raise VersionNotFoundError(f"version {version!r} does not exist under {self.root}")
                raise StoreError(f"version {version!r} is not finalized; only its writer may read it")
            try:
                shard = qe.EdgeShard.load(str(self._dir(version)))
            except Exception as e:
                raise StoreUnavailableError(f"cannot open version {version!r}: {e}") from e
            self._readers[version] = shard
            return shard

    # -- versions -------------------------------------------------------------------------

    def publish(self, version: str) -> None:
        if not self._finalized(version):
            if not self._dir(version).exists():
                raise VersionNotFoundError(f"cannot publish version {version!r}: it does not exist")
            raise StoreError(f"cannot publish version {version!r}: it is not finalized")
        self.check_replaces(version)
        fd, tmp = tempfile.mkstemp(prefix=f".{POINTER}.", dir=self.root)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(version)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.root / POINTER)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        directory = os.open(self.root, os.O_RDONLY)  # the rename itself survives a crash
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
        self._next_check = 0.0

    def current(self) -> str | None:
        return self._read_pointer()

    def serving(self) -> str:
        return self._published()

    def versions(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and not p.name.startswith("."))

    def _read_pointer(self) -> str | None:
        try:
            return (self.root / POINTER).read_text().strip() or None
        except FileNotFoundError:
            return None

    def _dir(self, version: str) -> Path:
        return self.root / check_version(version)

    def _finalized(self, version: str) -> bool:
        return (self._dir(version) / FINALIZED).exists()

    def _drop(self, version: str) -> None:
        with self._lock:
            writing = self._writing.pop(version, None)
            shards = [s for s in (writing and writing.shard, self._readers.pop(version, None)) if s]
            self._search.pop(version, None)
        for shard in shards:
            shard.close()
        # Renamed first so no one opens a half-deleted shard; open mmaps of other
        # processes stay valid until they close.
        trash = self.root / f".trash-{version}-{os.getpid()}"
        os.rename(self._dir(version), trash)
        shutil.rmtree(trash)

    def close(self) -> None:
        with self._lock:
            shards = [*(w.shard for w in self._writing.values()), *self._readers.values()]
            self._writing.clear()
            self._readers.clear()
            self._search.clear()
            self._current = None
            self._next_check = 0.0
        for shard in shards:
            shard.close()
