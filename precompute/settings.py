"""This machine's settings: where the stores, the work directory and the engines are, and how to run.

Each group is declared once, in the package it configures, and read from its PRECOMPUTE_*
variables; what varies per output is the pipeline file's instead (precompute/pipeline.py). An
output kind may declare a group of its own (OutputKind.settings, read by `group`).
An entry point (the CLI, the nightly flow, the service, a bench) reads them once with
`Machine.from_environment()` and passes them down: nothing below builds settings of its own.
`precompute settings` prints every setting of both kinds in one table (settings_table.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, TypeVar, get_type_hints

from pydantic_settings import BaseSettings

from precompute.jobs.settings import JobSettings
from precompute.lookup.settings import ServiceSettings
from precompute.models.settings import EngineSettings
from precompute.stores.key_value.settings import RedisSettings
from precompute.stores.vectors.settings import VectorStoreSettings

G = TypeVar("G", bound=BaseSettings)


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
    kinds: dict[type[BaseSettings], BaseSettings] = field(default_factory=dict, compare=False, repr=False)
    """The output kinds' own groups by class, each read on first use (`group`) or given."""

    @classmethod
    def from_environment(cls, *kinds: BaseSettings, **given: BaseSettings) -> Machine:
        """Every built-in group from its variables, except those `given` (by field name); `kinds`:
        output kinds' groups given instead of read."""
        built_in = {f.name for f in fields(cls)} - {"kinds"}
        unknown = set(given) - built_in
        if unknown:
            raise TypeError(f"a machine has no settings group {', '.join(sorted(unknown))}")
        hints = get_type_hints(cls)
        groups: dict[str, Any] = {name: given.get(name) or hints[name]() for name in built_in}
        return cls(**groups, kinds={type(group): group for group in kinds})

    @classmethod
    def prefixes(cls) -> set[str]:
        """The built-in groups' variable prefixes (PRECOMPUTE_ENGINE_, ...): a kind's group takes another."""
        hints = get_type_hints(cls)
        return {hints[f.name].model_config["env_prefix"] for f in fields(cls) if f.name != "kinds"}

    def group(self, settings: type[G]) -> G:
        """An output kind's own group (OutputKind.settings), read from its PRECOMPUTE_<GROUP>_*
        variables the first time it is asked for."""
        if settings not in self.kinds:
            self.kinds[settings] = settings()
        return self.kinds[settings]  # type: ignore[return-value]

