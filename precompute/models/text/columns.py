"""Parquet text columns that may hold invalid UTF-8: a bad row, never a crash.

Arrow does not check UTF-8 when it reads a Parquet string column, but converting a value to
Python does, and raises for the whole batch. So columns are checked here first (one pass in C++
per column; row by row only in a column that fails), and a row's bytes are kept exactly as they
were for rejects.parquet by reading its string columns as binary.
"""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa

TEXT_TYPES = (pa.string(), pa.large_string(), pa.binary(), pa.large_binary())
_AS_BINARY = {pa.string(): pa.binary(), pa.large_string(): pa.large_binary()}
_AS_STRING = {pa.binary(): pa.string(), pa.large_binary(): pa.large_string()}


def lossless(table: pa.Table) -> pa.Table:
    """Every string column as binary: converting it to Python never raises, and keeps the bytes."""
    fields = [f.with_type(_AS_BINARY.get(f.type, f.type)) for f in table.schema]
    return table.cast(pa.schema(fields, table.schema.metadata))


def as_text(schema: pa.Schema, columns: Iterable[str]) -> pa.Schema:
    """`schema` with `columns` as strings (binary ones too): what `cast` restores a checked table to."""
    wanted = set(columns)
    return pa.schema(
        [f.with_type(_AS_STRING.get(f.type, f.type)) if f.name in wanted else f for f in schema],
        schema.metadata,
    )


def readable(table: pa.Table) -> pa.Table:
    """Binary columns that hold only UTF-8 as strings: rejects.parquet reads as text where it can,
    and keeps the bytes of a column that has a row of invalid UTF-8."""
    fields = [
        f.with_type(_AS_STRING[f.type]) if f.type in _AS_STRING and _valid(table[f.name]) else f
        for f in table.schema
    ]
    return table.cast(pa.schema(fields, table.schema.metadata))


def _valid(column: pa.ChunkedArray) -> bool:
    try:
        for chunk in column.chunks:
            chunk.view(_AS_STRING.get(chunk.type, chunk.type)).validate(full=True)
    except pa.ArrowInvalid:
        return False
    return True


def utf8_errors(table: pa.Table, columns: Iterable[str] | None = None) -> list[str | None]:
    """Per row, a reason naming the first of `columns` (default: all) whose bytes are not UTF-8."""
    reasons: list[str | None] = [None] * table.num_rows
    for name in table.column_names if columns is None else columns:
        column = table[name]
        if column.type not in TEXT_TYPES or _valid(column):
            continue
        for row, data in enumerate(column.cast(_AS_BINARY.get(column.type, column.type)).to_pylist()):
            if data is None or reasons[row] is not None:
                continue
            try:
                data.decode("utf-8")
            except UnicodeDecodeError as e:
                reasons[row] = f"{name} is not valid UTF-8 (byte {e.start})"
    return reasons


def decodable(table: pa.Table) -> pa.Table:
    """The table without the rows holding invalid UTF-8 (the jobs quarantine them)."""
    keep = pa.array([reason is None for reason in utf8_errors(table)])
    return lossless(table).filter(keep).cast(as_text(table.schema, table.column_names))
