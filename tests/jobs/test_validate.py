"""The reject threshold (jobs/validate.py quarantine): a job fails past its ratio, not at it."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray

from precompute.jobs.validate import REASON, RejectRatioExceededError, quarantine

ROWS = 200


def tagged(bad: int) -> ray.data.Dataset:
    reasons = ["text is empty"] * bad + [None] * (ROWS - bad)
    return ray.data.from_arrow(pa.table({"id": [str(i) for i in range(ROWS)], REASON: pa.array(reasons, pa.string())}))


@pytest.mark.parametrize("bad", [0, 2])
def test_a_reject_ratio_at_its_limit_passes_with_every_bad_row_kept(ray_local, bad: int, tmp_path: Path) -> None:
    path = tmp_path / "rejects.parquet"
    assert quarantine(tagged(bad), ROWS, 2 / ROWS, path) == bad  # 2 of 200 is exactly 1%
    assert pq.read_table(path).num_rows == bad if bad else not path.exists()


def test_one_row_past_the_limit_fails_naming_the_count_and_where_the_reasons_are(
    ray_local, tmp_path: Path
) -> None:
    path = tmp_path / "rejects.parquet"
    with pytest.raises(RejectRatioExceededError) as raised:
        quarantine(tagged(3), ROWS, 2 / ROWS, path, noun="interactions")
    assert str(raised.value) == f"3 of 200 interactions rejected, over max_reject_ratio=0.01; reasons in {path}"
    assert pq.read_table(path).num_rows == 3  # kept, with their reasons, though the job fails
