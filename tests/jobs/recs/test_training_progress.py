"""Training you can watch: the recs job's train stage says what each check and candidate found,
and the run page charts each candidate's validation curve."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from precompute.bench.recs.shop import shop
from precompute.flows.run_page import render
from precompute.jobs.inputs import InteractionsInput
from precompute.jobs.recs.recommend import run_recs_job
from precompute.jobs.recs.spec import RecsSpec
from precompute.jobs.recs.state import Items
from precompute.jobs.settings import JobSettings
from precompute.jobs.work_dir import WorkPath
from precompute.kinds.recs import RecsComputed
from precompute.kinds.report import OutputReport, RunReport
from tests.jobs.recs.inputs import ParquetSink


def test_training_reports_each_check_and_candidate_as_it_goes(
    ray_local, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    items_table, orders = shop(users=60, seed=2)
    ids = items_table["id"].to_pylist()
    pq.write_table(orders, tmp_path / "orders.parquet")
    keys = np.array([i.encode().ljust(16, b"-")[:16] for i in ids], "S16")
    items = Items.of(pa.array(ids, pa.string()), np.zeros((len(ids), 4), np.float32), keys)
    sequence = {"dim": 8, "blocks": 1, "max_epochs": 2, "train_budget_s": 60, "history": 20}
    with caplog.at_level(logging.INFO, logger="precompute.progress"):
        report = run_recs_job(
            InteractionsInput(path=str(tmp_path / "orders.parquet"), basket="order_id"),
            RecsSpec(content_weight=0, sequence=sequence),
            JobSettings(users_per_block=64),
            items,
            ParquetSink(tmp_path / "out"),
            WorkPath.of(tmp_path / "work"),
            output="shelf",
        )
    lines = [r.getMessage() for r in caplog.records if r.name == "precompute.progress"]
    checks = [line for line in lines if line.startswith("shelf train sequence: epoch ")]
    assert checks, lines
    pattern = r"epoch \d+, step \d+, validation NDCG@10 [\d.]+ \(best [\d.]+ at step \d+\), \d+ s of 60 s budget left"
    assert all(re.search(pattern, line) for line in checks), checks
    assert checks[-1].startswith("shelf train sequence: epoch 2, ")  # max_epochs 2
    for candidate in ("sequence", "transitions", "ease", "sequence+transitions+ease"):
        assert any(line.startswith(f"shelf train {candidate}: held-out NDCG@10 ") for line in lines), candidate
    assert any(line.startswith("shelf train seen items: ") for line in lines)
    assert lines.index(checks[-1]) < lines.index(next(line for line in lines if line.startswith("shelf train: done")))

    # The run page charts the sequence candidate's curve, whichever model was published.
    curve = report.quality.curves["sequence"]
    assert len(curve) == len(checks) and report.quality.curves.keys() == {"sequence"}
    computed = RecsComputed(
        rows=report.rows,
        users=report.users,
        rescored=report.rescored,
        copied=report.copied,
        mode=report.mode,
        mode_reason=report.mode_reason,
        k=report.k,
        users_per_s=report.users_per_s,
        quality=report.quality,
    )
    output = OutputReport(kind="recs", published=True, version="v1", computed=computed, validation=report.quality)
    page = render(RunReport(run="r1", pipeline="shop", outputs={"shelf": output}, failed={}))
    assert page.count("<polyline") == 1 and "sequence: validation NDCG@10 at each training check" in page
    assert f"check {len(curve)}, best {max(curve)}" in page
    assert "held-out NDCG@10 of each candidate" in page and "seen items: " in page
