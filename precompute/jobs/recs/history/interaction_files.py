"""Interactions validated file by file, each file's good rows kept: a night reads again only the
files that moved.

An interaction log is a folder of files to which each day adds one (or of partitions a lake
rewrites a few of); its older files do not move. Each file's validation is kept by the digest of
its bytes, the columns it is read by and the item table it was checked against, since a good
row holds its item's position: `<work_dir>/cache/<output>/interactions/<key>/` holds the file's
good rows and, where it has any, its rejects (with their reasons) as Arrow IPC files,
memory-mapped where the work directory is local, and its counts of rows and rejects. A night
takes each file whose entry is there and checks the others together, CHECK_ROWS rows at a time;
the good rows come out in the input's file order, exactly as a validation of every file gives
them. The entries of the KEPT_NIGHTS latest nights stay; the others are deleted.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads

from precompute.jobs.inputs import InteractionsInput
from precompute.jobs.nights import inputs_digest
from precompute.jobs.recs.history.interactions import INDEX, SECONDS, clean, column_renames, tag_rejects
from precompute.jobs.validate import REASON, keep_rejects
from precompute.jobs.work_dir import WorkPath, read_ipc, write_ipc
from precompute.models.datasets import Digests, arrow_dataset

CHECKS = "interactions/v3"
"""The checks' identity in an entry's key: change it when a change to tag_rejects or clean
changes what a file's rows give, or an entry's files change (v2: the rejects counted in its
figures, their file written only where there are some; v3: the basket column)."""
CHECK_ROWS = 1_000_000
"""Rows tagged at a time: each tag_rejects call has a fixed cost beyond its rows, so the moved
files are read and tagged together, not file by file (`precompute bench scale`, its 1% rerun)."""
GOOD, REJECTED, FIGURES, NIGHTS = "good.arrow", "rejects.arrow", "figures.json", "nights.json"
KEPT_NIGHTS = 8
"""Nights whose entries are kept: the night after a failed or rolled-back one still finds the
files the published night read."""


class KeptFiles(NamedTuple):
    """Where and under what a night's file validations are kept."""

    folder: WorkPath
    digests: Digests
    """The input's files' digests (models/datasets.py InputFiles.digests: the night computes them once)."""
    vocabulary: str
    """The item table's digest (jobs/recs/state.py vocabulary_digest): what a good row's position means."""

    def entries(self, interactions: InteractionsInput, schema: pa.Schema) -> dict[str, WorkPath]:
        """Each file's entry folder, by its path; `schema`: the input's, which every file is read
        as (a reject keeps each of its columns)."""
        rules = {name: getattr(interactions, name) for name in ("user", "item", "weight", "time", "basket")}
        described = json.dumps(
            {**rules, "checks": CHECKS, "items": self.vocabulary, "schema": str(schema.remove_metadata())}, sort_keys=True
        )
        return {path: self.folder / inputs_digest(digest, described) for path, digest in self.digests.files.items()}

    def record(self, used: list[str]) -> None:
        """Tonight's entries (their names) among the KEPT_NIGHTS latest nights'; every other entry deleted."""
        self.folder.mkdir()
        nights_file = self.folder / NIGHTS
        nights = json.loads(nights_file.read_text())["nights"] if nights_file.is_file() else []
        nights = [*nights, used][-KEPT_NIGHTS:]
        nights_file.write_text(json.dumps({"nights": nights}))
        named = {name for night in nights for name in night}
        for entry in self.folder.folders():
            if entry.name not in named:
                entry.rmtree()


class FileRows(NamedTuple):
    """One file's validation: its row count, good rows (jobs/recs/history/interactions.py clean) and rejects."""

    rows: int
    good: pa.Table
    rejects: pa.Table


class Validated(NamedTuple):
    good: pa.Table
    """The good rows as `clean` makes them, file after file in the input's order."""
    rows: int
    rejects: int
    files: list[tuple[str, int]]
    """Each file's kept entry name (its bytes and how they were checked) and good rows, in the
    same order; empty without `kept` (or where a file has no entry)."""


def validated_interactions(
    interactions: InteractionsInput, items: pa.Array, rejects_path: WorkPath, kept: KeptFiles | None = None
) -> Validated:
    """The input's good rows, rows read and rows rejected, its rejects
    quarantined into `rejects_path` (failing past its max_reject_ratio). `items`: the item table's
    ids, as strings. `kept`: where files' validations are kept (the module's docstring); None
    checks every file and keeps nothing. Read and checked in this process, which trains on the
    good rows anyway: an order of magnitude faster than a Ray Data pass over the same rows
    (`precompute bench scale`)."""
    source = arrow_dataset(interactions)
    fragments = list(source.get_fragments())
    entries = {} if kept is None else kept.entries(interactions, source.schema)
    found = {f.path: recorded for f in fragments if (recorded := read_entry(entries.get(f.path))) is not None}
    moved = [f for f in fragments if f.path not in found]
    renames = column_renames(interactions, source.schema.names)
    for path, checked in checked_files(moved, source.schema, renames, items):
        found[path] = checked
        if path in entries:
            write_entry(entries[path], checked)
    ordered = [found[f.path] for f in fragments]
    if kept is not None:
        kept.record([entries[f.path].name for f in fragments if f.path in entries])
    rows = sum(file.rows for file in ordered)
    count = keep_rejects([file.rejects for file in ordered], rows, interactions.max_reject_ratio, rejects_path, "interactions")
    named = all(f.path in entries for f in fragments)
    files = [(entries[f.path].name, found[f.path].good.num_rows) for f in fragments] if kept and named else []
    if not ordered:  # no file: the good rows of an empty input, in their schema
        ordered = [next(checked_tables(source.schema.empty_table(), [0], renames, items))]
    return Validated(pa.concat_tables([file.good for file in ordered]), rows, count, files)


def checked_files(
    fragments: list[pads.Fragment], schema: pa.Schema, renames: dict[str, str], items: pa.Array
) -> Iterator[tuple[str, FileRows]]:
    """Each of `fragments` (files of a dataset whose schema is `schema`) checked, the files read
    in groups of at least CHECK_ROWS rows (the last may hold fewer) and tagged a group at a time."""
    group: list[tuple[str, pa.Table]] = []
    for number, fragment in enumerate(fragments):
        group.append((fragment.path, fragment.to_table(schema=schema)))
        if sum(table.num_rows for _, table in group) >= CHECK_ROWS or number == len(fragments) - 1:
            together = pa.concat_tables([table for _, table in group])
            lengths = [table.num_rows for _, table in group]
            yield from zip([path for path, _ in group], checked_tables(together, lengths, renames, items), strict=True)
            group = []


def checked_tables(table: pa.Table, lengths: list[int], renames: dict[str, str], items: pa.Array) -> Iterator[FileRows]:
    """`table`'s rows tagged (under the job's column names) and split back into its files of `lengths` rows."""
    tagged = tag_rejects(table.rename_columns([renames.get(n, n) for n in table.column_names]), items)
    start = 0
    for length in lengths:
        part = tagged.slice(start, length)
        bad = pc.is_valid(part[REASON])
        yield FileRows(length, clean(part.filter(pc.invert(bad))), part.filter(bad).drop_columns([INDEX, SECONDS]))
        start += length


def write_entry(entry: WorkPath, checked: FileRows) -> None:
    """A file's validation, its figures last: an entry without them was never finished. Its
    rejects only where it has some: most files have none, and a night maps every kept entry."""
    entry.mkdir()
    write_ipc(entry / GOOD, checked.good)
    if checked.rejects.num_rows:
        write_ipc(entry / REJECTED, checked.rejects)
    (entry / FIGURES).write_text(json.dumps({"rows": checked.rows, "rejects": checked.rejects.num_rows}))


def read_entry(entry: WorkPath | None) -> FileRows | None:
    """A file's kept validation; None where there is none (or it was never finished)."""
    if entry is None or not (entry / FIGURES).is_file():
        return None
    figures = json.loads((entry / FIGURES).read_text())
    rejects = read_ipc(entry / REJECTED) if figures["rejects"] else pa.table({})
    return FileRows(figures["rows"], read_ipc(entry / GOOD), rejects)

