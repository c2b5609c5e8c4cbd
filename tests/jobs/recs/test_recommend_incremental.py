"""Incremental recommendation runs on real Ray: given the published version, only the users whose
inputs moved are rescored and the store copies the rest. A module of their own, so that the two
test processes run them beside the full-run tests (tests/jobs/recs/test_recommend.py), not after them."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from precompute.jobs.inputs import InteractionsInput
from precompute.jobs.nights import Previous
from precompute.jobs.recs.recommend import RECIPE, RecsJobReport, run_recs_job
from precompute.jobs.recs.spec import RecsSpec
from precompute.jobs.recs.state import INDEX_FILE, STATE, Items, model_fingerprint, plan, vocabulary_digest
from precompute.jobs.settings import JobSettings
from precompute.jobs.text.content_cache import content_keys
from precompute.jobs.work_dir import WorkPath
from precompute.stores.key_value.records import decode_ranked
from precompute.stores.key_value.settings import RedisSettings
from precompute.stores.key_value.store import KeyValueStore
from precompute.stores.key_value.versions import CopyPlan, OutputVersions
from precompute.stores.versions import new_version
from tests.held_records import held_records
from tests.jobs.recs.inputs import BAD_ROWS, ParquetSink

MODEL = "minilm"
OUTPUT = "recs"


class Run(NamedTuple):
    report: RecsJobReport
    written: dict[str, bytes]
    """What the job wrote through its sink: the rescored users' values."""
    copy: CopyPlan | None


def recs_run(
    items: Items,
    interactions: Path,
    run_dir: Path,
    previous: Previous | None = None,
    model: str = "content",
    **spec: float | str,
) -> Run:
    plans: list[CopyPlan | None] = []
    report = run_recs_job(
        InteractionsInput(path=str(interactions)),
        RecsSpec(model=model, **spec),
        JobSettings(users_per_block=256),
        items,
        ParquetSink(run_dir / "out"),
        WorkPath.of(run_dir),
        before_write=lambda users, copy: plans.append(copy),
        items_model=MODEL,
        previous=previous,
    )
    written = {}
    if (run_dir / "out").exists():
        table = pq.read_table(run_dir / "out")
        written = dict(zip(table["id"].to_pylist(), table["value"].to_pylist(), strict=True))
    return Run(report, written, plans[0])


@pytest.fixture(scope="module")
def published(ray_local, items: Items, interactions: Path, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """A full run whose version counts as published: the next runs copy from it."""
    return recs_run(items, interactions, tmp_path_factory.mktemp("published"))


def previous_of(published: Run, users: range = range(10**6)) -> Previous:
    return Previous("20261124T030000Z-aaaaaa", WorkPath.of(published.report.rejects_path).parent, users)


def assert_same_values(got: dict[str, bytes], want: dict[str, bytes]) -> None:
    """The same items in the same order, scores equal to fp16's precision: a block of 2 users
    and one of 256 may sum the matrix product in another order."""
    assert got.keys() == want.keys()
    for user, value in got.items():
        (indices, scores), (want_indices, want_scores) = decode_ranked(value), decode_ranked(want[user])
        np.testing.assert_array_equal(indices, want_indices)
        np.testing.assert_allclose(scores, want_scores, atol=2e-3)


def good_rows(path: Path) -> list[dict[str, Any]]:
    table = pq.read_table(path)
    return table.slice(0, table.num_rows - len(BAD_ROWS)).to_pylist()


def histories(path: Path) -> dict[str, list[str]]:
    held: dict[str, list[str]] = {}
    for row in good_rows(path):
        held.setdefault(row["user_id"], []).append(row["item_id"])
    return held


@pytest.mark.slow
def test_a_rerun_with_nothing_changed_copies_the_version_whole_without_reading_or_scoring(
    items: Items, interactions: Path, published: Run, tmp_path: Path
) -> None:
    rerun = recs_run(items, interactions, tmp_path / "rerun", previous_of(published))
    report = rerun.report
    assert (report.mode, report.rescored, report.copied) == ("unchanged", 0, published.report.users)
    assert report.mode_reason == "the interactions, items and settings are those of 20261124T030000Z-aaaaaa"
    assert rerun.copy == CopyPlan("20261124T030000Z-aaaaaa", [])
    assert rerun.written == {}
    assert set(report.seconds) == {"digest", "write"}  # no validation, training, grouping or top-k
    assert (report.rows, report.rejects, report.quality) == (
        published.report.rows,
        published.report.rejects,
        published.report.quality,
    )
    assert report.rejects == len(BAD_ROWS)
    assert pq.read_table(report.rejects_path).num_rows == len(BAD_ROWS)  # its quarantine, kept

    # The copy carries the state on: the night after compares with it, and is unchanged too.
    copied = Previous("20261125T030000Z-cccccc", WorkPath.of(tmp_path / "rerun"), range(10**6))
    again = recs_run(items, interactions, tmp_path / "again", copied)
    assert (again.report.mode, again.report.quality) == ("unchanged", published.report.quality)

    # One row fewer in the file is a change: the night runs incremental.
    pq.write_table(pq.read_table(interactions).slice(1), tmp_path / "moved.parquet")
    moved = recs_run(items, tmp_path / "moved.parquet", tmp_path / "moved", copied)
    assert moved.report.mode == "incremental"


def test_a_night_that_adds_a_file_regroups_only_its_users_and_scores_them_as_a_full_run_would(
    items: Items, interactions: Path, tmp_path: Path
) -> None:
    log = tmp_path / "log"
    log.mkdir()
    table = pq.read_table(interactions)
    pq.write_table(table, log / "day-1.parquet")
    first = recs_run(items, log, tmp_path / "night-1")
    assert first.report.grouping == "every row grouped: nothing published yet"

    someone = sorted(histories(interactions))[0]
    day = [{"user_id": someone, "item_id": item, "weight": 1.0} for item in items.ids[-2:].to_pylist()]
    day.append({"user_id": "u-newcomer", "item_id": items.ids[0].as_py(), "weight": 0.5})
    pq.write_table(pa.Table.from_pylist(day, schema=table.schema), log / "day-2.parquet")
    second = recs_run(items, log, tmp_path / "night-2", Previous("v1", WorkPath.of(tmp_path / "night-1"), range(10**6)))

    assert second.report.grouping == "3 new rows regrouped with their users' kept ones"
    assert (second.report.mode, set(second.written)) == ("incremental", {someone, "u-newcomer"})
    scratch = recs_run(items, log, tmp_path / "scratch")
    assert scratch.report.grouping == "every row grouped: nothing published yet"
    assert_same_values(second.written, {user: scratch.written[user] for user in second.written})


def moved_interactions(items: Items, interactions: Path, tmp_path: Path) -> tuple[Path, str, str]:
    """The night after: one user lost an interaction (changed), one left (gone), and u-new came
    with two items. Returns (the new interactions file, changed, gone)."""
    held = histories(interactions)
    changed, gone, *_ = (user for user, items_held in sorted(held.items()) if len(items_held) >= 3)
    rows = good_rows(interactions)
    first_of_changed = next(i for i, row in enumerate(rows) if row["user_id"] == changed)
    rows = [row for i, row in enumerate(rows) if i != first_of_changed and row["user_id"] != gone]
    rows += [{"user_id": "u-new", "item_id": item, "weight": 1.0} for item in items.ids[:2].to_pylist()]
    moved = tmp_path / "interactions.parquet"
    pq.write_table(pa.Table.from_pylist(rows), moved)
    return moved, changed, gone


def test_changed_new_and_gone_users_are_rescored_or_deleted_and_no_one_else(
    items: Items, interactions: Path, published: Run, tmp_path: Path
) -> None:
    moved, changed, gone = moved_interactions(items, interactions, tmp_path)

    rerun = recs_run(items, moved, tmp_path / "incremental", previous_of(published))
    assert (rerun.report.mode, rerun.report.rescored) == ("incremental", 2)
    assert rerun.report.copied == rerun.report.users - 2 == published.report.users - 1 - 1
    assert rerun.copy == CopyPlan("20261124T030000Z-aaaaaa", [gone])
    full = recs_run(items, moved, tmp_path / "full")
    assert_same_values(rerun.written, {user: full.written[user] for user in (changed, "u-new")})


def test_an_items_changed_text_rescores_exactly_the_users_who_hold_it(
    items: Items, interactions: Path, published: Run, tmp_path: Path
) -> None:
    edited = len(items.ids) // 2
    keys = items.keys.copy()
    keys[edited] = content_keys(MODEL, ["a new description"])[0]
    vectors = items.vectors.copy()
    vectors[edited] = vectors[edited - 1]
    rerun = recs_run(Items.of(items.ids, vectors, keys), interactions, tmp_path, previous_of(published))
    holders = {user for user, held in histories(interactions).items() if items.ids[edited].as_py() in held}
    assert rerun.report.mode == "incremental" and 0 < len(holders) < rerun.report.users
    assert set(rerun.written) == holders and rerun.report.rescored == len(holders)


def test_users_past_what_a_copy_of_the_published_version_holds_run_in_full(
    items: Items, interactions: Path, published: Run, tmp_path: Path
) -> None:
    rerun = recs_run(items, interactions, tmp_path, previous_of(published, users=range(10)))
    assert rerun.report.mode == "full" and rerun.copy is None
    assert (
        rerun.report.mode_reason
        == f"{published.report.users} users are more or fewer than a copy of 20261124T030000Z-aaaaaa holds"
    )
    assert_same_values(rerun.written, published.written)


def test_a_change_of_model_or_items_plans_a_full_run(items: Items, published: Run, tmp_path: Path) -> None:
    previous = previous_of(published)

    def scoring(weight: float = 0.4) -> dict[str, object]:
        return {"model": "content", "trained": None, "content_weight": None, "popularity_weight": weight}

    def reason(items: Items = items, model: str = MODEL, k: int = 10, weight: float = 0.4) -> str:
        planned = plan(model_fingerprint(model, k, scoring(weight), len(items.ids), vocabulary_digest(items.ids), RECIPE), items, previous)
        return planned.reason if planned.mode == "full" else "incremental"

    added = Items.of(pa.array([*items.ids.to_pylist(), "zzz-new"], pa.string()), items.vectors, np.append(items.keys, np.array([b"0" * 16], "S16")))
    removed = Items.of(items.ids[1:], items.vectors[1:], items.keys[1:])
    assert reason() == "incremental"
    assert reason(k=5) == "k changed from 10 to 5"
    assert reason(weight=0.2) == "popularity_weight changed from 0.4 to 0.2"
    assert reason(model="mpnet") == "items_model changed from 'minilm' to 'mpnet'"
    assert reason(added) == "the items changed: 1 added, 0 removed"
    assert reason(removed) == "the items changed: 0 added, 1 removed"
    nothing = Previous(previous.version, WorkPath.of(tmp_path), previous.records)
    assert plan(model_fingerprint(MODEL, 10, scoring(), len(items.ids), vocabulary_digest(items.ids), RECIPE), items, nothing).reason == (
        "the published version 20261124T030000Z-aaaaaa left no recs state"
    )


def test_a_collaborative_model_copies_nobody_once_it_is_retrained(
    items: Items, interactions: Path, tmp_path: Path
) -> None:
    """Retrained on other interactions, EASE's item tower moves: every user is rescored. On the
    same interactions it is the same model, and the rerun copies everyone."""
    first = recs_run(items, interactions, tmp_path / "first", model="ease")
    assert first.report.users == len(first.written)
    previous = Previous("20261124T030000Z-bbbbbb", WorkPath.of(tmp_path / "first"), range(10**6))
    same = recs_run(items, interactions, tmp_path / "same", previous, model="ease")
    assert (same.report.mode, same.report.rescored) == ("unchanged", 0)
    rows = good_rows(interactions)[1:]
    moved = tmp_path / "interactions.parquet"
    pq.write_table(pa.Table.from_pylist(rows), moved)
    retrained = recs_run(items, moved, tmp_path / "retrained", previous, model="ease")
    assert retrained.report.mode == "full"
    assert retrained.report.mode_reason.startswith("trained changed from")


def test_als_kept_through_a_small_change_rescores_only_the_users_who_moved(
    items: Items, interactions: Path, tmp_path: Path
) -> None:
    """One user's interactions change: ALS is kept (its item factors and scale), so the run is
    incremental and rescores that user alone, as a full run with the kept model scores them.
    With retrain_share 0 it is trained again, and every user is rescored."""
    first = recs_run(items, interactions, tmp_path / "first", model="als")
    assert first.report.als == "trained: nothing published"
    previous = Previous("20261124T030000Z-cccccc", WorkPath.of(tmp_path / "first"), range(10**6))
    rows = good_rows(interactions)
    moved_user = rows[0]["user_id"]
    moved = tmp_path / "interactions.parquet"
    pq.write_table(pa.Table.from_pylist(rows[1:]), moved)

    kept = recs_run(items, moved, tmp_path / "kept", previous, model="als")
    assert kept.report.als.startswith("kept: ") and kept.report.mode == "incremental"
    assert kept.report.rescored == 1 and list(kept.written) == [moved_user]
    # Not measured again: the figures of the night it was trained, which judged it.
    assert kept.report.quality.models == first.report.quality.models
    assert kept.report.quality.note.startswith("measured the night ALS was trained; kept: ")
    no_copy = Previous(previous.version, previous.run_dir, range(0))  # a copy would not hold them: full
    full = recs_run(items, moved, tmp_path / "full", no_copy, model="als")
    assert full.report.als.startswith("kept: ") and full.report.mode == "full"
    assert_same_values(kept.written, {moved_user: full.written[moved_user]})

    retrained = recs_run(items, moved, tmp_path / "retrained", previous, model="als", retrain_share=0)
    assert retrained.report.als.startswith("trained: ") and "interactions changed" in retrained.report.als
    assert retrained.report.mode == "full" and retrained.report.mode_reason.startswith("trained changed from")
    assert "ALS was trained" not in retrained.report.quality.note


def redis_run(
    items: Items, interactions: Path, run_dir: Path, redis: RedisSettings, previous: Previous | None = None
) -> tuple[str, RecsJobReport, dict[str, bytes]]:
    """A run as the flow makes one (precompute/kinds/recs.py): a new version in real Redis, created
    fresh or as a server-side copy of `previous` less the users gone, written, published. Returns
    (version, report, every record the published version holds)."""
    with KeyValueStore(redis) as store:
        new = OutputVersions(store, OUTPUT).writer(new_version(), lambda: {"vocabulary": items.ids.to_pylist()})
        if previous is not None:
            previous = Previous(previous.version, previous.run_dir, new.copyable(previous.version))
        report = run_recs_job(
            InteractionsInput(path=str(interactions)),
            RecsSpec(model="content"),
            JobSettings(users_per_block=256),
            items,
            new.sink(),
            WorkPath.of(run_dir),
            new.create,
            items_model=MODEL,
            previous=previous,
        )
        store.publish(OUTPUT, new.version, report.samples)
    held = {user.decode(): value for user, value in held_records(redis, OUTPUT, new.version).items()}
    return new.version, report, held


def test_the_copy_plan_carried_out_in_redis_serves_copied_users_as_before_and_rescored_ones_afresh(
    items: Items, interactions: Path, redis_url: str, tmp_path: Path
) -> None:
    redis = RedisSettings(url=redis_url, prefix=f"inc{uuid.uuid4().hex[:8]}")
    first, report, before = redis_run(items, interactions, tmp_path / "first", redis)
    assert len(before) == report.users
    moved, changed, gone = moved_interactions(items, interactions, tmp_path)

    previous = Previous(first, WorkPath.of(tmp_path / "first"), range(0))  # its bucket fit: the store says
    _, rerun, after = redis_run(items, moved, tmp_path / "second", redis, previous)
    assert (rerun.mode, rerun.rescored, rerun.copied) == ("incremental", 2, report.users - 2)
    assert gone not in after and set(after) == set(before) - {gone} | {"u-new"}
    unchanged = set(after) - {changed, "u-new"}
    assert {user: after[user] for user in unchanged} == {user: before[user] for user in unchanged}  # copied
    _, _, fresh = redis_run(items, moved, tmp_path / "full", redis)
    assert_same_values({user: after[user] for user in (changed, "u-new")}, {u: fresh[u] for u in (changed, "u-new")})


@pytest.mark.parametrize("copy_holds", [True, False], ids=["incremental", "full"])
def test_a_night_under_the_same_model_fills_the_index_its_published_run_built(
    copy_holds: bool, items: Items, interactions: Path, tmp_path: Path
) -> None:
    """The index's lists and the content keys it was built over stay in the run's state; the
    next night under the same model fills them with tonight's vectors and carries them on,
    also when it rescores every user because a copy of the published version would not hold them."""
    first = recs_run(items, interactions, tmp_path / "first", topk="ivf")
    assert first.report.ranking["kept_from"] is None and (tmp_path / "first" / STATE / INDEX_FILE).is_file()
    edited = len(items.ids) // 2
    keys = items.keys.copy()
    keys[edited] = content_keys(MODEL, ["a new description"])[0]
    vectors = items.vectors.copy()
    vectors[edited] = vectors[edited - 1]
    tonight = Items.of(items.ids, vectors, keys)
    records = range(10**6) if copy_holds else range(0)
    previous = Previous("20261124T030000Z-dddddd", WorkPath.of(tmp_path / "first"), records)

    rerun = recs_run(tonight, interactions, tmp_path / "second", previous, topk="ivf")

    assert rerun.report.mode == ("incremental" if copy_holds else "full") and rerun.report.rescored > 0
    assert (rerun.report.ranking["kept_from"], rerun.report.ranking["moved"]) == (previous.version, 1)
    assert (tmp_path / "second" / STATE / INDEX_FILE).is_file()
    full = recs_run(tonight, interactions, tmp_path / "full", topk="exact")
    assert_same_values(rerun.written, {user: full.written[user] for user in rerun.written})
