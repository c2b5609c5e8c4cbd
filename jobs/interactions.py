"""Interactions as the recommendations job reads them: the input's columns under the job's names,
each row checked against the contract and the item table, good rows in the job's own types."""

from __future__ import annotations

import math

import pyarrow as pa
import pyarrow.compute as pc
import ray

from precompute.jobs.inputs import InteractionsInput
from precompute.jobs.validate import REASON, id_key
from precompute.models.text_columns import lossless, utf8_errors

USER, ITEM, WEIGHT = "user_id", "item_id", "weight"
INDEX = "item_index"
"""The item's position in the item table (sorted by id): what values and vectors are indexed by."""


def row_reason(user_id: object, item_id: object, weight: float | None, index: dict[str, int]) -> str | None:
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
    if id_key(item_id) not in index:
        return f"item_id {id_key(item_id)!r} is not in the item table"
    return None


def column_renames(interactions: InteractionsInput, present: list[str]) -> dict[str, str]:
    """The input's user, item and weight columns (those present) to the names the job uses."""
    names = {interactions.user: USER, interactions.item: ITEM, interactions.weight: WEIGHT}
    return {old: new for old, new in names.items() if old != new and old in present}


def read_interactions(interactions: InteractionsInput) -> ray.data.Dataset:
    dataset = ray.data.read_parquet(interactions.path)
    renames = column_renames(interactions, dataset.schema().names)
    return dataset.rename_columns(renames) if renames else dataset


def tag_rejects(batch: pa.Table, index: dict[str, int]) -> pa.Table:
    """Add `reject_reason` (null for good rows) and the item's position in the item table; string
    columns are read as their bytes."""
    undecodable = utf8_errors(batch, [USER, ITEM])
    batch = lossless(batch)
    weights = batch[WEIGHT].to_pylist() if WEIGHT in batch.column_names else [None] * batch.num_rows
    users, items = batch[USER].to_pylist(), batch[ITEM].to_pylist()
    reasons = [
        bad or row_reason(*row, index) for bad, *row in zip(undecodable, users, items, weights, strict=True)
    ]
    positions = [None if r else index[id_key(i)] for r, i in zip(reasons, items, strict=True)]
    return batch.append_column(REASON, pa.array(reasons, pa.string())).append_column(
        INDEX, pa.array(positions, pa.int64())
    )


def clean(batch: pa.Table) -> pa.Table:
    """Good rows in the job's own types; a missing or null weight is an unweighted interaction."""
    weights = batch[WEIGHT] if WEIGHT in batch.column_names else pa.nulls(batch.num_rows, pa.float32())
    return pa.table(
        {
            USER: pc.cast(batch[USER], pa.string()),
            INDEX: batch[INDEX],
            WEIGHT: pc.fill_null(pc.cast(weights, pa.float32()), 1.0),
        }
    )
