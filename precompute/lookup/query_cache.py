"""The search path's caches: query text -> vector, and search request -> answer.

Real query traffic repeats (a few queries make up much of it), and a repeated search costs
an embedding (milliseconds of CPU) and an index search for an answer that has not changed.

    vectors  (model hash, query) -> the query's vector. A vector depends only on the model, so
             it outlives versions made by the same model.
    answers  (output, version, query, k, filter) -> the answer's JSON bytes. An answer dies with
             its version: the first answer kept for an output's new version drops every entry
             of the output's older ones.

Both are LRUs bounded in bytes (cachetools), shared by the event loop and the search threads
under a lock. Their hits, misses and bytes are Prometheus metrics; the hit ratio is
hits / (hits + misses) of precompute_query_cache_total.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

import numpy as np
from cachetools import LRUCache

from precompute.lookup.metrics import Metrics

Value = TypeVar("Value", bytes, np.ndarray)


class QueryCache(Generic[Value]):
    def __init__(self, name: str, max_bytes: int, size: Callable[[Value], int], metrics: Metrics) -> None:
        self.max_bytes = max_bytes
        """What the entries may hold in all (0: the cache is off)."""
        self._entries: LRUCache[Hashable, Value] = LRUCache(maxsize=max(max_bytes, 1), getsizeof=size)
        self._enabled = max_bytes > 0
        self._lock = threading.Lock()
        self._hits = metrics.query_cache.labels(name, "hit")
        self._misses = metrics.query_cache.labels(name, "miss")
        self._bytes = metrics.query_cache_bytes.labels(name)
        self._versions: dict[str, str] = {}

    def get(self, key: Hashable) -> Value | None:
        if not self._enabled:
            return None
        with self._lock:
            value = self._entries.get(key)
        (self._misses if value is None else self._hits).inc()
        return value

    def put(self, key: Hashable, value: Value) -> None:
        if not self._enabled:
            return
        with self._lock:
            try:
                self._entries[key] = value
            except ValueError:  # larger than the whole cache: not kept
                pass
            self._bytes.set(self._entries.currsize)

    def put_answer(self, output: str, version: str, key: Hashable, value: Value) -> None:
        """Keep an answer of `version`; the output's first one from a new version drops the older ones'."""
        if self._versions.get(output) != version:
            with self._lock:
                for stale in [k for k in self._entries if k[0] == output and k[1] != version]:  # type: ignore[index]
                    del self._entries[stale]
            self._versions[output] = version
        self.put((output, version, key), value)

    def get_answer(self, output: str, version: str, key: Hashable) -> Value | None:
        return self.get((output, version, key))

    def __len__(self) -> int:
        return len(self._entries)
