"""A corpus's validation (jobs/text/corpus_validation.py): end to end, the bad rows quarantined and the
good ones read back; taken, not repeated, for the same files by the same rules, whole or file by
file."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
import ray

from precompute.jobs.inputs import CorpusInput
from precompute.jobs.text import corpus_validation
from precompute.jobs.text.corpus_repeats import as_ids
from precompute.jobs.text.corpus_validation import GoodRows, validated_corpus, validation_entry
from precompute.jobs.validate import REASON, RejectRatioExceededError, id_key
from precompute.jobs.work_dir import WorkPath
from precompute.models.datasets import input_files


def wholes(validations: WorkPath) -> list[WorkPath]:
    """The whole corpora's validations (beside them, the files' folder)."""
    return [e for e in validations.folders() if e.name != corpus_validation.FILES]


def entry(work_dir: Path, corpus: CorpusInput) -> corpus_validation.Validation:
    return validation_entry(WorkPath.of(work_dir), input_files(corpus).digests(), corpus)


def write_files(folder: Path, files: dict[str, list[tuple[str, str]]]) -> None:
    folder.mkdir(exist_ok=True)
    for name, rows in files.items():
        pq.write_table(pa.table({"id": [r[0] for r in rows], "text": [r[1] for r in rows]}), folder / name)


def read_good(good: GoodRows) -> list[dict]:
    """The good rows by id, read both ways a job reads them (streamed, and as blocks by tasks),
    which agree."""
    streamed = sorted(good.dataset().take_all(), key=lambda r: r["id"])
    assert sorted(pa.concat_tables(ray.get(good.blocks())).to_pylist(), key=lambda r: r["id"]) == streamed
    return streamed


def checked_files(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the files validate_files reads rows of, as it reads them."""
    checked: list[str] = []
    parts = corpus_validation.parts

    def spy(fragment: pads.Fragment) -> list[pads.Fragment]:
        checked.append(Path(fragment.path).name)
        return parts(fragment)

    monkeypatch.setattr(corpus_validation, "parts", spy)
    return checked


@pytest.fixture(params=["driver", "tasks"])
def checked_where(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Where a moved file's rows are checked: in this process (few rows), or by Ray tasks."""
    if request.param == "tasks":
        monkeypatch.setattr(corpus_validation, "DRIVER_ROWS", 0)
    return request.param


@pytest.mark.slow
def test_every_bad_row_is_quarantined_with_its_reason_and_the_good_ones_read_back_as_text(
    ray_local, checked_where: str, tmp_path: Path
) -> None:
    """The corpus contract end to end (validated_corpus), on columns named otherwise than id and
    text: each way a row can be bad gets its reason and keeps its exact bytes, both copies of a
    duplicated id go, a text of exactly max_text_bytes is read, and the good rows come back with
    their own column names' values as strings, every other column as it was."""
    rows = [
        (b"good", b"a fine text", b"t1"),
        (b"at-limit", b"x" * 20, b"t2"),
        (b"dup", b"one copy", b"t"),
        (b"dup", b"the other", b"t"),
        (None, b"no id", b"t"),
        (b"null-text", None, b"t"),
        (b"oversize", b"y" * 21, b"t"),
        (b"blank", b" \n ", b"t"),
        (b"bad-text", b"caf\xe9", b"t"),
        (b"bad-title", b"fine", b"caf\xe9"),
        (b"\xff\xfeid", b"a bad id", b"t"),
    ]
    key, body, title = zip(*rows, strict=True)
    path = tmp_path / "corpus.parquet"
    pq.write_table(
        pa.table(
            {
                "key": pa.array(key, pa.binary()).view(pa.string()),
                "body": pa.array(body, pa.binary()),
                "title": pa.array(title, pa.binary()).view(pa.string()),
            }
        ),
        path,
    )
    corpus = CorpusInput(path=str(path), id="key", text="body", max_text_bytes=20, max_reject_ratio=0.9)
    rejects_path = tmp_path / "rejects.parquet"

    good, read, rejected = validated_corpus(corpus, WorkPath.of(rejects_path))

    assert (read, rejected) == (11, 9)
    assert read_good(good) == [
        {"id": "at-limit", "text": "x" * 20, "title": "t2"},
        {"id": "good", "text": "a fine text", "title": "t1"},
    ]
    quarantined = pq.read_table(rejects_path)
    assert quarantined.column_names == ["id", "text", "title", REASON]
    reasons = sorted((r["id"], r["text"], r[REASON]) for r in quarantined.to_pylist() if r["id"] is not None)
    assert reasons == [
        (b"bad-text", b"caf\xe9", "text is not valid UTF-8 (byte 3)"),
        (b"bad-title", b"fine", "title is not valid UTF-8 (byte 3)"),
        (b"blank", b" \n ", "text is empty"),
        (b"dup", b"one copy", "id 'dup' is duplicated"),
        (b"dup", b"the other", "id 'dup' is duplicated"),
        (b"null-text", None, "text is null"),
        (b"oversize", b"y" * 21, "text is 21 bytes, over max_text_bytes=20"),
        (b"\xff\xfeid", b"a bad id", "id is not valid UTF-8 (byte 0)"),
    ]
    assert [r[REASON] for r in quarantined.to_pylist() if r["id"] is None] == ["id is null"]


def test_a_validation_of_the_same_files_by_the_same_rules_is_taken_not_repeated(
    ray_local, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The night's second text job over one corpus, or a night whose corpus did not move, takes
    the recorded validation: its figures, its rejects copied, the ids it found repeated (no
    column is read to find them again), the ratio checked by its own limit. Other bytes or
    another rule validate again."""
    path = tmp_path / "corpus.parquet"
    ids, texts = ["a", "b", "c", "d", "e", "e"], ["one", " ", "three", "four", "five", "five again"]
    pq.write_table(pa.table({"id": ids, "text": texts}), path)
    corpus = CorpusInput(path=str(path), max_reject_ratio=0.7)
    validations = WorkPath.of(tmp_path / corpus_validation.VALIDATED)

    first = WorkPath.of(tmp_path / "run-1" / "rejects.parquet")
    assert validated_corpus(corpus, first, entry(tmp_path, corpus))[1:] == (6, 3)

    monkeypatch.setattr(corpus_validation, "validate_files", None)  # reading a file again would raise
    second = WorkPath.of(tmp_path / "run-2" / "rejects.parquet")
    good, rows, rejects = validated_corpus(corpus, second, entry(tmp_path, corpus))
    assert (rows, rejects) == (6, 3) and [r["id"] for r in read_good(good)] == ["a", "c", "d"]
    assert pq.read_table(second.path).to_pylist() == pq.read_table(first.path).to_pylist()
    with pytest.raises(RejectRatioExceededError, match=r"3 of 6 rows rejected, over max_reject_ratio=0\.2"):
        validated_corpus(corpus.model_copy(update={"max_reject_ratio": 0.2}), second, entry(tmp_path, corpus))

    monkeypatch.undo()
    bytes_4 = corpus.model_copy(update={"max_text_bytes": 4})
    assert validated_corpus(bytes_4, second, entry(tmp_path, bytes_4))[1:] == (6, 4)
    pq.write_table(pa.table({"id": ["a", "b"], "text": ["one", "two"]}), path)
    assert validated_corpus(corpus, second, entry(tmp_path, corpus))[1:] == (2, 0)
    assert len(wholes(validations)) == 3


def test_the_newest_validations_are_kept(ray_local, tmp_path: Path) -> None:
    validations = WorkPath.of(tmp_path / corpus_validation.VALIDATED)
    for n in range(corpus_validation.KEPT_VALIDATIONS + 2):
        path = tmp_path / f"corpus-{n}.parquet"
        pq.write_table(pa.table({"id": [str(n)], "text": [f"text {n}"]}), path)
        corpus = CorpusInput(path=str(path))
        entry = validation_entry(WorkPath.of(tmp_path), input_files(corpus).digests(), corpus)
        validated_corpus(corpus, WorkPath.of(tmp_path / "rejects.parquet"), entry)
    kept = {json.loads((e / corpus_validation.FIGURES).read_text())["rows"] for e in wholes(validations)}
    assert len(wholes(validations)) == corpus_validation.KEPT_VALIDATIONS and kept == {1}


def test_a_night_reads_the_rows_of_the_files_that_moved_and_takes_the_others(
    ray_local, checked_where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder of three files, one rewritten: only its rows are read again; the other files'
    rejects, with their reasons, are the night's as before, and the figures are the corpus's."""
    folder = tmp_path / "corpus"
    write_files(folder, {"a.parquet": [("a1", "one"), ("a2", " ")], "b.parquet": [("b1", "two")], "c.parquet": [("c1", "three")]})
    corpus = CorpusInput(path=str(folder), max_reject_ratio=0.5)
    checked = checked_files(monkeypatch)
    first = WorkPath.of(tmp_path / "run-1" / "rejects.parquet")
    assert validated_corpus(corpus, first, entry(tmp_path, corpus))[1:] == (4, 1)
    assert sorted(checked) == ["a.parquet", "b.parquet", "c.parquet"]

    checked.clear()
    write_files(folder, {"c.parquet": [("c1", "three, revised"), ("c2", "")]})
    second = WorkPath.of(tmp_path / "run-2" / "rejects.parquet")
    good, rows, rejects = validated_corpus(corpus, second, entry(tmp_path, corpus))
    assert checked == ["c.parquet"]
    assert (rows, rejects) == (5, 2)
    assert [r["id"] for r in read_good(good)] == ["a1", "b1", "c1"]
    assert sorted((r["id"], r[REASON]) for r in pq.read_table(second.path).to_pylist()) == [
        ("a2", "text is empty"),
        ("c2", "text is empty"),
    ]


def test_an_id_that_a_moved_file_repeats_is_rejected_in_the_unmoved_file_too(
    ray_local, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Which ids repeat is the whole corpus's: a file whose bytes did not move is read again when
    the ids of it that the corpus repeats did, and both copies are rejected; once the repeat is
    gone, it is read again and its row is good."""
    folder = tmp_path / "corpus"
    write_files(folder, {"a.parquet": [("x", "one"), ("a2", "two")], "b.parquet": [("b1", "three")]})
    corpus = CorpusInput(path=str(folder), max_reject_ratio=0.5)
    checked = checked_files(monkeypatch)
    validated_corpus(corpus, WorkPath.of(tmp_path / "r1.parquet"), entry(tmp_path, corpus))

    checked.clear()
    write_files(folder, {"b.parquet": [("b1", "three"), ("x", "again")]})
    rejects_path = WorkPath.of(tmp_path / "r2.parquet")
    good, rows, rejects = validated_corpus(corpus, rejects_path, entry(tmp_path, corpus))
    assert sorted(checked) == ["a.parquet", "b.parquet"] and (rows, rejects) == (4, 2)
    assert sorted(r["text"] for r in pq.read_table(rejects_path.path).to_pylist()) == ["again", "one"]
    assert [r["id"] for r in read_good(good)] == ["a2", "b1"]

    checked.clear()
    write_files(folder, {"b.parquet": [("b1", "three, revised")]})
    assert validated_corpus(corpus, WorkPath.of(tmp_path / "r3.parquet"), entry(tmp_path, corpus))[1:] == (3, 0)
    assert sorted(checked) == ["a.parquet", "b.parquet"]


def test_a_file_rewritten_with_the_same_ids_is_the_only_one_whose_ids_are_read(
    ray_local, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows edited in place leave the corpus's ids as they were, so it repeats what it repeated
    (here "x", in both files, rejected in both) and the unmoved file's ids are not read; a
    rewrite that adds an id reads every file's ids again."""
    folder = tmp_path / "corpus"
    write_files(folder, {"a.parquet": [("x", "one"), ("a2", "two")], "b.parquet": [("b1", "three"), ("x", "four")]})
    corpus = CorpusInput(path=str(folder), max_reject_ratio=0.6)
    read: list[list[str]] = []
    corpus_ids = corpus_validation.corpus_ids

    def spy(source: pads.FileSystemDataset, fragments: dict, column: str) -> dict[str, pa.Table]:
        read.append(sorted(Path(path).name for path in fragments))
        return corpus_ids(source, fragments, column)

    monkeypatch.setattr(corpus_validation, "corpus_ids", spy)
    validated_corpus(corpus, WorkPath.of(tmp_path / "r1.parquet"), entry(tmp_path, corpus))

    read.clear()
    write_files(folder, {"b.parquet": [("b1", "three, revised"), ("x", "four, revised")]})
    good, rows, rejects = validated_corpus(corpus, WorkPath.of(tmp_path / "r2.parquet"), entry(tmp_path, corpus))
    assert read == [["b.parquet"]]
    assert (rows, rejects) == (4, 2) and [r["id"] for r in read_good(good)] == ["a2", "b1"]

    read.clear()
    write_files(folder, {"b.parquet": [("b1", "three"), ("x", "four"), ("b3", "five")]})
    assert validated_corpus(corpus, WorkPath.of(tmp_path / "r3.parquet"), entry(tmp_path, corpus))[1:] == (5, 2)
    assert read == [["b.parquet"], ["a.parquet"]]

    # Every kept validation shares a.parquet alone with the next night: the newest is compared.
    read.clear()
    write_files(folder, {"b.parquet": [("b1", "three"), ("x", "four"), ("b3", "five, revised")]})
    assert validated_corpus(corpus, WorkPath.of(tmp_path / "r4.parquet"), entry(tmp_path, corpus))[1:] == (5, 2)
    assert read == [["b.parquet"]]


def test_a_repeat_between_files_that_were_never_validated_together_is_found(ray_local, tmp_path: Path) -> None:
    """Each file was validated before, but not beside the other: the id both hold is found
    repeated all the same (the counted ids are those of the files that the most alike validation
    lacked, and those it found repeated)."""
    a, b = [("x", "one"), ("a2", "two")], [("x", "three"), ("b2", "four")]
    corpus = CorpusInput(path=str(tmp_path / "corpus"), max_reject_ratio=0.5)
    for n, files in enumerate(({"a.parquet": a}, {"b.parquet": b}, {"a.parquet": a, "b.parquet": b})):
        for old in (tmp_path / "corpus").glob("*.parquet"):
            old.unlink()
        write_files(tmp_path / "corpus", files)
        rejects_path = WorkPath.of(tmp_path / f"rejects-{n}.parquet")
        found = validated_corpus(corpus, rejects_path, entry(tmp_path, corpus))[1:]
    assert found == (4, 2)
    assert sorted(r["text"] for r in pq.read_table(rejects_path.path).to_pylist()) == ["one", "three"]


def test_a_large_file_is_checked_in_parts_with_every_reject_found(
    ray_local, checked_where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Parquet file of several row groups is checked by a task per run of them (row_groups.runs):
    the rows and rejects of all the parts are the file's."""
    monkeypatch.setattr(corpus_validation, "runs", lambda metadata: [([i], 0, 0) for i in range(metadata.num_row_groups)])
    texts = [f"text {i}" if i % 7 else "" for i in range(100)]
    path = tmp_path / "corpus.parquet"
    pq.write_table(pa.table({"id": [str(i) for i in range(100)], "text": texts}), path, row_group_size=10)
    corpus = CorpusInput(path=str(path), max_reject_ratio=0.2)
    fragment = next(iter(pads.dataset(path).get_fragments()))
    assert len(corpus_validation.parts(fragment)) == 10
    rejects_path = WorkPath.of(tmp_path / "rejects.parquet")
    assert validated_corpus(corpus, rejects_path, entry(tmp_path, corpus))[1:] == (100, 15)
    assert sorted(int(r["id"]) for r in pq.read_table(rejects_path.path).to_pylist()) == list(range(0, 100, 7))


def test_the_files_of_the_kept_validations_are_kept_and_no_others(ray_local, tmp_path: Path) -> None:
    folder = tmp_path / "corpus"
    files = WorkPath.of(tmp_path / corpus_validation.VALIDATED / corpus_validation.FILES)
    corpus = CorpusInput(path=str(folder))
    for n in range(corpus_validation.KEPT_VALIDATIONS + 2):
        write_files(folder, {"same.parquet": [("s", "unchanged")], "moving.parquet": [(f"m{n}", f"text {n}")]})
        validated_corpus(corpus, WorkPath.of(tmp_path / "rejects.parquet"), entry(tmp_path, corpus))
    assert len(files.folders()) == corpus_validation.KEPT_VALIDATIONS + 1  # the same file's one entry


@pytest.mark.parametrize(
    "ids", [pa.array([7, -1], pa.int64()), pa.array([b"a", b"\xff\xfe"], pa.binary()), pa.array([b"b"], pa.large_binary())]
)
def test_recorded_ids_read_back_as_the_ids_they_were(ids: pa.Array) -> None:
    """A validation records repeated ids as text (id_key); the next night's count takes them back
    in their column's type, an id that is not UTF-8 included."""
    keys = {id_key(i) for i in ids.to_pylist()}
    assert as_ids(keys, ids.type).sort().equals(ids.sort())


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_csv_and_json_files_are_checked_as_parquet_ones(ray_local, checked_where: str, fmt: str, tmp_path: Path) -> None:
    """Any format the input reads is checked file by file; a CSV id stays the text it was (007)."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    if fmt == "csv":
        (folder / "a.csv").write_text("id,text\n007,hello\n008, \n")
        (folder / "b.csv").write_text("id,text\n009,world\n")
    else:
        (folder / "a.jsonl").write_text('{"id": "007", "text": "hello"}\n{"id": "008", "text": " "}\n')
        (folder / "b.jsonl").write_text('{"id": "009", "text": "world"}\n')
    corpus = CorpusInput(path=str(folder), max_reject_ratio=0.5)
    rejects_path = WorkPath.of(tmp_path / "rejects.parquet")
    good, rows, rejects = validated_corpus(corpus, rejects_path, entry(tmp_path, corpus))
    assert (rows, rejects) == (3, 1)
    assert [r["id"] for r in read_good(good)] == ["007", "009"]
    assert [(r["id"], r[REASON]) for r in pq.read_table(rejects_path.path).to_pylist()] == [("008", "text is empty")]


def test_a_driver_kept_idle_leaves_even_a_few_moved_rows_to_ray_tasks(
    ray_local, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """JobSettings.driver_rows 0 keeps the driver idle (a cluster's): the rows of one small moved
    file, which it would check itself, go to a Ray task."""
    folder = tmp_path / "corpus"
    write_files(folder, {"a.parquet": [("a1", "one"), ("a2", " ")]})
    corpus = CorpusInput(path=str(folder), max_reject_ratio=0.5)
    monkeypatch.setattr(corpus_validation, "check_part", None)  # the driver's own check; the task's is its worker's
    rejects_path = WorkPath.of(tmp_path / "rejects.parquet")
    good, rows, rejects = validated_corpus(corpus, rejects_path, entry(tmp_path, corpus), driver=False)
    assert (rows, rejects) == (2, 1) and [r["id"] for r in read_good(good)] == ["a1"]
    with pytest.raises(TypeError):  # where the driver may check them, it does
        validated_corpus(corpus, rejects_path, driver=True)


def test_on_one_machine_even_many_moved_rows_are_checked_in_the_drivers_threads(
    ray_local, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A one-node Ray's tasks would share the driver's CPUs and first start their workers: past
    DRIVER_ROWS (0 here) the moved files are still checked in the driver, a thread per CPU."""
    folder = tmp_path / "corpus"
    write_files(folder, {"a.parquet": [("a1", "one"), ("a2", " ")], "b.parquet": [("b1", "two")]})
    corpus = CorpusInput(path=str(folder), max_reject_ratio=0.5)
    monkeypatch.setattr(corpus_validation, "DRIVER_ROWS", 0)
    monkeypatch.setattr(corpus_validation, "check_task", None)  # a Ray task would fail
    rejects_path = WorkPath.of(tmp_path / "rejects.parquet")
    good, rows, rejects = validated_corpus(corpus, rejects_path, entry(tmp_path, corpus))
    assert (rows, rejects) == (3, 1) and [r["id"] for r in read_good(good)] == ["a1", "b1"]
