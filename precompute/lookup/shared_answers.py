"""A Redis tier behind the in-process answer cache (lookup/query_cache.py), so that replicas
share the answers any one of them computed: a search that misses its process's cache looks in
Redis before it embeds, and a computed answer is stored there too.

Off by default (ServiceSettings.query_cache_redis). An entry's key holds its output and version,
so a new version's searches never read an older one's answers; entries expire after
`query_cache_redis_ttl_s`, which bounds what the cache holds in the Redis that also holds the
outputs. Redis failing here never fails a search: the search is computed as if it missed, and
the metric precompute_query_cache_total{cache="answers_redis",result="error"} counts it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable

from redis.exceptions import RedisError

from precompute.lookup.metrics import Metrics
from precompute.stores.key_value.reader import async_client
from precompute.stores.key_value.settings import RedisSettings

CACHE = "answers_redis"


class SharedAnswers:
    def __init__(self, settings: RedisSettings, ttl_s: int, metrics: Metrics) -> None:
        self._client = async_client(settings)
        self._prefix = f"{settings.prefix}:answers"
        self._ttl_s = ttl_s
        self._results = {
            result: metrics.query_cache.labels(CACHE, result) for result in ("hit", "miss", "error")
        }

    def key(self, output: str, version: str, request: Hashable) -> str:
        digest = hashlib.sha256(repr(request).encode()).hexdigest()[:32]
        return f"{self._prefix}:{output}:{version}:{digest}"

    async def get(self, output: str, version: str, request: Hashable) -> bytes | None:
        try:
            body = await self._client.get(self.key(output, version, request))
        except (RedisError, OSError):
            self._results["error"].inc()
            return None
        self._results["miss" if body is None else "hit"].inc()
        return body

    async def put(self, output: str, version: str, request: Hashable, body: bytes) -> None:
        try:
            await self._client.set(self.key(output, version, request), body, ex=self._ttl_s)
        except (RedisError, OSError):
            self._results["error"].inc()

    async def aclose(self) -> None:
        await self._client.aclose()
