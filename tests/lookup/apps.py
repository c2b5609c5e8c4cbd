"""The service's app for a test: these settings groups over the environment's, the demo pipeline by default."""

from __future__ import annotations

from starlette.applications import Starlette

from precompute.lookup.settings import ServiceSettings
from precompute.models.settings import Engine
from precompute.pipeline import Pipeline
from precompute.service.app import create_app
from precompute.settings import Machine
from precompute.stores.key_value.settings import RedisSettings
from precompute.stores.vectors.settings import VectorStoreSettings


def app_of(
    service: ServiceSettings,
    engine: Engine,
    stores: VectorStoreSettings | None = None,
    redis: RedisSettings | None = None,
    pipeline: Pipeline | None = None,
) -> Starlette:
    """`engine`: the suite's engine fixture, whose machine settings (the shared engine cache) apply."""
    given = {"service": service, "engine": engine.machine, "qdrant": stores, "redis": redis}
    return create_app(Machine.from_environment(**{k: v for k, v in given.items() if v is not None}), pipeline)
