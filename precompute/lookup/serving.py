"""What every served output shares: the service's settings, metrics and caches, the query encoders,
the key reader and the search threads. An output kind's `serve` gets it (service/app.py's Service
is one) and builds its output's answers on it."""

from __future__ import annotations

import os

import anyio

from precompute.lookup.keys import KeyLookups
from precompute.lookup.metrics import Metrics
from precompute.lookup.query_cache import QueryCache
from precompute.lookup.search import Encoders, QueryVector
from precompute.lookup.settings import ServiceSettings
from precompute.lookup.shared_answers import SharedAnswers
from precompute.models.settings import EngineSettings
from precompute.stores.key_value.settings import RedisSettings


class Serving:
    """The resources every served output shares; `start` and `stop` bracket the service's life."""

    def __init__(self, settings: ServiceSettings, redis: RedisSettings, engine: EngineSettings) -> None:
        self.settings = settings
        self.redis = redis
        self.engine = engine
        self.metrics = Metrics()
        cache_bytes = int(settings.query_cache_mb * 2**20)
        self.answers = QueryCache[bytes]("answers", cache_bytes, len, self.metrics)
        self.vectors = QueryCache[QueryVector]("vectors", cache_bytes, lambda v: v.nbytes, self.metrics)
        self.encoders = Encoders(settings)
        self.keys = KeyLookups(settings, redis, self.metrics)
        self.search_threads: anyio.CapacityLimiter | None = None
        """Searches at once: one per core, or a batch's rows per core where queries are batched
        (their threads wait on the batcher). Made in start: it needs the event loop."""
        self.long_searches: anyio.CapacityLimiter | None = None
        """Long queries at once: one core's share fewer than search_threads (at least one)."""
        self.shared: SharedAnswers | None = None
        """Answers in Redis, shared by replicas (ServiceSettings.query_cache_redis); made in start."""
        self.ready = False
        """True once every output is open and its engines warm."""

    def start(self) -> None:
        """The limiters and the shared answers, inside the event loop, before any output opens."""
        per_core = self.settings.query_batch_rows if self.encoders.batched(self.engine) else 1
        cores = len(os.sched_getaffinity(0))
        self.search_threads = anyio.CapacityLimiter(cores * per_core)
        self.long_searches = anyio.CapacityLimiter(max(cores - 1, 1) * per_core)
        if self.settings.query_cache_redis:
            self.shared = SharedAnswers(self.redis, self.settings.query_cache_redis_ttl_s, self.metrics)

    async def stop(self) -> None:
        """After every output closed."""
        self.ready = False
        if self.shared is not None:
            await self.shared.aclose()
            self.shared = None
        self.encoders.close()
