"""Which ids a corpus repeats, found file by file (jobs/text/corpus_validation.py validates with it).

A repeated id is a property of the whole corpus: its rows are rejects in every file that holds
it. A night finds the repeats from each file's ids, counting only those of the files that moved
since the kept validation most like tonight's corpus, and those it found repeated; where every
moved file holds the ids it held (rows edited in place, `same_ids`), the repeats are the kept
validation's and no other file's ids are read.
"""

from __future__ import annotations

import hashlib
import json
from typing import NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads

from precompute.jobs.validate import id_key, repeated_ids
from precompute.jobs.work_dir import WorkPath
from precompute.models.text.columns import lossless

FIGURES = "figures.json"
"""A kept validation's figures, a whole corpus's or one file's."""


def corpus_ids(source: pads.FileSystemDataset, fragments: dict[str, pads.Fragment], column: str) -> dict[str, pa.Table]:
    """Each file's ids (`fragments`, by path: `source`'s), in the corpus's type, as the one column
    `id` (as repeated_ids takes them), read in one scan, faster than a read a file."""
    read: dict[str, list[pa.RecordBatch]] = {path: [] for path in fragments}
    if fragments:
        files = pads.FileSystemDataset(list(fragments.values()), source.schema, source.format, source.filesystem)
        for tagged in files.scanner(columns=[column]).scan_batches():
            read[tagged.fragment.path].append(tagged.record_batch)
    schema = pa.schema([source.schema.field(column)])
    return {path: lossless(pa.Table.from_batches(b, schema).rename_columns(["id"])) for path, b in read.items()}


class Unmoved(NamedTuple):
    """What a kept validation of a corpus that shares files with this one says of them."""

    files: set[str]
    """This corpus's files (their paths) that it held as they are now."""
    duplicates: set[str]
    """The ids it found repeated."""
    entries: dict[str, str]
    """Each file it held, by path: its entry's name then (empty from a validation kept before
    they were recorded)."""
    newest: bool
    """Whether it is the newest kept validation: no other has recorded a file's entry since."""


def unmoved(folder: WorkPath, files: dict[str, WorkPath]) -> Unmoved | None:
    """Of the whole validations kept in `folder`, the one that shares most of `files` (this
    corpus's file entries, by path) (the newest of those that share as many); None where none
    shares a file."""
    kept = [json.loads((e / FIGURES).read_text()) for e in folder.folders() if (e / FIGURES).is_file()]
    kept.sort(key=lambda figures: figures.get("at", 0), reverse=True)
    newest = kept[0].get("at", 0) if kept else 0
    best = Unmoved(set(), set(), {}, False)
    for figures in kept:
        held = set(figures.get("files", []))
        shared = {path for path, file_entry in files.items() if file_entry.name in held}
        if len(shared) > len(best.files):
            best = Unmoved(shared, set(figures["duplicates"]), figures.get("paths", {}), figures.get("at") == newest)
    return best if best.files else None


def ids_digest(ids: pa.Table) -> str:
    """A file's ids in order (corpus_ids' table), digested."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, ids.schema) as writer:
        writer.write_table(ids.combine_chunks())
    return hashlib.sha256(sink.getvalue().to_pybytes()).hexdigest()


def same_ids(
    entries: WorkPath, before: Unmoved | None, paths: list[str], ids: dict[str, pa.Table]
) -> dict[str, list[str] | None] | None:
    """Each file's repeated ids where the corpus holds the files `before` held and every moved
    one (`ids`: theirs) the ids it held then, in order (its entry in `entries`, the files'
    folder, says): the corpus then repeats exactly what it
    repeated, so no other file's ids are read. A moved file's are those its entry then
    recorded; an unmoved file's, None: as its own entry records them, which holds while `before`
    is the newest validation (an older one's files may have been recorded since under another
    corpus's repeats). None where they may have moved."""
    if before is None or not before.newest or set(before.entries) != set(paths):
        return None
    repeated: dict[str, list[str] | None] = {path: None for path in paths if path not in ids}
    for path, table in ids.items():
        entry = entries / before.entries[path] / FIGURES
        figures = json.loads(entry.read_text()) if entry.is_file() else {}
        if figures.get("ids") != ids_digest(table):
            return None
        repeated[path] = figures["duplicates"]
    return repeated


def corpus_duplicates(ids: dict[str, pa.Table], unmoved: Unmoved | None) -> set[str]:
    """The ids that the corpus (each file's `ids`) holds more than once. Only a moved file's ids,
    and those that were repeated before, can be: with `unmoved`, only they are counted, not
    every id by a group-by."""
    everything = pa.concat_tables(ids.values())
    if unmoved is None:
        return repeated_ids(everything)
    before = pa.table({"id": as_ids(unmoved.duplicates, everything.schema.field("id").type)})
    candidates = pa.concat_tables([before, *(table for path, table in ids.items() if path not in unmoved.files)])
    return repeated_ids(everything.filter(pc.is_in(everything["id"], value_set=candidates["id"])))


def as_ids(keys: set[str], kind: pa.DataType) -> pa.Array:
    """Ids as id_key wrote them, back in their column's `kind` (integers, or text as its bytes)."""
    if pa.types.is_integer(kind):
        return pa.array([int(key) for key in keys], kind)
    return pa.array([key.encode("utf-8", "surrogateescape") for key in keys], kind)


def repeated_in(ids: dict[str, pa.Table], duplicates: set[str]) -> dict[str, list[str]]:
    """Which of each file's `ids` the corpus repeats, sorted (what its entry records)."""
    if not duplicates:
        return {path: [] for path in ids}
    repeated = as_ids(duplicates, next(iter(ids.values())).schema.field("id").type)
    return {
        path: sorted({id_key(i) for i in table.filter(pc.is_in(table["id"], value_set=repeated))["id"].to_pylist()})
        for path, table in ids.items()
    }
