"""Row validation (jobs/validate.py): every way a row can be bad is quarantined with its reason, and
a job fails past its reject ratio, not at it."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
import ray
from hypothesis import given, settings
from hypothesis import strategies as st

from precompute.jobs.validate import (
    REASON,
    RejectRatioExceededError,
    duplicate_ids,
    quarantine,
    row_reason,
    tag_rejects,
)
from precompute.jobs.work_dir import WorkPath

ROWS = 200


def tagged(bad: int) -> ray.data.Dataset:
    reasons = ["text is empty"] * bad + [None] * (ROWS - bad)
    return ray.data.from_arrow(pa.table({"id": [str(i) for i in range(ROWS)], REASON: pa.array(reasons, pa.string())}))


@pytest.mark.parametrize("bad", [0, 2])
def test_a_reject_ratio_at_its_limit_passes_with_every_bad_row_kept(ray_local, bad: int, tmp_path: Path) -> None:
    path = tmp_path / "work" / "embeddings" / "rejects.parquet"  # its folders made as needed
    assert quarantine(tagged(bad), ROWS, 2 / ROWS, WorkPath.of(path)) == bad  # 2 of 200 is exactly 1%
    assert pq.read_table(path).num_rows == bad if bad else not path.exists()


def test_one_row_past_the_limit_fails_naming_the_count_and_where_the_reasons_are(
    ray_local, tmp_path: Path
) -> None:
    path = tmp_path / "rejects.parquet"
    with pytest.raises(RejectRatioExceededError) as raised:
        quarantine(tagged(3), ROWS, 2 / ROWS, WorkPath.of(path), noun="interactions")
    assert str(raised.value) == f"3 of 200 interactions rejected, over max_reject_ratio=0.01; reasons in {path}"
    assert pq.read_table(path).num_rows == 3  # kept, with their reasons, though the job fails


SPACES = [chr(c) for c in range(0x3001) if chr(c).isspace()]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.one_of(st.none(), st.sampled_from(["a", "b", "c", "d"])),
            st.one_of(st.none(), st.text(st.sampled_from([*SPACES, "x", "é", "\u200b", "\x00"]), max_size=6)),
        ),
        max_size=12,
    )
)
def test_rows_tagged_column_wise_get_the_reason_each_row_checked_alone_gets(rows: list) -> None:
    """tag_rejects checks one by one only the rows its column-wise pass suspects: every Unicode
    space `str.strip` removes, nulls, repeated ids and the byte limit (3 here) must all be among
    them, so each row gets the reason row_reason gives it alone."""
    table = pa.table({"id": pa.array([r[0] for r in rows], pa.string()), "text": pa.array([r[1] for r in rows], pa.string())})
    duplicates = duplicate_ids(pads.dataset(table))
    tagged = tag_rejects(table, duplicates, max_text_bytes=3)
    expected = [row_reason(i, t and t.encode(), duplicates, 3) for i, t in rows]
    assert tagged[REASON].to_pylist() == expected
