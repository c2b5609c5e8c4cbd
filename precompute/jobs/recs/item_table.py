"""An embeddings version's items sorted by id, as the recommendations read them: carried from the
version it copies, not read and sorted again every night.

Reading an embeddings version's staged parts whole and sorting them by id cost every night,
the unchanged one too, a pass over every item (`precompute bench scale`). A version's table is kept
in `<work_dir>/cache/<embeddings output>/items/` as a base (`<base>.arrow`: ids sorted, content
keys, vectors, in Arrow IPC, memory-mapped) and the rows that differ from it
(`<version>.delta.arrow`: their positions, keys and vectors), named by `<version>.json`. A
version that is a copy of one whose table is kept, with the same ids, is that table with the
copy's changes applied (jobs/vectors/load.py CHANGES); any other, or one whose rows differing
from the base would pass REBASE_SHARE of them, is read whole into a base of its own. The
tables of the KEPT latest versions stay, with their bases. A base's ids are checked unique
when it is made, and each record holds its base's vocabulary digest (recs_state.vocabulary_digest),
hashed then: the versions of a base share its ids. A record without one (written before it
was kept) is not kept.
"""

from __future__ import annotations

import json
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from precompute.jobs.inputs import InteractionsInput
from precompute.jobs.recs.state import Items, check_unique, vocabulary_digest
from precompute.jobs.staging import committed_dataset
from precompute.jobs.text.content_cache import KEY, key_array
from precompute.jobs.text.embedding_cache import EMBEDDING, embeddings_of
from precompute.jobs.vectors.load import CHANGES, SOURCE
from precompute.jobs.work_dir import WorkPath, mapped_ipc, patchable, read_ipc, write_ipc
from precompute.models.datasets import arrow_dataset

TABLES = "items"
POSITION, VOCABULARY = "position", "vocabulary"
REBASE_SHARE = 0.05
"""Rows differing from the base, as a share of them, past which a version is read into a base
of its own: every night's delta holds all of them, and grows with the nights since the base."""
KEPT = 4
"""Versions whose tables stay: the published one and the few a rollback or a slow reader holds."""


class Kept(NamedTuple):
    base: pa.Table
    delta: pa.Table
    mapped: np.ndarray | None
    """The base file's bytes, mapped copy-on-write (work_dir.mapped_ipc): the delta is patched
    into them, so that 1% of the items moved does not copy the other 99% first."""
    name: str
    """The base's version: its file's name, which a carried version's record names."""
    vocabulary: str
    """The base's ids' vocabulary digest."""


def sorted_items(staged: WorkPath, version: str, cache: WorkPath) -> Items:
    """The items of embeddings `version` (its committed parts in `staged`), sorted by id: a
    value's indices point there. `cache`: the embeddings output's cache folder."""
    folder = cache / TABLES
    kept = table_of(folder, version)
    if kept is None:
        kept = carried(folder, staged, version)
    if kept is None:
        kept = rebased(folder, staged, version)
    return patched(kept)


def table_of(folder: WorkPath, version: str) -> Kept | None:
    """A kept version's table; None where it is not kept."""
    record = folder / f"{version}.json"
    if not record.is_file():
        return None
    recorded = json.loads(record.read_text())
    base = folder / f"{recorded['base']}.arrow"
    if VOCABULARY not in recorded or not base.is_file():
        return None
    table, mapped = mapped_ipc(base)
    return Kept(table, read_ipc(folder / f"{version}.delta.arrow"), mapped, recorded["base"], recorded[VOCABULARY])


def carried(folder: WorkPath, staged: WorkPath, version: str) -> Kept | None:
    """The table of the version this one copies, with the copy's CHANGES applied; None where
    it is not a copy, its source's table is not kept, or the ids moved."""
    changes = staged / CHANGES
    if not changes.is_file():
        return None
    moved = pq.read_table(changes.path, filesystem=changes.fs)
    source = (moved.schema.metadata or {}).get(SOURCE)
    if source is None or KEY not in moved.column_names:
        return None
    kept = table_of(folder, source.decode())
    if kept is None or moved[EMBEDDING].null_count:
        return None  # not kept, or ids deleted: another vocabulary
    base, before, mapped, name, vocabulary = kept
    positions = positions_of(pc.cast(moved["id"], base.schema.field("id").type), base["id"])
    if positions is None:
        return None  # ids added: another vocabulary
    keys = pc.cast(moved[KEY], pa.binary(16))
    now = pa.table({POSITION: positions, KEY: keys, EMBEDDING: moved[EMBEDDING]})
    unmoved = before.filter(pc.invert(pc.is_in(before[POSITION], value_set=now[POSITION])))
    delta = pa.concat_tables([unmoved.cast(now.schema), now]).sort_by(POSITION)
    if delta.num_rows > REBASE_SHARE * base.num_rows:
        return None
    record(folder, version, name, delta, vocabulary)
    return Kept(base, delta, mapped, name, vocabulary)


def positions_of(ids: pa.Array | pa.ChunkedArray, among: pa.ChunkedArray) -> np.ndarray | None:
    """Each of `ids`' row in `among`; None where one is not there (or repeats). Looked up the
    other way round, each of `among` in `ids`, so that the hash table is built over the few
    moved ids, not over every item: its cost grows with the moved ids, not the catalogue."""
    found = pc.index_in(among, value_set=ids).to_numpy(zero_copy_only=False)  # NaN: not moved
    rows = np.flatnonzero(~np.isnan(found))
    if len(rows) != len(ids):
        return None
    positions = np.empty(len(ids), np.int64)
    positions[found[rows].astype(np.int64)] = rows
    return positions


def rebased(folder: WorkPath, staged: WorkPath, version: str) -> Kept:
    """The version's committed parts read whole and sorted by id, kept as a base of its own."""
    table = committed_dataset(staged).to_table(columns=["id", KEY, EMBEDDING])
    table = table.set_column(0, "id", pc.cast(table["id"], pa.string())).sort_by("id")
    ids = table["id"].combine_chunks()  # one copy: the table's combine below keeps a single chunk as it is
    base = pa.table({"id": ids, KEY: pc.cast(table[KEY], pa.binary(16)), EMBEDDING: table[EMBEDDING]}).combine_chunks()
    check_unique(ids)  # once per base, as its digest: its versions share its ids
    write_ipc(folder / f"{version}.arrow", base)
    empty = pa.schema([(POSITION, pa.int64()), base.schema.field(KEY), base.schema.field(EMBEDDING)]).empty_table()
    vocabulary = vocabulary_digest(ids)
    record(folder, version, version, empty, vocabulary)
    return Kept(read_ipc(folder / f"{version}.arrow"), empty, None, version, vocabulary)


def patched(kept: Kept) -> Items:
    """The base's items with the delta's rows in place."""
    base, delta, mapped, _, vocabulary = kept
    vectors, keys = embeddings_of(base), key_array(base[KEY])
    if delta.num_rows:
        positions = delta[POSITION].to_numpy()
        vectors, keys = patchable(vectors, mapped), patchable(keys, mapped)
        vectors[positions], keys[positions] = embeddings_of(delta), key_array(delta[KEY])
    return Items(base["id"].combine_chunks(), vectors, keys, vocabulary)


def record(folder: WorkPath, version: str, base: str, delta: pa.Table, vocabulary: str) -> None:
    """Keep `version`'s table (its delta last, then its record), and only the KEPT latest
    versions' tables with their bases."""
    write_ipc(folder / f"{version}.delta.arrow", delta)
    (folder / f"{version}.json").write_text(json.dumps({"base": base, "rows": delta.num_rows, VOCABULARY: vocabulary}))
    latest = sorted(f.name.removesuffix(".json") for f in folder.glob("*.json"))[-KEPT:]
    bases = {json.loads((folder / f"{v}.json").read_text())["base"] for v in latest}
    for file in folder.iterdir():
        name, kind = file.name.split(".", 1)
        if name and (name not in bases if kind == "arrow" else name not in latest):
            file.unlink()



NO_CONTENT = b"\0" * 16
"""The content key of every item of a catalogue of ids alone: nothing about an item changes but its id."""


def interaction_items(interactions: InteractionsInput) -> Items:
    """A catalogue of ids alone (a recs output without an embeddings output): the distinct item
    ids of the interactions, sorted as the item table sorts them, with no vector (one zero
    column: the content towers score nothing) and one content key for all. A null id or one
    whose bytes are not UTF-8 is no item: its rows are rejected with their reason."""
    column = arrow_dataset(interactions).to_table(columns=[interactions.item])[interactions.item]
    distinct = pc.unique(column.combine_chunks()).drop_null()
    if pa.types.is_integer(distinct.type):
        ids = pc.cast(distinct, pa.string())
    else:
        texts = []
        for value in distinct.to_pylist():
            try:
                texts.append(value.decode("utf-8") if isinstance(value, bytes) else value)
            except UnicodeDecodeError:
                continue
        ids = pc.unique(pa.array(texts, pa.string()))  # two spellings (binary, string) of one id
    ids = ids.take(pc.sort_indices(ids))
    return Items.of(ids, np.zeros((len(ids), 1), np.float32), np.full(len(ids), NO_CONTENT, "S16"))
