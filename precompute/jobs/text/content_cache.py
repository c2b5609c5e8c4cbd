"""Content-keyed results of the last successful run, reused for this run's rows that have them.

A row's content key hashes (the producer's identity, text): for embeddings the model hash
(weights, tokenizer, preprocessing); for labels also the head and its vocabulary. A cache
is the previous run's committed staged parts, promoted by an atomic pointer swap once its
version was written: a failed run never replaces it, and it holds exactly that run's
corpus (no unbounded growth).

The rows are compared on the driver by (id, content key, a hash of their payload): a few
bytes a row, never a cached value. Then three kinds of row take three paths:
- the same id, key and payload: the cached staged row is this run's row as it is, read from
  the cache's parts and never handed to a model (most rows of a nightly run);
- the same id and key, another payload: the row is joined to its cached value, the join's
  cached side narrowed to those rows, and the model passes the value through;
- the rest are computed.
The id is part of the key because two ids with the same text share a content key: an id
whose text moved to a new id is computed again, which is rare and cheap.
"""

from __future__ import annotations

import hashlib
import logging
import math
import posixpath
from typing import NamedTuple

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import ray
from pyarrow.fs import FileSystem
from ray import ObjectRef

from precompute.jobs.staging import (
    COMPUTED,
    committed_dataset,
    committed_parts,
    is_committed,
    part_name,
    read_committed,
    write_part,
)
from precompute.jobs.text.corpus_validation import GoodRows
from precompute.jobs.work_dir import WorkPath, copy_file

POINTER = "CURRENT"
KEY = "content_key"
DIGEST = "digest"
JOIN_ROWS_PER_PARTITION = 20_000
"""Rows per join partition: each is joined in one task, its cached values in memory (30 MB of
384-d embeddings)."""

GATHERED_ROWS = 100_000
"""A night's fresh rows, when at most this many, are gathered in Ray's object store (out of
the rows reuse_previous read) before the model's actor pool starts. Streamed, they were read
out of the whole corpus again beside the pool, whose actors hold their CPUs from the start,
and the read ran one task at a time: gathered first, an incremental night's few rows embed
several times faster (`precompute bench scale`, its 1% rerun). More rows stream, as a full
run's do (gathered, they would fill the store)."""

log = logging.getLogger(__name__)


def content_keys(identity: str, texts: list[str]) -> list[bytes]:
    prefix = f"{identity}\x00".encode()
    return [hashlib.sha256(prefix + text.encode()).digest()[:16] for text in texts]


def key_array(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Content keys (a binary column of 16-byte keys) as a numpy array of 16-byte strings, taken
    from the column's buffer, orders of magnitude cheaper than a Python bytes object per key,
    in every night's items and again in an incremental night's comparison with the published
    ones."""
    keys = pc.cast(column, pa.binary(16))
    if isinstance(keys, pa.ChunkedArray):  # one chunk viewed: Arrow's concatenation copies it
        keys = keys.chunk(0) if keys.num_chunks == 1 else keys.combine_chunks()
    return np.frombuffer(keys.buffers()[1], "S16", count=len(keys), offset=keys.offset * 16)


def differ(before: np.ndarray, after: np.ndarray) -> np.ndarray:
    """Where two arrays of content keys (key_array's, as long) differ, as a mask: compared as
    two 64-bit halves, faster than numpy's byte-by-byte comparison of 16-byte strings, twice in
    every incremental night's plan and once in its index's."""
    a, b = (np.ascontiguousarray(keys).view(np.uint64).reshape(-1, 2) for keys in (before, after))
    return (a[:, 0] != b[:, 0]) | (a[:, 1] != b[:, 1])


def key_column(keys: np.ndarray) -> pa.Array:
    """`keys` (key_array's) as an Arrow column, byte for byte: pyarrow's own conversion of a
    numpy bytes array drops each key's trailing zero bytes."""
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(16), len(keys), [None, pa.py_buffer(np.ascontiguousarray(keys))])


def with_content_keys(batch: pa.Table, identity: str) -> pa.Table:
    """A map_batches step (no model): the batch with its rows' content keys."""
    return batch.append_column(
        KEY, pa.array(content_keys(identity, batch["text"].to_pylist()), pa.binary(16))
    )


def previous_run(cache_dir: WorkPath) -> WorkPath | None:
    """The promoted run's committed parts folder; None when there is none (first run, or a
    folder staged before manifests existed: its rows are simply computed again)."""
    pointer = cache_dir / POINTER
    if not pointer.exists():
        return None
    run_dir = cache_dir / pointer.read_text().strip()  # older pointers hold an absolute path
    if not is_committed(run_dir):
        log.warning("cache %s points to %s, which has no manifest: computing every row", cache_dir, run_dir)
        return None
    return run_dir


def stage_kept(run_dir: WorkPath, stale: ObjectRef, target: WorkPath) -> list[ObjectRef]:
    """Start writing the previous run's staged rows that are this run's exactly (`run_dir`'s
    committed parts less the `stale` ids: ids_ref) into `target` as parts of its own, one Ray
    task per part; each task returns its part's manifest entry (StagingSink's `kept`). A task
    reads and writes its Parquet directly: through Ray Data the same rows took more than twice
    as long (`precompute bench scale`, its 1% rerun), carried through its object store twice."""
    target.mkdir()
    return [keep_part.remote(run_dir.fs, part, target, [stale]) for part in committed_parts(run_dir)]


@ray.remote
def keep_part(fs: FileSystem, part: str, target: WorkPath, stale: list[ObjectRef]) -> dict[str, int | str]:
    """One committed part (`part` on `fs`) less the `stale` rows, under a name of its own in
    `target`: the file copied as it is where it holds none of them (most of a nightly run's
    parts; server-side on object storage), else its other rows written. A part staged with its
    COMPUTED column (before parts dropped it) is written once more, without it. `stale` is
    wrapped in a list so that Ray passes the reference, not the ids."""
    with fs.open_input_file(part) as source:
        file = pq.ParquetFile(source)
        stored = file.schema_arrow.names
        moved = pc.is_in(file.read(columns=["id"])["id"], value_set=ray.get(stale[0]))
        if COMPUTED in stored or pc.any(moved).as_py():
            rows = file.read(columns=[c for c in stored if c != COMPUTED])  # kept: none computed
            return write_part(rows.filter(pc.invert(moved)), target)
    name = part_name()
    copy_file(fs, part, (target / name).path)
    return {"name": name, "rows": len(moved), "computed": 0}


class Reuse(NamedTuple):
    fresh: ray.data.Dataset | None
    """The rows the model sees: those to compute, and those whose payload alone moved, joined
    to their cached `columns`; None when there is none."""
    kept: list[ObjectRef]
    """The manifest entries of the kept rows' parts, being written (stage_kept)."""
    count: int
    """Rows kept."""
    gone: list[str]
    """The ids of the cache's rows that this run lacks (as strings)."""
    source: WorkPath | None = None
    """The cache's run whose rows were kept; None when none was."""


def reuse_previous(
    rows: GoodRows,
    cache_dir: WorkPath | None,
    columns: list[str],
    payload: list[str],
    staged: WorkPath,
) -> Reuse:
    """Split `rows` (with `id`, content keys and `payload` columns) by what the previous run
    staged with its `columns` of values: see the module's docstring. Reads `rows` once into
    Ray's object store (GoodRows.blocks), and their keys and payload to the driver. No cache
    (`cache_dir` None, or nothing promoted): every row is fresh, and streams (GoodRows.dataset).
    Both sides are chosen by the ids that
    moved (this run's fresh ones, the cache's stale ones), few on a nightly run: each block
    looks its rows up in a small set. The kept rows' parts start being written into `staged`
    (this run's staging folder) before the fresh rows are gathered: at most GATHERED_ROWS, out
    of the rows read (reading the corpus again for them was a sizeable share of an incremental
    night's labels: `precompute bench scale`, its 1% rerun); more stream from the input again. The rows read leave the
    store once the fresh ones are taken: a corpus's id, text and payload (about 200 MB a
    million rows of bench scale), spilled to disk by Ray past its store."""
    previous = None if cache_dir is None else previous_run(cache_dir)
    if previous is None:
        return Reuse(rows.dataset(), [], 0, [])
    read = rows.blocks()  # once: its keys go to the driver, a night's few fresh rows come from it
    now = to_driver(read, ["id", KEY, *payload])
    if now is None:
        return Reuse(rows.dataset(), [], 0, [])
    cached = committed_dataset(previous)
    if cached.schema.field("id").type != now.schema.field("id").type:
        return Reuse(rows.dataset(), [], 0, [])  # the id column's type moved: no id is the same
    cached_payload = payload_types(cached.schema, {"id", KEY, COMPUTED, *columns})
    same_payload = cached_payload == payload_types(now.schema, {"id", KEY})
    before = cached.to_table(columns=["id", KEY, *(payload if same_payload else [])])
    now_rows, before_rows = digests(now, payload), digests(before, payload if same_payload else [])
    matched = now_rows.join(before_rows, on=["id", KEY], suffix="_before")
    same = matched.filter(pl.col(DIGEST) == pl.col(f"{DIGEST}_before") if same_payload else pl.lit(False))
    fresh_ids, stale_ids = now_rows.join(same, on="id", how="anti"), before_rows.join(same, on="id", how="anti")
    kept = [] if same.is_empty() else stage_kept(previous, ids_ref(stale_ids, now), staged)
    source = previous if kept else None
    gone = [str(i) for i in stale_ids.join(now_rows, on="id", how="anti")["id"].to_list()]
    if fresh_ids.is_empty():
        return Reuse(None, kept, len(same), gone, source)
    gathered = len(fresh_ids) <= GATHERED_ROWS
    if kept and gathered:  # a few fresh rows, out of the rows read
        ids = ids_ref(fresh_ids, now)
        fresh = ray.data.from_arrow_refs([rows_with_ids.remote(block, [ids]) for block in read])
    elif kept:  # more stream from the input again
        fresh = rows.dataset().map_batches(with_ids, fn_kwargs={"ids": ids_ref(fresh_ids, now)}, batch_format="pyarrow")
    else:  # none kept: every row, as a full run's
        fresh = rows.dataset()
    moved = matched.join(same, on="id", how="anti")  # the same text, another payload
    if not moved.is_empty():
        # The value columns the cache holds: one a newer job added (a labels output's agreement
        # with its corrections) is computed for these rows, as for any fresh row.
        values = read_committed(previous).select_columns(["id", KEY, *(c for c in columns if c in cached.schema.names)])
        if kept:  # else every cached row may match
            values = values.map_batches(with_ids, fn_kwargs={"ids": ids_ref(moved, now)}, batch_format="pyarrow")
        fresh = fresh.join(
            values, "left_outer", num_partitions=max(1, math.ceil(len(fresh_ids) / JOIN_ROWS_PER_PARTITION)), on=("id", KEY)
        )
    if kept and gathered:
        fresh = fresh.materialize()
    return Reuse(fresh, kept, len(same), gone, source)


def to_driver(blocks: list[ObjectRef], columns: list[str]) -> pa.Table | None:
    """The `blocks`' `columns` as one table in this process; None when there is no row."""
    tables = [t for t in ray.get([block_columns.remote(block, columns) for block in blocks]) if t.num_rows]
    return pa.concat_tables(tables) if tables else None


@ray.remote
def block_columns(block: pa.Table, columns: list[str]) -> pa.Table:
    """A task a block, where the block is, not a Ray Data operator, whose start costs more than
    this work does (`precompute bench scale`), as for rows_with_ids."""
    return block.select(columns)


@ray.remote
def rows_with_ids(block: pa.Table, ids: list[ObjectRef]) -> pa.Table:
    """with_ids as a task a block, for block_columns' reason. `ids` is wrapped in a
    list so that Ray passes the reference, as keep_part's `stale`."""
    return with_ids(block, ids[0])


def payload_types(schema: pa.Schema, not_payload: set[str]) -> dict[str, pa.DataType]:
    return {f.name: f.type for f in schema if f.name not in not_payload}


def digests(table: pa.Table, columns: list[str]) -> pl.DataFrame:
    """(id, content key, digest): the `columns` of each row hashed to one number, comparable
    within this process (0 where there are none to compare)."""
    frame = pl.from_arrow(table)
    assert isinstance(frame, pl.DataFrame)
    hashed = frame.select(columns).hash_rows(seed=0) if columns else pl.lit(0, pl.UInt64)
    return frame.select("id", KEY, **{DIGEST: hashed})


def changes(now: pl.DataFrame, before: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Of two `digests` frames: (`now`'s rows not in `before` as they are, `before`'s rows whose
    id `now` lacks)."""
    return now.join(before, on=["id", KEY, DIGEST], how="anti"), before.join(now, on="id", how="anti")


def ids_ref(frame: pl.DataFrame, like: pa.Table) -> ObjectRef:
    """The frame's ids in the object store, typed as `like`'s (what with_ids and keep_part take)."""
    return ray.put(frame["id"].to_arrow().cast(like.schema.field("id").type))


def with_ids(batch: pa.Table, ids: ObjectRef) -> pa.Table:
    return batch.filter(pc.is_in(batch["id"], value_set=ray.get(ids)))


def uncached(batch: pa.Table, column: str) -> np.ndarray:
    """Which rows of a joined batch found no cached `column` (all of them when nothing was joined)."""
    if column not in batch.column_names:
        return np.ones(batch.num_rows, dtype=bool)
    return batch[column].is_null().to_numpy(zero_copy_only=False)


def promote(cache_dir: WorkPath, run_dir: WorkPath) -> None:
    """Make the committed parts in `run_dir` the cache the next run reads: the pointer names it
    relative to the cache, so a work directory moved or mounted elsewhere keeps its caches."""
    (cache_dir / POINTER).write_text(posixpath.relpath(run_dir.path, cache_dir.path))
