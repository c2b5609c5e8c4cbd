"""Held-out texts for the accuracy gate and calibration texts for static INT8, never overlapping.

Rows are assigned by a hash of their id, so the split is stable across runs and
independent of row order: the gate never scores an engine on texts that set its ranges.
An input too small to fill a purpose's slot lends it rows of the free slots, half each, so
a catalogue of a few hundred rows is gated on what it has (the report says how few); one of a
few rows lends any row it has.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Literal

import pyarrow as pa
import pyarrow.parquet as pq

from precompute.models.datasets import DatasetInput, files_dataset, input_files
from precompute.models.errors import ModelError
from precompute.models.text.columns import decodable

SPLIT_SLOT = {"gate": 0, "calibration": 1}
FALLBACK_SLOTS = {"gate": frozenset({2, 4, 6, 8}), "calibration": frozenset({3, 5, 7, 9})}
"""Free slots a purpose may borrow from when its own slot holds fewer texts than asked."""
SAMPLE_BATCH = 4096
"""Rows read at a time: about ten batches hold the 256 gate texts of one slot in ten."""


class TextSample(DatasetInput):
    """An input's texts, by the names of its id and text columns."""

    id: str = "id"
    """The column of each row's unique id."""
    text: str = "text"
    """The column of each row's text."""

    def id_columns(self) -> tuple[str, ...]:
        return (self.id,)


def split_slot(id_: object) -> int:
    """The row's slot of ten: 0 is the gate's, 1 calibration's, the rest free (training)."""
    return hashlib.sha256(str(id_).encode()).digest()[0] % 10


def texts_digest(texts: list[str]) -> str:
    """What a set of gate texts is, for the keys of the results cached for it."""
    return hashlib.sha256("\x00".join(texts).encode()).hexdigest()[:16]


def sample_batches(sample: TextSample, columns: list[str]) -> Iterator[pa.Table]:
    """The input's decodable rows in file order, `columns` of SAMPLE_BATCH rows at a time, read
    on this thread: a caller that needs the first few thousand stops early, so memory and
    time do not grow with the input (every engine's actors read their gate texts here).

    Parquet is read file by file (ParquetFile.iter_batches), not by a dataset scan: a scan left
    unfinished reads the rest of its file when it is closed (pre-buffered row groups, then every
    batch, even at readahead 0), and the process keeps the memory. Taking 256 gate texts of
    bench scale's corpus grew a process by 141 MB of USS at 100,000 rows and 190 MB at 1M
    (437 MB two seconds after the scan's first batch); read file by file, 40 and 38 MB. CSV and
    JSON Lines, which have no row groups, are scanned."""
    files = input_files(sample)
    dataset = files_dataset(files, sample.path)
    try:
        schema = pa.schema([dataset.schema.field(column) for column in columns])
        if files.format == "parquet":
            for path in files.files:
                with files.filesystem.open_input_file(path) as file:
                    reader = pq.ParquetFile(file, pre_buffer=False)
                    for batch in reader.iter_batches(SAMPLE_BATCH, columns=columns, use_threads=False):
                        # Dictionary columns read as their values, as the dataset's schema says.
                        yield decodable(pa.Table.from_batches([batch]).cast(schema))
        else:
            for batch in dataset.to_batches(columns=columns, batch_size=SAMPLE_BATCH, use_threads=False):
                yield decodable(pa.Table.from_batches([batch]))  # invalid UTF-8: the job's to quarantine
    except (KeyError, OSError, pa.ArrowException) as e:
        raise ModelError(f"{sample.path}: cannot read columns {', '.join(columns)} ({e})") from e


def reference_texts(
    sample: TextSample, purpose: Literal["gate", "calibration"], count: int, at_least: int = 1
) -> list[str]:
    """The first `count` texts of the input whose id hashes into the purpose's slot (1 in 10),
    then, if those are fewer, of its fallback slots; then, to reach `at_least`, of any slot (an
    input of a few rows: the gate and calibration may share a text then); fewer are an error.
    Reading stops once the purpose's own slot has `count`: a large input is read no further."""
    own, borrowed, anywhere = [], [], []
    for batch in sample_batches(sample, [sample.id, sample.text]):
        for id_, text in zip(batch[sample.id].to_pylist(), batch[sample.text].to_pylist(), strict=True):
            if not (isinstance(text, str) and text.strip()):
                continue
            slot = split_slot(id_)
            if slot == SPLIT_SLOT[purpose]:
                own.append(text)
                if len(own) == count:
                    return own
            elif slot in FALLBACK_SLOTS[purpose] and len(borrowed) < count:
                borrowed.append(text)
            elif len(anywhere) < at_least:
                anywhere.append(text)
    found = own + borrowed[: count - len(own)]
    found += anywhere[: max(0, at_least - len(found))]
    if len(found) < at_least:
        raise ModelError(f"reference texts {sample.path}: {len(found)} {purpose} texts, at least {at_least} needed")
    return found
