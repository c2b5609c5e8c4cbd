"""Histories kept night to night (jobs/recs/history/kept_histories.py): a night that only adds files regroups
the users they touch into the published night's grouping, and gets exactly what grouping every
row gives; anything else groups every row, and says why."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from precompute.jobs.nights import Previous
from precompute.jobs.recs.history.interaction_files import Validated
from precompute.jobs.recs.history.interactions import INDEX, SECONDS, USER, WEIGHT
from precompute.jobs.recs.history.kept_histories import grouped, keep_grouping
from precompute.jobs.recs.history.seen import ranges
from precompute.jobs.recs.history.user_histories import Grouped, group_all, user_rows
from precompute.jobs.recs.state import STATE, stage
from precompute.jobs.work_dir import WorkPath

ITEMS = 50
VOCABULARY = "v1"


def rows(rng: np.random.Generator, users: list[str], count: int) -> pa.Table:
    """Clean rows: repeated items, times that tie, and rows without a time."""
    seconds = rng.integers(0, 20, count).astype(np.float64)
    return pa.table(
        {
            USER: pa.array(rng.choice(users, count), pa.string()),
            INDEX: pa.array(rng.integers(0, ITEMS, count), pa.int64()),
            WEIGHT: pa.array(rng.choice([1.0, 0.5], count), pa.float32()),
            SECONDS: pa.array(seconds, mask=rng.random(count) < 0.2),
        }
    )


def night(
    run_dir: Path, files: dict[str, pa.Table] | list[tuple[str, pa.Table]], previous: Previous | None, vocabulary: str = VOCABULARY
) -> tuple[Grouped, str, Previous]:
    """Group a night's files (their entry names and clean rows) as the job does, and stage what
    the next night reads."""
    named = list(files.items()) if isinstance(files, dict) else files
    tables = [table for _, table in named]
    valid = Validated(pa.concat_tables(tables), sum(t.num_rows for t in tables), 0, [(n, t.num_rows) for n, t in named])
    grouping, how = grouped(valid, vocabulary, previous)
    folder = WorkPath.of(run_dir)
    stage(folder, {}, pa.array([f"i{i}" for i in range(ITEMS)]), np.zeros(ITEMS, "S16"), user_rows(grouping, np.zeros(ITEMS, bool)))
    keep_grouping(folder / STATE, grouping, valid, vocabulary)
    return grouping, how, Previous(run_dir.name, folder, range(0))


def assert_same(got: Grouped, expected: Grouped) -> None:
    for name in ("offsets", "items", "weights", "ids"):
        np.testing.assert_array_equal(getattr(got.seen, name), getattr(expected.seen, name), err_msg=name)
    assert got.ids.equals(expected.ids)
    np.testing.assert_array_equal(got.fingerprints, expected.fingerprints)
    assert got.seconds.equals(expected.seconds)


@pytest.mark.parametrize("seed", range(4))
def test_a_night_that_adds_files_regroups_only_their_users_and_gets_what_grouping_every_row_gives(
    tmp_path: Path, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    users = [f"u{i:03d}" for i in range(0, 200, 2)]
    files = {"day-1": rows(rng, users, 400), "day-2": rows(rng, users, 300)}
    first, how, previous = night(tmp_path / "night-1", files, None)
    assert how == "every row grouped: nothing published yet"
    assert_same(first, group_all(pa.concat_tables(files.values())))

    # A day of the same users and new ones (between, before and after the kept ids), and a day
    # with no good row.
    newcomers = ["a-first", "u001", "u101", "u151", "zz-last"]
    files |= {"day-3": rows(rng, users[:7] + newcomers, 40), "day-4": rows(rng, users, 0)}
    second, how, previous = night(tmp_path / "night-2", files, previous)
    assert how == "40 new rows regrouped with their users' kept ones"
    assert_same(second, group_all(pa.concat_tables(files.values())))

    files |= {"day-5": rows(rng, users[-3:], 12)}  # the night after: from the regrouped night's state
    third, how, _ = night(tmp_path / "night-3", files, previous)
    assert how == "12 new rows regrouped with their users' kept ones"
    assert_same(third, group_all(pa.concat_tables(files.values())))


def test_a_file_moved_or_gone_or_another_vocabulary_groups_every_row(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    users = [f"u{i}" for i in range(30)]
    files = {"day-1": rows(rng, users, 100), "day-2": rows(rng, users, 100)}
    _, _, previous = night(tmp_path / "night-1", files, None)

    rewritten = {"day-1": files["day-1"], "day-2-rewritten": rows(rng, users, 90)}
    got, how, _ = night(tmp_path / "moved", rewritten, previous)
    assert how == "every row grouped: 1 files read then moved or went"
    assert_same(got, group_all(pa.concat_tables(rewritten.values())))

    got, how, _ = night(tmp_path / "gone", {"day-2": files["day-2"]}, previous)
    assert how == "every row grouped: 1 files read then moved or went"

    _, how, _ = night(tmp_path / "items", files, previous, vocabulary="v2")
    assert how == "every row grouped: the items changed"

    # Two files of the same bytes have one entry name: each counts, so dropping one is a file gone.
    _, _, twice = night(tmp_path / "twice-1", [("day-1", files["day-1"]), ("day-1", files["day-1"])], None)
    _, how, _ = night(tmp_path / "twice-2", [("day-1", files["day-1"])], twice)
    assert how == "every row grouped: 1 files read then moved or went"


def test_ranges_lists_each_run_of_positions_in_order() -> None:
    np.testing.assert_array_equal(ranges(np.array([5, 0, 9]), np.array([2, 3, 0])), [5, 6, 0, 1, 2])
    assert len(ranges(np.zeros(0, np.int64), np.zeros(0, np.int64))) == 0
