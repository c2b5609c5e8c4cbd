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
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from precompute.kinds import registry
from precompute.lookup.errors import Refused, error, unavailable
from precompute.lookup.metrics import RequestMetrics
from precompute.lookup.openapi import openapi_document
from precompute.lookup.served import Endpoint, Handler, Served
from precompute.lookup.serving import Serving
from precompute.pipeline import Pipeline, load_pipeline
from precompute.settings import Machine
from precompute.stores.errors import StoreUnavailableError
from precompute.stores.versions import version_age

log = logging.getLogger("lookup")


class Service(Serving):
    """Every output of the pipeline file as its kind serves it, on what they share (Serving)."""

    def __init__(self, machine: Machine, pipeline: Pipeline) -> None:
        super().__init__(machine.service, machine.redis, machine.engine)
        self.machine = machine
        self.pipeline = pipeline
        self.outputs: dict[str, Served] = {
            name: output.kind.serve(self, output, machine) for name, output in pipeline.declared.items()
        }

    @asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self.start()
        for served in self.outputs.values():
            await served.open()
        self.ready = True
        log.info("serving on http://%s:%d: %s", self.settings.host, self.settings.port, await self.served())
        yield
        self.ready = False
        for served in self.outputs.values():
            await served.close()
        await self.stop()

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
            for kind in registry().values()
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
        expected = None if token is None else token.encode()

        async def wrapped(request: Request) -> Response:
            if expected is not None:
                given = bearer_token(request.headers.get("authorization"))
                if given is None:
                    return error(401, "missing bearer token", headers={"WWW-Authenticate": CHALLENGE})
                if not hmac.compare_digest(given, expected):
                    challenge = f'{CHALLENGE}, error="invalid_token"'
                    return error(401, "wrong bearer token", headers={"WWW-Authenticate": challenge})
            try:
                return await handler(request)
            except Refused as e:
                return e.response

        wrapped.__doc__ = handler.__doc__
        return wrapped


CHALLENGE = 'Bearer realm="precompute"'
"""RFC 6750's challenge on a 401, with error="invalid_token" where a token was given and is wrong."""


def bearer_token(authorization: str | None) -> bytes | None:
    """The token of an `Authorization: Bearer <token>` header (RFC 6750, 2.1): the scheme's case
    does not matter (RFC 9110, 11.1) and one or more spaces part it from the token; None without
    one. Compared as bytes: a header not in ASCII is a wrong token, never a 500."""
    if authorization is None:
        return None
    scheme, _, token = authorization.strip(" \t").partition(" ")
    token = token.lstrip(" ")
    if scheme.lower() != "bearer" or not token:
        return None
    return token.encode("latin-1", errors="replace")


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
