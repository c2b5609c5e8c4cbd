"""`POST /v1/search[/{name}]`: the route of an embeddings output, over its Searcher (search.py).

A search is answered from the query cache (lookup/query_cache.py) on the event loop, else embeds
the query and searches the published version on a search thread, at most one per core, so key
lookups never wait behind an embedding. A computed answer's `Server-Timing` header (W3C) gives
the milliseconds of its two steps, `embed` (absent when the query's vector was cached) and
`index`: what the service adds around them is the rest of the client's wait. A long query (over long_query_chars) costs several short
ones, so long queries take at most all search threads but one: a short query never waits behind
them.
"""

from __future__ import annotations

import json
from functools import partial
from typing import Annotated

import anyio
from pydantic import BaseModel, ConfigDict, Field, field_validator
from starlette.requests import Request
from starlette.responses import Response

from precompute.lookup.errors import error, unavailable, validated_body
from precompute.lookup.openapi import search_operation
from precompute.lookup.search import INT64, FilterError, FilterKey, Found, Searcher
from precompute.lookup.served import Endpoint
from precompute.lookup.serving import Serving
from precompute.models import Engine, InvalidInputError
from precompute.stores.errors import StoreUnavailableError, VersionNotFoundError
from precompute.stores.vectors.store import VectorStore


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


class SearchOutput:
    """An embeddings output as the service answers it (lookup/served.py Served)."""

    store = "vector store"

    def __init__(self, service: Serving, name: str, store: VectorStore, engine: Engine) -> None:
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
        timing: dict[str, str] = {}  # a cached answer's steps were another request's
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
                body, timing["Server-Timing"] = answer_body(version, found), server_timing(found)
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
        return Response(body, media_type="application/json", headers=timing)


def filter_key(filter: dict[str, str | int | bool] | None) -> tuple[tuple[str, str, object], ...]:
    """A filter as part of a cache key: True and 1 are equal in Python, not in a payload."""
    return tuple(sorted((key, type(value).__name__, value) for key, value in (filter or {}).items()))


def server_timing(found: Found) -> str:
    steps = [] if found.embed_ms is None else [f"embed;dur={found.embed_ms:.3f}"]
    return ", ".join([*steps, f"index;dur={found.index_ms:.3f}"])


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
