"""Bench records (bench/records.py) and the page rendered from them (bench/report.py): every field
typed, the newest record per bench and machine class, and a committed page that matches its records."""

from __future__ import annotations

import json
import re
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from precompute.bench.records import MAX_LIST, RESULTS_ENV, Figure, write_record
from precompute.bench.report import newest, read_records, render, summary
from precompute.cli.bench import bench_app
from precompute.models.hardware import device_fingerprint

ROOT = Path(__file__).resolve().parents[2]
CPU_A, CPU_B = "cpu:Model A:avx2", "cpu:Model B:avx2+avx512f"


def test_a_record_holds_every_field_typed_in_the_folder_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(RESULTS_ENV, str(tmp_path / "results"))
    monkeypatch.setattr(sys, "argv", ["/venv/bin/precompute", "bench", "lookup", "--rate", "500"])
    result = {"p99_ms": 1.5, "latencies": list(range(MAX_LIST + 1)), "rates": {"500": {"runs": [1, 2]}}}
    path = write_record(
        "lookup",
        result,
        dataset="demo corpus ids",
        ours=Figure("service p99", 1.5, "ms"),
        baseline=Figure("redis-py GET p99", 0.5, "ms"),
        higher_is_better=False,
    )

    assert path.parent == tmp_path / "results"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d{6}-lookup-[a-z0-9-]+\.json", path.name)
    record = json.loads(path.read_text())
    assert set(record) == {
        "bench", "command", "commit", "date", "machine", "dataset", "ours", "baseline", "ratio",
        "higher_is_better", "result",
    }
    assert record["bench"] == "lookup" and record["dataset"] == "demo corpus ids"
    assert record["command"] == "precompute bench lookup --rate 500"
    assert re.fullmatch(r"[0-9a-f]{4,40}(-dirty)?|unknown", record["commit"])
    assert datetime.fromisoformat(record["date"]).utcoffset().total_seconds() == 0
    machine = record["machine"]
    assert machine["class"] == device_fingerprint("cpu")
    assert isinstance(machine["cpu"], str) and all(isinstance(flag, str) for flag in machine["isa"])
    assert isinstance(machine["cores"], int) and machine["cores"] >= 1
    assert machine["gpu"] is None and machine["gpu_memory_gib"] is None
    assert isinstance(machine["memory_gib"], float) and machine["memory_gib"] > 0
    assert record["ours"] == {"name": "service p99", "value": 1.5, "unit": "ms"}
    assert record["baseline"] == {"name": "redis-py GET p99", "value": 0.5, "unit": "ms"}
    assert record["ratio"] == pytest.approx(1 / 3, abs=1e-4) and record["higher_is_better"] is False
    assert record["result"] == {"p99_ms": 1.5, "rates": {"500": {"runs": [1, 2]}}}  # the long list left out


def test_the_ratio_is_ours_over_the_baseline_where_higher_is_better_and_none_over_zero(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(RESULTS_ENV, str(tmp_path))
    ours, baseline = Figure("ours", 300.0, "docs/s"), Figure("theirs", 100.0, "docs/s")
    higher = json.loads(write_record("embed", {}, dataset="d", ours=ours, baseline=baseline).read_text())
    assert higher["ratio"] == 3.0
    nothing = Figure("theirs", 0.0, "docs/s")
    zero = json.loads(write_record("pipeline", {}, dataset="d", ours=ours, baseline=nothing).read_text())
    assert zero["ratio"] is None
    given = json.loads(write_record("publish", {}, dataset="d", ours=ours, baseline=baseline, ratio=2.9).read_text())
    assert given["ratio"] == 2.9  # the bench's own, as it printed it


def record(
    bench: str, machine_class: str, date: str, value: float, dataset: str = "demo corpus", **machine: Any
) -> dict[str, Any]:
    return {
        "bench": bench,
        "command": f"precompute bench {bench}",
        "commit": "abc1234",
        "date": date,
        "machine": {
            "class": machine_class,
            "cpu": machine_class.split(":")[1],
            "isa": ["avx2"],
            "cores": 4,
            "gpu": None,
            "gpu_memory_gib": None,
            "memory_gib": 16.0,
            **machine,
        },
        "dataset": dataset,
        "ours": {"name": "ours", "value": value, "unit": "docs/s"},
        "baseline": {"name": "theirs", "value": 100.0, "unit": "docs/s"},
        "ratio": value / 100,
        "higher_is_better": True,
        "result": {},
    }


RECORDS = {
    "2026-01-01T000000-embed-model-a.json": record("embed", CPU_A, "2026-01-01T00:00:00Z", 110),
    "2026-01-03T000000-embed-model-a.json": record("embed", CPU_A, "2026-01-03T00:00:00Z", 130),
    "2026-01-02T000000-embed-model-a.json": record("embed", CPU_A, "2026-01-02T00:00:00Z", 120),
    "2026-01-02T000000-embed-model-b.json": record("embed", CPU_B, "2026-01-02T00:00:00Z", 220),
    "2026-01-01-gpu-embed.json": record("embed", "cuda:GPU X:sm_90", "2026-01-01", 900, gpu="GPU X"),
    "2026-01-01T000000-lookup-model-b.json": record("lookup", CPU_B, "2026-01-01T00:00:00Z", 50),
    "2026-01-02T000000-lookup-model-b.json": record("lookup", CPU_B, "2026-01-02T00:00:00Z", 60, "a shop"),
}


def write(folder: Path, names: list[str]) -> Path:
    folder.mkdir()
    for name in names:
        (folder / name).write_text(json.dumps(RECORDS[name], indent=1) + "\n")
    return folder


def test_the_report_keeps_the_newest_record_per_bench_machine_class_and_data_set(tmp_path: Path) -> None:
    folder = write(tmp_path / "results", list(RECORDS))
    chosen = {key: r.file for key, r in newest(read_records(folder)).items()}
    assert chosen == {
        ("embed", CPU_A, "demo corpus"): "2026-01-03T000000-embed-model-a.json",
        ("embed", CPU_B, "demo corpus"): "2026-01-02T000000-embed-model-b.json",
        ("embed", "cuda:GPU X:sm_90", "demo corpus"): "2026-01-01-gpu-embed.json",
        ("lookup", CPU_B, "a shop"): "2026-01-02T000000-lookup-model-b.json",
        ("lookup", CPU_B, "demo corpus"): "2026-01-01T000000-lookup-model-b.json",
    }
    page = render(folder)
    for name in chosen.values():
        assert f"(../bench/results/{name})" in page
    assert "2026-01-01T000000-embed-model-a.json" not in page and "2026-01-02T000000-embed-model-a.json" not in page
    assert "precompute bench report" in page and "by hand" in page


def test_the_summary_has_one_row_per_bench_from_its_newest_record_whatever_the_files_order(
    tmp_path: Path,
) -> None:
    names = list(RECORDS)
    first = summary(write(tmp_path / "one", names))
    assert first == summary(write(tmp_path / "two", names[::-1])) == summary(tmp_path / "one")
    rows = first.splitlines()[2:]
    assert [row.split(" | ")[0] for row in rows] == ["| `embed`", "| `lookup`"]
    assert "**130 docs/s**" in rows[0] and "1.3x" in rows[0] and "Model A, 4 cores" in rows[0]
    assert render(tmp_path / "one") == render(tmp_path / "two")


def test_bench_report_summary_prints_the_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = write(tmp_path / "results", list(RECORDS))
    monkeypatch.setenv(RESULTS_ENV, str(folder))
    printed = CliRunner().invoke(bench_app, ["report", "--summary"])
    assert printed.exit_code == 0, printed.output
    assert printed.output.strip() == summary(folder)


def test_a_file_that_is_not_a_record_is_refused_by_name(tmp_path: Path) -> None:
    folder = write(tmp_path / "results", [])
    (folder / "old.json").write_text(json.dumps({"date": "2026-01-01", "runs": []}))
    with pytest.raises(ValueError, match=r"old\.json: not a bench record"):
        read_records(folder)


def test_the_committed_page_is_the_one_its_records_render() -> None:
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    assert page == render(ROOT / "bench" / "results"), "docs/benchmarks.md is stale: run `precompute bench report`"
