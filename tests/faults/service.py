"""A real `precompute serve` process over published outputs, for the fault tests."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from precompute.demo_data import DEMO_CORPUS
from precompute.lookup.settings import ServiceSettings
from precompute.models import Encoder, Engine
from precompute.service.server import running
from precompute.stores.key_value.server import free_port
from precompute.stores.key_value.settings import RedisSettings
from precompute.stores.vectors.settings import VectorStoreSettings
from tests.lookup.test_keys import publish_both
from tests.lookup.test_search import write_version

V1 = "20261121T010000Z-aaaaaa"


@contextmanager
def published_service(
    encoder: Encoder,
    engine: Engine,
    redis_url: str,
    directory: Path,
    monkeypatch: pytest.MonkeyPatch,
    log: Path | None = None,
    **service: object,
) -> Iterator[tuple[str, RedisSettings]]:
    """V1 of the shipped pipeline's three outputs, served by a child process: (base URL, its Redis)."""
    stores = VectorStoreSettings(type="edge", path=directory / "qdrant")
    redis = RedisSettings(url=redis_url, prefix=f"f{uuid.uuid4().hex[:8]}")
    write_version(stores, V1, pq.read_table(DEMO_CORPUS).slice(0, 100).to_pylist(), encoder)
    publish_both(redis, V1, 1)
    monkeypatch.setenv("PRECOMPUTE_ENGINE_CACHE_DIR", str(engine.machine.cache_dir))
    settings = ServiceSettings(port=free_port(), warmup_queries=1, **service)
    with running(settings, stores, redis, log=log) as base:
        yield base, redis
