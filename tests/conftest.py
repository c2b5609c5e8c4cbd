"""Shared fixtures: one engine cache per test run, so the real model is exported once.

The suite's engines gate on 64 held-out texts and calibrate on 32 (PRECOMPUTE_ENGINE_GATE_TEXTS
and ..._CALIBRATION_TEXTS, which every output's engine policy reads, in this process and in the
`precompute` processes tests start): small sets keep the suite fast, and every test's engines
find the same gate results in the cache. The defaults are larger.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from precompute.demo_data import DEMO_CORPUS
from precompute.kinds import registry
from precompute.models import Encoder, Engine, EngineSettings, load_encoder
from precompute.models.engines import runtime
from precompute.models.source import bundled_encoder
from precompute.models.text.reference import TextSample

if TYPE_CHECKING:
    from ray.cluster_utils import Cluster

GATE_TEXTS, CALIBRATION_TEXTS = "64", "32"
ROOT = Path(__file__).resolve().parents[1]


def pytest_configure(config: pytest.Config) -> None:
    os.environ["PRECOMPUTE_ENGINE_GATE_TEXTS"] = GATE_TEXTS
    os.environ["PRECOMPUTE_ENGINE_CALIBRATION_TEXTS"] = CALIBRATION_TEXTS


@pytest.fixture(autouse=True)
def job_work_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test's JobSettings() works in a folder of its own, never the user's
    ~/.local/share/precompute: the jobs keep caches there (jobs/recs/history/interaction_files.py)."""
    folder = tmp_path / "job-work"
    monkeypatch.setenv("PRECOMPUTE_JOB_WORK_DIR", str(folder))
    return folder


@pytest.fixture(scope="session")
def engine_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh cache per run, or PRECOMPUTE_TEST_ENGINE_CACHE's: `make mutation` runs the same
    tests once per mutant and keeps the real model's export and gate results between runs."""
    kept = os.environ.get("PRECOMPUTE_TEST_ENGINE_CACHE")
    return Path(kept) if kept else tmp_path_factory.mktemp("engines")


@pytest.fixture(scope="session")
def settings(engine_cache: Path) -> Engine:
    """The bundled encoder gated on the demo corpus, as the demo pipeline's outputs build it."""
    return Engine(
        model=bundled_encoder(),
        reference=TextSample(path=str(DEMO_CORPUS)),
        machine=EngineSettings(cache_dir=engine_cache),
    )


@pytest.fixture
def cpu_without_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU's ladder as on CPUs without AMX-BF16 (int8 -> fp32), whatever this one has, in this
    process: for tests of what FP32 does after INT8 (the BF16 rung's own: test_engine.py)."""
    monkeypatch.setattr(runtime, "native_bf16", lambda: False)


@pytest.fixture(scope="session")
def encoder(settings: Engine) -> Encoder:
    with load_encoder(settings) as encoder:
        yield encoder


@pytest.fixture(scope="session")
def bundled_cache(encoder: Encoder, settings: Engine) -> dict[str, Path]:
    """The bundled model's FP32 export in the shared engine cache, found by its key: tests of
    other models add entries of the same kind to that cache."""
    entries = {}
    for key_file in settings.machine.cache_dir.glob("*/key.json"):
        kind = key_file.parent.name.rsplit("-", 1)[0]
        if (
            kind == "export"
            and json.loads(key_file.read_text())["model"] == settings.model.hash
        ):
            entries[kind] = key_file.parent
    return entries


@pytest.fixture(scope="session")
def corpus_texts() -> list[str]:
    return pq.read_table(DEMO_CORPUS, columns=["text"])["text"].to_pylist()


LOCAL_RAY = {"num_cpus": 2, "log_to_driver": False}


@pytest.fixture(scope="session")
def prefect_api() -> Iterator[str]:
    """One Prefect test API for the run (it takes tens of seconds to start on a loaded machine).
    Yields its URL: a `precompute run` process a test starts is given it as PREFECT_API_URL,
    and talks to it as a production run talks to a Prefect server."""
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield PREFECT_API_URL.value()


@pytest.fixture(scope="session")
def ray_local() -> None:
    """One local Ray for the run, on 2 CPUs like the development machines (STACK.md's hang)."""
    from precompute.jobs.ray_session import start_local, stop_local

    start_local(**LOCAL_RAY)
    yield
    stop_local()


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Cluster]:
    """A Ray cluster of separate node processes: a head with no CPUs, so every task and actor
    runs on a worker, and two worker nodes of 2 CPUs each (one survives the other's loss without
    STACK.md's hang). Token authentication is on, as `ray start` has it. Jobs join it through
    their ray_address setting; this process only watches it (`cluster.global_state`). One
    process joins one Ray at a time, so the run's local Ray is stopped meanwhile and started again.
    One cluster per module: its tests that take a node away run last."""
    import ray
    from ray._private.authentication.authentication_token_setup import (
        enable_token_auth_by_default,
        ensure_token_if_auth_enabled,
    )
    from ray.cluster_utils import Cluster

    from precompute.jobs.ray_session import start_local, stop_local, worker_pool

    had_local = ray.is_initialized()
    stop_local()
    # Short, because Ray's socket paths must fit in 107 bytes; and ours, because the cluster
    # records its address in <RAY_TMPDIR>/ray/ray_current_cluster, where a plain ray.init() of
    # anyone else on this machine would find it in /tmp/ray.
    temp_dir = tempfile.mkdtemp(prefix="ray")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("RAY_TMPDIR", temp_dir)
        # What ray.init does for a new cluster; the nodes inherit this process's mode and token.
        enable_token_auth_by_default()
        ensure_token_if_auth_enabled(None, create_token_if_missing=True)
        cluster = Cluster()
        node_cpus = 2
        try:
            # Generous: nodes start slowly on a loaded machine. A lost node is declared dead
            # after Ray's default 5 failed health checks 3 s apart, written out because the
            # 15 s a lost node's actors stay "temporarily unavailable" are what a job must
            # outlast (jobs/ray_session.py actor_pool): a retry budget spent in that window
            # failed one full run in three at 3 checks a second apart, and every run at 15 s.
            cluster.add_node(
                wait=False,
                num_cpus=0,
                include_dashboard=False,
                _system_config={
                    "health_check_period_ms": 3000,
                    "health_check_failure_threshold": 5,
                    **worker_pool(node_cpus),  # the worker nodes': the head runs none
                },
            )
            for _ in range(2):
                cluster.add_node(wait=False, num_cpus=node_cpus)
            cluster.wait_for_nodes(timeout=180)
            yield cluster
        finally:
            with contextlib.suppress(Exception):
                cluster.shutdown()
            stop_local()  # whatever a failed start or shutdown left running
            shutil.rmtree(temp_dir, ignore_errors=True)
    if had_local:
        start_local(**LOCAL_RAY)


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
    from precompute.stores.key_value.server import redis_server

    with redis_server(tmp_path_factory.mktemp("redis")) as url:
        yield url


@pytest.fixture
def lengths_kind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The test-only kind tests/kinds/lengths.py installed as a plug-in: its distribution on the
    path, whose metadata declares the entry point as a package's `[project.entry-points.
    "precompute.kinds"]` would once installed; processes the test starts find it too."""
    site = tmp_path / "site"
    metadata = site / "lengths_kind-1.0.dist-info"
    metadata.mkdir(parents=True)
    (metadata / "METADATA").write_text("Metadata-Version: 2.1\nName: lengths-kind\nVersion: 1.0\n")
    (metadata / "entry_points.txt").write_text("[precompute.kinds]\nlengths = tests.kinds.lengths:Lengths\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), str(ROOT)]))  # for the processes started
    registry.cache_clear()
    yield
    registry.cache_clear()


@dataclass(frozen=True)
class LengthsNight:
    pipeline: Path
    """The pipeline file, the test's to write (PRECOMPUTE_PIPELINE names it)."""
    corpus: Path
    rows: int


@pytest.fixture
def lengths_night(lengths_kind: None, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> LengthsNight:
    """The plug-in kind installed, its input (the demo corpus's first rows), and stores of this
    test's own: a Redis prefix, a work directory and a Qdrant path."""
    night = LengthsNight(tmp_path / "precompute.toml", tmp_path / "corpus.parquet", 40)
    pq.write_table(pq.read_table(DEMO_CORPUS).slice(0, night.rows), night.corpus)
    for name, value in {
        "PRECOMPUTE_PIPELINE": str(night.pipeline),
        "PRECOMPUTE_REDIS_URL": redis_url,
        "PRECOMPUTE_REDIS_PREFIX": f"lengths{uuid.uuid4().hex[:8]}",
        "PRECOMPUTE_JOB_WORK_DIR": str(tmp_path / "work"),
        "PRECOMPUTE_QDRANT_PATH": str(tmp_path / "qdrant"),
    }.items():
        monkeypatch.setenv(name, value)
    return night
