"""Versioned key lookups in Redis, the reading half: the lookup service's async reader.

One round trip per answer: a pipeline of the HGETs in the version this reader saw last (and
in its base, for an overlay: key_value_overlay.py), then a GET of the pointer. The values are returned only if the pointer still names that
version; otherwise the reader follows the pointer (reading the new version's registry
entry once) and asks again. So every answer comes from one version, and a publish or a
rollback costs readers one extra round trip, never an error. The pointer is read after
the values because a version is deleted only once it is no longer published (its base only
once no registered overlay holds it): if it is still published after the HGETs, they read it whole. (Cluster pipelines go to several
nodes at once and lose that order; there deletion also waits `keep_versions` publishes.)
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Self

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from precompute.stores.errors import StoreUnavailableError, VersionNotFoundError
from precompute.stores.key_value import meta as kv_meta
from precompute.stores.key_value.overlay import Layout, answers, ask
from precompute.stores.key_value.settings import (
    OutputKeys,
    RedisSettings,
    output_keys,
    unavailable_as_store_error,
)

SWITCHES = 3
"""Pointer moves followed within one call before giving up with a retryable error."""
CACHED_VERSIONS = 8
"""Layouts kept (two outputs, a few versions each)."""


def async_client(settings: RedisSettings) -> aioredis.Redis | RedisCluster:
    """A client for the service's event loop: short timeouts, one immediate retry."""
    options: dict[str, Any] = {
        "socket_timeout": settings.socket_timeout,
        "socket_connect_timeout": settings.socket_timeout,
        # One immediate retry replaces a pooled connection a restart broke; more would
        # hold the request while Redis is down, when a quick 503 is the answer.
        "retry": Retry(NoBackoff(), 1),
    }
    cls = RedisCluster if settings.cluster else aioredis.Redis
    return cls.from_url(settings.url, **options)


class KeyValueReader:
    """For the ASGI service; use one instance from one event loop (redis.asyncio connections are bound to it)."""

    def __init__(self, settings: RedisSettings) -> None:
        self.settings = settings
        self._client = async_client(self.settings)
        self._published: dict[str, str] = {}
        """The version each output's pointer named last time: where the next read looks first."""
        self._layouts: dict[tuple[str, str], Layout] = {}

    async def get(self, output: str, item_id: str) -> tuple[str, bytes | None]:
        """(published version, value or None for an unknown id)."""
        version, values = await self.get_many(output, [item_id])
        return version, values[0]

    async def get_many(self, output: str, ids: Sequence[str]) -> tuple[str, list[bytes | None]]:
        """(published version, one value or None per id): all from that one version."""
        keys = output_keys(self.settings, output)
        fields = []
        for i, item_id in enumerate(ids):
            if not isinstance(item_id, str):
                raise ValueError(f"ids[{i}] must be str, got {type(item_id).__name__}")
            fields.append(item_id.encode())
        with unavailable_as_store_error(self.settings):
            version = self._published.get(output)
            if version is None:
                version = await self._follow(keys, await self._client.get(keys.pointer))
            for _ in range(SWITCHES):
                layout = await self._layout(keys, version)
                pipe = self._client.pipeline(transaction=False)
                ask(pipe, keys, layout, fields)
                pipe.get(keys.pointer)
                *values, pointer = await pipe.execute()
                if pointer == version.encode():
                    return version, answers(layout, values, len(fields))
                version = await self._follow(keys, pointer)
        raise StoreUnavailableError(f"the published version of {output!r} kept switching", retry_after=0.1)

    async def meta_owner(self, output: str, version: str) -> str:
        """The version whose meta `version` reads: itself, or the base an overlay shares it with
        (key_value_meta.py), so that a caller keeps one copy of what it makes of a meta."""
        keys = output_keys(self.settings, output)
        with unavailable_as_store_error(self.settings):
            return kv_meta.owner(version, await self._registered(keys, version))

    async def meta(self, output: str, version: str) -> dict[str, Any]:
        """What create_version stored with the version (e.g. its vocabulary); read once per version."""
        keys = output_keys(self.settings, output)
        with unavailable_as_store_error(self.settings):
            entry = await self._registered(keys, version)
            raw = await self._client.get(keys.meta(kv_meta.owner(version, entry)))
        return kv_meta.stored_meta(raw, keys, version, entry)

    async def _follow(self, keys: OutputKeys, pointer: bytes | None) -> str:
        if pointer is None:
            raise VersionNotFoundError(f"nothing of output {keys.output!r} is published")
        version = pointer.decode()
        await self._layout(keys, version)
        self._published[keys.output] = version
        return version

    async def _layout(self, keys: OutputKeys, version: str) -> Layout:
        layout = self._layouts.get((keys.output, version))
        if layout is not None:
            return layout
        layout = self._layouts[keys.output, version] = Layout.of(version, await self._registered(keys, version))
        if len(self._layouts) > CACHED_VERSIONS:
            del self._layouts[next(iter(self._layouts))]
        return layout

    async def _registered(self, keys: OutputKeys, version: str) -> dict[str, Any]:
        raw = await self._client.hget(keys.registry, version)
        if raw is None:
            raise VersionNotFoundError(f"version {version!r} of output {keys.output!r} does not exist")
        return json.loads(raw)

    async def aclose(self) -> None:
        await self._client.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
