"""Row checks for the corpus contract: each bad row gets a reason, none is silently dropped."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Set
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import ray
from ray.data.expressions import col

from precompute.jobs.inputs import CorpusInput, read_input
from precompute.jobs.nights import inputs_digest
from precompute.jobs.work_dir import WorkPath
from precompute.models.datasets import arrow_dataset
from precompute.models.errors import InvalidInputError, ModelError
from precompute.models.text_columns import as_text, lossless, readable, utf8_errors
from precompute.models.tokenize import check_text

REASON = "reject_reason"
VALIDATED = "validated"
"""<work_dir>/validated/<key>/: a corpus's validation (FIGURES, and its REJECTS), by the digest of
its files and rules (validation_entry)."""
FIGURES = "figures.json"
KEPT_VALIDATIONS = 8
"""Validations kept: a night's corpus or two, for several outputs and a few nights."""
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
    ids = lossless(dataset.to_table(columns=[column]).rename_columns(["id"]))
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
    tables = [t for t in ray.get(rejects.to_arrow_refs()) if t.num_rows]
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


def validation_entry(work_dir: WorkPath, files: str, corpus: CorpusInput) -> WorkPath:
    """The folder of the corpus's validation under `work_dir`: keyed by its `files` (their digest)
    and the rules its rows are checked by."""
    rules = {"id": corpus.id, "text": corpus.text, "max_text_bytes": corpus.max_text_bytes}
    return work_dir / VALIDATED / inputs_digest(files, json.dumps(rules, sort_keys=True))


class KnownValidation(NamedTuple):
    rows: int
    rejects: int
    duplicates: set[str]
    """The ids the corpus repeats, whose rows every pass rejects: kept with the figures so that
    a pass over a known corpus reads no column of it first (the ids of 1M rows: 0.5 s)."""


def known_validation(entry: WorkPath, rejects_path: WorkPath, max_ratio: float) -> KnownValidation | None:
    """An earlier validation recorded in `entry`, its rejects copied to `rejects_path` (its ratio
    checked against this job's `max_ratio`); None if there is none (or it kept no duplicates)."""
    if not (entry / FIGURES).is_file():
        return None
    figures = json.loads((entry / FIGURES).read_text())
    if "duplicates" not in figures:
        return None
    if figures["rejects"]:
        rejects_path.parent.mkdir()
        entry.fs.copy_file((entry / REJECTS).path, rejects_path.path)
    check_ratio(figures["rejects"], figures["rows"], max_ratio, rejects_path)
    return KnownValidation(figures["rows"], figures["rejects"], set(figures["duplicates"]))


def record_validation(entry: WorkPath, known: KnownValidation, rejects_path: WorkPath) -> None:
    """Keep a validation's figures and rejects in `entry`, and the KEPT_VALIDATIONS newest of its
    folder's entries."""
    entry.mkdir()
    if known.rejects:
        rejects_path.fs.copy_file(rejects_path.path, (entry / REJECTS).path)
    figures = {"rows": known.rows, "rejects": known.rejects, "duplicates": sorted(known.duplicates), "at": time.time()}
    (entry / FIGURES).write_text(json.dumps(figures))
    entries = [e for e in entry.parent.folders() if (e / FIGURES).is_file()]
    recorded = sorted(entries, key=lambda e: json.loads((e / FIGURES).read_text())["at"], reverse=True)
    for old in recorded[KEPT_VALIDATIONS:]:
        old.rmtree()


def canonical_columns(corpus: CorpusInput) -> dict[str, str]:
    """The input's id and text columns renamed to `id` and `text`, the names every job uses."""
    return {old: new for old, new in ((corpus.id, "id"), (corpus.text, "text")) if old != new}


def payload_columns(corpus: CorpusInput) -> list[str]:
    """The good rows' columns besides `id` and `text`, known without reading a row."""
    renames = canonical_columns(corpus)
    return [c for c in (renames.get(n, n) for n in arrow_dataset(corpus).schema.names) if c not in ("id", "text")]


def validated_corpus(
    corpus: CorpusInput, rejects_path: WorkPath, entry: WorkPath | None = None
) -> tuple[ray.data.Dataset, int, int]:
    """(good rows, rows read, rows rejected) of a corpus Parquet; rejects quarantined first.
    `entry`: this validation's folder among the work directory's (validation_entry),
    where one of the same files by the same rules (the night's other text job, a night whose
    corpus did not move) is taken, its rejects copied and its repeated ids kept, instead of
    reading every row to quarantine them again (or their ids to find the repeated ones)."""
    source = arrow_dataset(corpus)
    renames = canonical_columns(corpus)
    schema = pa.schema(
        [f.with_name(renames.get(f.name, f.name)) for f in source.schema], source.schema.metadata
    )
    dataset = read_input(corpus)
    if renames:
        dataset = dataset.rename_columns(renames)
    known = None if entry is None else known_validation(entry, rejects_path, corpus.max_reject_ratio)
    duplicates = duplicate_ids(source, corpus.id) if known is None else known.duplicates
    tagged = dataset.map_batches(
        tag_rejects,
        batch_format="pyarrow",
        fn_kwargs={"duplicates": duplicates, "max_text_bytes": corpus.max_text_bytes},
    )
    if known is None:
        rows = source.count_rows()
        known = KnownValidation(rows, quarantine(tagged, rows, corpus.max_reject_ratio, rejects_path), duplicates)
        if entry is not None:
            record_validation(entry, known, rejects_path)
    good = tagged.filter(expr=col(REASON).is_null()).drop_columns([REASON])
    # Good rows' bytes are UTF-8: back to strings, the id and text columns whatever their type was.
    return good.map_batches(restore, batch_format="pyarrow", fn_kwargs={"schema": schema}), known.rows, known.rejects


def restore(batch: pa.Table, schema: pa.Schema) -> pa.Table:
    return batch.cast(as_text(schema, ["id", "text"]))
