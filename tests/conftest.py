"""Shared fixtures: one engine cache per test run, so the real model is exported once."""

from __future__ import annotations

from pathlib import Path

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
def corpus_texts() -> list[str]:
    return pq.read_table(DEMO_CORPUS, columns=["text"])["text"].to_pylist()
