"""An output as the lookup service answers it: what an output kind's `serve` returns.

The service (app.py) mounts each served output's endpoints under /v1/<route>/<output>, and the
first output of each kind also under /v1/<route>; it opens them in its lifespan (stores,
warm engines), asks each for its published version for /readyz, and closes them on shutdown.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import Response

Handler = Callable[[Request], Awaitable[Response]]


@dataclass(frozen=True)
class Endpoint:
    path: str
    """The route's path, as Starlette matches it (`{id:path}`: an id may hold an escaped '/')."""
    method: str
    handler: Handler
    template: str
    """The path as OpenAPI documents it and the metrics label it (`{id}`)."""
    operation: dict[str, Any]
    """Its OpenAPI operation: summary, parameters, request body, responses."""


class Served(Protocol):
    store: str
    """The store it reads, as a 503 names it ("vector store", "key-value store")."""

    def endpoints(self, base: str) -> list[Endpoint]:
        """Its routes under `base` (/v1/<route>/<output> or /v1/<route>)."""
        ...

    async def open(self) -> None:
        """Open its stores and warm its engines, before the service reports ready."""
        ...

    async def version(self) -> str | None:
        """The published version (None before the first publish); StoreUnavailableError while
        its store is down."""
        ...

    def engine(self, version: str) -> str | None:
        """backend/device/precision of the engine that answers for `version`; None without one."""
        ...

    async def close(self) -> None: ...
