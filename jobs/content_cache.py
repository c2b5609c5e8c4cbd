"""Content-keyed results of the last successful run, joined to this run's rows inside the dataset.

A row's content key hashes (the producer's identity, text): for embeddings the model hash
(weights, tokenizer, preprocessing); for labels also the head and its vocabulary. A cache
is the previous run's committed staged parts, promoted by an atomic pointer swap once its
version was written: a failed run never replaces it, and it holds exactly that run's
corpus (no unbounded growth).

No process holds a cache whole: its parts are read as a Ray dataset and joined to the rows
(left outer, hash-partitioned) on (id, content key). The id is part of the join key because
two ids with the same text share a content key: the cache holds one row per id, so each
row finds at most one match and the join never multiplies rows (an id whose text moved to
a new id is computed again, which is rare and cheap).
"""

from __future__ import annotations

import hashlib
import logging
import math
import posixpath

import numpy as np
import pyarrow as pa
import ray

from precompute.jobs.staging import is_committed, read_committed
from precompute.jobs.work_dir import WorkPath

POINTER = "CURRENT"
KEY = "content_key"
JOIN_ROWS_PER_PARTITION = 20_000
"""Rows per join partition: each is joined in one task, its cached values in memory (30 MB of
384-d embeddings)."""

log = logging.getLogger(__name__)


def content_keys(identity: str, texts: list[str]) -> list[bytes]:
    prefix = f"{identity}\x00".encode()
    return [hashlib.sha256(prefix + text.encode()).digest()[:16] for text in texts]


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


def join_previous(
    rows: ray.data.Dataset, row_count: int, cache_dir: WorkPath, columns: list[str]
) -> ray.data.Dataset:
    """`rows` (with `id` and content keys) with the previous run's `columns` where (id, key)
    matched, null where not; `rows` unchanged when there is no previous run."""
    previous = previous_run(cache_dir)
    if previous is None:
        return rows
    cached = read_committed(previous).select_columns(["id", KEY, *columns])
    return rows.join(
        cached,
        "left_outer",
        num_partitions=max(1, math.ceil(row_count / JOIN_ROWS_PER_PARTITION)),
        on=("id", KEY),
    )


def uncached(batch: pa.Table, column: str) -> np.ndarray:
    """Which rows of a joined batch found no cached `column` (all of them when nothing was joined)."""
    if column not in batch.column_names:
        return np.ones(batch.num_rows, dtype=bool)
    return batch[column].is_null().to_numpy(zero_copy_only=False)


def promote(cache_dir: WorkPath, run_dir: WorkPath) -> None:
    """Make the committed parts in `run_dir` the cache the next run reads: the pointer names it
    relative to the cache, so a work directory moved or mounted elsewhere keeps its caches."""
    (cache_dir / POINTER).write_text(posixpath.relpath(run_dir.path, cache_dir.path))
