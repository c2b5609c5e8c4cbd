"""Engines are built once per key and reused until the key changes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from precompute.models import Engine, load_encoder
from precompute.models.engines.cache import EngineCache


def test_miss_builds_then_hit_reuses(tmp_path: Path) -> None:
    cache, builds = EngineCache(tmp_path), []

    def build(directory: Path) -> None:
        builds.append(directory)
        (directory / "engine.bin").write_bytes(b"engine")

    first = cache.get_or_build("onnxruntime-int8", {"model": "a", "precision": "int8"}, build)
    second = cache.get_or_build("onnxruntime-int8", {"model": "a", "precision": "int8"}, build)
    assert (first.hit, second.hit, len(builds)) == (False, True, 1)
    assert first.path == second.path and (second.path / "engine.bin").read_bytes() == b"engine"


def test_changed_key_is_a_miss(tmp_path: Path) -> None:
    cache = EngineCache(tmp_path)
    a = cache.get_or_build("e", {"model": "a", "runtime": "1.0"}, lambda d: None)
    b = cache.get_or_build("e", {"model": "a", "runtime": "1.1"}, lambda d: None)
    assert not b.hit and a.path != b.path


def test_failed_build_leaves_nothing_behind(tmp_path: Path) -> None:
    cache = EngineCache(tmp_path)

    def broken(directory: Path) -> None:
        (directory / "half.bin").write_bytes(b"half")
        raise RuntimeError("out of memory")

    with pytest.raises(RuntimeError, match="out of memory"):
        cache.get_or_build("e", {"model": "a"}, broken)
    assert os.listdir(tmp_path) == []
    assert not cache.get_or_build("e", {"model": "a"}, lambda d: None).hit


def test_concurrent_builder_that_loses_the_race_keeps_the_winner(tmp_path: Path) -> None:
    cache = EngineCache(tmp_path)

    def racing(directory: Path) -> None:
        # Another process finishes the same key while this one is still building.
        cache.get_or_build("e", {"model": "a"}, lambda d: (d / "engine.bin").write_bytes(b"winner"))
        (directory / "engine.bin").write_bytes(b"loser")

    entry = cache.get_or_build("e", {"model": "a"}, racing)
    assert (entry.path / "engine.bin").read_bytes() == b"winner"
    assert [p.name for p in tmp_path.iterdir()] == [entry.path.name]


def test_load_encoder_hits_the_cache_and_rebuilds_per_precision(encoder, settings: Engine) -> None:
    with load_encoder(settings) as again:
        assert again.report.cache_hit and again.report.engine_dir == encoder.report.engine_dir
    # Another precision, another entry.
    with load_encoder(settings.replace(precision="fp32")) as fp32:
        assert fp32.report.precision == "fp32" and fp32.report.engine_dir != encoder.report.engine_dir
