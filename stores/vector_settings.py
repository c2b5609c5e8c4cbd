"""Typed settings of the vector store, read from PRECOMPUTE_QDRANT_* variables."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class VectorStoreSettings(BaseSettings):
    """Where corpus vectors live; every field has an env var PRECOMPUTE_QDRANT_<NAME>."""

    model_config = SettingsConfigDict(env_prefix="PRECOMPUTE_QDRANT_", frozen=True)

    type: Literal["edge", "server"] = "edge"
    """edge: Qdrant's Rust engine in-process (qdrant-edge-py), files under `path`; nothing to
    run, about 1 ms a query, but one machine only. server: a Qdrant server at `url`; shared
    by many service replicas and scales out, at the cost of a network hop and a process to run."""

    path: Path = Path.home() / ".local" / "share" / "precompute" / "qdrant"
    """edge only: the directory of shards. Must be a local disk both the writer (nightly
    flow) and the reader (lookup service) can reach; a network filesystem gives no
    guarantee for the atomic pointer replace that publish relies on."""

    url: str | None = None
    """server only: e.g. http://qdrant:6333. Required when type is server."""

    api_key: str | None = None
    """server only: sent with every request; use it only over https."""

    prefer_grpc: bool = True
    """server only: gRPC (port 6334) for bulk upload and queries, markedly faster than REST
    for large batches; turn off where only the REST port is reachable."""

    name: str = Field("corpus", pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
    """The logical collection readers query: the alias on a server, the directory on edge.
    Each version is stored apart (`<name>-<version>` / `<name>/<version>`)."""

    keep_versions: int = Field(3, ge=0)
    """Versions kept for rollback besides the published one; older ones are deleted whole.
    More means a longer rollback reach at the cost of disk: a 384-d vector alone is 1.5 KB."""
