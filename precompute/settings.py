"""This machine's settings: where the stores, the work directory and the engines are, and how to run.

Each group is declared once, in the package it configures, and read from its PRECOMPUTE_*
variables; what varies per output is the pipeline file's instead (precompute/pipeline.py).
An entry point (the CLI, the nightly flow, the service, a bench) reads them once with
`Machine.from_environment()` and passes them down: nothing below builds settings of its own.
`precompute settings` prints every setting of both kinds in one table (settings_table.py).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, get_type_hints

from pydantic_settings import BaseSettings

from precompute.jobs.settings import JobSettings
from precompute.lookup.settings import ServiceSettings
from precompute.models.settings import EngineSettings
from precompute.stores.key_value.settings import RedisSettings
from precompute.stores.vectors.settings import VectorStoreSettings


@dataclass(frozen=True)
class Machine:
    engine: EngineSettings
    """PRECOMPUTE_ENGINE_*: backend, device, threads and the engine cache."""
    job: JobSettings
    """PRECOMPUTE_JOB_*: the work directory, the Ray cluster, actors."""
    redis: RedisSettings
    """PRECOMPUTE_REDIS_*: the key-value store."""
    qdrant: VectorStoreSettings
    """PRECOMPUTE_QDRANT_*: the vector store."""
    service: ServiceSettings
    """PRECOMPUTE_SERVICE_*: the lookup service."""

    @classmethod
    def from_environment(cls, **given: BaseSettings) -> Machine:
        """Every group from its variables, except those `given` (by field name)."""
        unknown = set(given) - {f.name for f in fields(cls)}
        if unknown:
            raise TypeError(f"a machine has no settings group {', '.join(sorted(unknown))}")
        hints = get_type_hints(cls)
        groups: dict[str, Any] = {f.name: given.get(f.name) or hints[f.name]() for f in fields(cls)}
        return cls(**groups)

