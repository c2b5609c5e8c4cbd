"""Interactions checked column-wise (jobs/recs/history/interactions.py tag_rejects): each row gets exactly the
reason the row-by-row contract gives it, and a good row its item's position; a folder of files is
read in chunks, every row kept once (validated_interactions)."""

from __future__ import annotations

import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from precompute.jobs.inputs import InteractionsInput
from precompute.jobs.recs.history import interaction_files
from precompute.jobs.recs.history.interaction_files import validated_interactions
from precompute.jobs.recs.history.interactions import INDEX, probed, row_reason, searched, tag_rejects
from precompute.jobs.recs.quality import valid_interactions
from precompute.jobs.validate import REASON, RejectRatioExceededError
from precompute.jobs.work_dir import WorkPath

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


@settings(max_examples=200, deadline=None)
@given(st.sets(st.text(max_size=3), min_size=1, max_size=8), st.lists(st.text(max_size=3), max_size=12), st.data())
def test_an_item_id_is_found_in_the_sorted_ids_by_search_and_by_probe_alike(items: set, strangers: list, data) -> None:
    """Ids before the first item, after the last, between two and equal to one: each gets its
    position in the sorted ids, or -1, whichever way item_positions picks to look them up."""
    ids = sorted(items)
    wanted = list(dict.fromkeys(strangers + data.draw(st.lists(st.sampled_from(ids), max_size=6))))
    expected = [ids.index(i) if i in items else -1 for i in wanted]
    sorted_ids, needles = pa.array(ids, pa.string()), pa.array(wanted, pa.string())
    assert searched(sorted_ids, needles).tolist() == expected
    assert probed(sorted_ids, needles).tolist() == expected
    tagged = tag_rejects(pa.table({"user_id": ["u"] * len(wanted), "item_id": needles}), sorted_ids)
    assert tagged[INDEX].to_pylist() == [None if at < 0 else at for at in expected]


def test_positions_are_in_the_callers_order_where_its_ids_are_not_sorted() -> None:
    """valid_interactions (the quality check's and the benches' path) takes ids in any order; the
    job's item table comes sorted."""
    table = pa.table({"user_id": ["u", "u", "v", "w"], "item_id": ["z", "a", "m", "gone"]})
    assert valid_interactions(table, ["z", "m", "a"])[INDEX].to_pylist() == [0, 2, 1]


def test_a_folder_of_files_validated_in_chunks_keeps_every_row_once_in_order(tmp_path: Path, monkeypatch) -> None:
    """Files gathered into groups (CHECK_ROWS, 3 here) and split back: each good row once,
    in the files' order, each bad one in the rejects with its reason, under the job's column names."""
    monkeypatch.setattr(interaction_files, "CHECK_ROWS", 3)
    folder = tmp_path / "interactions"
    folder.mkdir()
    files = [
        [("u1", "i0", 1.0), ("u1", "gone", 1.0)],
        [],
        [("u2", "i1", 0.5), ("u2", "i2", -1.0), ("u3", "i2", 2.0), ("u3", "i0", 1.0)],
    ]
    schema = pa.schema([("who", pa.string()), ("what", pa.string()), ("weight", pa.float32())])
    for n, rows in enumerate(files):
        table = pa.Table.from_pylist([dict(zip(schema.names, row, strict=True)) for row in rows], schema)
        pq.write_table(table, folder / f"part-{n}.parquet")
    source = InteractionsInput(path=str(folder), user="who", item="what", max_reject_ratio=0.5)
    rejects = WorkPath.of(tmp_path / "run" / "rejects.parquet")
    good, rows, count, _ = validated_interactions(source, pa.array(ITEMS), rejects)
    assert (rows, count) == (6, 2)
    assert good["user_id"].to_pylist() == ["u1", "u2", "u3", "u3"]
    assert good[INDEX].to_pylist() == [0, 1, 2, 0]
    quarantined = pq.read_table(rejects.path)
    assert quarantined["user_id"].to_pylist() == ["u1", "u2"]
    assert quarantined[REASON].to_pylist() == ["item_id 'gone' is not in the item table", "weight -1.0 is negative"]


def test_interactions_past_the_reject_ratio_fail_naming_the_quarantine(tmp_path: Path) -> None:
    pq.write_table(pa.table({"user_id": ["u1", "u2"], "item_id": ["i0", "gone"]}), tmp_path / "seen.parquet")
    rejects = WorkPath.of(tmp_path / "run" / "rejects.parquet")
    with pytest.raises(RejectRatioExceededError, match=r"1 of 2 interactions rejected.*rejects\.parquet"):
        validated_interactions(InteractionsInput(path=str(tmp_path / "seen.parquet")), pa.array(ITEMS), rejects)
    assert pq.read_table(rejects.path)[REASON].to_pylist() == ["item_id 'gone' is not in the item table"]
