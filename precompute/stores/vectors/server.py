"""Versions as collections of a Qdrant server, published by an alias swap.

Collection `<name>-<version>` per version; the alias `<name>` names the published one,
and readers query the alias, so a publish is one `update_collection_aliases` call
(delete + create, applied atomically by the server). A version is created with
`hnsw_config.m = 0` (no graph is built while points stream in), finalized by setting the
graph's `m` (stores/vectors/store.py GraphParams: 16 unless the check asked for a denser graph) and
waiting for the collection to turn green, and marked finalized in the collection's metadata
(Qdrant 1.16+ servers), which publish checks. With `quantization = "int8"` the collection also
keeps scalar INT8 vectors (quantile 0.99, in RAM); queries always ask to rescore the version's
oversampled candidates with the original vectors (a server otherwise decides by itself), which
collections without quantization ignore. A version's search parameters (SearchParams, tuned by
the nightly check) live in the same metadata. A copy of a version (`copy_version`) is a new
collection configured like it, filled by scrolling the source's points through this client: it
saves the night's embedding, not the server's graph build (a server would clone the segments
from a snapshot, which local mode cannot run: not built).

Also runs on qdrant-client's local mode (`QdrantClient(":memory:")` or `path=`), which is
what the tests inject: a pure-Python brute force that accepts and ignores HNSW and
quantization settings.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any, TypeVar

import grpc
import numpy as np
from qdrant_client import QdrantClient, models
from qdrant_client.common.client_exceptions import ResourceExhaustedResponse
from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

from precompute.stores.errors import StoreError, StoreUnavailableError, VersionNotFoundError
from precompute.stores.vectors.settings import Quantization, VectorStoreSettings
from precompute.stores.vectors.store import (
    ID_KEY,
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

FINALIZED_KEY = "precompute_finalized"
META_KEY = "precompute_meta"
RETRY_AFTER_S = 1.0
TRANSIENT_HTTP = {429, 502, 503, 504}
TRANSIENT_GRPC = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}

FIELD_SCHEMAS = {
    bool: models.PayloadSchemaType.BOOL,
    int: models.IntegerIndexParams(
        type=models.IntegerIndexType.INTEGER, lookup=True, range=False
    ),  # see qdrant_edge_store
    str: models.PayloadSchemaType.KEYWORD,
}

T = TypeVar("T")


def server_quantization(quantization: str) -> models.ScalarQuantization | None:
    if quantization == "none":
        return None
    return models.ScalarQuantization(
        scalar=models.ScalarQuantizationConfig(type=models.ScalarType.INT8, quantile=0.99, always_ram=True)
    )


def server_params(params: SearchParams) -> models.SearchParams:
    """Rescoring is always asked for (a server otherwise decides); a collection without quantization ignores it."""
    return models.SearchParams(
        hnsw_ef=params.hnsw_ef,
        exact=params.exact,
        quantization=models.QuantizationSearchParams(rescore=True, oversampling=params.oversampling),
    )


def server_filter(filter: Filter | None) -> models.Filter | None:
    if not filter:
        return None
    return models.Filter(
        must=[models.FieldCondition(key=k, match=models.MatchValue(value=v)) for k, v in filter.items()]
    )


@contextmanager
def translated(what: str) -> Iterator[None]:
    """qdrant-client's REST, gRPC and local-mode errors as StoreError; transient ones retryable."""
    try:
        yield
    except ResourceExhaustedResponse as e:
        raise StoreUnavailableError(f"{what}: {e}", retry_after=e.retry_after_s) from e
    except (ResponseHandlingException, ConnectionError, TimeoutError) as e:
        raise StoreUnavailableError(f"{what}: {e}", retry_after=RETRY_AFTER_S) from e
    except UnexpectedResponse as e:
        if e.status_code in TRANSIENT_HTTP:
            raise StoreUnavailableError(f"{what}: {e}", retry_after=RETRY_AFTER_S) from e
        raise StoreError(f"{what}: {e}") from e
    except grpc.RpcError as e:
        if e.code() in TRANSIENT_GRPC:
            raise StoreUnavailableError(f"{what}: {e.details()}", retry_after=RETRY_AFTER_S) from e
        raise StoreError(f"{what}: {e.details()}") from e


class QdrantServerStore(VectorStore):
    def __init__(
        self,
        settings: VectorStoreSettings,
        name: str,
        client: QdrantClient | None = None,
        ready_timeout_s: float = 600.0,
    ) -> None:
        """`client` overrides the one settings describe (tests pass a local-mode client)."""
        if client is None:
            if settings.url is None:
                raise ValueError("PRECOMPUTE_QDRANT_URL is required when PRECOMPUTE_QDRANT_TYPE is 'server'")
            client = QdrantClient(
                url=settings.url, api_key=settings.api_key, prefer_grpc=settings.prefer_grpc
            )
        self.client = client
        self.name = check_name(name)
        self.where = f"qdrant server: {self.name}"
        self.full_scan_threshold_kb = settings.full_scan_threshold_kb
        self.default_search = SearchParams(settings.hnsw_ef)
        self._search = {}
        self.ready_timeout_s = ready_timeout_s
        """How long finalize waits for the index to be built before giving up (retryable)."""
        self._fields: dict[str, dict[str, type | None]] = {}

    def _collection(self, version: str) -> str:
        return f"{self.name}-{check_version(version)}"

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        with translated(what):
            return fn()

    def _require(self, version: str) -> str:
        collection = self._collection(version)
        if not self._call(f"checking version {version!r}", lambda: self.client.collection_exists(collection)):
            raise VersionNotFoundError(f"version {version!r} does not exist (no collection {collection!r})")
        return collection

    def create_version(
        self, version: str, dim: int, meta: Mapping[str, Any] | None = None, quantization: Quantization = "none"
    ) -> None:
        collection = self._collection(version)
        with translated(f"creating version {version!r}"):
            if self.client.collection_exists(collection):
                raise StoreError(f"version {version!r} already exists (collection {collection!r})")
            self.client.create_collection(
                collection,
                vectors_config=models.VectorParams(size=dim, distance=models.Distance.COSINE),
                hnsw_config=models.HnswConfigDiff(
                    m=0,
                    ef_construct=GraphParams.of(meta or {}).ef_construct,
                    full_scan_threshold=self.full_scan_threshold_kb,
                ),
                quantization_config=server_quantization(quantization),
                metadata={FINALIZED_KEY: False, META_KEY: {**(meta or {}), "dim": dim}},
            )

    def copy_version(self, source: str, version: str, meta: Mapping[str, Any]) -> None:
        if not self._finalized(source):
            raise VersionNotFoundError(f"cannot copy version {source!r}: it is not a finalized version")
        collection = self._require(source)
        with translated(f"reading version {source!r}"):
            quantized = self.client.get_collection(collection).config.quantization_config is not None
        self.create_version(version, self.meta(source)["dim"], meta, "int8" if quantized else "none")
        fields = self._fields.setdefault(version, {})
        offset = None
        with translated(f"copying version {source!r} into {version!r}"):
            while True:
                points, offset = self.client.scroll(
                    collection, limit=UPSERT_BATCH, offset=offset, with_payload=True, with_vectors=True
                )
                note_field_types([{k: v for k, v in (p.payload or {}).items() if k != ID_KEY} for p in points], fields)
                self.client.upsert(
                    self._collection(version),
                    [models.PointStruct(id=p.id, vector=p.vector, payload=p.payload) for p in points],
                    wait=True,
                )
                if offset is None:
                    break

    def meta(self, version: str) -> dict[str, Any]:
        collection = self._require(version)
        with translated(f"reading version {version!r}"):
            metadata = self.client.get_collection(collection).config.metadata or {}
        return dict(metadata.get(META_KEY) or {})

    def upsert(
        self, version: str, ids: Sequence[str], vectors: np.ndarray, payloads: Sequence[Mapping[str, Any]]
    ) -> None:
        check_points(ids, vectors, payloads)
        collection = self._require(version)
        if self._finalized(version):
            raise StoreError(f"version {version!r} is finalized: a finalized version is never written again")
        note_field_types(payloads, self._fields.setdefault(version, {}))
        with translated(f"upsert into version {version!r}"):
            self.client.upload_collection(
                collection,
                vectors=np.asarray(vectors, dtype=np.float32),
                payload=[with_id(i, p) for i, p in zip(ids, payloads, strict=False)],
                ids=[point_id(i) for i in ids],
                batch_size=UPSERT_BATCH,
                wait=True,
            )

    def delete(self, version: str, ids: Sequence[str]) -> None:
        collection = self._require(version)
        if self._finalized(version):
            raise StoreError(f"version {version!r} is finalized: a finalized version is never written again")
        with translated(f"delete from version {version!r}"):
            for start in range(0, len(ids), UPSERT_BATCH):
                batch = [point_id(i) for i in ids[start : start + UPSERT_BATCH]]
                self.client.delete(collection, models.PointIdsList(points=batch), wait=True)

    def finalize(self, version: str) -> None:
        collection = self._require(version)
        with translated(f"finalizing version {version!r}"):
            for key, kind in self._fields.pop(version, {}).items():
                if kind is not None:  # before the graph, so HNSW builds its filter-aware links
                    self.client.create_payload_index(collection, key, FIELD_SCHEMAS[kind], wait=True)
            graph = GraphParams.of(self.meta(version))
            self.client.update_collection(collection, hnsw_config=models.HnswConfigDiff(m=graph.m))
            deadline = time.monotonic() + self.ready_timeout_s
            while (status := self.client.get_collection(collection).status) != models.CollectionStatus.GREEN:
                if status == models.CollectionStatus.RED:
                    raise StoreError(
                        f"version {version!r}: collection {collection!r} is red (optimizer failed)"
                    )
                if time.monotonic() > deadline:
                    raise StoreUnavailableError(
                        f"version {version!r} not green after {self.ready_timeout_s:g} s", retry_after=10.0
                    )
                if status == models.CollectionStatus.GREY:  # pending but not started: an update starts them
                    self.client.update_collection(collection, optimizers_config=models.OptimizersConfigDiff())
                time.sleep(0.2)
            self.client.update_collection(collection, metadata={FINALIZED_KEY: True})

    def count(self, version: str) -> int:
        collection = self._require(version)
        return self._call(
            f"counting version {version!r}", lambda: self.client.count(collection, exact=True).count
        )

    def record_search(self, version: str, params: SearchParams) -> None:
        collection = self._require(version)
        meta = {**self.meta(version), SEARCH_KEY: asdict(params)}
        self._call(
            f"recording the search of version {version!r}",
            lambda: self.client.update_collection(collection, metadata={META_KEY: meta}),
        )
        self._search[version] = params

    def search(
        self,
        vector: np.ndarray,
        k: int,
        filter: Filter | None = None,
        version: str | None = None,
        params: SearchParams | None = None,
    ) -> list[Hit]:
        """version None reads the alias with the store's default params: the service names its version."""
        check_k(k)
        target = self.name if version is None else self._collection(version)
        if params is None and version is not None:
            params = self.searched_with(version)
        try:
            with translated(f"search in {target!r}"):
                points = self.client.query_points(
                    target,
                    query=vector,
                    limit=k,
                    query_filter=server_filter(filter),
                    search_params=server_params(params or self.default_search),
                    with_payload=True,
                ).points
        except StoreUnavailableError:
            raise
        except (StoreError, ValueError) as e:  # ValueError: local mode's "Collection ... not found"
            self._explain_missing(version)
            if isinstance(e, StoreError):
                raise
            raise StoreError(f"search in {target!r}: {e}") from e
        hits = []
        for p in points:
            payload = dict(p.payload or {})
            hits.append(Hit(str(payload.pop(ID_KEY, p.id)), p.score, payload))
        return hits

    def _explain_missing(self, version: str | None) -> None:
        """After a failed search: the precise error when the version or the alias is missing."""
        if version is None and self.current() is None:
            raise VersionNotFoundError(f"nothing is published under alias {self.name!r}")
        if version is not None:
            self._require(version)

    def publish(self, version: str) -> None:
        collection = self._require(version)
        if not self._finalized(version):
            raise StoreError(f"cannot publish version {version!r}: it is not finalized")
        self.check_replaces(version)
        operations: list[models.AliasOperations] = []
        if self.current() is not None:
            operations.append(
                models.DeleteAliasOperation(delete_alias=models.DeleteAlias(alias_name=self.name))
            )
        operations.append(
            models.CreateAliasOperation(
                create_alias=models.CreateAlias(collection_name=collection, alias_name=self.name)
            )
        )
        self._call(
            f"publishing version {version!r}",
            lambda: self.client.update_collection_aliases(change_aliases_operations=operations),
        )

    def current(self) -> str | None:
        aliases = self._call("reading aliases", lambda: self.client.get_aliases().aliases)
        prefix = f"{self.name}-"
        for alias in aliases:
            if alias.alias_name == self.name and alias.collection_name.startswith(prefix):
                return alias.collection_name.removeprefix(prefix)
        return None

    def versions(self) -> list[str]:
        collections = self._call("listing collections", lambda: self.client.get_collections().collections)
        prefix = f"{self.name}-"
        return sorted(c.name.removeprefix(prefix) for c in collections if c.name.startswith(prefix))

    def _finalized(self, version: str) -> bool:
        collection = self._collection(version)
        with translated(f"reading version {version!r}"):
            if not self.client.collection_exists(collection):
                return False
            metadata = self.client.get_collection(collection).config.metadata or {}
        return metadata.get(FINALIZED_KEY) is True

    def _drop(self, version: str) -> None:
        collection = self._collection(version)
        self._call(f"deleting version {version!r}", lambda: self.client.delete_collection(collection))
        self._search.pop(version, None)

    def close(self) -> None:
        self.client.close()
