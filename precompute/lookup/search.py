"""`POST /v1/search[/{name}]`: embed the query with the model that made the served version, then search it.

A search is answered from the query cache (lookup/query_cache.py) on the event loop, else embeds
the query and searches the published version on a search thread, at most one per core, so key
lookups never wait behind an embedding. A long query (over long_query_chars) costs several short
ones, so long queries take at most all search threads but one: a short query never waits behind
them. A query is cut to max_query_tokens (or the model's window), and the answer says so.

Each embeddings output has its own store and follows its own published version. A version
records the model that made it (stores/vectors/store.py `meta`), so when a new model's version is
published the service embeds queries with that model from then on: its encoder is loaded on
the first query that needs it (cached by model hash, shared by outputs), and the dimension of
query and index always agree.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Annotated, Protocol

import anyio
import numpy as np
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator
from starlette.requests import Request
from starlette.responses import Response

from precompute.lookup.errors import error, unavailable, validated_body
from precompute.lookup.openapi import search_operation
from precompute.lookup.outages import StoreHealth
from precompute.lookup.query_batcher import QueryBatcher
from precompute.lookup.query_cache import QueryCache
from precompute.lookup.served import Endpoint
from precompute.lookup.settings import ServiceSettings
from precompute.models import Engine, InvalidInputError, load_encoder
from precompute.models.engines.load import peer_independent
from precompute.models.engines.runtime import resolve_device
from precompute.models.settings import EngineSettings
from precompute.models.source import ModelSource
from precompute.models.text.encoder import EngineReport
from precompute.models.text.reference import TextSample
from precompute.models.text.tokenize import TextTokenizer
from precompute.stores.errors import StoreUnavailableError, VersionNotFoundError
from precompute.stores.vectors.store import Filter, Hit, VectorStore

if TYPE_CHECKING:
    from precompute.service.app import Service

WARMUP_TEXT = "warm-up query for the engine and the index"


FilterKey = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=r"^[^\x00-\x1f\x7f]+$")]
"""A payload field's name: no control characters (Qdrant refuses a NUL)."""
INT64 = range(-(2**63), 2**63)
"""Payload integers are int64."""


class FilterError(ValueError):
    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


class SearchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    query: str = Field(min_length=1)
    k: int = Field(10, ge=1)
    filter: Annotated[dict[FilterKey, str | int | bool], Field(max_length=16)] | None = None
    """Exact matches, all of them, on fields of the version's payload."""

    @field_validator("filter")
    @classmethod
    def _int64(cls, value: dict[str, str | int | bool] | None) -> dict[str, str | int | bool] | None:
        for key, v in (value or {}).items():
            if isinstance(v, int) and v not in INT64:
                raise ValueError(f"the value of {key!r} is outside int64")
        return value


QUERY_ENGINE = {"streams": 1, "threads": 1, "graph": "query"}
"""One query per call, one thread: after idle gaps, waking a thread pool costs more at the p99
than it saves at the p50 (README, "Figures behind the defaults"). The fused graph suits one short text."""


class QueryEncoder(Protocol):
    """An engine for one query at a time (models.Encoder) or a micro-batcher in front of one."""

    report: EngineReport
    tokenizer: TextTokenizer

    def encode_query(self, text: object) -> np.ndarray: ...

    def encode_ids(self, ids: list[int]) -> np.ndarray: ...

    def close(self) -> None: ...


class Encoders:
    """Query encoders by model hash, loaded once each."""

    def __init__(self, settings: ServiceSettings) -> None:
        self.settings = settings
        self._encoders: dict[str, QueryEncoder] = {}
        self._lock = threading.Lock()

    def batched(self, machine: EngineSettings) -> bool:
        if self.settings.query_batch == "auto":
            return resolve_device(machine) == "cuda"
        return self.settings.query_batch == "on"

    def get(self, engine: Engine, warmup_queries: int = 0) -> QueryEncoder:
        with self._lock:
            encoder = self._encoders.get(engine.model.hash)
            if encoder is None:
                encoder = self._load(engine)
                for _ in range(warmup_queries):
                    encoder.encode_query(WARMUP_TEXT)
                self._encoders[engine.model.hash] = encoder
            return encoder

    def _load(self, engine: Engine) -> QueryEncoder:
        if not self.batched(engine.machine):
            return load_encoder(engine.replace(**QUERY_ENGINE))
        rows = self.settings.query_batch_rows
        batch_engine = peer_independent(engine).replace(streams=1, batch_size=rows)
        return QueryBatcher(load_encoder(batch_engine), rows, self.settings.query_batch_wait_ms / 1000)

    def close(self) -> None:
        for encoder in self._encoders.values():
            encoder.close()
        self._encoders.clear()


@dataclass(frozen=True)
class QueryVector:
    """A query's vector, and the tokens it was cut to when the text had more (else None)."""

    vector: np.ndarray
    cut_to: int | None

    @property
    def nbytes(self) -> int:
        return self.vector.nbytes


@dataclass(frozen=True)
class Found:
    hits: list[Hit]
    cut_to: int | None
    """The answer says so: a query longer than max_query_tokens (or the model's window) was cut."""


@dataclass(frozen=True)
class ServedVersion:
    """What a version's meta says about answering it."""

    engine: Engine
    """The engine of the model that made the version."""
    payload: dict[str, str] | None
    """Its payload's field types (None: written without them)."""
    integer_ids: bool
    """The input's ids were integers: hits answer them as numbers."""


class Searcher:
    """One embeddings output: its store, and the encoder of whichever version it serves."""

    def __init__(
        self,
        name: str,
        store: VectorStore,
        encoders: Encoders,
        engine: Engine,
        vectors: QueryCache[QueryVector],
        max_query_tokens: int | None = None,
    ) -> None:
        self.health = StoreHealth(f"vector store of {name}")
        self.store = store
        self.encoders = encoders
        self.vectors = vectors
        self.max_query_tokens = max_query_tokens
        self.engine = engine
        """The output's engine as the pipeline file states it: a version's own model replaces its model."""
        self._versions: dict[str, ServedVersion] = {}
        """The served version's, replaced whole (search threads read it)."""

    def served(self, version: str) -> ServedVersion:
        known = self._versions.get(version)
        if known is None:
            meta = self.store.meta(version)
            engine = self.engine
            if "model" in meta:  # else written without one (by hand): the file's model
                model = ModelSource.model_validate(meta["model"])
                engine = engine.replace(model=model, reference=TextSample.model_validate(meta["reference"]))
            known = ServedVersion(engine, meta.get("payload"), bool(meta.get("integer_ids")))
            self._versions = {version: known}  # one version is served at a time
        return known

    def engine_of(self, version: str) -> Engine:
        return self.served(version).engine

    def check_filter(self, version: str, filter: Filter) -> None:
        """Raise FilterError unless each key is a field of the version's payload, with a value of
        its type: a filter on a field that does not exist would match nothing, silently."""
        fields = self.served(version).payload
        if fields is None:  # a version written without its payload's schema
            return
        for key, value in filter.items():
            if key not in fields:
                raise FilterError(
                    key, f"no payload field {key!r} (the fields are {', '.join(sorted(fields))})"
                )
            if type(value).__name__ != fields[key]:
                raise FilterError(
                    key, f"payload field {key!r} holds {fields[key]}, not {type(value).__name__}"
                )

    def warm(self, queries: int) -> None:
        """Load and warm the encoders of the file's model and of the served version's, if any."""
        self.encoders.get(self.engine, warmup_queries=queries)
        if (version := self.store.current()) is not None:
            self.encoders.get(self.engine_of(version), warmup_queries=queries)

    def encoder_for(self, version: str) -> QueryEncoder:
        """Blocking on a model's first query: the engine loads (from the cache, or built)."""
        return self.encoders.get(self.engine_of(version))

    def search_published(
        self, version: str, query: str, k: int, filter: Filter | None
    ) -> tuple[str, Found]:
        """(version, found) of `version`, or of the version published now if `version` was collected
        meanwhile: a reader's view of the pointer may be a moment old, and another process deletes
        a version as soon as it is neither published nor kept. A search never fails for that."""
        try:
            return version, self.search(version, query, k, filter)
        except VersionNotFoundError:
            published = self.store.current()
            if published is None or published == version:
                raise
            return published, self.search(published, query, k, filter)

    def search(self, version: str, query: str, k: int, filter: Filter | None) -> Found:
        """Hits of `version`, on a search thread (the event loop stays free for key lookups): the
        version's encoder (loaded on a model's first query), the query's vector (cached), the
        index. Raises VersionNotFoundError, StoreUnavailableError, InvalidInputError (the
        query), FilterError."""
        engine = self.engine_of(version)
        if filter:
            self.check_filter(version, filter)
        embedded = self.vectors.get((engine.model.hash, query))
        if embedded is None:
            encoder = self.encoders.get(engine)
            ids, cut = encoder.tokenizer.query_ids(query, self.max_query_tokens)
            embedded = QueryVector(encoder.encode_ids(ids), len(ids) if cut else None)
            self.vectors.put((engine.model.hash, query), embedded)
        hits = self.store.search(embedded.vector, k, filter, version=version)
        if self.served(version).integer_ids:
            hits = [dataclasses.replace(hit, id=int(hit.id)) for hit in hits]
        return Found(hits, embedded.cut_to)


class SearchOutput:
    """An embeddings output as the service answers it (lookup/served.py Served)."""

    store = "vector store"

    def __init__(self, service: Service, name: str, store: VectorStore, engine: Engine) -> None:
        self.service = service
        self.name = name
        max_tokens = service.settings.max_query_tokens
        self.searcher = Searcher(name, store, service.encoders, engine, service.vectors, max_tokens)

    def endpoints(self, base: str) -> list[Endpoint]:
        async def search(request: Request) -> Response:
            return await self.search(request)

        search.__doc__ = f"Embed `query`, return the `k` nearest documents of {self.name}'s published version."
        return [Endpoint(base, "POST", search, base, search_operation(SearchRequest))]

    async def open(self) -> None:
        await anyio.to_thread.run_sync(self.searcher.warm, self.service.settings.warmup_queries)

    async def version(self) -> str | None:
        try:
            version = self.searcher.store.current()
        except StoreUnavailableError as e:
            self.searcher.health.failed(e)
            raise
        self.searcher.health.ok()
        return version

    def engine(self, version: str) -> str | None:
        report = self.searcher.encoder_for(version).report
        return f"{report.backend}/{report.device}/{report.precision}"

    async def close(self) -> None:
        self.searcher.store.close()

    async def search(self, request: Request) -> Response:
        """Embed `query`, return the `k` nearest documents of the published version (with `filter`)."""
        service, settings, searcher = self.service, self.service.settings, self.searcher
        req = await validated_body(request, SearchRequest, settings)
        if len(req.query) > settings.max_query_chars:
            return error(422, f"query is longer than {settings.max_query_chars} characters", field="query")
        if req.k > settings.max_k:
            return error(422, f"k must be at most {settings.max_k}", field="k")
        if not service.ready:
            return error(503, "warming up", headers={"Retry-After": "1"})
        key = (req.query, req.k, filter_key(req.filter))
        try:
            version = searcher.store.serving()
            body = service.answers.get_answer(self.name, version, key)
            if body is None and service.shared is not None:
                body = await service.shared.get(self.name, version, key)
                if body is not None:
                    service.answers.put_answer(self.name, version, key, body)
            if body is None:
                search = partial(searcher.search_published, version, req.query, req.k, req.filter)
                if len(req.query) > settings.long_query_chars:  # never on every search thread at once
                    async with service.long_searches:
                        version, found = await anyio.to_thread.run_sync(search, limiter=service.search_threads)
                else:
                    version, found = await anyio.to_thread.run_sync(search, limiter=service.search_threads)
                body = answer_body(version, found)
                service.answers.put_answer(self.name, version, key, body)
                if service.shared is not None:
                    await service.shared.put(self.name, version, key, body)
        except InvalidInputError as e:
            return error(422, e.reason, field="query")
        except FilterError as e:
            return error(422, str(e), field=f"filter.{e.key}")
        except VersionNotFoundError:
            return error(503, f"no version of {self.name} is published yet", headers={"Retry-After": "5"})
        except StoreUnavailableError as e:
            service.metrics.store_errors.labels(self.name).inc()
            searcher.health.failed(e)
            return unavailable("vector store", e)
        searcher.health.ok()
        return Response(body, media_type="application/json")


def filter_key(filter: dict[str, str | int | bool] | None) -> tuple[tuple[str, str, object], ...]:
    """A filter as part of a cache key: True and 1 are equal in Python, not in a payload."""
    return tuple(sorted((key, type(value).__name__, value) for key, value in (filter or {}).items()))


def answer_body(version: str, found: Found) -> bytes:
    answer: dict[str, object] = {
        "version": version,
        "hits": [{"id": h.id, "score": h.score, "payload": h.payload} for h in found.hits],
    }
    if found.cut_to is not None:
        answer["query_cut_to_tokens"] = found.cut_to
    return json.dumps(
        answer,
        ensure_ascii=False,
        allow_nan=False,
        separators=(",", ":"),
    ).encode()
