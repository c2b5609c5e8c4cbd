"""Inputs as users have them (models/datasets.py): files, folders, globs, hive partitions, CSV and
JSON Lines, dictionary columns, and the one-line refusals of what cannot be read."""

from __future__ import annotations

import datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest

from precompute.jobs.inputs import read_input
from precompute.models.datasets import DatasetInput, InputError, arrow_dataset, input_files
from precompute.models.text.reference import TextSample

ROWS = pa.table({"id": pa.array([1, 2, 3], pa.int32()), "text": pa.array(["a", "b", "a"]).dictionary_encode()})


@pytest.fixture
def hive(tmp_path: Path) -> Path:
    """Three days of a warehouse export, with the marker files Spark leaves beside them."""
    for day in ("2026-11-24", "2026-11-25", "2026-11-26"):
        (tmp_path / f"dt={day}").mkdir()
        pq.write_table(ROWS, tmp_path / f"dt={day}" / "part-0.parquet")
    (tmp_path / "_SUCCESS").touch()
    (tmp_path / "dt=2026-11-25" / ".part-0.parquet.crc").touch()
    return tmp_path


def days(source: DatasetInput) -> list[str]:
    return [Path(f).parent.name for f in input_files(source).files]


def test_a_folder_is_its_data_files_and_where_selects_partitions(hive: Path) -> None:
    assert days(DatasetInput(path=str(hive))) == ["dt=2026-11-24", "dt=2026-11-25", "dt=2026-11-26"]
    assert days(DatasetInput(path=str(hive), where={"dt": "2026-11-25"})) == ["dt=2026-11-25"]
    # A TOML date (dt = 2026-11-26, unquoted) and a list of values select the same way.
    both = DatasetInput(path=str(hive), where={"dt": [datetime.date(2026, 11, 26), "2026-11-24"]})
    assert days(both) == ["dt=2026-11-24", "dt=2026-11-26"]
    # Partition folders choose files; the rows are the files' own columns, dictionaries decoded.
    table = arrow_dataset(DatasetInput(path=str(hive), where={"dt": "2026-11-25"})).to_table()
    assert table.schema == pa.schema([("id", pa.int32()), ("text", pa.string())])
    assert table["text"].to_pylist() == ["a", "b", "a"]


def test_a_glob_names_files_across_folders(hive: Path) -> None:
    assert days(DatasetInput(path=f"{hive}/dt=2026-11-2[56]/*.parquet")) == ["dt=2026-11-25", "dt=2026-11-26"]
    assert arrow_dataset(DatasetInput(path=f"{hive}/*/*.parquet")).count_rows() == 9


def test_csv_and_json_lines_are_read_by_their_extension_or_the_format_given(tmp_path: Path) -> None:
    pcsv.write_csv(ROWS.cast(pa.schema([("id", pa.int32()), ("text", pa.string())])), tmp_path / "rows.csv")
    (tmp_path / "rows.jsonl").write_text('{"id": 1, "text": "a"}\n{"id": 2, "text": "b"}\n')
    (tmp_path / "export.txt").write_text('{"id": 1, "text": "a"}\n')
    assert arrow_dataset(DatasetInput(path=str(tmp_path / "rows.csv"))).to_table()["text"].to_pylist() == [
        "a",
        "b",
        "a",
    ]
    assert input_files(DatasetInput(path=str(tmp_path / "rows.jsonl"))).format == "json"
    assert arrow_dataset(DatasetInput(path=str(tmp_path / "export.txt"), format="json")).count_rows() == 1


@pytest.mark.parametrize(
    ("where", "path", "message"),
    [
        ({"day": "2026-11-25"}, "", r"where names day, not a partition folder of it \(partitions: dt\)"),
        ({"dt": "2027-01-01"}, "", r"no partition has dt in \(2027-01-01\)"),
        ({}, "nowhere", r"nowhere: no such file, or no files in it"),
        ({}, "dt=2026-11-2[89]/*", r"no such file, or no files in it"),
    ],
)
def test_what_cannot_be_read_is_refused_in_one_line(hive: Path, where: dict, path: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        input_files(DatasetInput(path=str(hive / path) if path else str(hive), where=where))


def test_a_folder_of_mixed_or_unknown_formats_asks_for_a_format(tmp_path: Path) -> None:
    pq.write_table(ROWS, tmp_path / "a.parquet")
    pcsv.write_csv(pa.table({"id": [1]}), tmp_path / "b.csv")
    with pytest.raises(InputError, match=r"holds csv and parquet files; name one with a glob"):
        input_files(DatasetInput(path=str(tmp_path)))
    (tmp_path / "notes.md").write_text("x")
    with pytest.raises(InputError, match=r"cannot tell the format of .*notes.md; set format"):
        input_files(DatasetInput(path=str(tmp_path / "notes.md")))


def test_csv_ids_stay_strings_on_every_reader(ray_local, tmp_path: Path) -> None:
    """CSV says nothing of types: an id column is read as strings by the driver and by Ray, so a
    zero-padded id keeps its zeros (inference would read `007` as 7); other columns are inferred."""
    (tmp_path / "items.csv").write_text("id,text,price\n007,first,1.5\n8,second,2\n")
    sample = TextSample(path=str(tmp_path / "items.csv"))
    table = arrow_dataset(sample).to_table()
    assert table["id"].to_pylist() == ["007", "8"] and table.schema.field("price").type == pa.float64()
    assert [row["id"] for row in read_input(sample).iter_rows()] == ["007", "8"]
    assert arrow_dataset(DatasetInput(path=str(tmp_path / "items.csv"))).to_table()["id"].to_pylist() == [7, 8]
