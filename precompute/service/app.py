"""The ASGI app: every output of the pipeline file served by its kind, `/healthz`, `/readyz`, `/metrics`,
`/openapi.json`.

Each output is served under its name (`POST /v1/search/{name}`, `GET /v1/labels/{name}/{id}`,
`POST /v1/recs/{name}:batchGet`, ...); the unnamed routes (`/v1/search`, `/v1/labels/{id}`, ...)
answer from the first output of each kind. An unnamed route's id that starts with an output's
name and a `/` reaches that output: such ids are read through the named route. The store
readers follow the version pointers, so a new publication is served without a restart.
"""

from __future__ import annotations

import hmac
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from precompute.kinds import kinds
from precompute.lookup.errors import Refused, error, unavailable
from precompute.lookup.keys import KeyLookups
from precompute.lookup.metrics import Metrics, RequestMetrics
from precompute.lookup.openapi import openapi_document
from precompute.lookup.query_cache import QueryCache
from precompute.lookup.search import Encoders, QueryVector
from precompute.lookup.served import Endpoint, Handler, Served
from precompute.lookup.shared_answers import SharedAnswers
from precompute.pipeline import Pipeline, load_pipeline
from precompute.settings import Machine
from precompute.stores.errors import StoreUnavailableError
from precompute.stores.versions import version_age

log = logging.getLogger("lookup")


class Service:
    """What every served output shares: settings, caches, the query encoders, the key reader."""

    def __init__(self, machine: Machine, pipeline: Pipeline) -> None:
        self.machine = machine
        self.settings = machine.service
        self.pipeline = pipeline
        self.metrics = Metrics()
        cache_bytes = int(self.settings.query_cache_mb * 2**20)
        self.answers = QueryCache[bytes]("answers", cache_bytes, len, self.metrics)
        self.vectors = QueryCache[QueryVector]("vectors", cache_bytes, lambda v: v.nbytes, self.metrics)
        self.encoders = Encoders(self.settings)
        self.keys = KeyLookups(self.settings, machine.redis, self.metrics)
        self.search_threads: anyio.CapacityLimiter | None = None
        """Searches at once: one per core, or a batch's rows per core where queries are batched
        (their threads wait on the batcher). Made in lifespan: it needs the event loop."""
        self.long_searches: anyio.CapacityLimiter | None = None
        """Long queries at once: one core's share fewer than search_threads (at least one)."""
        self.shared: SharedAnswers | None = None
        """Answers in Redis, shared by replicas (ServiceSettings.query_cache_redis); made in lifespan."""
        self.ready = False
        """True once every output is open and its engines warm."""
        self.outputs: dict[str, Served] = {name: pipeline.kind(name).serve(self, name) for name in pipeline.outputs}

    @asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        per_core = self.settings.query_batch_rows if self.encoders.batched(self.machine.engine) else 1
        cores = len(os.sched_getaffinity(0))
        self.search_threads = anyio.CapacityLimiter(cores * per_core)
        self.long_searches = anyio.CapacityLimiter(max(cores - 1, 1) * per_core)
        for served in self.outputs.values():
            await served.open()
        if self.settings.query_cache_redis:
            self.shared = SharedAnswers(self.machine.redis, self.settings.query_cache_redis_ttl_s, self.metrics)
        self.ready = True
        log.info("serving on http://%s:%d: %s", self.settings.host, self.settings.port, await self.served())
        yield
        self.ready = False
        if self.shared is not None:
            await self.shared.aclose()
            self.shared = None
        for served in self.outputs.values():
            await served.close()
        self.encoders.close()

    async def served(self) -> str:
        """Each output and the version it serves, for the start-up line of the log."""
        lines = []
        for name, served in self.outputs.items():
            try:
                version = await served.version()
            except StoreUnavailableError:
                version = "(store unavailable)"
            lines.append(f"{name} {version or '(nothing published)'}")
        return ", ".join(lines)

    def endpoints(self) -> list[Endpoint]:
        """Every output's under its name, then the first of each kind's under the kind's route: a
        literal output name before the unnamed route's {id:path}."""
        named = [
            endpoint
            for name, served in self.outputs.items()
            for endpoint in served.endpoints(f"/v1/{self.pipeline.kind(name).route}/{name}")
        ]
        defaults = [
            endpoint
            for kind in kinds()
            if (name := self.pipeline.default(kind.name)) is not None
            for endpoint in self.outputs[name].endpoints(f"/v1/{kind.route}")
        ]
        return named + defaults

    async def healthz(self, request: Request) -> Response:
        """The process is alive."""
        return JSONResponse({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        """Ready once every output is open and its store answers; 503 with the reason before.

        An output not published yet does not hold readiness back (its version is null, its
        reads answer 503): outputs are published independently, and a service that serves
        only some of them is still ready to serve those.
        """
        if not self.ready:
            return error(503, "warming up", headers={"Retry-After": "1"})
        versions: dict[str, str | None] = {}
        engines: dict[str, str] = {}
        for name, served in self.outputs.items():
            try:
                versions[name] = version = await served.version()
            except StoreUnavailableError as e:
                return unavailable(served.store, e)
            if version is not None:
                self.metrics.version_age.labels(name).set(version_age(version))
                if (engine := served.engine(version)) is not None:
                    engines[name] = engine
        return JSONResponse({"status": "ready", "versions": versions, "engines": engines})

    async def metrics_endpoint(self, request: Request) -> Response:
        return Response(self.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    def guarded(self, handler: Handler) -> Handler:
        """The bearer token checked first, when the service has one (a data route's: /v1/*); a
        Refused's answer given (lookup/errors.py)."""
        token = self.settings.auth_token
        expected = None if token is None else f"Bearer {token}".encode()

        async def wrapped(request: Request) -> Response:
            if expected is not None and not hmac.compare_digest(
                request.headers.get("authorization", "").encode(), expected
            ):
                return error(401, "missing or wrong bearer token")
            try:
                return await handler(request)
            except Refused as e:
                return e.response

        wrapped.__doc__ = handler.__doc__
        return wrapped


def create_app(machine: Machine | None = None, pipeline: Pipeline | None = None) -> Starlette:
    """Settings left out are read from their PRECOMPUTE_* variables; the pipeline from its file."""
    service = Service(machine or Machine.from_environment(), pipeline or load_pipeline())
    endpoints = service.endpoints()
    routes = [Route(e.path, service.guarded(e.handler), methods=[e.method]) for e in endpoints]
    routes += [
        Route("/healthz", service.healthz),
        Route("/readyz", service.readyz),
        Route("/metrics", service.metrics_endpoint, include_in_schema=False),
    ]
    document = openapi_document(endpoints)

    async def openapi(request: Request) -> Response:
        return JSONResponse(document)

    routes.append(Route("/openapi.json", openapi, include_in_schema=False))
    metrics = Middleware(RequestMetrics, latency=service.metrics.latency)
    app = Starlette(routes=routes, middleware=[metrics], lifespan=service.lifespan)
    app.state.service = service
    return app
