"""Machine-wide settings of the jobs, read from PRECOMPUTE_JOB_* variables (inputs are the pipeline file's)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, PlainSerializer, PlainValidator, WithJsonSchema
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from precompute.jobs.work_dir import LOCAL_STATE, WorkPath

WorkDir = Annotated[
    WorkPath, NoDecode, PlainValidator(WorkPath.of), PlainSerializer(str), WithJsonSchema({"type": "string"})
]
"""A path or URI in the environment and the settings table, a WorkPath in code."""


class JobSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PRECOMPUTE_JOB_", frozen=True, use_attribute_docstrings=True)

    work_dir: WorkDir = WorkPath.of(LOCAL_STATE / "jobs")
    """Rejects, staged outputs, caches (`runs/<output>/<version>`, `cache/<output>`) and run
    reports (`reports/`): a local folder, or an object-store URI (s3://bucket/precompute) where
    a cluster's nodes share no filesystem. Logs and the run lock stay on the machine that runs."""

    ray_address: str | None = None
    """A Ray cluster (ray://host:10001 or auto); None starts a local Ray for this process."""

    actors: int = Field(1, ge=1)
    """Inference actors. Each takes one GPU where there are GPUs; on CPU each takes one core
    and runs the engine's streams on all of them (the read tasks need little)."""

    rows_per_batch: int = Field(2048, ge=1)
    """Rows per actor call; the engine sorts them by length and re-batches them, so more
    rows mean less padding and fewer calls (`bench pipeline` measures it), at the cost of a
    later first output and 3 MB of vectors a call."""

    driver_rows: int = Field(2048, ge=0)
    """Embeddings and labels: a night that computes at most this many rows (an incremental one)
    runs the model on them in the driver, which opens the gated engine from the cache, not in
    an actor pool, whose start (a process, its imports, the engine opened) outlasts the
    model's work on so few rows (`precompute bench scale`, its 1% rerun). 0: always the
    actors (a cluster whose driver machine should stay idle). Not where there are GPUs, which
    the actors hold."""

    topk_actors: int = Field(1, ge=1)
    """Recommendations: top-k actors, each holding the whole item matrix; one GPU each where
    there are GPUs."""

    topk_driver_users: int = Field(20_000, ge=0)
    """Recommendations: the driver, which holds the towers and the ranking already, ranks a
    night's users itself, not a top-k actor pool, when they are at most this many (an
    incremental night's) or when Ray runs on one node, where the pool's actors would share the
    driver's CPUs: the pool's start (a process, the towers and the item graph through Ray's
    object store) outlasts an incremental night's ranking, and on one node a full night ranks
    faster in the driver than in one actor (`precompute bench scale`). 0: always the actors
    (a cluster whose driver machine should stay idle). Not where there are GPUs, which the actors hold."""

    users_per_block: int = Field(512, ge=1)
    """Recommendations, exact top-k: users scored per matrix multiply, against tiles of items
    whose [block, tile] float32 score buffer (bounded: jobs/recs/topk/exact.py) is allocated once per actor.
    The IVF index ranks up to 256 MB of query vectors per call (jobs/recs/topk/candidates.py)."""

    pushgateway_url: str | None = None
    """A Prometheus Pushgateway (http://host:9091) each run pushes its metrics to
    (flows/run_metrics.py); they are written under `metrics/` in the work directory either way."""
