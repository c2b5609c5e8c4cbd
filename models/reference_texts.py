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
import pyarrow.dataset as pads

from precompute.models.datasets import DatasetInput, arrow_dataset
from precompute.models.errors import ModelError
from precompute.models.text_columns import decodable_rows

SPLIT_SLOT = {"gate": 0, "calibration": 1}
FALLBACK_SLOTS = {"gate": frozenset({2, 4, 6, 8}), "calibration": frozenset({3, 5, 7, 9})}
"""Free slots a purpose may borrow from when its own slot holds fewer texts than asked."""


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


def sample_rows(sample: TextSample, columns: list[str]) -> Iterator[dict[str, object]]:
    """The input's decodable rows in file order, as dicts of `columns`, read a batch at a time:
    a caller that needs the first few thousand stops early, so memory and time do not grow with
    the input (every engine's actors read their gate texts here). Without read-ahead: Arrow's
    scanner otherwise reads ahead 16 batches and pre-buffers a Parquet file's row groups, and a
    process keeps the memory (the reader of 256 gate texts of a 1M-row corpus grew by 649 MB
    of USS, now 203 MB; at 100,000 rows by 125 MB and 139 MB)."""
    try:
        dataset = arrow_dataset(sample)
        parquet = isinstance(dataset.format, pads.ParquetFileFormat)
        options = {"fragment_scan_options": pads.ParquetFragmentScanOptions(pre_buffer=False)} if parquet else {}
        for batch in dataset.to_batches(columns=columns, batch_readahead=0, fragment_readahead=0, **options):
            # A row of invalid UTF-8 is left out: the job's to quarantine.
            yield from decodable_rows(pa.Table.from_batches([batch]))
    except (OSError, pa.ArrowException) as e:
        raise ModelError(f"{sample.path}: cannot read columns {', '.join(columns)} ({e})") from e


def reference_texts(
    sample: TextSample, purpose: Literal["gate", "calibration"], count: int, at_least: int = 1
) -> list[str]:
    """The first `count` texts of the input whose id hashes into the purpose's slot (1 in 10),
    then, if those are fewer, of its fallback slots; then, to reach `at_least`, of any slot (an
    input of a few rows: the gate and calibration may share a text then); fewer are an error.
    Reading stops once the purpose's own slot has `count`: a large input is read no further."""
    own, borrowed, anywhere = [], [], []
    for row in sample_rows(sample, [sample.id, sample.text]):
        text = row[sample.text]
        if not (isinstance(text, str) and text.strip()):
            continue
        slot = split_slot(row[sample.id])
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
