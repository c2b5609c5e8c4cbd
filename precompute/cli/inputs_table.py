"""What an input may be, in one table generated from the code that decides it: `precompute inputs`.

Each column type is offered to the same checks `precompute check` runs (jobs/inputs.py
COLUMN_TYPES, after models/datasets.py reads dictionary columns as their values), so the table
cannot promise what a check refuses. The table is docs/inputs.md, which `precompute docs` writes;
a test checks it is this one.
"""

from __future__ import annotations

import pyarrow as pa

from precompute.jobs.inputs import COLUMN_TYPES
from precompute.models.datasets import COMPRESSION, EXTENSIONS, plain_type

CANDIDATES: dict[str, pa.DataType] = {
    "int32": pa.int32(),
    "int64": pa.int64(),
    "uint64": pa.uint64(),
    "float64": pa.float64(),
    "bool": pa.bool_(),
    "decimal128": pa.decimal128(12, 2),
    "string": pa.string(),
    "large_string": pa.large_string(),
    "dictionary<string>": pa.dictionary(pa.int32(), pa.string()),
    "binary": pa.binary(),
    "timestamp (any unit, any zone)": pa.timestamp("ms", tz="Europe/Paris"),
    "date32": pa.date32(),
    "list<string>": pa.list_(pa.string()),
    "list<int64>": pa.list_(pa.int64()),
    "list<dictionary<string>>": pa.list_(pa.dictionary(pa.int32(), pa.string())),
}
"""The Arrow types a warehouse export holds, by the name the table shows."""
FIELDS = {
    "id": "embeddings, labels: `input.id`; recs towers' features",
    "text": "embeddings, labels: `input.text`; embeddings: `queries.text`",
    "label": "labels: `input.label`",
    "user": "recs, related: `input.user`",
    "item": "recs, related: `input.item`",
    "weight": "recs, related: `input.weight`",
    "time": "recs, related: `input.time`",
    "basket": "recs, related: `input.basket`",
}
SOURCES = [
    ("a file", "`corpus.parquet`"),
    ("a folder of files", "`exports/corpus/` (names starting `_` or `.` are skipped: `_SUCCESS`, `.crc`)"),
    ("a glob", "`exports/*/part-*.parquet`"),
    ("hive partitions", '`exports/corpus` with `where = { region = "eu" }` (a list for several)'),
    ("object storage", "`s3://`, `gs://`, `hdfs://`, `abfs://` (pyarrow), any other fsspec scheme installed"),
]


def accepted(field: str) -> list[str]:
    accepts = COLUMN_TYPES[field][0]
    return [name for name, kind in CANDIDATES.items() if accepts(plain_type(kind))]


def markdown() -> str:
    types = ["| column | where | accepted Arrow types |", "|---|---|---|"]
    types += [f"| {field} | {where} | {', '.join(accepted(field))} |" for field, where in FIELDS.items()]
    formats: dict[str, list[str]] = {}
    for extension, name in EXTENSIONS.items():
        formats.setdefault(name, []).append(f"`{extension}`")
    sources = ["| source | example |", "|---|---|"] + [f"| {what} | {example} |" for what, example in SOURCES]
    sources.append(
        "| formats | "
        + "; ".join(f"{name}: {', '.join(ext)}" for name, ext in formats.items())
        + f" (compressed too: {', '.join(f'`{c}`' for c in COMPRESSION)}); `format =` names it otherwise |"
    )
    return "\n".join(types) + "\n\n" + "\n".join(sources)
