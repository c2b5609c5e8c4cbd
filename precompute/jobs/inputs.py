"""The inputs the jobs read, as the pipeline file names them: a file (or URI) and its columns."""

from __future__ import annotations

import pyarrow as pa
import ray
from pydantic import Field

from precompute.jobs.row_groups import ParquetRowGroups
from precompute.models.datasets import (
    DatasetInput,
    InputError,
    arrow_dataset,
    decoded,
    input_files,
    plain_schema,
)
from precompute.models.text.columns import TEXT_TYPES
from precompute.models.text.reference import TextSample


def _is_text(kind: pa.DataType) -> bool:
    return kind in TEXT_TYPES


def _is_key(kind: pa.DataType) -> bool:
    return kind in TEXT_TYPES or pa.types.is_integer(kind)


TIME_TYPES = "timestamps, dates, numbers or ISO-8601 strings"


def is_time(kind: pa.DataType) -> bool:
    """A column type jobs/recs/history/interactions.py time_seconds reads (dictionaries read as their values:
    models/datasets.py plain_type)."""
    return (
        pa.types.is_timestamp(kind)
        or pa.types.is_date(kind)
        or pa.types.is_integer(kind)
        or pa.types.is_floating(kind)
        or pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
    )


def _is_label(kind: pa.DataType) -> bool:
    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_integer(kind)


def _is_labels(kind: pa.DataType) -> bool:
    is_list = pa.types.is_list(kind) or pa.types.is_large_list(kind)
    return _is_label(kind) or (is_list and _is_label(kind.value_type))


def _is_weight(kind: pa.DataType) -> bool:
    return (
        pa.types.is_integer(kind)
        or pa.types.is_floating(kind)
        or pa.types.is_boolean(kind)
        or pa.types.is_decimal(kind)
    )


COLUMN_TYPES = {
    "id": (_is_key, "strings, bytes or integers"),
    "text": (_is_text, "strings or UTF-8 bytes"),
    "label": (_is_labels, "strings or integers, or lists of them (several labels per row)"),
    "user": (_is_key, "strings, bytes or integers"),
    "item": (_is_key, "strings, bytes or integers"),
    "weight": (_is_weight, "numbers or booleans"),
    "time": (is_time, TIME_TYPES),
    "basket": (_is_key, "strings, bytes or integers"),
}
"""What each input column may hold, by its field in an `input` table: anything else is refused
before a job reads a row."""


class CorpusInput(TextSample):
    """A corpus (a file, folder, glob or partitioned dataset) and the names of its columns."""

    label: str | None = None
    """Labels with a trained head: the column it learns from; a list column gives several labels
    per row (a sigmoid head, each label's threshold chosen on held-out rows)."""
    max_text_bytes: int = Field(1_000_000, ge=1)
    """A longer text is rejected, not read: the model sees its first few hundred tokens anyway."""
    max_reject_ratio: float = Field(0.01, ge=0, le=1)
    """The job fails, before any inference, when more than this share of rows is rejected."""

    def sample(self) -> TextSample:
        """The id and text columns alone: where an engine draws its gate and calibration texts."""
        return TextSample(path=self.path, format=self.format, where=self.where, id=self.id, text=self.text)


class CorrectionsInput(DatasetInput):
    """Labels a person corrected: each row a corpus row's id and the label it must have."""

    id: str = "id"
    """The column of the corpus row's id."""
    label: str = "label"
    """The column of the label that row must have."""
    max_rows: int = Field(100_000, ge=1)
    """Corrections are read into memory and go with the job's tasks: past this many, the
    labels belong in the corpus's label column."""

    def id_columns(self) -> tuple[str, ...]:
        return (self.id,)

    def read(self) -> tuple[tuple[str, str], ...]:
        """(id, label) pairs sorted by id, each id once (its last row, as a file of edits is
        appended to); ids as strings, as the corpus's are compared (str of each id)."""
        dataset = arrow_dataset(self)
        if (rows := dataset.count_rows()) > self.max_rows:
            raise InputError(f"{self.path}: {rows:,} corrections, more than max_rows {self.max_rows:,}")
        table = decoded(dataset.to_table(columns=[self.id, self.label]))
        pairs: dict[str, str] = {}
        for number, (id_, label) in enumerate(zip(*(table[c].to_pylist() for c in (self.id, self.label)), strict=True)):
            if id_ is None or label is None or not str(label):
                raise InputError(f"{self.path}: row {number}: a correction needs an id and a label")
            pairs[str(id_)] = str(label)
        return tuple(sorted(pairs.items()))


class InteractionsInput(DatasetInput):
    """Interactions (a file, folder, glob or partitioned dataset) and the names of their columns."""

    user: str = "user_id"
    """The column of the user's id."""
    item: str = "item_id"
    """The column of the item's id: an id of the items' embeddings output."""
    weight: str = "weight"
    """Optional in the data: without the column every interaction weighs 1."""
    time: str = "timestamp"
    """Optional in the data (timestamps of any unit or zone, dates, numbers, ISO-8601 strings):
    it orders each user's history, and the quality check holds out each user's last
    interaction; without it, a seeded random one."""
    basket: str | None = None
    """The column of the order, session or visit an interaction belongs to, where there is one:
    the quality check then holds out each user's last basket (scored by recall and NDCG over its
    items, and on the items new to the user) instead of their last interaction."""
    max_reject_ratio: float = Field(0.01, ge=0, le=1)
    """The job fails when more than this share of interactions is rejected."""

    def id_columns(self) -> tuple[str, ...]:
        return (self.user, self.item) + ((self.basket,) if self.basket else ())


def read_input(source: DatasetInput) -> ray.data.Dataset:
    """The input's rows on Ray, from the same files the driver's checks read (models/datasets.py);
    Parquet by row groups (jobs/row_groups.py)."""
    files = input_files(source)
    encoded = files.encoded()
    # The files are chosen already: no extension filter, and partition folders are not columns.
    options = {"filesystem": files.filesystem, "partitioning": None, "file_extensions": None}
    if files.format == "parquet":
        dataset = ray.data.read_datasource(ParquetRowGroups(encoded))
    elif files.format == "csv":
        dataset = ray.data.read_csv(list(files.files), convert_options=files.csv_options(), **options)
    else:
        dataset = ray.data.read_json(list(files.files), **options)
    if plain_schema(encoded.schema) != encoded.schema:
        dataset = dataset.map_batches(decoded, batch_format="pyarrow")
    return dataset
