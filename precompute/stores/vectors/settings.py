"""Typed settings of the vector store, read from PRECOMPUTE_QDRANT_* variables."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

Quantization = Literal["none", "int8"]
"""A version's stored vectors: FP32 only, or also a scalar INT8 copy (held in RAM) that the HNSW
search walks, its top `k x QUANTIZED_OVERSAMPLING` candidates then rescored with the FP32
vectors, so scores stay exact cosines: a quarter of the memory per vector in the hot path and
faster distance computations, for a little recall, which the nightly flow gates like any
precision. The originals stay on disk beside it. Fixed when a version is created; readers need
no setting."""

QUANTIZED_OVERSAMPLING = 2.0
"""INT8 versions: candidates rescored with the FP32 vectors per result asked for: at Qdrant's
default of 1.0 the demo corpus's recall@10 fell under the flow's gate (`precompute bench
vectors` reports INT8's recall@10)."""


class VectorStoreSettings(BaseSettings):
    """Where corpus vectors live; every field has an env var PRECOMPUTE_QDRANT_<NAME>."""

    model_config = SettingsConfigDict(env_prefix="PRECOMPUTE_QDRANT_", frozen=True, use_attribute_docstrings=True)

    type: Literal["edge", "server"] = "edge"
    """edge: Qdrant's Rust engine in-process (qdrant-edge-py), files under `path`; nothing to
    run and no network hop, but one machine only. server: a Qdrant server at `url`; shared
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

    full_scan_threshold_kb: int = Field(1_000, ge=1)
    """A version (or segment) smaller than this many KB of vectors is searched by exact scan,
    a larger one through its HNSW graph; fixed when a version is created. Qdrant's default
    is 10,000 (about 6,500 x 384); ours is lower because a scan reads every vector, and at
    low request rates other work evicts them from the CPU caches between queries, where the
    graph reads a few (`precompute bench vectors`)."""

    graph_points: int = Field(100_000, ge=1_000)
    """edge only: the most points one HNSW graph holds; a larger version is built as several
    graphs over parts of at most this many points, so its build grows linearly with the corpus.
    One graph over every point grew as N log N, and slower still once it outgrew the CPU caches. A
    search walks each graph, and small graphs keep more of the exact neighbours at a given
    `hnsw_ef`, which the nightly index check then lowers (`precompute bench vectors`). A Qdrant server
    bounds its own segments (its `max_segment_size`)."""

    max_hnsw_ef: int = Field(1024, ge=1)
    """The most the nightly index check raises a version's `hnsw_ef` to (jobs/vectors/index_check.py)
    before it tries more oversampling and then an exact scan."""

    exact_scan: bool = True
    """Whether the index check may serve a version by exact scan when no graph search reaches
    min_recall. A scan reads every vector per query: fine for thousands of points, tens of ms
    at a million. Off: such a version is refused and the published one stays."""

    hnsw_ef: int = Field(64, ge=1)
    """Candidates the graph search keeps (Qdrant's `hnsw_ef`): more is slower and nearer to
    exact (`precompute bench vectors`); the nightly flow refuses to publish a version
    whose recall@10 against exact search is under its output's min_recall."""
