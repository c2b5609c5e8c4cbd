"""Interactions checked column-wise (jobs/interactions.py tag_rejects): each row gets exactly the
reason the row-by-row contract gives it, and a good row its item's position."""

from __future__ import annotations

import math

import pyarrow as pa
from hypothesis import example, given, settings
from hypothesis import strategies as st

from precompute.jobs.interactions import INDEX, row_reason, tag_rejects
from precompute.jobs.validate import REASON

ITEMS = ["i0", "i1", "i2"]
WEIGHTS = st.one_of(st.none(), st.sampled_from([1.0, 0.0, -0.5, math.nan, math.inf, -math.inf, 2.5]))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.one_of(st.none(), st.sampled_from(["u1", "u2"])),
            st.one_of(st.none(), st.sampled_from([*ITEMS, "gone", ""])),
            WEIGHTS,
        ),
        max_size=12,
    ),
    st.booleans(),
)
@example([("u1", "i0", math.inf), ("u2", "i1", math.nan), ("u1", "i2", -0.5), ("u2", "gone", 1.0)], True)
def test_rows_tagged_column_wise_get_the_reason_each_row_checked_alone_gets(rows: list, with_weight: bool) -> None:
    columns = {"user_id": pa.array([r[0] for r in rows], pa.string()), "item_id": pa.array([r[1] for r in rows], pa.string())}
    if with_weight:
        columns["weight"] = pa.array([r[2] for r in rows], pa.float32())
    tagged = tag_rejects(pa.table(columns), pa.array(ITEMS))
    positions = {item: n for n, item in enumerate(ITEMS)}
    expected = [
        row_reason(user, item and item.encode(), weight if with_weight else None, positions.get(item))
        for user, item, weight in rows
    ]
    assert tagged[REASON].to_pylist() == expected
    assert tagged[INDEX].to_pylist() == [positions[item] if why is None else None for (_, item, _), why in zip(rows, expected, strict=True)]


def test_integer_item_ids_are_found_by_their_decimal_text() -> None:
    tagged = tag_rejects(pa.table({"user_id": ["u1", "u2"], "item_id": [7, 8]}), pa.array(["7", "9"]))
    assert tagged[INDEX].to_pylist() == [0, None]
    assert tagged[REASON].to_pylist() == [None, "item_id '8' is not in the item table"]
