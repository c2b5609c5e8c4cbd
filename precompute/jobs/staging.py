"""Exactly-once staging: a run's Parquet parts, committed through a manifest.

Ray retries a write task whose worker died (a killed process, a lost node); the dead
attempt may already have written a part that no task returns, and a reader that globbed
the folder would read its rows twice. So each write task returns the parts it wrote,
`on_write_complete` (which sees the returns of successful tasks only) commits exactly
those in a manifest replaced by rename, and deletes any other part. Every reader of a
run's parts (the vector-store load, validation, the caches) reads the manifest's parts
and nothing else: a folder without a manifest was never committed.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import ray
from ray import ObjectRef
from ray.data.block import Block, BlockAccessor
from ray.data.datasource import Datasink, WriteResult

from precompute.jobs.nights import copy_files
from precompute.jobs.row_groups import ParquetRowGroups
from precompute.jobs.work_dir import WorkPath

MANIFEST = "manifest.json"
PARTS = "part-*.parquet"
COMPUTED = "computed"
"""Optional boolean column of the blocks a sink writes: the row ran inference tonight (False: its
value came from the cache). Counted into its part's manifest entry and not stored, so that a
part whose rows a later night keeps is copied as it is (jobs/text/content_cache.py keep_part)."""


class UncommittedError(Exception):
    """A run folder whose write never completed: it has no manifest."""


def part_name() -> str:
    """A new part's file name: unique, so that a retried task never overwrites a committed part."""
    return f"part-{uuid.uuid4().hex}.parquet"


def dictionary_columns(schema: pa.Schema) -> list[str]:
    """The columns worth Parquet's dictionary encoding: all but lists. An embedding's floats never
    repeat, and pyarrow's attempt to build a dictionary of them, before it falls back to plain
    pages, took about half the time of writing a part of embeddings, and slowed reading it
    back."""
    lists = (pa.types.is_list, pa.types.is_fixed_size_list)
    return [f.name for f in schema if not any(is_list(f.type) for is_list in lists)]


def write_part(table: pa.Table, run_dir: WorkPath) -> dict[str, Any]:
    """`table` as a new part of `run_dir` (not yet committed), its COMPUTED column counted and
    dropped; returns its manifest entry."""
    computed = 0
    if COMPUTED in table.column_names:
        computed, table = int(pc.sum(table[COMPUTED]).as_py() or 0), table.drop_columns([COMPUTED])
    name = part_name()
    path = (run_dir / name).path
    pq.write_table(table, path, filesystem=run_dir.fs, use_dictionary=dictionary_columns(table.schema))
    return {"name": name, "rows": table.num_rows, "computed": computed}


class StagingSink(Datasink[list[dict[str, Any]]]):
    """Writes each block as a Parquet part of `run_dir` and commits the parts that were returned,
    with those `kept`: parts other tasks write into `run_dir` (their manifest entries, awaited
    before the commit: jobs/text/content_cache.py stage_kept)."""

    def __init__(self, run_dir: WorkPath, kept: list[ObjectRef] | None = None) -> None:
        self.run_dir = run_dir
        self.kept = kept or []
        self.rows = self.computed = 0
        """Rows committed, and of them those with `computed` true; set by on_write_complete."""

    def on_write_start(self, schema: pa.Schema | None = None) -> None:
        self.run_dir.mkdir()

    def write(self, blocks: Iterable[Block], ctx: Any) -> list[dict[str, Any]]:
        parts = []
        for block in blocks:
            table = BlockAccessor.for_block(block).to_arrow()
            if table.num_rows:
                parts.append(write_part(table, self.run_dir))
        return parts

    def on_write_complete(self, write_result: WriteResult[list[dict[str, Any]]]) -> None:
        self.commit(write_result.write_returns)

    def commit(self, write_returns: list[list[dict[str, Any]]]) -> None:
        """Commit the parts the write tasks returned and the kept ones (a run that computed no
        row commits with no write: `commit([])`)."""
        parts = [*ray.get(self.kept), *(part for returned in write_returns for part in returned)]
        commit(self.run_dir, parts)
        self.rows = sum(p["rows"] for p in parts)
        self.computed = sum(p["computed"] for p in parts)


def commit(run_dir: WorkPath, parts: list[dict[str, Any]]) -> None:
    """Write the manifest of `parts` atomically, then delete every part it does not list."""
    (run_dir / MANIFEST).write_text(json.dumps({"parts": parts}))
    listed = {p["name"] for p in parts}
    for orphan in run_dir.glob(PARTS):
        if orphan.name not in listed:
            orphan.unlink()


def copy_committed(source: WorkPath, target: WorkPath) -> None:
    """The committed parts of `source` copied into `target`, the manifest last: a run that keeps
    another run's staged rows (an unchanged night: jobs/nights.py)."""
    parts = json.loads((source / MANIFEST).read_text())["parts"]
    copy_files(source, target, [*(p["name"] for p in parts), MANIFEST])


def is_committed(run_dir: WorkPath) -> bool:
    return (run_dir / MANIFEST).is_file()


def committed_parts(run_dir: WorkPath) -> list[str]:
    """Paths of the parts the manifest lists, in its order, on `run_dir.fs`."""
    if not is_committed(run_dir):
        raise UncommittedError(f"{run_dir} has no {MANIFEST}: its write never completed")
    parts = json.loads((run_dir / MANIFEST).read_text())["parts"]
    return [(run_dir / p["name"]).path for p in parts]


def committed_dataset(run_dir: WorkPath) -> pads.Dataset:
    """The committed parts as one pyarrow dataset (read in batches, never whole unless asked)."""
    return pads.dataset(committed_parts(run_dir), format="parquet", filesystem=run_dir.fs)


def read_committed(run_dir: WorkPath) -> ray.data.Dataset:
    """The committed parts as a Ray dataset, read where Ray's tasks run, by row groups as the
    inputs are (jobs/row_groups.py): through Ray Data's Parquet reader, which gives a task
    several parts, a reader's USS went 139 -> 173 MB from 100,000 to 1M rows in bench scale."""
    return ray.data.read_datasource(ParquetRowGroups(committed_dataset(run_dir)))
