"""Interactions as the recommendations job reads them: the input's columns under the job's names,
each row checked against the contract and the item table, good rows in the job's own types.

Time comes as warehouses write it (Arrow timestamps of any unit and zone, dates, numbers,
ISO-8601 strings) and leaves here as float64 SECONDS: what orders each user's history. Numbers
are taken as they are (seconds or milliseconds: only their order matters), a time without a zone
as UTC.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from precompute.jobs.inputs import TIME_TYPES, InteractionsInput, is_time
from precompute.jobs.validate import REASON, id_key
from precompute.models.text.columns import lossless, utf8_errors

USER, ITEM, WEIGHT, TIME, BASKET = "user_id", "item_id", "weight", "time", "basket"
INDEX = "item_index"
"""The item's position in the item table (sorted by id): what values and vectors are indexed by."""
SECONDS = "seconds"
"""The row's time as float64 (null without a time column): the order of a user's history."""
BASKET_TYPE = pa.binary()
"""A good row's basket (order, session, visit) as bytes, whatever the input's key type: only
equality matters (jobs/recs/quality.py holds out each user's last basket); null without one."""


def iso_seconds(value: object) -> float | None:
    """An ISO-8601 string's (or its UTF-8 bytes') seconds since the epoch; None if it is not one."""
    try:
        text = value.decode("utf-8") if isinstance(value, bytes) else str(value)
        moment = datetime.fromisoformat(text.strip())
    except (UnicodeDecodeError, ValueError):
        return None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def as_float(numbers: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    """float64, rounding integers past 2**53 (nanoseconds since 1970) rather than refusing them."""
    return pc.cast(numbers, pa.float64(), safe=False)


def time_seconds(column: pa.ChunkedArray | pa.Array) -> tuple[pa.Array, list[str | None]]:
    """(float64 seconds, a reason per row that has none: null, NaN or not ISO-8601)."""
    kind = column.type
    if pa.types.is_dictionary(kind):
        column, kind = column.cast(kind.value_type), kind.value_type
    if pa.types.is_timestamp(kind):
        per_second = {"s": 1, "ms": 1e3, "us": 1e6, "ns": 1e9}[kind.unit]
        seconds = pc.divide(as_float(pc.cast(column, pa.int64())), per_second)
    elif pa.types.is_date32(kind):
        seconds = pc.multiply(as_float(pc.cast(column, pa.int32())), 86_400.0)
    elif pa.types.is_date64(kind):
        seconds = pc.divide(as_float(pc.cast(column, pa.int64())), 1e3)
    elif pa.types.is_integer(kind) or pa.types.is_floating(kind):
        seconds = as_float(column)
    elif is_time(kind):
        seconds = pa.array([None if v is None else iso_seconds(v) for v in column.to_pylist()], pa.float64())
    else:
        raise ValueError(f"{TIME} column is {kind}, not {TIME_TYPES}")
    if isinstance(seconds, pa.ChunkedArray):
        seconds = seconds.combine_chunks()
    if not pc.any(pc.fill_null(pc.is_nan(seconds), True)).as_py():
        return seconds, [None] * len(seconds)
    return seconds, [time_reason(r, v) for r, v in zip(column.to_pylist(), seconds.to_pylist(), strict=True)]


def time_reason(raw: object, seconds: float | None) -> str | None:
    if raw is None:
        return f"{TIME} is null"
    if seconds is None:
        return f"{TIME} {raw!r} is not an ISO-8601 time"
    return f"{TIME} is NaN" if math.isnan(seconds) else None


def row_reason(user_id: object, item_id: object, weight: float | None, position: int | None) -> str | None:
    if user_id is None:
        return "user_id is null"
    if item_id is None:
        return "item_id is null"
    if weight is not None and math.isnan(weight):
        return "weight is NaN"
    if weight is not None and math.isinf(weight):
        return "weight is infinite"
    if weight is not None and weight < 0:
        return f"weight {weight} is negative"
    if position is None:
        return f"item_id {id_key(item_id)!r} is not in the item table"
    return None


def basket_reason(batch: pa.Table, row: int) -> str | None:
    return f"{BASKET} is null" if BASKET in batch.column_names and not batch[BASKET][row].is_valid else None


def item_positions(column: pa.ChunkedArray, items: pa.Array, undecodable: list[str | None]) -> pa.Array:
    """Each row's item position in `items` (their ids as strings, unique and sorted, as the item
    table holds them), null where it is not there or its bytes are not UTF-8 (cast to text, such
    a row would fail the whole batch). The rows' distinct ids are looked up whichever way costs
    less (`searched` or `probed`), so a night's new file costs what its rows do, not what the
    catalogue does."""
    if any(undecodable):
        bad = pa.array([reason is not None for reason in undecodable])
        column = pc.if_else(bad, pa.scalar(None, column.type), column)
    keys = column.cast(pa.large_string()) if pa.types.is_large_binary(column.type) else column
    encoded = pc.dictionary_encode(keys.cast(pa.string()).combine_chunks())  # one hash pass: ids and rows
    distinct = encoded.dictionary
    place = np.full(len(distinct) + 1, -1, np.int64)  # the last: a row whose id is null
    if len(items) and len(distinct):
        fewer = len(distinct) * math.log2(len(items)) < len(items)
        place[:-1] = searched(items, distinct) if fewer else probed(items, distinct)
    positions = place[pc.fill_null(encoded.indices, len(distinct)).to_numpy()]
    return pa.array(positions, pa.int32(), mask=positions < 0)


def searched(items: pa.Array, ids: pa.Array) -> np.ndarray:
    """Each of `ids`' position in the sorted `items` (-1 where it is not there), by a binary search
    per id (log2 of the items' count comparisons each)."""
    at = np.minimum(pc.search_sorted(items, ids).to_numpy(), len(items) - 1).astype(np.int64)
    return np.where(pc.equal(items.take(at), ids).to_numpy(zero_copy_only=False), at, -1)


def probed(items: pa.Array, ids: pa.Array) -> np.ndarray:
    """The same, by probing every item against a hash of `ids`: it wins where the ids are many
    against the items: searching costs ids x log2(items), probing a pass over the items (and a
    hash of the ids), so one new file's ids among many items are searched and a full night's
    are probed (the caller's rule). Hashing the items instead costs more than probing
    (`precompute bench scale`)."""
    among = pc.index_in(items, value_set=ids)  # each item's place among the ids
    found = pc.is_valid(among)
    place = np.full(len(ids), -1, np.int64)
    place[among.filter(found).to_numpy()] = pc.indices_nonzero(found).to_numpy()
    return place


def weight_suspects(weights: pa.ChunkedArray) -> pa.ChunkedArray:
    """NaN, infinite or negative weights (checked as float64; a null weighs 1)."""
    numbers = pc.cast(weights, pa.float64())
    return pc.fill_null(pc.or_(pc.or_(pc.is_nan(numbers), pc.is_inf(numbers)), pc.less(numbers, 0)), False)


def tag_rejects(batch: pa.Table, items: pa.Array) -> pa.Table:
    """Add `reject_reason` (null for good rows), the item's position in `items` (the item table's
    ids, as strings, sorted) and the row's SECONDS; string columns are read as their bytes. The checks
    run column-wise; only the rows they flag are checked one by one, for their reasons."""
    undecodable = utf8_errors(batch, [USER, ITEM])
    if TIME in batch.column_names:
        seconds, bad_times = time_seconds(batch[TIME])
    else:
        seconds, bad_times = pa.nulls(batch.num_rows, pa.float64()), [None] * batch.num_rows
    batch = lossless(batch)
    positions = item_positions(batch[ITEM], items, undecodable)
    flags = [np.asarray(pc.is_null(batch[USER])), np.asarray(pc.is_null(positions))]
    if WEIGHT in batch.column_names:
        flags.append(np.asarray(weight_suspects(batch[WEIGHT])))
    if any(bad_times):
        flags.append(np.array([bad is not None for bad in bad_times]))
    if BASKET in batch.column_names:
        flags.append(np.asarray(pc.is_null(batch[BASKET])))
    rows = np.flatnonzero(np.logical_or.reduce(flags))
    checked = batch.take(pa.array(rows, pa.int64()))
    weights = checked[WEIGHT].to_pylist() if WEIGHT in batch.column_names else [None] * len(rows)
    found = positions.take(pa.array(rows, pa.int64())).to_pylist()
    reasons: list[str | None] = [None] * batch.num_rows
    users, items = checked[USER].to_pylist(), checked[ITEM].to_pylist()
    for row, *values in zip(rows, users, items, weights, found, strict=True):
        reasons[row] = undecodable[row] or row_reason(*values) or bad_times[row] or basket_reason(batch, row)
    reason = pa.array(reasons, pa.string())
    no_position = pa.scalar(None, pa.int64())
    good_positions = pc.if_else(pc.is_null(reason), pc.cast(positions, pa.int64()), no_position)
    tagged = batch.append_column(REASON, reason).append_column(INDEX, good_positions)
    return tagged.append_column(SECONDS, seconds)


def column_renames(interactions: InteractionsInput, present: list[str]) -> dict[str, str]:
    """The input's user, item, weight, time and basket columns (those present) to the names the job uses."""
    names = {
        interactions.user: USER,
        interactions.item: ITEM,
        interactions.weight: WEIGHT,
        interactions.time: TIME,
    }
    if interactions.basket is not None:
        names[interactions.basket] = BASKET
    return {old: new for old, new in names.items() if old != new and old in present}


def clean(batch: pa.Table) -> pa.Table:
    """Good rows in the job's own types; a missing or null weight is an unweighted interaction."""
    weights = batch[WEIGHT] if WEIGHT in batch.column_names else pa.nulls(batch.num_rows, pa.float32())
    return pa.table(
        {
            USER: pc.cast(batch[USER], pa.string()),
            INDEX: batch[INDEX],
            WEIGHT: pc.fill_null(pc.cast(weights, pa.float32()), 1.0),
            SECONDS: batch[SECONDS],
            BASKET: basket_bytes(batch[BASKET]) if BASKET in batch.column_names else pa.nulls(batch.num_rows, BASKET_TYPE),
        }
    )


def basket_bytes(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """A basket column of any key type as BASKET_TYPE (integers by their decimal text)."""
    if pa.types.is_integer(column.type):
        column = pc.cast(column, pa.string())
    return pc.cast(column, BASKET_TYPE)
