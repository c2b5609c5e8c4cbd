"""The nightly flow on Prefect's test harness, real Ray, the in-process Qdrant engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prefect.testing.utilities import prefect_test_harness

from flows.nightly import nightly
from stores.vector_settings import VectorStoreSettings
from stores.vectors import open_vector_store


@pytest.fixture(scope="module")
def prefect_api() -> None:
    with prefect_test_harness(server_startup_timeout=60):
        yield


@pytest.fixture
def environment(settings, small_corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The flow reads its settings from the environment, as in production."""
    env = {
        "PRECOMPUTE_JOB_INPUT": str(small_corpus),
        "PRECOMPUTE_JOB_WORK_DIR": str(tmp_path / "work"),
        "PRECOMPUTE_JOB_MAX_REJECT_RATIO": "0.05",
        "PRECOMPUTE_QDRANT_PATH": str(tmp_path / "qdrant"),
        "PRECOMPUTE_ENGINE_CACHE_DIR": str(settings.cache_dir),
        "PRECOMPUTE_ENGINE_GATE_TEXTS": str(settings.gate_texts),
        "PRECOMPUTE_ENGINE_CALIBRATION_TEXTS": str(settings.calibration_texts),
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return tmp_path


def test_nightly_publishes_reuses_and_collects_garbage(prefect_api, ray_local, environment: Path) -> None:
    first = nightly(keep_versions=1)
    assert (first["rows"], first["rejects"], first["computed"], first["reused"]) == (204, 4, 200, 0)
    assert first["validation"]["count"] == 200 and first["validation"]["recall_at_10"] >= 0.99
    assert first["gate"][0]["passed"] and first["engine"]["precision"] == "int8"
    saved = json.loads((environment / "work" / "reports" / f"{first['version']}.json").read_text())
    assert saved == first

    second = nightly(keep_versions=1)
    assert (second["computed"], second["reused"]) == (0, 200)
    third = nightly(keep_versions=1)
    assert third["deleted_versions"] == [first["version"]]
    runs = environment / "work" / "runs"
    assert sorted(p.name for p in runs.iterdir()) == sorted([second["version"], third["version"]])
    with open_vector_store(VectorStoreSettings()) as store:
        assert store.current() == third["version"]
        assert store.versions() == [second["version"], third["version"]]


def test_a_version_that_fails_validation_is_not_published(prefect_api, ray_local, environment: Path) -> None:
    published = nightly()
    with pytest.raises(Exception, match="recall@10"):
        nightly(min_recall=1.01)
    with open_vector_store(VectorStoreSettings()) as store:
        assert store.current() == published["version"]
