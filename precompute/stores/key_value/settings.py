"""Typed settings of the key-value store (PRECOMPUTE_REDIS_*), and the key layout they define.

The layout lives here, and nowhere else, because both halves need it: the writer
(key_value.py, which imports Ray) and the service's reader (key_value_reader.py, which must not).

    {pc:labels}:current                   string: the published version; publish is one SET
    {pc:labels}:versions                  hash: version -> JSON {rows, buckets, created, [base...]}
    {pc:labels}:20261122T031500-ab12cd:meta string: that version's meta (JSON), e.g. its vocabulary
    {pc:labels}:dropping                  hash: versions being deleted (moved here from :versions)
    {pc:labels}:bases                     hash: overlay version -> the version it overlays
    pc:labels:20261122T031500-ab12cd:{17} hash: item id -> value, bucket 17 of that version

Records are grouped Instagram-style into small hashes, which Redis keeps as listpacks (one
allocation, about two bytes of framing per field and value) as long as a hash holds at
most `hash-max-listpack-entries` fields (512 by default in Redis 7.0) of at most
`hash-max-listpack-value` bytes each (64: a top-10 ranked value is 60, and ids must stay
under it too). A key per record costs several times the overhead instead (`precompute bench
publish` measures both). Cluster:
the bookkeeping keys of an output (and its versions' meta) share one hash tag, so the scripts
that check and flip them touch one slot; buckets are tagged by number, so a version spreads over slots.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import redis
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict
from redis.backoff import ExponentialWithJitterBackoff
from redis.cluster import RedisCluster
from redis.exceptions import (
    ClusterDownError,
    ConnectionError,
    RedisClusterException,
    TimeoutError,
    TryAgainError,
)
from redis.retry import Retry

from precompute.stores.errors import StoreUnavailableError

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
UNAVAILABLE = (ConnectionError, TimeoutError, ClusterDownError, TryAgainError, RedisClusterException)
"""What redis-py raises while Redis is down, overloaded or failing over: retryable.
RedisClusterException is what a cluster client raises when no node is reachable."""


class RedisSettings(BaseSettings):
    """Where key lookups live; every field has an env var PRECOMPUTE_REDIS_<NAME>."""

    model_config = SettingsConfigDict(env_prefix="PRECOMPUTE_REDIS_", frozen=True, use_attribute_docstrings=True)

    url: str = "redis://127.0.0.1:6379/0"
    """redis:// or rediss:// (TLS); with `cluster`, any one node of the cluster."""

    cluster: bool = False
    """Talk Redis Cluster (slot routing, MOVED handling). The key layout is the same either way."""

    prefix: str = Field("pc", pattern=_NAME.pattern)
    """First part of every key: separates deployments sharing one Redis."""

    entries_per_bucket: int = Field(100, ge=1, le=400)
    """Mean records per hash. Buckets vary around the mean (crc32 of the id, about +-10% at
    100); one past `hash-max-listpack-entries` (512; some deployments set 128, which 0.3%
    of buckets would pass at 100) becomes a hash table, markedly larger. A lookup scans
    its bucket's listpack, so buckets stay small; fewer records per bucket add per-key
    overhead (about 100 bytes a key). Fixed per version at create_version."""

    socket_timeout: float = Field(0.5, gt=0)
    """Seconds to connect or wait for a reply; past it the service answers 503 instead of hanging."""

    write_batch: int = Field(50_000, ge=1)
    """Records per pipelined round trip when writing, and per Ray write task. Larger puts
    more records into each HSET, which is what makes writes fast (`precompute bench publish`);
    a pipeline of 50,000 records is about 5 MB, and Redis serves other clients between its
    16 KB reads of it."""


def check_output(output: str) -> str:
    """Outputs become key parts: refuse ':' and braces, which would break the layout."""
    if not isinstance(output, str) or not _NAME.match(output):
        raise ValueError(f"output {output!r} is not a valid output name (letters, digits, '_', '-')")
    return output


def bucket_of(item_id: bytes, buckets: int) -> int:
    """Stable across processes and releases (unlike hash()): writer and reader must agree."""
    return zlib.crc32(item_id) % buckets


def buckets_of(item_ids: list[bytes], buckets: int) -> list[int]:
    """`bucket_of` for many ids, without a Python call per id (the write path's loop)."""
    crc32 = zlib.crc32
    return [crc32(item_id) % buckets for item_id in item_ids]


@dataclass(frozen=True, slots=True)
class OutputKeys:
    """Every key of one output."""

    prefix: str
    output: str

    @property
    def pointer(self) -> str:
        return f"{{{self.prefix}:{self.output}}}:current"

    @property
    def registry(self) -> str:
        return f"{{{self.prefix}:{self.output}}}:versions"

    @property
    def published(self) -> str:
        """Versions that were ever published (a rollback's targets), and when they last were."""
        return f"{{{self.prefix}:{self.output}}}:published"

    @property
    def dropping(self) -> str:
        return f"{{{self.prefix}:{self.output}}}:dropping"

    @property
    def bases(self) -> str:
        """Registered overlay versions -> the whole version each overlays (key_value_overlay.py)."""
        return f"{{{self.prefix}:{self.output}}}:bases"

    def meta(self, version: str) -> str:
        """What create_version stored with the version (e.g. a 1M-item vocabulary, 16 MB of
        JSON), apart from its registry entry so that reading a bucket count or listing the
        versions never decodes it; in the registry's slot, so one script writes both."""
        return f"{{{self.prefix}:{self.output}}}:{version}:meta"

    def bucket(self, version: str, bucket: int) -> str:
        return f"{self.prefix}:{self.output}:{version}:{{{bucket}}}"


def output_keys(settings: RedisSettings, output: str) -> OutputKeys:
    return OutputKeys(settings.prefix, check_output(output))


@contextmanager
def unavailable_as_store_error(settings: RedisSettings) -> Iterator[None]:
    """Turn redis-py's transient errors into StoreUnavailableError (the service's 503)."""
    try:
        yield
    except UNAVAILABLE as e:
        where = re.sub(r"//[^@/]*@", "//", settings.url)  # no password in logs
        raise StoreUnavailableError(f"Redis at {where} is unavailable: {e}") from e


Client = redis.Redis | RedisCluster


def connect(settings: RedisSettings) -> Client:
    """A few quick retries: a job rides out a blip, HSET and UNLINK being safe to repeat."""
    options: dict[str, Any] = {
        "socket_timeout": settings.socket_timeout,
        "socket_connect_timeout": settings.socket_timeout,
        "retry": Retry(ExponentialWithJitterBackoff(cap=0.5, base=0.01), 3),
    }
    with unavailable_as_store_error(settings):
        if settings.cluster:
            return RedisCluster.from_url(settings.url, **options)
        return redis.Redis.from_url(settings.url, **options)
