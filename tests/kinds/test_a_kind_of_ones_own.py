"""An output kind installed as a plug-in: one module (tests/kinds/lengths.py: a spec, a settings
group and hooks) and one registry entry (a `precompute.kinds` entry point of an installed
distribution) take it through `precompute check`, `precompute settings`, the nightly flow,
`status`, `rollback` and the lookup service, none of which knows it."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pyarrow.parquet as pq
import pytest

from precompute.flows.nightly import nightly
from precompute.lookup.settings import ServiceSettings
from precompute.pipeline import load_pipeline
from precompute.service.server import running
from precompute.stores.key_value.server import free_port
from tests.conftest import LengthsNight

pytestmark = pytest.mark.slow  # seconds to minutes each: left out of `pytest -m "not slow"`



@pytest.fixture
def environment(lengths_night: LengthsNight) -> LengthsNight:
    """The plug-in kind's night, its pipeline file one output of it."""
    lengths_night.pipeline.write_text('[outputs.sizes]\nkind = "lengths"\ninput = { path = "corpus.parquet" }\n')
    return lengths_night


def precompute(*args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "precompute", *args], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == code, done.stderr
    return done


def test_its_settings_group_is_read_and_listed_like_the_built_in_ones(
    environment: LengthsNight, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PRECOMPUTE_LENGTHS_UNIT", "bytes")
    assert "lengths in bytes" in precompute("check").stdout
    listed = precompute("settings").stdout
    assert "| `lengths.unit` | `PRECOMPUTE_LENGTHS_UNIT` | lengths | `characters` |" in listed


def test_check_runs_outputs_after_those_they_need_and_refuses_a_cycle_in_one_line(environment: LengthsNight) -> None:
    pipeline = environment.pipeline
    one = 'kind = "lengths"\ninput = { path = "corpus.parquet" }'
    pipeline.write_text(f'[outputs.a]\n{one}\nafter = ["b"]\n[outputs.b]\n{one}\nstore = "bb"\n')
    plan = precompute("check").stdout
    assert plan.index("\nb (lengths") < plan.index("\na (lengths, default route, after b)")
    pipeline.write_text(f'[outputs.a]\n{one}\nafter = ["b"]\n[outputs.b]\n{one}\nstore = "bb"\nafter = ["a"]\n')
    refused = precompute("check", code=2).stderr
    assert refused.strip() == f"error: {pipeline}: outputs: the outputs need each other in a cycle (a -> b -> a)"
    pipeline.write_text(f'[outputs.a]\n{one}\nafter = ["c"]\n')
    refused = precompute("check", code=2).stderr
    assert refused.strip() == f"error: {pipeline}: outputs.a: needs output 'c', which the file does not declare"


def test_a_kind_of_ones_own_runs_through_check_the_flow_status_rollback_and_the_service(
    prefect_api: str, environment: LengthsNight
) -> None:
    plan = precompute("check").stdout
    assert "sizes (lengths, default route)" in plan and "redis keys" in plan and "lengths in characters" in plan

    first, second = nightly(), nightly()
    versions = [run["outputs"]["sizes"]["version"] for run in (first, second)]
    assert all(run["outputs"]["sizes"]["computed"] == environment.rows for run in (first, second))

    (status,) = json.loads(precompute("status", "--json").stdout)
    assert (status["kind"], status["current"]) == ("lengths", versions[1])
    assert [(v["name"], v["count"]) for v in status["versions"]] == [(versions[0], environment.rows), (versions[1], environment.rows)]
    assert precompute("rollback", "sizes").stdout.strip() == f"sizes: serving {versions[0]}"

    rows = pq.read_table(environment.corpus).to_pylist()
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
