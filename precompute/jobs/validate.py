"""Row checks for the corpus contract: each bad row gets a reason, none is silently dropped."""

from __future__ import annotations

import sys
from collections.abc import Set

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import ray
from ray.data.expressions import col

from precompute.jobs.work_dir import WorkPath
from precompute.models.errors import InvalidInputError, ModelError
from precompute.models.text.columns import lossless, readable, utf8_errors
from precompute.models.text.tokenize import check_text

REASON = "reject_reason"
REJECTS = "rejects.parquet"
"""A job's quarantined rows, with their reasons, in its run folder."""


class RejectRatioExceededError(ModelError):
    """Too many bad rows: the input is more likely broken than the rows."""


VISIBLE = "[^" + "".join(f"\\x{{{c:x}}}" for c in range(sys.maxunicode + 1) if chr(c).isspace()) + "]"
"""A character that `str.strip` keeps, as an RE2 class: a text without one is empty."""


def id_key(value: object) -> str:
    """An id as the jobs key it; the bytes of a binary or unchecked id never raise here."""
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else str(value)


def duplicate_ids(dataset: pads.Dataset, column: str = "id") -> set[str]:
    """Ids that occur more than once. All their rows are rejected: which copy is right is unknowable."""
    return repeated_ids(lossless(dataset.to_table(columns=[column]).rename_columns(["id"])))


def repeated_ids(ids: pa.Table) -> set[str]:
    """The values that its column `id` holds more than once (duplicate_ids)."""
    counts = ids.group_by("id").aggregate([("id", "count")])
    repeated = counts.filter(pc.greater(counts["id_count"], 1))["id"]
    return {id_key(i) for i in repeated.to_pylist()}


def row_reason(id_: object, text: object, duplicates: Set[str], max_text_bytes: int) -> str | None:
    if id_ is None:
        return "id is null"
    if id_key(id_) in duplicates:
        return f"id {id_key(id_)!r} is duplicated"
    if text is None:
        return "text is null"
    if isinstance(text, bytes) and len(text) > max_text_bytes:
        return f"text is {len(text)} bytes, over max_text_bytes={max_text_bytes}"
    try:
        check_text(0, text)
    except InvalidInputError as e:
        return e.reason
    return None


def tag_rejects(batch: pa.Table, duplicates: Set[str], max_text_bytes: int) -> pa.Table:
    """Add a `reject_reason` column (null for good rows), string columns read as their bytes.

    Only the rows `suspects` flags are checked one by one: a batch of good rows never becomes
    Python objects, which cost seconds and hundreds of MB a million rows."""
    undecodable = utf8_errors(batch)
    batch = lossless(batch)
    reasons: list[str | None] = [None] * batch.num_rows
    rows = np.flatnonzero(suspects(batch, duplicates, max_text_bytes, any(undecodable)))
    checked = batch.select(["id", "text"]).take(pa.array(rows, pa.int64()))
    for row, id_, text in zip(rows, checked["id"].to_pylist(), checked["text"].to_pylist(), strict=True):
        reasons[row] = undecodable[row] or row_reason(id_, text, duplicates, max_text_bytes)
    return batch.append_column(REASON, pa.array(reasons, type=pa.string()))


def suspects(batch: pa.Table, duplicates: Set[str], max_text_bytes: int, undecodable: bool) -> np.ndarray:
    """Rows that may be bad, found column-wise: a null id or text, a duplicated id, a text over
    `max_text_bytes` or without a character `str.strip` keeps. Every row where a column holds
    invalid UTF-8 (the text cannot be matched as UTF-8 then)."""
    if undecodable:
        return np.ones(batch.num_rows, dtype=bool)
    text = batch["text"].cast(pa.large_string())
    flags = [
        pc.is_null(batch["id"]),
        pc.invert(pc.fill_null(pc.match_substring_regex(text, VISIBLE), False)),
        pc.fill_null(pc.greater(pc.binary_length(batch["text"]), max_text_bytes), False),
    ]
    if duplicates:
        flags.append(pa.array([id_key(i) in duplicates for i in batch["id"].to_pylist()]))
    return np.logical_or.reduce([np.asarray(flag) for flag in flags])


def quarantine(tagged: ray.data.Dataset, rows: int, max_ratio: float, path: WorkPath, noun: str = "rows") -> int:
    """Write every row with a reason to `path`, before any inference is spent; fail past `max_ratio`."""
    rejects = tagged.filter(expr=col(REASON).is_not_null()).materialize()
    return keep_rejects(ray.get(rejects.to_arrow_refs()), rows, max_ratio, path, noun)


def keep_rejects(tables: list[pa.Table], rows: int, max_ratio: float, path: WorkPath, noun: str = "rows") -> int:
    """Write the rejects `tables` (string columns as their bytes) to `path` as one file, where
    there is a row; fail past `max_ratio` of `rows`. The count of rejects."""
    tables = [t for t in tables if t.num_rows]
    if tables:
        path.parent.mkdir()
        pq.write_table(readable(pa.concat_tables(tables)), path.path, filesystem=path.fs)
    count = sum(t.num_rows for t in tables)
    check_ratio(count, rows, max_ratio, path, noun)
    return count


def check_ratio(count: int, rows: int, max_ratio: float, path: WorkPath, noun: str = "rows") -> None:
    if rows and count / rows > max_ratio:
        raise RejectRatioExceededError(
            f"{count} of {rows} {noun} rejected, over max_reject_ratio={max_ratio}; reasons in {path}"
        )
