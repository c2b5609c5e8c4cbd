"""Interactions validated file by file (jobs/recs/history/interaction_files.py): a night takes the kept
validation of every file that did not move, checks only the others, and gives exactly what a
validation of every file gives."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from precompute.jobs.inputs import InteractionsInput
from precompute.jobs.recs.history import interaction_files
from precompute.jobs.recs.history.interaction_files import (
    NIGHTS,
    REJECTED,
    KeptFiles,
    read_entry,
    validated_interactions,
    write_entry,
)
from precompute.jobs.recs.history.interactions import INDEX, WEIGHT
from precompute.jobs.validate import REASON, RejectRatioExceededError
from precompute.jobs.work_dir import WorkPath
from precompute.models.datasets import arrow_dataset, input_files

ITEMS = ["i0", "i1", "i2"]
MARK = 9.0
"""A weight no input here has: a kept file's rows carrying it were read from its entry, not its file."""


def write(folder: Path, name: str, rows: list[tuple[str | None, str, float]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    users, items, weights = (list(column) for column in zip(*rows, strict=True))
    pq.write_table(pa.table({"user_id": pa.array(users, pa.string()), "item_id": items, "weight": weights}), folder / name)


def night(source: InteractionsInput, cache: Path, run: Path, items: list[str] = ITEMS) -> tuple[pa.Table, int, int]:
    kept = KeptFiles(WorkPath.of(cache), input_files(source).digests(), "|".join(items))
    good, rows, rejects, _ = validated_interactions(source, pa.array(items), WorkPath.of(run / "rejects.parquet"), kept)
    return good, rows, rejects


def entry_of(cache: Path, folder: Path, name: str, source: InteractionsInput) -> WorkPath:
    """Where the validation of `folder/name` is kept, against ITEMS."""
    kept = KeptFiles(WorkPath.of(cache), input_files(source).digests(), "|".join(ITEMS))
    return kept.entries(source, arrow_dataset(source).schema)[str(folder / name)]


def marked(cache: Path, folder: Path, name: str, source: InteractionsInput) -> None:
    """The kept entry of `folder/name` rewritten with every good row weighing MARK."""
    entry = entry_of(cache, folder, name, source)
    recorded = read_entry(entry)
    assert recorded is not None
    weights = pa.array([MARK] * recorded.good.num_rows, pa.float32())
    good = recorded.good.set_column(recorded.good.schema.get_field_index(WEIGHT), WEIGHT, weights)
    write_entry(entry, recorded._replace(good=good))


@pytest.fixture
def log(tmp_path: Path) -> tuple[Path, InteractionsInput]:
    folder = tmp_path / "log"
    write(folder, "day-1.parquet", [("u1", "i0", 1.0), ("u1", "gone", 1.0), ("u2", "i1", 0.5)])
    write(folder, "day-2.parquet", [("u2", "i2", 2.0), (None, "i0", 1.0), ("u3", "i0", 1.0)])
    return folder, InteractionsInput(path=str(folder), max_reject_ratio=0.5)


def test_a_night_that_adds_a_file_checks_only_it_and_gives_what_checking_every_file_gives(
    log: tuple[Path, InteractionsInput], tmp_path: Path
) -> None:
    folder, source = log
    cache = tmp_path / "cache"
    night(source, cache, tmp_path / "night-1")
    write(folder, "day-3.parquet", [("u1", "i2", 0.25), ("u4", "i9", 1.0)])
    good, rows, count = night(source, cache, tmp_path / "night-2")
    whole = validated_interactions(source, pa.array(ITEMS), WorkPath.of(tmp_path / "whole" / "rejects.parquet"))
    assert good.equals(whole.good) and (rows, count) == (whole.rows, whole.rejects) == (8, 3)
    assert good["user_id"].to_pylist() == ["u1", "u2", "u2", "u3", "u1"]  # the files' order, then their rows'
    quarantined, expected = (pq.read_table(p / "rejects.parquet") for p in (tmp_path / "night-2", tmp_path / "whole"))
    assert quarantined.equals(expected)
    assert quarantined[REASON].to_pylist() == [
        "item_id 'gone' is not in the item table",
        "user_id is null",
        "item_id 'i9' is not in the item table",
    ]

    # The kept files' rows come from their entries: marked there, they come back marked; the new file's do not.
    marked(cache, folder, "day-1.parquet", source)
    marked(cache, folder, "day-2.parquet", source)
    write(folder, "day-4.parquet", [("u5", "i1", 1.0)])
    good, rows, count = night(source, cache, tmp_path / "night-3")
    assert good[WEIGHT].to_pylist() == [MARK] * 4 + [0.25, 1.0]
    assert (rows, count) == (9, 3)


def test_a_rewritten_file_other_items_or_other_columns_are_checked_again(
    log: tuple[Path, InteractionsInput], tmp_path: Path
) -> None:
    folder, source = log
    cache = tmp_path / "cache"
    night(source, cache, tmp_path / "night-1")
    marked(cache, folder, "day-1.parquet", source)
    marked(cache, folder, "day-2.parquet", source)

    write(folder, "day-2.parquet", [("u2", "i2", 2.0), ("u3", "i0", 1.0)])  # rewritten: checked
    good, _, count = night(source, cache, tmp_path / "night-2")
    assert good[WEIGHT].to_pylist() == [MARK, MARK, 2.0, 1.0] and count == 1

    # Another item table: a good row's position means another item, so every file is checked again.
    grown = ["i0", "i05", "i1", "i2"]
    good, _, _ = night(source, cache, tmp_path / "night-3", grown)
    assert MARK not in good[WEIGHT].to_pylist()
    assert good[INDEX].to_pylist() == [0, 2, 3, 0]

    # Read under other column names: other rules, other entries.
    renamed = InteractionsInput(path=str(folder), user="item_id", item="user_id", max_reject_ratio=1.0)
    good, _, count = night(renamed, cache, tmp_path / "night-4")
    assert good.num_rows == 0 and count == 5


def test_a_file_with_no_rejects_keeps_no_rejects_file_and_its_entry_still_serves(
    log: tuple[Path, InteractionsInput], tmp_path: Path
) -> None:
    folder, source = log
    cache = tmp_path / "cache"
    write(folder, "day-3.parquet", [("u1", "i2", 0.25)])
    night(source, cache, tmp_path / "night-1")
    has_rejects = [(entry_of(cache, folder, f"day-{day}.parquet", source) / REJECTED).is_file() for day in (1, 2, 3)]
    assert has_rejects == [True, True, False]

    good, rows, count = night(source, cache, tmp_path / "night-2")  # every file from its entry
    whole = validated_interactions(source, pa.array(ITEMS), WorkPath.of(tmp_path / "whole" / "rejects.parquet"))
    assert good.equals(whole.good) and (rows, count) == (whole.rows, whole.rejects) == (7, 2)
    quarantined, expected = (pq.read_table(p / "rejects.parquet") for p in (tmp_path / "night-2", tmp_path / "whole"))
    assert quarantined.equals(expected)


def test_rejects_of_kept_files_still_count_against_the_ratio(log: tuple[Path, InteractionsInput], tmp_path: Path) -> None:
    folder, source = log
    cache = tmp_path / "cache"
    night(source, cache, tmp_path / "night-1")  # 2 of 6 rejected
    write(folder, "day-3.parquet", [("u1", "gone", 1.0), ("u2", "gone", 1.0)])
    with pytest.raises(RejectRatioExceededError, match=r"4 of 8 interactions rejected"):
        night(InteractionsInput(path=str(folder), max_reject_ratio=0.4), cache, tmp_path / "night-2")
    assert pq.read_table(tmp_path / "night-2" / "rejects.parquet").num_rows == 4


def test_entries_no_recent_night_read_are_deleted(
    log: tuple[Path, InteractionsInput], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(interaction_files, "KEPT_NIGHTS", 2)
    folder, source = log
    cache = tmp_path / "cache"

    def entries() -> set[str]:
        return {entry.name for entry in cache.iterdir() if entry.is_dir()}

    night(source, cache, tmp_path / "night-1")
    first = entries()
    (folder / "day-1.parquet").unlink()
    write(folder, "day-3.parquet", [("u1", "i2", 0.25)])
    night(source, cache, tmp_path / "night-2")
    assert len(first) == 2 and len(entries()) == 3 and first < entries()  # night 1 is among the latest two
    night(source, cache, tmp_path / "night-3")
    assert len(entries()) == 2 and len(first & entries()) == 1 and (cache / NIGHTS).is_file()
    marked(cache, folder, "day-2.parquet", source)  # the kept entries still serve
    assert pc.sum(night(source, cache, tmp_path / "night-4")[0][WEIGHT]).as_py() == pytest.approx(2 * MARK + 0.25)
