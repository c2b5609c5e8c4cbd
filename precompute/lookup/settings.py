"""Typed settings of the lookup service, read from PRECOMPUTE_SERVICE_* variables."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class ServiceSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PRECOMPUTE_SERVICE_", frozen=True, use_attribute_docstrings=True)

    host: str = "127.0.0.1"
    """The address the service listens on (0.0.0.0: every interface)."""
    port: int = Field(8000, ge=1, le=65535)
    """The port the service listens on, shared by its workers."""
    auth_token: str | None = None
    """When set, /v1/* requires `Authorization: Bearer <token>`; health and metrics stay open."""

    max_query_chars: int = Field(20_000, ge=1)
    """Longer queries are refused (422): a body that long is not a query. Shorter ones are cut to
    max_query_tokens instead."""

    max_query_tokens: int | None = Field(None, ge=2)
    """Queries are cut to this many tokens (None: the model's window, 256 for MiniLM), and the
    answer then says `query_cut_to_tokens`: a lower cap bounds the latency of the longest query
    (`precompute bench fidelity` measures each length)."""

    long_query_chars: int = Field(256, ge=1)
    """Queries longer than this (about 60 tokens) run on all search threads but one at most, so
    a short query always finds one free: a 256-token query costs what ten 16-token ones do."""

    max_k: int = Field(100, ge=1)
    """Largest `k` of a search or a recommendation read (recommendations return at most what was stored)."""

    max_id_chars: int = Field(256, ge=1)
    """Longer ids in key lookups are refused (422) before they reach Redis."""

    max_body_bytes: int = Field(262_144, ge=1024)
    """Larger request bodies are refused (413) unread: a full batchGet of long ids fits."""

    max_headers: int = Field(64, ge=8, le=1024)
    """Requests with more header fields are refused (431) before the app sees them."""

    max_header_bytes: int = Field(16_384, ge=1024)
    """Requests whose header fields (names and values) add up to more are refused (431): a
    bearer token and a browser's cookies fit."""

    request_timeout_s: float = Field(10.0, gt=0)
    """A request's head (line and headers) must arrive within this after its connection opened or
    its previous answer left, else the connection is closed; its body then within this again, else
    408. Idle, half-open and byte-at-a-time clients hold no socket for longer."""

    workers: int = Field(1, ge=1, le=64)
    """Processes serving the port, each with its own engine and store readers: searches embed in
    parallel across them, at the memory of one engine each. `precompute bench capacity` measures 1 and 2."""

    max_connections: int = Field(1000, ge=1)
    """Connections (and requests in flight) beyond this get 503 at once, before any work."""

    max_batch_ids: int = Field(500, ge=1)
    """Ids per batchGet: one pipeline of that many reads, and an answer about that many times
    a single one; larger batches hold the event loop (and Redis) longer for everyone else."""

    query_cache_mb: float = Field(32.0, ge=0)
    """Bytes of each of the two query caches (answers, query vectors; lookup/query_cache.py),
    per worker process; 0 turns them off."""

    query_cache_redis: bool = False
    """Also keep answers in Redis (the key lookups' server; lookup/shared_answers.py), so replicas
    share what any one computed: a search that misses this process's cache looks there first."""

    query_cache_redis_ttl_s: int = Field(3600, ge=1)
    """How long an answer stays in Redis: this bounds the cache there (answers per hour x size)."""

    query_batch: Literal["auto", "on", "off"] = "auto"
    """Micro-batching of queries that arrive together (lookup/query_batcher.py). auto: on where the
    query engine runs on a GPU; on CPUs a batch cost more per query than a query alone
    (`precompute bench query-engines`)."""

    query_batch_rows: int = Field(8, ge=1, le=256)
    """Queries per batch, at most; every batch has this many rows."""

    query_batch_wait_ms: float = Field(1.0, ge=0, le=100)
    """How long the first query of a batch waits for others to join."""

    warmup_queries: int = Field(20, ge=1)
    """Dummy queries run before /readyz turns ready, so the first real query is not the slowest."""
