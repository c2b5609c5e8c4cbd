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
    write_part,
)
from precompute.jobs.text.content_cache import stage_kept
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


def test_kept_rows_are_staged_beside_the_computed_ones_in_one_manifest(ray_local, tmp_path: Path) -> None:
    """A night's kept rows (the previous run's parts less the stale ids, written by tasks of their
    own) and its computed rows commit together; a night that computed none commits its kept
    rows alone; a kept part a retried task left behind is deleted like a write's."""
    previous = WorkPath.of(tmp_path / "previous")
    before = pa.table({"id": [str(i) for i in range(1000)], "computed": [True] * 1000})
    ray.data.from_arrow(before).repartition(3).write_datasink(StagingSink(previous))
    stale = ray.put(pa.array([str(i) for i in range(0, 1000, 10)]))

    run = WorkPath.of(tmp_path / "run")
    sink = StagingSink(run, stage_kept(previous, stale, run))
    pq.write_table(before.slice(0, 10), (run / "part-orphan.parquet").path)
    fresh = pa.table({"id": [f"new-{i}" for i in range(50)], "computed": [True] * 50})
    ray.data.from_arrow(fresh).write_datasink(sink)
    staged = committed_dataset(run).to_table()
    assert (sink.rows, sink.computed) == (950, 50) and not (tmp_path / "run" / "part-orphan.parquet").exists()
    assert sorted(staged["id"].to_pylist()) == sorted([str(i) for i in range(1000) if i % 10] + fresh["id"].to_pylist())
    assert staged.column_names == ["id"]  # computed is counted in the manifest, not stored
    assert len(committed_parts(run)) == 4

    alone = WorkPath.of(tmp_path / "alone")
    sink = StagingSink(alone, stage_kept(previous, stale, alone))
    sink.commit([])
    assert (sink.rows, sink.computed) == (900, 0) and committed_dataset(alone).count_rows() == 900


def test_a_kept_part_without_stale_rows_is_copied_as_it_is(ray_local, tmp_path: Path) -> None:
    """Most parts of a nightly run hold no row that moved: their bytes are copied, not decoded and
    written again. A part staged with a computed column (before parts dropped it) is written once
    more without it."""
    previous = WorkPath.of(tmp_path / "previous")
    before = pa.table({"id": [str(i) for i in range(300)], "computed": [True] * 300})
    ray.data.from_arrow(before).repartition(3).write_datasink(StagingSink(previous))
    parts = {Path(p).read_bytes(): p for p in committed_parts(previous)}
    old = pa.table({"id": ["old-0", "old-1"], "computed": [True, False]})  # as parts were staged before
    pq.write_table(old, tmp_path / "previous" / "part-old.parquet")
    manifest = json.loads((tmp_path / "previous" / MANIFEST).read_text())
    manifest["parts"].append({"name": "part-old.parquet", "rows": 2, "computed": 1})
    (tmp_path / "previous" / MANIFEST).write_text(json.dumps(manifest))
    stale = ray.put(pa.array(["5"]))  # in one part of the three

    run = WorkPath.of(tmp_path / "run")
    sink = StagingSink(run, stage_kept(previous, stale, run))
    sink.commit([])
    kept = {Path(p).read_bytes(): p for p in committed_parts(run)}
    assert len(kept) == 4 and len(kept.keys() & parts.keys()) == 2  # two copied byte for byte
    assert (sink.rows, sink.computed) == (301, 0)
    staged = committed_dataset(run).to_table()
    assert staged.column_names == ["id"] and sorted(staged["id"].to_pylist()) == sorted(
        [str(i) for i in range(300) if i != 5] + ["old-0", "old-1"]
    )


def test_a_part_encodes_its_vectors_plain_and_its_strings_by_dictionary(tmp_path: Path) -> None:
    """A vector's floats never repeat: building a dictionary of them halved a part's write speed."""
    vectors = pa.FixedSizeListArray.from_arrays(pa.array([0.5 * i for i in range(3 * 8)], pa.float32()), 8)
    table = pa.table({"id": ["a", "b", "c"], "embedding": vectors, "computed": [True, False, True]})
    entry = write_part(table, WorkPath.of(tmp_path))
    assert (entry["rows"], entry["computed"]) == (3, 2) and entry["name"].startswith("part-")
    written = pq.ParquetFile(tmp_path / entry["name"])
    group = written.metadata.row_group(0)
    columns = [group.column(i) for i in range(group.num_columns)]
    dictionary = {column.path_in_schema: column.has_dictionary_page for column in columns}
    assert (dictionary["id"], dictionary["embedding.list.element"]) == (True, False)
    assert written.read().equals(table.drop_columns(["computed"]))  # counted, not stored
