"""Row checks for the corpus contract: each bad row gets a reason, none is silently dropped."""

from __future__ import annotations

from collections.abc import Set

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads

from models.errors import InvalidInputError
from models.tokenize import check_text

REASON = "reject_reason"


def duplicate_ids(uri: str) -> set[str]:
    """Ids that occur more than once. All their rows are rejected: which copy is right is unknowable."""
    ids = pads.dataset(uri, format="parquet").to_table(columns=["id"])
    counts = ids.group_by("id").aggregate([("id", "count")])
    repeated = counts.filter(pc.greater(counts["id_count"], 1))["id"]
    return {str(i) for i in repeated.to_pylist()}


def row_reason(id_: object, text: object, duplicates: Set[str]) -> str | None:
    if id_ is None:
        return "id is null"
    if str(id_) in duplicates:
        return f"id {id_!r} is duplicated"
    try:
        check_text(0, text)
    except InvalidInputError as e:
        return e.reason
    return None


def tag_rejects(batch: pa.Table, duplicates: Set[str]) -> pa.Table:
    """Add a `reject_reason` column: null for good rows."""
    reasons = [
        row_reason(i, t, duplicates)
        for i, t in zip(batch["id"].to_pylist(), batch["text"].to_pylist(), strict=True)
    ]
    return batch.append_column(REASON, pa.array(reasons, type=pa.string()))
