"""Shared fixtures: one engine cache per test run, so the real model is exported once."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from models import Encoder, EngineSettings, load_encoder
from models.settings import DEMO_CORPUS


@pytest.fixture(scope="session")
def engine_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("engines")


@pytest.fixture(scope="session")
def settings(engine_cache: Path) -> EngineSettings:
    """Small gate and calibration sets keep the suite fast; the defaults are larger."""
    return EngineSettings(cache_dir=engine_cache, gate_texts=64, calibration_texts=32)


@pytest.fixture(scope="session")
def encoder(settings: EngineSettings) -> Encoder:
    with load_encoder(settings) as encoder:
        yield encoder


@pytest.fixture(scope="session")
def bundled_cache(encoder: Encoder, settings: EngineSettings) -> dict[str, Path]:
    """The bundled model's FP32 export and reference outputs in the shared engine cache, found by
    their keys: tests of other models add entries of the same kinds to that cache."""
    entries = {}
    for key_file in settings.cache_dir.glob("*/key.json"):
        kind = key_file.parent.name.rsplit("-", 1)[0]
        if (
            kind in ("export", "reference")
            and json.loads(key_file.read_text())["model"] == settings.model.hash
        ):
            entries[kind] = key_file.parent
    return entries


@pytest.fixture(scope="session")
def corpus_texts() -> list[str]:
    return pq.read_table(DEMO_CORPUS, columns=["text"])["text"].to_pylist()


@pytest.fixture(scope="session")
def ray_local() -> None:
    """One local Ray for the run, on 2 CPUs like the development machines (STACK.md's hang)."""
    from jobs.ray_session import start_local, stop_local

    start_local(2, log_to_driver=False)
    yield
    stop_local()


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """200 real documents plus one row of each kind the contract rejects. Every 25th of the demo
    corpus, whose rows are ordered by gate/calibration slot: each slot gets its tenth."""
    rows = pq.read_table(DEMO_CORPUS).take(list(range(0, 5000, 25))).to_pylist()
    bad = [
        {**rows[0], "id": None},
        {**rows[1], "id": "dup"},
        {**rows[2], "id": "dup"},
        {**rows[3], "id": "empty-text", "text": "   "},
    ]
    path = tmp_path_factory.mktemp("corpus") / "corpus.parquet"
    pq.write_table(pa.Table.from_pylist(rows + bad), path)
    return path


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One real redis-server for the run, on a free port (`make test` installs redis-server)."""
    from stores.redis_server import redis_server

    with redis_server(tmp_path_factory.mktemp("redis")) as url:
        yield url
