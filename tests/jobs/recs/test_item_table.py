"""An embeddings version's items sorted by id (jobs/recs/item_table.py): a copy's table is its source's
with the copy's changes applied, exactly what reading its parts whole gives, without reading them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from precompute.jobs.recs import item_table
from precompute.jobs.recs.item_table import TABLES, VOCABULARY, sorted_items
from precompute.jobs.recs.state import check_unique, vocabulary_digest
from precompute.jobs.staging import commit, committed_dataset, committed_parts, write_part
from precompute.jobs.text.content_cache import KEY
from precompute.jobs.text.embedding_cache import EMBEDDING, embeddings_column
from precompute.jobs.vectors.load import changes_file
from precompute.jobs.work_dir import WorkPath

DIM = 4


def rows(ids: list[str], seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    keys = [rng.bytes(16) for _ in ids]
    return pa.table({"id": ids, KEY: pa.array(keys, pa.binary(16)), EMBEDDING: embeddings_column(rng.random((len(ids), DIM), np.float32))})


def staged(root: Path, version: str, table: pa.Table, source: str | None = None, changed: pa.Table | None = None) -> WorkPath:
    """A version's committed parts (two, in no id order), and a copy's CHANGES of `source`."""
    folder = WorkPath.of(root / version)
    folder.mkdir()
    shuffled = table.take(pa.array(np.random.default_rng(1).permutation(table.num_rows)))
    half = table.num_rows // 2
    commit(folder, [write_part(shuffled.slice(0, half), folder), write_part(shuffled.slice(half), folder)])
    if source is not None:
        assert changed is not None
        with changes_file(folder, table.schema, source) as changes:
            changes.write_table(changed.cast(changes.schema))
    return folder


def whole(table: pa.Table) -> tuple[list[str], np.ndarray, np.ndarray]:
    ordered = table.sort_by("id")
    vectors = ordered[EMBEDDING].combine_chunks().flatten().to_numpy().reshape(-1, DIM)
    return ordered["id"].to_pylist(), vectors, np.array(ordered[KEY].to_pylist(), "S16")


def same(items: item_table.Items, table: pa.Table) -> bool:
    """The table's items, and the vocabulary digest of their ids (kept with the base, not hashed)."""
    ids, vectors, keys = whole(table)
    digest = items.vocabulary == vocabulary_digest(pa.array(ids, pa.string()))
    return items.ids.to_pylist() == ids and np.array_equal(items.vectors, vectors) and bool((items.keys == keys).all()) and digest


def test_a_copys_table_is_its_sources_with_the_changes_applied_and_reads_no_part(tmp_path: Path) -> None:
    cache = WorkPath.of(tmp_path / "cache")
    ids = [f"doc-{n:03d}" for n in range(200)]
    first = rows(ids, 0)
    assert same(sorted_items(staged(tmp_path, "v1", first), "v1", cache), first)

    changed = rows(["doc-007", "doc-150"], 5)
    second = pa.concat_tables([first.filter(pa.compute.invert(pa.compute.is_in(first["id"], changed["id"]))), changed])
    v2 = staged(tmp_path, "v2", second, "v1", changed)
    for part in committed_parts(v2):  # the table comes from v1's and the changes alone
        Path(part).write_bytes(b"not parquet")
    items = sorted_items(v2, "v2", cache)
    assert same(items, second)

    changed_again = rows(["doc-007", "doc-099"], 6)
    rest = second.filter(pa.compute.invert(pa.compute.is_in(second["id"], changed_again["id"])))
    third = pa.concat_tables([rest, changed_again])
    assert same(sorted_items(staged(tmp_path, "v3", third, "v2", changed_again), "v3", cache), third)
    assert item_table.table_of(cache / TABLES, "v3")[1].num_rows == 3  # doc-007, 099, 150 differ from v1's
    assert same(sorted_items(v2, "v2", cache), second)  # kept: read again as it was


def test_a_record_without_its_bases_vocabulary_digest_is_not_kept(tmp_path: Path, monkeypatch) -> None:
    """Records written before the digest was kept with them: the version is read whole once, as
    a base of its own, never served with a digest hashed from other ids."""
    cache = WorkPath.of(tmp_path / "cache")
    first = rows([f"doc-{n:03d}" for n in range(50)], 0)
    v1 = staged(tmp_path, "v1", first)
    sorted_items(v1, "v1", cache)
    record = cache / TABLES / "v1.json"
    record.write_text(json.dumps({k: v for k, v in json.loads(record.read_text()).items() if k != VOCABULARY}))
    assert item_table.table_of(cache / TABLES, "v1") is None
    read = []
    monkeypatch.setattr(item_table, "committed_dataset", lambda staged: read.append(staged) or committed_dataset(staged))
    assert same(sorted_items(v1, "v1", cache), first) and read == [v1]
    assert item_table.table_of(cache / TABLES, "v1") is not None


@pytest.mark.parametrize("change", ["added", "deleted", "many"])
def test_a_copy_with_other_ids_or_most_rows_moved_is_read_whole(tmp_path: Path, change: str, monkeypatch) -> None:
    monkeypatch.setattr(item_table, "REBASE_SHARE", 0.05)
    cache = WorkPath.of(tmp_path / "cache")
    ids = [f"doc-{n:03d}" for n in range(100)]
    first = rows(ids, 0)
    sorted_items(staged(tmp_path, "v1", first), "v1", cache)
    if change == "added":
        changed = rows(["doc-500"], 3)
        second = pa.concat_tables([first, changed])
    elif change == "deleted":
        changed = pa.table({"id": ["doc-004"], KEY: pa.nulls(1, pa.binary(16)), EMBEDDING: pa.nulls(1, pa.list_(pa.float32(), DIM))})
        second = first.filter(pa.compute.not_equal(first["id"], "doc-004"))
    else:
        changed = rows(ids[:6], 3)
        second = pa.concat_tables([first.slice(6), changed])
    items = sorted_items(staged(tmp_path, "v2", second, "v1", changed), "v2", cache)
    assert same(items, second)
    base, delta, *_ = item_table.table_of(cache / TABLES, "v2")
    assert base.num_rows == second.num_rows and delta.num_rows == 0  # a base of its own


def test_only_the_latest_versions_tables_stay_with_their_bases(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(item_table, "KEPT", 2)
    cache = WorkPath.of(tmp_path / "cache")
    ids = [f"doc-{n:03d}" for n in range(100)]
    table = rows(ids, 0)
    sorted_items(staged(tmp_path, "v1", table), "v1", cache)
    for number in range(2, 5):
        changed = rows([ids[number]], number)
        table = pa.concat_tables([table.filter(pa.compute.not_equal(table["id"], ids[number])), changed])
        sorted_items(staged(tmp_path, f"v{number}", table, f"v{number - 1}", changed), f"v{number}", cache)
    names = sorted(p.name for p in (cache / TABLES).iterdir())
    assert names == ["v1.arrow", "v3.delta.arrow", "v3.json", "v4.delta.arrow", "v4.json"]
    assert same(sorted_items(WorkPath.of(tmp_path / "v4"), "v4", cache), table)


def test_moved_ids_are_found_at_their_rows_and_an_id_not_there_or_twice_finds_none() -> None:
    among = pa.chunked_array([pa.array(["a", "b", "c"]), pa.array(["d", "e"])])
    assert item_table.positions_of(pa.array(["e", "a", "c"]), among).tolist() == [4, 0, 2]
    assert item_table.positions_of(pa.array(["e", "zzz"]), among) is None  # an id added
    assert item_table.positions_of(pa.array(["b", "b"]), among) is None
    assert item_table.positions_of(pa.array([], pa.string()), among).tolist() == []


@pytest.mark.parametrize("ids", [["a", "b", "c"], ["c", "a", "b"], [], ["a"]])
def test_item_ids_sorted_or_not_pass_when_unique(ids: list[str]) -> None:
    check_unique(pa.array(ids, pa.string()))


@pytest.mark.parametrize("ids", [["a", "b", "b", "c"], ["b", "a", "b"]])
def test_a_repeated_item_id_is_refused_sorted_or_not(ids: list[str]) -> None:
    with pytest.raises(ValueError, match="item ids must be unique: 1 duplicates"):
        check_unique(pa.array(ids, pa.string()))


def test_a_version_whose_ids_repeat_is_refused_when_its_base_is_made(tmp_path: Path) -> None:
    """Uniqueness is checked once per base, where the table is read whole: its versions share its ids."""
    table = rows(["doc-1", "doc-2", "doc-2"], 0)
    with pytest.raises(ValueError, match="item ids must be unique: 1 duplicates"):
        sorted_items(staged(tmp_path, "v1", table), "v1", WorkPath.of(tmp_path / "cache"))
