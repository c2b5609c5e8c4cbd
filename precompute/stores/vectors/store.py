"""The vector store contract: versions written aside, published by one atomic switch.

A version is a whole copy of the corpus vectors (an edge shard or a server collection).
The nightly flow creates it, upserts into it, finalizes it (builds the HNSW index) and
publishes it; readers only ever query the published version, so they never see a half
one. Old versions stay for rollback until `gc` deletes them whole.
"""

from __future__ import annotations

import re
import uuid
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

import numpy as np

from precompute.stores.errors import StoreError, VersionNotFoundError
from precompute.stores.vectors.settings import QUANTIZED_OVERSAMPLING, Quantization
from precompute.stores.versions import Version, version_age

ITEM_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "precompute:item")
"""Qdrant point ids must be unsigned ints or UUIDs: item ids map to uuid5(ITEM_NAMESPACE, id)."""
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")
ID_KEY = "id"
"""Payload key that keeps the original item id (set by upsert, removed from Hit.payload)."""
UPSERT_BATCH = 256
"""Points per write request: Qdrant's bulk-upload advice is 64-256."""

Filter = Mapping[str, str | int | bool]
SEARCH_KEY = "search"
"""The version's meta key that holds the SearchParams its check chose (jobs/vectors/index_check.py)."""


@dataclass(frozen=True)
class SearchParams:
    """How a query walks a version: what the nightly check tuned it to, recorded with the version."""

    hnsw_ef: int
    """Candidates the graph search keeps: more is slower and nearer to exact."""
    oversampling: float = QUANTIZED_OVERSAMPLING
    """INT8 versions: candidates rescored with the FP32 vectors per result asked for."""
    exact: bool = False
    """Skip the graph: scan every vector (exact FP32 scores); the last rung of the check's ladder."""


GRAPH_KEY = "graph"
"""The version's meta key of the GraphParams it was built with."""


@dataclass(frozen=True)
class GraphParams:
    """How a version's HNSW graph is built. A denser graph (more links per point, a wider search
    while linking) finds more of the exact top 10 at any hnsw_ef, for a longer load: the index
    check asks the next build for one when search alone did not reach min_recall."""

    m: int = 16
    ef_construct: int = 100

    def denser(self) -> GraphParams:
        return GraphParams(min(2 * self.m, MAX_M), min(2 * self.ef_construct, MAX_EF_CONSTRUCT))

    @classmethod
    def of(cls, meta: Mapping[str, Any]) -> GraphParams:
        """The graph a version's meta asks for (the defaults when it names none)."""
        return cls(**meta.get(GRAPH_KEY, {}))


MAX_M, MAX_EF_CONSTRUCT = 64, 800
"""Past these a graph costs several times the vectors' memory and load time for little recall."""


@dataclass(frozen=True, slots=True)
class Hit:
    id: str | int
    """The item's id: a string as stored; the service answers an integer where the input's were."""
    score: float
    """Cosine similarity, higher is nearer."""
    payload: dict[str, Any]
    """As upserted, without the reserved `id` key."""


def point_id(item_id: str) -> str:
    return str(uuid.uuid5(ITEM_NAMESPACE, str(item_id)))


def check_name(name: str) -> str:
    """A collection name becomes a directory or a collection: letters, digits, '_' and '-'."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"collection {name!r} is not a valid name (letters, digits, '_', '-')")
    return name


def check_points(ids: Sequence[str], vectors: np.ndarray, payloads: Sequence[Mapping[str, Any]]) -> None:
    if vectors.ndim != 2:
        raise ValueError(f"vectors must be 2-D [points, dim], got shape {vectors.shape}")
    if not len(ids) == len(vectors) == len(payloads):
        raise ValueError(
            f"ids, vectors and payloads differ in length: {len(ids)}, {len(vectors)}, {len(payloads)}"
        )


def note_field_types(payloads: Sequence[Mapping[str, Any]], seen: dict[str, type | None]) -> None:
    """Record each payload key's scalar type (bool, int or str) in `seen`; None once it varies.

    Finalize gives every key with one scalar type a payload index: without one, a filter
    reads every point's payload (`precompute bench vectors` runs a filtered search).
    """
    for payload in payloads:
        for key, value in payload.items():
            kind = type(value) if type(value) in (bool, int, str) else None
            if seen.setdefault(key, kind) is not kind:
                seen[key] = None


def with_id(item_id: str, payload: Mapping[str, Any]) -> dict[str, Any]:
    return {**payload, ID_KEY: str(item_id)}


def check_k(k: int) -> None:
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")


class VectorStore(ABC):
    """Versioned corpus vectors of one collection. Versions are strings that sort by time
    ("20261122T031500-ab12"); the store is `Versioned` (versions.py)."""

    where: str
    """"qdrant edge: <name>" or "qdrant server: <name>"."""
    default_search: SearchParams
    """What a version without recorded SearchParams is searched with (VectorStoreSettings.hnsw_ef)."""
    _search: dict[str, SearchParams]
    """Each version's SearchParams as `searched_with` read them (set empty by a store's __init__)."""

    @abstractmethod
    def create_version(
        self, version: str, dim: int, meta: Mapping[str, Any] | None = None, quantization: Quantization = "none"
    ) -> None:
        """A new, empty version: cosine distance, HNSW indexing deferred until `finalize`.

        `meta` (JSON) travels with the version: the model that made it, so a reader embeds
        queries with the same model; `meta(version)` returns it with the `dim`.
        quantization: whether the version also keeps INT8 vectors to search (vector_settings.py).
        """

    @abstractmethod
    def copy_version(self, source: str, version: str, meta: Mapping[str, Any]) -> None:
        """A new version holding `source`'s points, configured as it is (dimension, graph,
        quantization), with `meta` in place of its meta (`dim` kept); written to with `upsert`
        and `delete` until `finalize`, like a created one. A night that changed a few rows
        writes those, not every point (jobs/vectors/load.py)."""

    @abstractmethod
    def meta(self, version: str) -> dict[str, Any]:
        """What create_version recorded: `dim`, and the writer's `meta` (e.g. `model`)."""

    def check_replaces(self, version: str) -> None:
        """Refuse to publish a version whose dimension differs from the published one's while
        its model is the same: readers of a model expect its dimension. A new model makes a
        new version like any other, and readers switch to it (and its dimension) atomically."""
        current = self.current()
        if current is None or current == version:
            return
        new, old = self.meta(version), self.meta(current)
        same_model = (new.get("model") or {}).get("hash") == (old.get("model") or {}).get("hash")
        if new.get("dim") != old.get("dim") and same_model:
            raise StoreError(
                f"cannot publish version {version!r}: its dimension {new.get('dim')} differs from the "
                f"published {current!r}'s {old.get('dim')} with the same model"
            )

    @abstractmethod
    def upsert(
        self, version: str, ids: Sequence[str], vectors: np.ndarray, payloads: Sequence[Mapping[str, Any]]
    ) -> None:
        """Write points in batches of UPSERT_BATCH; the payload key `id` is reserved for the item id."""

    @abstractmethod
    def delete(self, version: str, ids: Sequence[str]) -> None:
        """Remove points by item id from a version being written; ids it does not hold are ignored."""

    @abstractmethod
    def finalize(self, version: str) -> None:
        """Index payload fields and build the HNSW index; return once the version is ready to serve.

        Payload indexes cover the keys this store instance saw in `upsert` with one scalar
        type: the instance that loads a version finalizes it.
        """

    @abstractmethod
    def count(self, version: str) -> int:
        """Exact number of points in the version."""

    @abstractmethod
    def search(
        self,
        vector: np.ndarray,
        k: int,
        filter: Filter | None = None,
        version: str | None = None,
        params: SearchParams | None = None,
    ) -> list[Hit]:
        """Top-k by cosine; `filter` is an exact-match AND over payload keys. version None: the
        published one. params None: those recorded with the version, else the store's defaults."""

    @abstractmethod
    def record_search(self, version: str, params: SearchParams) -> None:
        """Keep `params` in the version's meta (before it is published): readers search with them."""

    def searched_with(self, version: str) -> SearchParams:
        """The SearchParams recorded with `version`, else default_search (a version written before
        they were); read once, since a published version's meta never changes."""
        params = self._search.get(version)
        if params is None:
            recorded = self.meta(version).get(SEARCH_KEY)
            params = self._search[version] = self.default_search if recorded is None else SearchParams(**recorded)
        return params

    @abstractmethod
    def publish(self, version: str) -> None:
        """Make a finalized version the one readers see, in one atomic switch."""

    @abstractmethod
    def current(self) -> str | None:
        """The published version, None before the first publish."""

    def serving(self) -> str:
        """The version a search with version=None reads now; VersionNotFoundError before any publish.

        A reader that reports which version answered asks this once, then searches that
        version explicitly: the answer and the version it names cannot disagree. A store
        may answer from a cached view of the pointer (edge: at most pointer_check_s old).
        """
        version = self.current()
        if version is None:
            raise VersionNotFoundError("nothing is published yet")
        return version

    @abstractmethod
    def versions(self) -> list[str]:
        """Every stored version, finalized or not, oldest first."""

    @abstractmethod
    def close(self) -> None:
        """Release files, engines and connections; the store is unusable afterwards."""

    @abstractmethod
    def _finalized(self, version: str) -> bool:
        """True if the version exists and `finalize` completed on it."""

    @abstractmethod
    def _drop(self, version: str) -> None:
        """Delete a whole version; never called on the published one."""

    def listing(self) -> list[Version]:
        current = self.current()
        return [Version(v, self.count(v), version_age(v), v == current) for v in self.versions()]

    def rollback(self, to: str | None = None) -> str:
        """Publish `to`, or by default the newest finalized version older than the published one."""
        if to is None:
            current = self.current()
            if current is None:
                raise VersionNotFoundError("nothing is published yet: there is no version to roll back from")
            older = [v for v in self.versions() if v < current and self._finalized(v)]
            if not older:
                raise VersionNotFoundError(f"no finalized version older than {current!r} to roll back to")
            to = older[-1]
        self.publish(to)
        return to

    def drop(self, version: str) -> None:
        if version in self.versions() and version != self.current():
            self._drop(version)

    def collect(self, keep: int) -> list[str]:
        """Delete all versions but the published one and the `keep` newest finalized others
        (rollback targets); return them, oldest first.

        An unfinalized version older than the published one is a failed or killed run's: it is
        deleted whatever `keep` says. Newer unfinalized ones are runs in progress and stay.
        """
        if keep < 0:
            raise ValueError(f"keep must be >= 0, got {keep}")
        current = self.current()
        others = [v for v in self.versions() if v != current]
        finalized = [v for v in others if self._finalized(v)]
        abandoned = [v for v in others if current is not None and v < current and v not in finalized]
        doomed = sorted(abandoned + finalized[: max(len(finalized) - keep, 0)])
        for version in doomed:
            self._drop(version)
        return doomed

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

