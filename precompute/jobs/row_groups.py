"""Parquet inputs read by row groups: a read task's memory bounded by READ_TASK_BYTES, not by a file.

Ray Data's first Parquet datasource gives each task whole files, so a task over one large file
grows with it: reading bench scale's corpus (one file, 65,536-row groups) a read task's USS went
279 → 722 MB from 100,000 to 1M rows, read here 260 → 291 MB. Its second
datasource splits row groups but starts 32 footer-reading actors for every read
(jobs/ray_session.py). Here the driver reads each file's footer and hands a task a run of the
file's row groups up to READ_TASK_BYTES (uncompressed, as the footer says): several small files
stay one task each, as before, and one large file becomes many.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
from ray.data import DataContext
from ray.data.block import BlockMetadata
from ray.data.datasource import Datasource, ReadTask

READ_TASK_BYTES = 32 * 1024 * 1024
"""Row groups' uncompressed bytes a read task takes at most, a block's worth (jobs/ray_session.py
TARGET_BLOCK_BYTES); a single larger group is a task of its own."""
BATCH_ROWS = 8192
"""Rows a read task decodes at a time: its blocks are cut to Ray Data's target size anyway."""


class ParquetRowGroups(Datasource):
    """The files of `dataset` (a pyarrow Parquet dataset) as read tasks of whole row groups."""

    def __init__(self, dataset: pads.FileSystemDataset) -> None:
        self.dataset = dataset

    def estimate_inmemory_data_size(self) -> int | None:
        return None

    def get_read_tasks(
        self, parallelism: int, per_task_row_limit: int | None = None, data_context: DataContext | None = None
    ) -> list[ReadTask]:
        schema = self.dataset.schema
        tasks = []
        for fragment in self.dataset.get_fragments():
            for ids, rows, size in runs(fragment.metadata):
                metadata = BlockMetadata(rows, size, exec_stats=None, input_files=[fragment.path])
                part = fragment.subset(row_group_ids=ids)
                tasks.append(ReadTask(partial(batches, part, schema), metadata, schema, per_task_row_limit))
        return tasks


def runs(metadata: pq.FileMetaData) -> Iterator[tuple[list[int], int, int]]:
    """(row group ids, rows, uncompressed bytes) of consecutive groups up to READ_TASK_BYTES;
    a file without a row group yields one empty run (its schema is still read)."""
    ids: list[int] = []
    rows = size = 0
    for i in range(metadata.num_row_groups):
        group = metadata.row_group(i)
        if ids and size + group.total_byte_size > READ_TASK_BYTES:
            yield ids, rows, size
            ids, rows, size = [], 0, 0
        ids.append(i)
        rows += group.num_rows
        size += group.total_byte_size
    yield ids, rows, size


def batches(part: pads.ParquetFileFragment, schema: pa.Schema) -> Iterator[pa.Table]:
    """The fragment's rows in the dataset's schema, BATCH_ROWS at a time."""
    for batch in part.to_batches(schema=schema, batch_size=BATCH_ROWS):
        yield pa.Table.from_batches([batch], schema)
