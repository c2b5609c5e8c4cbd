"""Parquet inputs read by row groups: many tasks for one large file, the same rows as the file."""

from __future__ import annotations

import itertools
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

from precompute.jobs import row_groups
from precompute.jobs.inputs import read_input
from precompute.jobs.row_groups import ParquetRowGroups, runs
from precompute.models.datasets import DatasetInput


def metadata(path: Path, sizes: list[int]) -> pq.FileMetaData:
    """A file whose row groups hold `sizes` rows of one 1,000-byte string each."""
    tables = [pa.table({"text": ["x" * 1000] * size}) for size in sizes]
    with pq.ParquetWriter(path, tables[0].schema, compression="none", use_dictionary=False) as writer:
        for table in tables:
            writer.write_table(table)
    return pq.ParquetFile(path).metadata


def test_consecutive_row_groups_are_packed_up_to_a_tasks_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every group once, in order; a run stays within the bound unless it is one group larger than
    it; the next run's first group would not have fitted."""
    monkeypatch.setattr(row_groups, "READ_TASK_BYTES", 20_000)
    rows = [4, 4, 15, 2, 3, 4, 1, 1, 1, 30]
    file = metadata(tmp_path / "a.parquet", rows)
    size = [file.row_group(i).total_byte_size for i in range(file.num_row_groups)]
    packed = list(runs(file))
    assert [i for ids, _, _ in packed for i in ids] == list(range(file.num_row_groups))
    assert [rows for _, rows, _ in packed] == [sum(rows[i] for i in ids) for ids, _, _ in packed]
    assert all(total <= 20_000 or len(ids) == 1 for ids, _, total in packed)
    assert all(a[2] + size[b[0][0]] > 20_000 for a, b in itertools.pairwise(packed))
    assert 2 < len(packed) < file.num_row_groups
    no_group = pq.ParquetWriter(tmp_path / "c.parquet", pa.schema({"text": pa.string()}))
    no_group.close()
    empty = pq.ParquetFile(tmp_path / "c.parquet").metadata
    assert [(ids, rows) for ids, rows, _ in runs(empty)] == [([], 0)]


def test_one_large_file_is_read_by_several_tasks_with_every_row_once(
    ray_local, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(row_groups, "READ_TASK_BYTES", 64 * 1024)
    path = tmp_path / "large.parquet"
    table = pa.table({"id": list(range(5000)), "text": [f"text {i} " * 20 for i in range(5000)]})
    pq.write_table(table, path, row_group_size=500)
    tasks = ParquetRowGroups(pads.dataset(path)).get_read_tasks(1)
    assert len(tasks) > 4 and sum(task.metadata.num_rows for task in tasks) == 5000
    rows = read_input(DatasetInput(path=str(path))).take_all()
    assert sorted(rows, key=lambda row: row["id"]) == table.to_pylist()
