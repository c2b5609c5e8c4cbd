"""Typed settings of the lookup service, read from PRECOMPUTE_SERVICE_* variables."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class ServiceSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PRECOMPUTE_SERVICE_", frozen=True)

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    auth_token: str | None = None
    """When set, /v1/* requires `Authorization: Bearer <token>`; health and metrics stay open."""

    max_query_chars: int = Field(1000, ge=1)
    """Longer queries are refused (422), not truncated: a query that long is a client bug."""

    max_k: int = Field(100, ge=1)
    """Largest `k` of a search or a recommendation read (recommendations return at most what was stored)."""

    max_id_chars: int = Field(256, ge=1)
    """Longer ids in key lookups are refused (422) before they reach Redis."""

    max_batch_ids: int = Field(500, ge=1)
    """Ids per batchGet: one pipeline of that many reads, and an answer about that many times
    a single one; larger batches hold the event loop (and Redis) longer for everyone else."""

    warmup_queries: int = Field(20, ge=1)
    """Dummy queries run before /readyz turns ready, so the first real query is not the slowest."""
