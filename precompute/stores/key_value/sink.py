"""The Ray Datasink that writes a job's records into an unpublished Redis version."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable
from typing import Any

import pyarrow as pa
import ray
from ray.data.block import Block, BlockAccessor
from ray.data.datasource import Datasink, WriteResult

from precompute.stores.errors import StoreError
from precompute.stores.key_value.settings import RedisSettings, buckets_of, check_output, output_keys
from precompute.stores.key_value.store import KeyValueStore
from precompute.stores.versions import check_version

BUCKET = "bucket"


def with_bucket(batch: pa.Table, buckets: int) -> pa.Table:
    ids = batch["id"].cast(pa.string()).to_pylist()
    return batch.append_column(BUCKET, pa.array(buckets_of([i.encode() for i in ids], buckets), pa.int64()))


class KeyValueSink(Datasink[int]):
    """Writes Ray Data blocks with columns `id` (string or integer) and `value` (binary) into a version.

    Each write task opens its own connection (the sink is a pickled copy there). A failed
    write deletes the whole version: a half-written version is never worth keeping.
    """

    def __init__(self, settings: RedisSettings, output: str, version: str) -> None:
        """A sink into `version`, which create_version must have registered."""
        self.settings = settings
        self.output = check_output(output)
        self.version = check_version(version)
        self.rows = 0
        """Records written, set once the write completes; publish checks the count in Redis."""

    @property
    def min_rows_per_write(self) -> int:
        """Rows per write task: each pays a connection and a registry read, and more rows
        per task put more records into each HSET (records per HSET = rows per task x
        entries_per_bucket / rows of the version)."""
        return self.settings.write_batch

    def routed(self, values: ray.data.Dataset, rows: int) -> ray.data.Dataset:
        """`values` hash-partitioned by the bucket each id falls in, a block per write task, so
        each task writes whole buckets: about entries_per_bucket records per HSET, where rows
        in any order put about one in each at millions of rows. Fewer rows than one write
        task takes need no routing. Call it once the version exists (its bucket count)."""
        if rows <= self.settings.write_batch:
            return values
        with KeyValueStore(self.settings) as store:
            buckets = store.layout(self.output, self.version).buckets
        tagged = values.map_batches(with_bucket, fn_kwargs={"buckets": buckets}, batch_format="pyarrow")
        return tagged.repartition(math.ceil(rows / self.settings.write_batch), keys=[BUCKET])

    def on_write_start(self, schema: pa.Schema | None = None) -> None:
        if schema is not None and {"id", "value"} - set(schema.names):
            raise ValueError(f"blocks need columns 'id' and 'value', got {schema.names}")
        with KeyValueStore(self.settings) as store:
            store.check_writable(output_keys(self.settings, self.output), self.version)

    def write(self, blocks: Iterable[Block], ctx: Any) -> int:
        """All the task's blocks in one store write, for the fullest HSETs."""
        ids: list[str] = []
        values: list[bytes] = []
        for block in blocks:
            table = BlockAccessor.for_block(block).to_arrow()
            ids += table["id"].cast(pa.string()).to_pylist()
            values += table["value"].to_pylist()
        with KeyValueStore(self.settings) as store:
            return store.write(self.output, self.version, ids, values)

    def on_write_complete(self, write_result: WriteResult[int]) -> None:
        self.rows = sum(write_result.write_returns)

    def on_write_failed(self, error: Exception) -> None:
        # Best effort, like Ray's call itself: the caller must see `error`, not a cleanup
        # failure; a version left behind stays registered, so a later collect_garbage deletes it.
        with contextlib.suppress(StoreError), KeyValueStore(self.settings) as store:
            store.drop_version(self.output, self.version)
