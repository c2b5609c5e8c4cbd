"""The ASGI app: search (lookup/search.py), key lookups (lookup/keys.py), `/healthz`, `/readyz`,
`/metrics`, `/openapi.json`.

Every output of the pipeline file is served under its name (`POST /v1/search/{name}`,
`GET /v1/labels/{name}/{id}`, `GET /v1/recs/{name}/{id}`, `POST /v1/labels/{name}:batchGet`, ...);
the unnamed routes answer from the first output of each kind. A search is answered from the
query cache (lookup/query_cache.py) on the event loop, else embeds the query (about 1-2 ms
for a short query with the INT8 engine) and searches the published version on a search
thread, at most one per core, so key lookups never wait behind an embedding. The store
readers follow the version pointers, so a new publication is served without a restart. An
unnamed route's id that starts with an output's name and a `/` reaches that output: such ids
are read through the named route.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import numpy as np
from precompute.lookup.errors import Refused, error, unavailable, validated_body
from precompute.lookup.keys import LABELS, RECS, Handler, KeyLookups
from precompute.lookup.metrics import Metrics
from precompute.lookup.openapi import openapi_document
from precompute.lookup.query_cache import QueryCache
from precompute.lookup.search import Encoders, FilterError, Searcher, SearchRequest
from precompute.lookup.settings import ServiceSettings
from precompute.lookup.shared_answers import SharedAnswers
from precompute.models import EngineSettings, InvalidInputError
from precompute.stores.errors import StoreUnavailableError, VersionNotFoundError
from precompute.stores.key_value_reader import KeyValueReader
from precompute.stores.redis_settings import RedisSettings
from precompute.stores.vector_settings import VectorStoreSettings
from precompute.stores.vectors import Hit, open_vector_store, version_age
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from precompute.pipeline import Pipeline, load_pipeline

log = logging.getLogger("lookup")


class Service:
    """Owns the engine and the store readers; handlers are its methods and KeyLookups'."""

    def __init__(
        self,
        settings: ServiceSettings,
        engine: EngineSettings,
        stores: VectorStoreSettings,
        redis: RedisSettings,
        pipeline: Pipeline,
    ) -> None:
        self.settings = settings
        self.pipeline = pipeline
        self.engine_settings = engine
        self.encoders = Encoders(settings)
        self.store_settings = stores
        self.redis_settings = redis
        self.metrics = Metrics()
        cache_bytes = int(settings.query_cache_mb * 2**20)
        self.answers = QueryCache[bytes]("answers", cache_bytes, len, self.metrics)
        self.vectors = QueryCache[np.ndarray]("vectors", cache_bytes, lambda v: v.nbytes, self.metrics)
        self.search_threads: anyio.CapacityLimiter | None = None
        """Searches at once: one per core, or a batch's rows per core where queries are batched
        (their threads wait on the batcher). Made in lifespan: it needs the event loop."""
        self.searchers: dict[str, Searcher] = {}
        """Embeddings outputs by name; empty until warm."""
        self.keys = KeyLookups(settings, self.metrics, pipeline)
        self.shared: SharedAnswers | None = None
        """Answers in Redis, shared by replicas (ServiceSettings.query_cache_redis); made in lifespan."""

    @asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        per_core = self.settings.query_batch_rows if self.encoders.batched(self.engine_settings) else 1
        self.search_threads = anyio.CapacityLimiter(len(os.sched_getaffinity(0)) * per_core)
        searchers = {}
        for name in self.pipeline.of_kind("embeddings"):
            store = open_vector_store(self.pipeline.vector_settings(name, self.store_settings))
            engine = self.pipeline.engine_settings(name, self.engine_settings)
            searcher = Searcher(name, store, self.encoders, engine, self.vectors)
            await anyio.to_thread.run_sync(searcher.warm, self.settings.warmup_queries)
            searchers[name] = searcher
        self.searchers = searchers
        self.keys.reader = KeyValueReader(self.redis_settings)
        if self.settings.query_cache_redis:
            self.shared = SharedAnswers(
                self.redis_settings, self.settings.query_cache_redis_ttl_s, self.metrics
            )
        log.info("serving on http://%s:%d: %s", self.settings.host, self.settings.port, await self.served())
        yield
        await self.keys.reader.aclose()
        if self.shared is not None:
            await self.shared.aclose()
            self.shared = None
        self.keys.reader = None
        for searcher in self.searchers.values():
            searcher.store.close()
        self.searchers = {}
        self.encoders.close()

    async def served(self) -> str:
        """Each output and the version it serves, for the start-up line of the log."""
        versions: dict[str, str | None] = {}
        for name, searcher in self.searchers.items():
            try:
                versions[name] = searcher.store.current()
            except StoreUnavailableError as e:
                searcher.health.failed(e)
                versions[name] = "(store unavailable)"
        try:
            versions.update(await self.keys.versions())
        except StoreUnavailableError as e:
            self.keys.health.failed(e)
            versions.update(dict.fromkeys(self.keys.outputs, "(store unavailable)"))
        return ", ".join(
            f"{name} {versions.get(name) or '(nothing published)'}" for name in self.pipeline.outputs
        )

    def search(self, name: str) -> Handler:
        async def search(request: Request) -> Response:
            return await self.search_output(name, request)

        search.__doc__ = f"Embed `query`, return the `k` nearest documents of {name}'s published version."
        return search

    async def search_output(self, name: str, request: Request) -> Response:
        """Embed `query`, return the `k` nearest documents of the published version (with `filter`)."""
        req = await validated_body(request, SearchRequest, self.settings)
        if len(req.query) > self.settings.max_query_chars:
            return error(
                422, f"query is longer than {self.settings.max_query_chars} characters", field="query"
            )
        if req.k > self.settings.max_k:
            return error(422, f"k must be at most {self.settings.max_k}", field="k")
        searcher = self.searchers.get(name)
        if searcher is None:
            return error(503, "warming up", headers={"Retry-After": "1"})
        key = (req.query, req.k, filter_key(req.filter))
        try:
            version = searcher.store.serving()
            body = self.answers.get_answer(name, version, key)
            if body is None and self.shared is not None:
                body = await self.shared.get(name, version, key)
                if body is not None:
                    self.answers.put_answer(name, version, key, body)
            if body is None:
                hits = await anyio.to_thread.run_sync(
                    searcher.search, version, req.query, req.k, req.filter, limiter=self.search_threads
                )
                body = answer_body(version, hits)
                self.answers.put_answer(name, version, key, body)
                if self.shared is not None:
                    await self.shared.put(name, version, key, body)
        except InvalidInputError as e:
            return error(422, e.reason, field="query")
        except FilterError as e:
            return error(422, str(e), field=f"filter.{e.key}")
        except VersionNotFoundError:
            return error(503, f"no version of {name} is published yet", headers={"Retry-After": "5"})
        except StoreUnavailableError as e:
            self.metrics.store_errors.labels(name).inc()
            searcher.health.failed(e)
            return unavailable("vector store", e)
        searcher.health.ok()
        return Response(body, media_type="application/json")

    async def healthz(self, request: Request) -> Response:
        """The process is alive."""
        return JSONResponse({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        """Ready once the engine is warm and both stores answer; 503 with the reason before.

        An output not published yet does not hold readiness back (its version is null, its
        reads answer 503): outputs are published independently, and a service that serves
        only some of them is still ready to serve those.
        """
        if not self.searchers and self.pipeline.of_kind("embeddings"):
            return error(503, "warming up", headers={"Retry-After": "1"})
        versions: dict[str, str | None] = {}
        engines: dict[str, str] = {}
        for name, searcher in self.searchers.items():
            try:
                versions[name] = searcher.store.current()
            except StoreUnavailableError as e:
                searcher.health.failed(e)
                return unavailable("vector store", e)
            searcher.health.ok()
            if versions[name] is not None:
                report = searcher.encoder_for(versions[name]).report
                engines[name] = f"{report.backend}/{report.device}/{report.precision}"
        try:
            versions.update(await self.keys.versions())
        except StoreUnavailableError as e:
            self.keys.health.failed(e)
            return unavailable("key-value store", e)
        self.keys.health.ok()
        for output, version in versions.items():
            if version is not None:
                self.metrics.version_age.labels(output).set(version_age(version))
        return JSONResponse({"status": "ready", "versions": versions, "engines": engines})

    async def metrics_endpoint(self, request: Request) -> Response:
        return Response(self.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    def timed(self, route: str, handler: Handler) -> Handler:
        """Latency histogram per route, and optional bearer-token auth on /v1/*."""
        token = self.settings.auth_token
        expected = None if token is None else f"Bearer {token}".encode()

        async def wrapped(request: Request) -> Response:
            start = time.perf_counter()
            if (
                expected is not None
                and route.startswith("/v1/")
                and not hmac.compare_digest(request.headers.get("authorization", "").encode(), expected)
            ):
                response: Response = error(401, "missing or wrong bearer token")
            else:
                try:
                    response = await handler(request)
                except Refused as e:
                    response = e.response
            self.metrics.latency.labels(route, str(response.status_code)).observe(time.perf_counter() - start)
            return response

        wrapped.__doc__ = handler.__doc__
        return wrapped


def filter_key(filter: dict[str, str | int | bool] | None) -> tuple[tuple[str, str, object], ...]:
    """A filter as part of a cache key: True and 1 are equal in Python, not in a payload."""
    return tuple(sorted((key, type(value).__name__, value) for key, value in (filter or {}).items()))


def answer_body(version: str, hits: list[Hit]) -> bytes:
    return json.dumps(
        {"version": version, "hits": [{"id": h.id, "score": h.score, "payload": h.payload} for h in hits]},
        ensure_ascii=False,
        allow_nan=False,
        separators=(",", ":"),
    ).encode()


def create_app(
    settings: ServiceSettings | None = None,
    engine: EngineSettings | None = None,
    stores: VectorStoreSettings | None = None,
    redis: RedisSettings | None = None,
    pipeline: Pipeline | None = None,
) -> Starlette:
    """Settings left out are read from their PRECOMPUTE_* variables; the pipeline from its file."""
    pipeline = pipeline or load_pipeline()
    service = Service(
        settings or ServiceSettings(),
        engine or EngineSettings(),
        stores or VectorStoreSettings(),
        redis or RedisSettings(),
        pipeline,
    )
    keys = service.keys
    routes = []
    for name in pipeline.of_kind("embeddings"):
        named = f"/v1/search/{name}"
        routes.append(Route(named, service.timed(named, service.search(name)), methods=["POST"]))
    if (name := pipeline.default("embeddings")) is not None:
        routes.append(
            Route("/v1/search", service.timed("/v1/search", service.search(name)), methods=["POST"])
        )
    for kind in (LABELS, RECS):
        named = [(name, f"/v1/{kind.name}/{name}") for name in pipeline.of_kind(kind.name)]
        default = pipeline.default(kind.name)
        # Named routes first: a literal output name before the unnamed route's {id:path}.
        for name, base in [*named, *([(default, f"/v1/{kind.name}")] if default else [])]:
            single, batch = f"{base}/{{id}}", f"{base}:batchGet"
            routes += [
                # `:path`: an id may hold a '/' (sent as %2F); metrics label the route by its template.
                Route(f"{base}/{{id:path}}", service.timed(single, keys.get(name)), methods=["GET"]),
                Route(batch, service.timed(batch, keys.batch_get(name)), methods=["POST"]),
            ]
    routes += [
        Route("/healthz", service.timed("/healthz", service.healthz)),
        Route("/readyz", service.timed("/readyz", service.readyz)),
        Route("/metrics", service.metrics_endpoint, include_in_schema=False),
    ]

    document = openapi_document(SearchRequest, LABELS.batch_model, RECS.batch_model)

    async def openapi(request: Request) -> Response:
        return JSONResponse(document)

    routes.append(Route("/openapi.json", openapi, include_in_schema=False))
    app = Starlette(routes=routes, lifespan=service.lifespan)
    app.state.service = service
    return app
