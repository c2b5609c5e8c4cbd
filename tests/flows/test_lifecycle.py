"""The night's lifecycle, the same for every kind (flows/lifecycle.py), seen through the plug-in
kind tests/kinds/lengths.py in real Redis and Prefect: a version its check refuses is dropped
whole and the published one keeps serving; one that passes is published, its steps timed and
its kind's own figures in the report; an output runs after the output it needs, and is skipped
with one line when that one failed."""

from __future__ import annotations

from pathlib import Path

import pytest

from precompute.flows.nightly import RunFailedError, nightly
from precompute.kinds.report import STEPS
from precompute.pipeline import load_pipeline
from precompute.settings import Machine
from tests.conftest import LengthsNight

pytestmark = pytest.mark.slow  # nights through Prefect's steps

ONE = 'kind = "lengths"\ninput = { path = "corpus.parquet" }'


@pytest.fixture
def night(lengths_night: LengthsNight, prefect_api: str) -> LengthsNight:
    return lengths_night


def versions(path: Path, name: str) -> tuple[str | None, list[str]]:
    output = load_pipeline(path).declared[name]
    with output.kind.versions(output, Machine.from_environment()) as store:
        return store.current(), store.versions()


def test_a_refused_version_is_dropped_whole_and_the_published_one_serves_on(night: LengthsNight) -> None:
    night.pipeline.write_text(f"[outputs.sizes]\n{ONE}\n")
    first = nightly()["outputs"]["sizes"]
    assert first["published"] and set(first["steps"]) == set(STEPS) and first["longest"] > 0
    assert (first["rows"], first["computed"]) == (night.rows, night.rows)

    night.pipeline.write_text(f"[outputs.sizes]\n{ONE}\nlongest = 1\n")
    with pytest.raises(RunFailedError, match=r"^sizes failed at check: QualityError: a text of \d+ is longer"):
        nightly()
    assert versions(night.pipeline, "sizes") == (first["version"], [first["version"]])


def test_an_output_runs_after_the_one_it_needs_and_is_skipped_in_one_line_when_it_failed(night: LengthsNight) -> None:
    night.pipeline.write_text(f'[outputs.after]\n{ONE}\nafter = ["first"]\n[outputs.first]\n{ONE}\nstore = "firsts"\n')
    ran = nightly()["outputs"]
    assert list(ran) == ["first", "after"] and all(output["published"] for output in ran.values())

    night.pipeline.write_text(
        f'[outputs.after]\n{ONE}\nafter = ["first"]\n[outputs.first]\n{ONE}\nstore = "firsts"\nlongest = 1\n'
    )
    with pytest.raises(RunFailedError) as failed:
        nightly()
    assert failed.value.failed["first"].startswith("check: QualityError")
    assert failed.value.failed["after"] == "plan: SkippedError: output 'first', which it needs, was not published in this run"
