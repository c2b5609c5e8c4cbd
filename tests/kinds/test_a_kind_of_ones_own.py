"""An output kind installed as a plug-in: one module (tests/kinds/lengths.py) and one registry entry
(a `precompute.kinds` entry point of an installed distribution) take it through `precompute
check`, the nightly flow, `status`, `rollback` and the lookup service, none of which knows it."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import pyarrow.parquet as pq
import pytest

from precompute.demo_data import DEMO_CORPUS
from precompute.flows.nightly import nightly
from precompute.lookup.settings import ServiceSettings
from precompute.pipeline import load_pipeline
from precompute.service.server import running
from precompute.stores.key_value.server import free_port

ROWS = 40


@pytest.fixture
def environment(lengths_kind: None, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    corpus = tmp_path / "corpus.parquet"
    pq.write_table(pq.read_table(DEMO_CORPUS).slice(0, ROWS), corpus)
    pipeline = tmp_path / "precompute.toml"
    pipeline.write_text('[outputs.sizes]\nkind = "lengths"\ninput = { path = "corpus.parquet" }\n')
    for name, value in {
        "PRECOMPUTE_PIPELINE": str(pipeline),
        "PRECOMPUTE_REDIS_URL": redis_url,
        "PRECOMPUTE_REDIS_PREFIX": f"kind{uuid.uuid4().hex[:8]}",
        "PRECOMPUTE_JOB_WORK_DIR": str(tmp_path / "work"),
        "PRECOMPUTE_QDRANT_PATH": str(tmp_path / "qdrant"),
    }.items():
        monkeypatch.setenv(name, value)
    return corpus


def precompute(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "precompute", *args], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_kind_of_ones_own_runs_through_check_the_flow_status_rollback_and_the_service(
    prefect_api: str, environment: Path
) -> None:
    plan = precompute("check")
    assert "sizes (lengths, default route)" in plan and "redis keys" in plan

    first, second = nightly(), nightly()
    versions = [run["outputs"]["sizes"]["version"] for run in (first, second)]
    assert all(run["outputs"]["sizes"]["computed"] == ROWS for run in (first, second))

    (status,) = json.loads(precompute("status", "--json"))
    assert (status["kind"], status["current"]) == ("lengths", versions[1])
    assert [(v["name"], v["count"]) for v in status["versions"]] == [(versions[0], ROWS), (versions[1], ROWS)]
    assert precompute("rollback", "sizes").strip() == f"sizes: serving {versions[0]}"

    rows = pq.read_table(environment).to_pylist()
    service = ServiceSettings(port=free_port(), warmup_queries=1)
    with running(service, pipeline=load_pipeline()) as base:
        assert httpx.get(f"{base}/readyz").json()["versions"] == {"sizes": versions[0]}
        for path in ("/v1/lengths/sizes", "/v1/lengths"):  # by name, and the kind's first output
            answer = httpx.get(f"{base}{path}/{rows[3]['id']}").json()
            assert answer["version"] == versions[0]
            assert answer["lengths"] == [{"unit": "characters", "value": float(len(rows[3]["text"]))}]
        batch = httpx.post(f"{base}/v1/lengths:batchGet", json={"ids": [rows[0]["id"], "nope"]}).json()
        assert batch["missing"] == ["nope"] and len(batch["results"]) == 1
        assert "/v1/lengths/sizes/{id}" in httpx.get(f"{base}/openapi.json").json()["paths"]
