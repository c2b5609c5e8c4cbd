"""The night's lifecycle, the same for every kind (flows/lifecycle.py), seen through the plug-in
kind tests/kinds/lengths.py in real Redis and Prefect: a version its check refuses is dropped
whole and the published one keeps serving; one that passes is published, its steps timed and
its kind's own figures in the report; an output runs after the output it needs, and is skipped
with one line when that one failed."""

from __future__ import annotations

import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from precompute.demo_data import DEMO_CORPUS
from precompute.flows.nightly import RunFailedError, nightly
from precompute.kinds.report import STEPS
from precompute.pipeline import load_pipeline
from precompute.settings import Machine

pytestmark = pytest.mark.slow  # nights through Prefect's steps

ROWS = 30
ONE = 'kind = "lengths"\ninput = { path = "corpus.parquet" }'


@pytest.fixture
def pipeline(lengths_kind: None, prefect_api: str, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    pq.write_table(pq.read_table(DEMO_CORPUS).slice(0, ROWS), tmp_path / "corpus.parquet")
    for name, value in {
        "PRECOMPUTE_PIPELINE": str(tmp_path / "precompute.toml"),
        "PRECOMPUTE_REDIS_URL": redis_url,
        "PRECOMPUTE_REDIS_PREFIX": f"life{uuid.uuid4().hex[:8]}",
        "PRECOMPUTE_JOB_WORK_DIR": str(tmp_path / "work"),
        "PRECOMPUTE_QDRANT_PATH": str(tmp_path / "qdrant"),
    }.items():
        monkeypatch.setenv(name, value)
    return tmp_path / "precompute.toml"


def versions(path: Path, name: str) -> tuple[str | None, list[str]]:
    output = load_pipeline(path).declared[name]
    with output.kind.versions(output, Machine.from_environment()) as store:
        return store.current(), store.versions()


def test_a_refused_version_is_dropped_whole_and_the_published_one_serves_on(pipeline: Path) -> None:
    pipeline.write_text(f"[outputs.sizes]\n{ONE}\n")
    first = nightly()["outputs"]["sizes"]
    assert first["published"] and set(first["steps"]) == set(STEPS) and first["longest"] > 0
    assert (first["rows"], first["computed"]) == (ROWS, ROWS)

    pipeline.write_text(f"[outputs.sizes]\n{ONE}\nlongest = 1\n")
    with pytest.raises(RunFailedError, match=r"^sizes failed at check: QualityError: a text of \d+ is longer"):
        nightly()
    assert versions(pipeline, "sizes") == (first["version"], [first["version"]])


def test_an_output_runs_after_the_one_it_needs_and_is_skipped_in_one_line_when_it_failed(pipeline: Path) -> None:
    pipeline.write_text(f'[outputs.after]\n{ONE}\nafter = ["first"]\n[outputs.first]\n{ONE}\nstore = "firsts"\n')
    ran = nightly()["outputs"]
    assert list(ran) == ["first", "after"] and all(output["published"] for output in ran.values())

    pipeline.write_text(
        f'[outputs.after]\n{ONE}\nafter = ["first"]\n[outputs.first]\n{ONE}\nstore = "firsts"\nlongest = 1\n'
    )
    with pytest.raises(RunFailedError) as failed:
        nightly()
    assert failed.value.failed["first"].startswith("check: QualityError")
    assert failed.value.failed["after"] == "plan: SkippedError: output 'first', which it needs, was not published in this run"
