"""Row validation (jobs/validate.py): every way a row can be bad is quarantined with its reason, and
a job fails past its reject ratio, not at it."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
import ray
from hypothesis import given, settings
from hypothesis import strategies as st

from precompute.jobs import validate
from precompute.jobs.inputs import CorpusInput
from precompute.jobs.validate import (
    REASON,
    RejectRatioExceededError,
    duplicate_ids,
    quarantine,
    row_reason,
    tag_rejects,
    validated_corpus,
    validation_entry,
)
from precompute.jobs.work_dir import WorkPath
from precompute.models.datasets import input_files

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


def test_every_bad_row_is_quarantined_with_its_reason_and_the_good_ones_read_back_as_text(
    ray_local, tmp_path: Path
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
    assert sorted(good.take_all(), key=lambda r: r["id"]) == [
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
    validations = WorkPath.of(tmp_path / validate.VALIDATED)

    def entry(corpus: CorpusInput) -> WorkPath:
        return validation_entry(WorkPath.of(tmp_path), input_files(corpus).digest(), corpus)

    first = WorkPath.of(tmp_path / "run-1" / "rejects.parquet")
    assert validated_corpus(corpus, first, entry(corpus))[1:] == (6, 3)

    monkeypatch.setattr(validate, "quarantine", None)  # a second pass over the rows would raise
    monkeypatch.setattr(validate, "duplicate_ids", None)  # and so would a read of their ids
    second = WorkPath.of(tmp_path / "run-2" / "rejects.parquet")
    good, rows, rejects = validated_corpus(corpus, second, entry(corpus))
    assert (rows, rejects) == (6, 3) and sorted(r["id"] for r in good.take_all()) == ["a", "c", "d"]
    assert pq.read_table(second.path).to_pylist() == pq.read_table(first.path).to_pylist()
    with pytest.raises(RejectRatioExceededError, match=r"3 of 6 rows rejected, over max_reject_ratio=0\.2"):
        validated_corpus(corpus.model_copy(update={"max_reject_ratio": 0.2}), second, entry(corpus))

    monkeypatch.undo()
    bytes_4 = corpus.model_copy(update={"max_text_bytes": 4})
    assert validated_corpus(bytes_4, second, entry(bytes_4))[1:] == (6, 4)
    pq.write_table(pa.table({"id": ["a", "b"], "text": ["one", "two"]}), path)
    assert validated_corpus(corpus, second, entry(corpus))[1:] == (2, 0)
    assert len(validations.folders()) == 3


def test_the_newest_validations_are_kept(ray_local, tmp_path: Path) -> None:
    validations = WorkPath.of(tmp_path / validate.VALIDATED)
    for n in range(validate.KEPT_VALIDATIONS + 2):
        path = tmp_path / f"corpus-{n}.parquet"
        pq.write_table(pa.table({"id": [str(n)], "text": [f"text {n}"]}), path)
        corpus = CorpusInput(path=str(path))
        entry = validation_entry(WorkPath.of(tmp_path), input_files(corpus).digest(), corpus)
        validated_corpus(corpus, WorkPath.of(tmp_path / "rejects.parquet"), entry)
    kept = {json.loads((e / validate.FIGURES).read_text())["rows"] for e in validations.folders()}
    assert len(validations.folders()) == validate.KEPT_VALIDATIONS and kept == {1}
