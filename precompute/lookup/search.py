"""Search an embeddings output: embed the query with the model that made the served version, then search it.

The route is search_route.py's. A query is cut to max_query_tokens (or the model's window), and
the answer says so.

Each embeddings output has its own store and follows its own published version. A version
records the model that made it (stores/vectors/store.py `meta`), so when a new model's version is
published the service embeds queries with that model from then on: its encoder is loaded on
the first query that needs it (cached by model hash, shared by outputs), and the dimension of
query and index always agree.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass
from typing import Annotated, Protocol

import numpy as np
from pydantic import StringConstraints

from precompute.lookup.outages import StoreHealth
from precompute.lookup.query_batcher import QueryBatcher
from precompute.lookup.query_cache import QueryCache
from precompute.lookup.settings import ServiceSettings
from precompute.models import Engine, load_encoder
from precompute.models.engines.load import peer_independent
from precompute.models.engines.runtime import resolve_device
from precompute.models.settings import EngineSettings
from precompute.models.source import ModelSource
from precompute.models.text.encoder import EngineReport
from precompute.models.text.reference import TextSample
from precompute.models.text.tokenize import TextTokenizer
from precompute.stores.errors import VersionNotFoundError
from precompute.stores.vectors.store import Filter, Hit, VectorStore

WARMUP_TEXT = "warm-up query for the engine and the index"


FilterKey = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=r"^[^\x00-\x1f\x7f]+$")]
"""A payload field's name: no control characters (Qdrant refuses a NUL)."""
INT64 = range(-(2**63), 2**63)
"""Payload integers are int64."""


class FilterError(ValueError):
    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


QUERY_ENGINE = {"streams": 1, "threads": 1, "graph": "query"}
"""One query per call, one thread: after idle gaps, waking a thread pool costs more at the p99
than it saves at the p50 (`precompute bench search` measures both). The fused graph suits one short text."""


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
    embed_ms: float | None
    """Tokenizing and embedding the query; None when its vector came from the cache."""
    index_ms: float
    """Searching the index, filter included."""


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
            if "model" in meta:  # else written without one (not by the flow): the file's model
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
        start, embed_ms = time.perf_counter(), None
        embedded = self.vectors.get((engine.model.hash, query))
        if embedded is None:
            encoder = self.encoders.get(engine)
            ids, cut = encoder.tokenizer.query_ids(query, self.max_query_tokens)
            embedded = QueryVector(encoder.encode_ids(ids), len(ids) if cut else None)
            self.vectors.put((engine.model.hash, query), embedded)
            embed_ms = (time.perf_counter() - start) * 1000
        searched = time.perf_counter()
        hits = self.store.search(embedded.vector, k, filter, version=version)
        index_ms = (time.perf_counter() - searched) * 1000
        if self.served(version).integer_ids:
            hits = [dataclasses.replace(hit, id=int(hit.id)) for hit in hits]
        return Found(hits, embedded.cut_to, embed_ms, index_ms)
