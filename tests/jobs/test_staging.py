"""Staged parts on real Ray: only the parts a completed write returned are ever read."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray

from precompute.jobs.staging import (
    MANIFEST,
    StagingSink,
    UncommittedError,
    committed_dataset,
    committed_parts,
)
from precompute.jobs.work_dir import WorkPath


def test_a_write_commits_its_parts_and_deletes_what_no_task_returned(ray_local, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    rows = pa.table({"id": [str(i) for i in range(1000)], "computed": [i % 4 == 0 for i in range(1000)]})
    # What a write task killed after writing, then retried, leaves behind: a part no task returned.
    pq.write_table(rows.slice(0, 100), run_dir / "part-orphan.parquet")

    sink = StagingSink(WorkPath.of(run_dir))
    ray.data.from_arrow(rows).repartition(4).write_datasink(sink)

    assert (sink.rows, sink.computed) == (1000, 250)
    assert not (run_dir / "part-orphan.parquet").exists()
    assert sorted(committed_dataset(WorkPath.of(run_dir)).to_table()["id"].to_pylist()) == sorted(rows["id"].to_pylist())
    listed = {p["name"] for p in json.loads((run_dir / MANIFEST).read_text())["parts"]}
    assert (
        {Path(p).name for p in committed_parts(WorkPath.of(run_dir))} == listed == {p.name for p in run_dir.glob("part-*")}
    )


def test_a_folder_without_a_manifest_is_never_read(tmp_path: Path) -> None:
    pq.write_table(pa.table({"id": ["a"]}), tmp_path / "part-0.parquet")
    with pytest.raises(UncommittedError, match=r"no manifest\.json: its write never completed"):
        committed_dataset(WorkPath.of(tmp_path))
