"""`precompute bench scale` at a tiny size: every stage timed, memory, growth exponents; its inputs and their rerun change."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from precompute.bench.records import RESULTS_ENV
from precompute.bench.scale import data as scale_data
from precompute.bench.scale.data import ROW_GROUP_ROWS, change_inputs, corpus, interactions, write_inputs
from precompute.bench.scale.main import RESOLUTION_S, exponent, main, summary
from precompute.bench.scale.stages import STAGES

ROWS = 400


def test_inputs_are_deterministic_with_unique_ids_and_interactions_that_reference_them() -> None:
    table = corpus(2000, seed=3)
    assert table.equals(corpus(2000, seed=3))
    assert len(pc.unique(table["id"])) == 2000
    seen = interactions(table, seed=3)
    assert pc.all(pc.is_in(seen["item_id"], table["id"])).as_py()
    assert len(pc.unique(seen["user_id"])) == 200  # a tenth of the rows
    counts = pc.value_counts(seen["item_id"]).field("counts").to_numpy()
    assert counts.max() >= 10 * counts.mean()  # a long tail: a few items are in many users' lists


def test_a_rerun_changes_the_share_asked_for_in_the_newest_files_and_keeps_every_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The corpus and the interactions are folders of files; a rerun's changed texts are the
    share asked for, all in the newest files, and no other file is written again; its new
    interactions are a file of their own, added to the log."""
    monkeypatch.setattr(scale_data, "FILE_ROWS", 500)
    corpus_path, interactions_path = write_inputs(tmp_path, 4000)
    files = sorted(corpus_path.iterdir())
    assert len(files) == 8 and pq.ParquetFile(files[0]).metadata.num_row_groups == math.ceil(500 / ROW_GROUP_ROWS)
    written = {f.name: f.stat().st_mtime_ns for f in files}
    before, seen_before = pq.read_table(corpus_path), pq.read_table(interactions_path)
    changed = change_inputs(tmp_path, 0.05)
    after, seen_after = pq.read_table(corpus_path), pq.read_table(interactions_path)
    assert after["id"].equals(before["id"]) and after["section"].equals(before["section"])
    moved = pc.not_equal(after["text"], before["text"])
    assert 100 <= changed["texts_changed"] <= 300 and pc.sum(moved).as_py() <= changed["texts_changed"]
    assert not pc.any(moved.slice(0, 3500)).as_py()  # only the newest file's rows: 2 x 5% of 8 files
    rewritten = sorted(f.name for f in files if f.stat().st_mtime_ns != written[f.name])
    assert rewritten == ["part-00007.parquet"]
    users = len(pc.unique(seen_before["user_id"]))
    assert 0 < changed["users_changed"] <= 0.1 * users
    assert pc.all(pc.is_in(seen_after["item_id"], after["id"])).as_py()
    log = sorted(interactions_path.iterdir())
    assert [f.name for f in log] == [f"part-{n:05d}.parquet" for n in range(len(log))] and len(log) >= 2
    assert pq.read_table(log[:-1]).equals(seen_before)  # the older days as they were
    new = pq.read_table(log[-1])
    assert len(pc.unique(new["user_id"])) == changed["users_changed"]
    pairs = [pc.binary_join_element_wise(t["user_id"], t["item_id"], "/") for t in (seen_before, new)]
    assert not pc.any(pc.is_in(pairs[1], pairs[0])).as_py()  # items the users did not hold


@pytest.mark.slow  # a real nightly run in a process of its own: a minute or two on 2 CPUs
def test_every_stage_is_timed_with_memory_and_exponents(
    prefect_api: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One size without its rerun (tests/flows and tests/jobs prove reruns recompute only what
    changed); the exponents' and the rerun's arithmetic run on this run's own figures."""
    monkeypatch.setenv("PRECOMPUTE_ENGINE_CACHE_DIR", str(tmp_path / "engines"))
    monkeypatch.setenv("PRECOMPUTE_JOB_DRIVER_ROWS", "0")  # the actors it measures, not the driver
    monkeypatch.setenv("PREFECT_API_URL", prefect_api)  # the size's process: no Prefect of its own to start
    monkeypatch.setenv(RESULTS_ENV, str(tmp_path / "results"))
    # 400 rows of 58 sections are a few-shot corpus (about six rows a section) for the test's tiny
    # random encoder, which TF-IDF beats: this test times the stages, not the head's quality.
    monkeypatch.setenv("PRECOMPUTE_OUTPUTS__LABELS__MAX_BASELINE_LOSS", "1.0")
    result = main([ROWS], work_dir=str(tmp_path / "bench"), rerun=False)

    assert result["sizes"] == [ROWS]
    assert not result["failed"] and result["rerun"] is None
    for stage in STAGES:
        assert result["seconds"][stage][ROWS] is not None, stage
    memory = result["memory"][ROWS]
    assert memory["driver_peak_rss_mb"] > 50
    assert any(name.startswith("ray::") for name in memory["ray_peak_rss_mb"])
    assert 0 < memory["ray_peak_uss_mb"]["ray::EmbedActor"] <= memory["ray_peak_rss_mb"]["ray::EmbedActor"]
    assert memory["redis_bytes_per_record"] > 0
    assert memory["qdrant_disk_mb"] > 0
    chosen = result["search"][ROWS]  # at the flow's default min_recall
    assert chosen["params"] and chosen["recall_at_10"] >= 0.99 and chosen["p99_ms"] >= chosen["median_ms"] > 0
    (path,) = (tmp_path / "results").iterdir()  # the run's record: one size is its own linear baseline
    record = json.loads(path.read_text())
    assert record["bench"] == "scale" and record["result"]["sizes"] == [ROWS]
    assert record["ours"]["value"] == record["baseline"]["value"] > 0 and record["ratio"] == 1.0

    (run,) = json.loads((tmp_path / "bench" / f"rows-{ROWS}" / "result.json").read_text())
    doubled = {**run, "report": json.loads(json.dumps(run["report"]))}
    for output in doubled["report"]["outputs"].values():  # the same run, every stage twice as long
        output["seconds"] = {key: 2 * value for key, value in output["seconds"].items()}
        output["steps"] = {key: 2 * value for key, value in output["steps"].items()}
    doubled["wall_s"] = 2 * run["wall_s"]
    figures = summary({ROWS: [run], 2 * ROWS: [doubled, run, run]}, Path("model"))
    for stage in STAGES:  # linear; a stage under the report's resolution counts as constant
        linear = 1.0 if result["seconds"][stage][ROWS] >= RESOLUTION_S else 0.0
        assert figures[f"{stage}_exponent"] == linear, stage
    assert figures["rerun"]["embeddings"]["computed"] == run["report"]["outputs"]["embeddings"]["computed"]
    twice = {name: 2 * seconds for name, seconds in figures["rerun"]["seconds"].items()}
    assert figures["rerun"]["first_run_seconds"] == pytest.approx(twice, abs=0.011)
    # The rerun and the unchanged night (the third run) against the full run: half of it here.
    assert figures["rerun"]["wall_percent_of_first"] == figures["unchanged"]["wall_percent_of_first"] == 50.0
    assert all(share in (None, 50.0) for share in figures["unchanged"]["percent_of_first"].values())


def test_exponent_is_the_slope_of_time_against_rows_on_log_scales() -> None:
    assert exponent(1_000, 2.0, 10_000, 20.0) == 1.0
    assert exponent(1_000, 2.0, 10_000, 200.0) == 2.0
    assert exponent(1_000, 0.0, 10_000, 0.0) == 0.0  # both under the report's resolution
    assert exponent(1_000, None, 10_000, 1.0) is None
