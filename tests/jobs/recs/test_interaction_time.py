"""Time columns as warehouses write them: every representation orders a history the same way, a row
whose time cannot be read is quarantined with its reason, and any other column type is refused in
one line before any job."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from precompute.jobs.inputs import InteractionsInput
from precompute.jobs.nights import Previous
from precompute.jobs.recs.held_out import hold_out
from precompute.jobs.recs.history.interactions import tag_rejects
from precompute.jobs.recs.quality import valid_interactions
from precompute.jobs.recs.recommend import run_recs_job
from precompute.jobs.recs.spec import RecsSpec, SequenceSpec
from precompute.jobs.recs.state import SEQUENCE_WEIGHTS, STATE, Items
from precompute.jobs.settings import JobSettings
from precompute.jobs.text.content_cache import content_keys
from precompute.jobs.validate import REASON
from precompute.jobs.work_dir import WorkPath
from precompute.kinds import PipelineError
from precompute.pipeline import load_pipeline
from precompute.stores.key_value.records import decode_ranked
from tests.jobs.recs.inputs import ParquetSink

CATALOGUE = 20
USERS = 30
STEPS = 6
START = 1_700_000_000
"""A user's t-th step is day t after START: every representation, dates included, keeps the order."""


def walks() -> tuple[list[str], list[str], np.ndarray]:
    """(user, item, seconds) rows: each user walks items in a cycle (item i, then i + 1), rows shuffled."""
    rng = np.random.default_rng(0)
    rows = []
    for user in range(USERS):
        first = int(rng.integers(CATALOGUE))
        rows += [(f"u{user}", f"i{(first + t) % CATALOGUE:02}", START + 86_400 * t) for t in range(STEPS)]
    order = rng.permutation(len(rows))
    users, items, seconds = zip(*(rows[i] for i in order), strict=True)
    return list(users), list(items), np.array(seconds, np.int64)


def iso(seconds: np.ndarray, form: str) -> list[str]:
    return [datetime.fromtimestamp(int(s), UTC).strftime(form) for s in seconds]


def representations(seconds: np.ndarray) -> dict[str, pa.Array]:
    """The same instants in every type a user could have."""
    stamps = pa.array(seconds, pa.timestamp("s"))
    return {
        "timestamp[s]": stamps,
        "timestamp[ms, UTC]": stamps.cast(pa.timestamp("ms", tz="UTC")),
        "timestamp[us, New York]": stamps.cast(pa.timestamp("us", tz="America/New_York")),
        "timestamp[ns]": stamps.cast(pa.timestamp("ns")),
        "date32": pa.array(seconds // 86_400, pa.int32()).cast(pa.date32()),
        "date64": pa.array(seconds * 1000, pa.date64()),
        "int64 seconds": pa.array(seconds),
        "int64 milliseconds": pa.array(seconds * 1000),
        "int32 seconds": pa.array(seconds, pa.int32()),
        "float64": pa.array(seconds, pa.float64()),
        "ISO with Z": pa.array(iso(seconds, "%Y-%m-%dT%H:%M:%SZ")),
        "ISO with offset": pa.array(iso(seconds, "%Y-%m-%dT%H:%M:%S+00:00"), pa.large_string()),
        "ISO date": pa.array(iso(seconds, "%Y-%m-%d")).dictionary_encode(),
    }


def items_table() -> list[str]:
    return [f"i{i:02}" for i in range(CATALOGUE)]


@pytest.mark.parametrize("kind", list(representations(np.zeros(1, np.int64))))
def test_every_time_type_holds_out_the_same_latest_interactions(kind: str) -> None:
    users, items, seconds = walks()
    reference = pa.table({"user_id": users, "item_id": items, "time": pa.array(seconds, pa.float64())})
    table = reference.set_column(2, "time", representations(seconds)[kind])
    want = hold_out(valid_interactions(reference, items_table()), seed=0)
    split = hold_out(valid_interactions(table, items_table()), seed=0)
    assert split.name == "temporal" and len(split.train.items) == USERS * (STEPS - 1)
    np.testing.assert_array_equal(split.held.items, want.held.items)
    np.testing.assert_array_equal(split.train.items, want.train.items)  # each history in time order


def test_a_time_that_cannot_be_read_is_its_rows_reason() -> None:
    table = pa.table(
        {
            "user_id": ["u1", "u2", "u3", "u4", "u5"],
            "item_id": ["i00"] * 5,
            "time": ["2026-11-25T10:00:00+01:00", "yesterday", None, "2026-11-25", "2026-13-01"],
        }
    )
    tagged = tag_rejects(table, pa.array(["i00"]))
    assert tagged[REASON].to_pylist() == [
        None,
        "time 'yesterday' is not an ISO-8601 time",
        "time is null",
        None,
        "time '2026-13-01' is not an ISO-8601 time",
    ]
    assert tagged["seconds"].to_pylist()[0] == datetime(2026, 11, 25, 9, tzinfo=UTC).timestamp()
    floats = tag_rejects(
        pa.table({"user_id": ["u1", "u2"], "item_id": ["i00"] * 2, "time": [1.0, float("nan")]}), pa.array(["i00"])
    )
    assert floats[REASON].to_pylist() == [None, "time is NaN"]


@pytest.mark.parametrize(
    ("column", "type_name"),
    [
        (pa.array([True]), "bool"),
        (pa.array([[1]]), "list<element: int64>"),
        (pa.array([Decimal("1.5")]), "decimal128(2, 1)"),
    ],
)
def test_any_other_time_type_is_refused_in_one_line_before_any_job(
    column: pa.Array, type_name: str, tmp_path: Path
) -> None:
    pq.write_table(pa.table({"id": ["i00"], "text": ["a package"]}), tmp_path / "corpus.parquet")
    data = tmp_path / "interactions.parquet"
    pq.write_table(pa.table({"user_id": ["u1"], "item_id": ["i00"], "timestamp": column}), data)
    path = tmp_path / "precompute.toml"
    path.write_text(
        '[outputs.docs]\nkind = "embeddings"\ninput = { path = "corpus.parquet" }\n'
        '[outputs.recs]\nkind = "recs"\nitems = "docs"\ninput = { path = "interactions.parquet" }\n'
    )
    with pytest.raises(PipelineError) as raised:
        load_pipeline(path).check()
    assert str(raised.value) == (
        f"{path}: outputs.recs.input.time: column 'timestamp' of {data} is {type_name}, "
        "not timestamps, dates, numbers or ISO-8601 strings"
    )


def test_the_job_orders_each_history_by_a_warehouse_timestamp(ray_local, tmp_path: Path) -> None:
    """Rows shuffled, time as timestamp[ms, UTC] (what Spark and pandas write): transitions learn
    the cycle, and each user's first recommendation is the item after their latest one."""
    users, items, seconds = walks()
    path = tmp_path / "interactions.parquet"
    time = pa.array(seconds * 1000, pa.timestamp("ms", tz="UTC"))
    pq.write_table(pa.table({"user_id": users, "item_id": items, "timestamp": time}), path)
    ids = items_table()
    vectors = np.random.default_rng(1).standard_normal((CATALOGUE, 8)).astype(np.float32)
    report = run_recs_job(
        InteractionsInput(path=str(path)),
        RecsSpec(model="transitions", content_weight=0, popularity_weight=0, k=3),
        JobSettings(),
        Items.of(pa.array(ids, pa.string()), vectors, np.array(content_keys("random", ids), "S16")),
        ParquetSink(tmp_path / "out"),
        WorkPath.of(tmp_path / "work"),
    )
    assert (report.rows, report.rejects, report.users) == (USERS * STEPS, 0, USERS)
    latest: dict[str, tuple[int, str]] = {}
    for user, item, second in zip(users, items, seconds, strict=True):
        latest[user] = max(latest.get(user, (0, "")), (int(second), item))
    written = pq.read_table(tmp_path / "out").to_pylist()
    assert len(written) == USERS
    for row in written:
        indices, _ = decode_ranked(row["value"])
        assert ids[indices[0]] == f"i{(ids.index(latest[row['id']][1]) + 1) % CATALOGUE:02}"


def test_a_sequence_night_stages_its_weights_and_the_next_night_starts_from_them(
    ray_local, tmp_path: Path
) -> None:
    users, items, seconds = walks()
    path = tmp_path / "interactions.parquet"
    pq.write_table(pa.table({"user_id": users, "item_id": items, "timestamp": seconds}), path)
    ids = items_table()
    vectors = np.random.default_rng(1).standard_normal((CATALOGUE, 8)).astype(np.float32)
    network = SequenceSpec(
        dim=16, blocks=1, history=8, batch=16, max_epochs=3, calibration_rows=16, gate_users=16
    )
    settings = RecsSpec(model="sequence", content_weight=0, k=3, sequence=network)

    def night(work: Path, previous: Previous | None, interactions: Path = path) -> dict:
        sink, catalogue = ParquetSink(work / "out"), Items.of(pa.array(ids, pa.string()), vectors, np.array(content_keys("random", ids), "S16"))
        report = run_recs_job(
            InteractionsInput(path=str(interactions)),
            settings,
            JobSettings(),
            catalogue,
            sink,
            WorkPath.of(work),
            previous=previous,
        )
        assert report.quality.published == "sequence" and report.users == USERS
        return report.sequence

    first = night(tmp_path / "first", None)
    assert first["training"]["start"] == "cold" and first["engines"]["gates"][-1]["precision"] == "fp32"
    assert (tmp_path / "first" / STATE / SEQUENCE_WEIGHTS).is_file()
    moved = tmp_path / "next.parquet"  # the next night's interactions: one row fewer, so it trains
    pq.write_table(pq.read_table(path).slice(1), moved)
    second = night(tmp_path / "second", Previous("v1", WorkPath.of(tmp_path / "first"), range(0, 1000)), moved)
    assert second["training"]["start"] == f"warm: {CATALOGUE} of {CATALOGUE} items' weights carried over"
