"""A corpus validated file by file: what each file's rows hold against the corpus contract, kept
in the work directory, so a night reads again only the files that moved.

A corpus is often a folder of files of which a night rewrites a few (a data lake's partitions).
Each file's validation is kept by the digest of its bytes and the rules it was checked by
(`<work_dir>/validated/files/<key>/`: its rows, its rejects with their reasons, the ids of it
that the corpus repeated, which every file rejects, and a digest of its ids in order). Which ids
repeat is a property of the whole corpus (jobs/text/corpus_repeats.py: only the moved files' ids are
read where each holds the ids it held). A night takes each file whose bytes, rules and repeated
ids are as recorded, and checks the others a run of row groups at a time: by Ray tasks across a cluster, in this
process's threads on one machine or where they are few (DRIVER_ROWS). Never a Ray Data operator
(a whole validation runs an order of magnitude faster as tasks than through Ray Data:
`precompute bench scale`). The whole corpus's validation is kept as
well (`<work_dir>/validated/<key>/`): the night's second text job, or a night whose corpus did
not move, reads no file's ids at all.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import partial
from typing import NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import ray
from ray import ObjectRef

from precompute.jobs.inputs import CorpusInput, read_input
from precompute.jobs.nights import inputs_digest
from precompute.jobs.ray_session import one_node
from precompute.jobs.row_groups import batches, runs
from precompute.jobs.text.corpus_repeats import (
    FIGURES,
    corpus_duplicates,
    corpus_ids,
    ids_digest,
    repeated_in,
    same_ids,
    unmoved,
)
from precompute.jobs.validate import (
    REASON,
    REJECTS,
    check_ratio,
    keep_rejects,
    tag_rejects,
)
from precompute.jobs.work_dir import WorkPath
from precompute.models.datasets import Digests, arrow_dataset
from precompute.models.text.columns import as_text

VALIDATED = "validated"
"""<work_dir>/validated/<key>/: a corpus's validation (FIGURES, and its REJECTS), by the digest of
its files and rules; <work_dir>/validated/files/<key>/: one file's, by its bytes and the rules."""
FILES = "files"
DRIVER_ROWS = 100_000
"""The moved files' rows are checked in this process, a thread per CPU, when they are at most
this many or Ray is this one machine, not by Ray tasks: a night's first task starts a worker and
its imports, which cost more than checking that many rows in threads; once Ray's workers have
started, tasks cost about what threads do (`precompute bench scale`). Never where the
driver is kept idle (JobSettings.driver_rows 0)."""
KEPT_VALIDATIONS = 8
"""Whole validations kept, with the files' they were made of: a night's corpus or two, for
several outputs and a few nights."""


class Validation(NamedTuple):
    """Where a corpus's validation is kept (validation_entry)."""

    whole: WorkPath
    files: dict[str, WorkPath]
    """Each file's, by its path."""


def validation_entry(work_dir: WorkPath, digests: Digests, corpus: CorpusInput) -> Validation:
    """The folders of the corpus's validation under `work_dir`: keyed by its files' `digests`
    and the rules its rows are checked by."""
    rules = json.dumps({"id": corpus.id, "text": corpus.text, "max_text_bytes": corpus.max_text_bytes}, sort_keys=True)
    folder = work_dir / VALIDATED
    files = {file: folder / FILES / inputs_digest(digest, rules) for file, digest in digests.files.items()}
    return Validation(folder / inputs_digest(digests.whole, rules), files)


class KnownValidation(NamedTuple):
    rows: int
    rejects: int
    duplicates: set[str]
    """The ids the corpus repeats, whose rows every pass rejects: kept with the figures so that
    a pass over a known corpus reads no column of it first (its ids alone are a read of every row)."""


def known_validation(entry: WorkPath, rejects_path: WorkPath, max_ratio: float) -> KnownValidation | None:
    """An earlier validation of the whole corpus recorded in `entry`, its rejects copied to
    `rejects_path` (its ratio checked against this job's `max_ratio`); None if there is none."""
    if not (entry / FIGURES).is_file():
        return None
    figures = json.loads((entry / FIGURES).read_text())
    if "files" not in figures:
        return None  # recorded before files were kept: validated again, and recorded with them
    if figures["rejects"]:
        rejects_path.parent.mkdir()
        entry.fs.copy_file((entry / REJECTS).path, rejects_path.path)
    check_ratio(figures["rejects"], figures["rows"], max_ratio, rejects_path)
    return KnownValidation(figures["rows"], figures["rejects"], set(figures["duplicates"]))


def record_validation(
    entry: WorkPath, known: KnownValidation, rejects_path: WorkPath, files: dict[str, str]
) -> None:
    """Keep a validation's figures and rejects in `entry`, its `files`' entries' names by path,
    and the KEPT_VALIDATIONS newest of the folder's entries with the files' they name."""
    entry.mkdir()
    if known.rejects:
        rejects_path.fs.copy_file(rejects_path.path, (entry / REJECTS).path)
    figures = {
        **known._asdict(),
        "duplicates": sorted(known.duplicates),
        "files": list(files.values()),
        "paths": files,
        "at": time.time(),
    }
    (entry / FIGURES).write_text(json.dumps(figures))
    entries = [e for e in entry.parent.folders() if (e / FIGURES).is_file()]
    recorded = [json.loads((e / FIGURES).read_text()) | {"entry": e} for e in entries]
    recorded.sort(key=lambda figures: figures["at"], reverse=True)
    for old in recorded[KEPT_VALIDATIONS:]:
        old["entry"].rmtree()
    named = {name for figures in recorded[:KEPT_VALIDATIONS] for name in figures.get("files", [])}
    for file_entry in (entry.parent / FILES).folders():
        if file_entry.name not in named:
            file_entry.rmtree()


def canonical_columns(corpus: CorpusInput) -> dict[str, str]:
    """The input's id and text columns renamed to `id` and `text`, the names every job uses."""
    return {old: new for old, new in ((corpus.id, "id"), (corpus.text, "text")) if old != new}


def payload_columns(corpus: CorpusInput) -> list[str]:
    """The good rows' columns besides `id` and `text`, known without reading a row."""
    renames = canonical_columns(corpus)
    return [c for c in (renames.get(n, n) for n in arrow_dataset(corpus).schema.names) if c not in ("id", "text")]


def validated_corpus(
    corpus: CorpusInput, rejects_path: WorkPath, validation: Validation | None = None, driver: bool = True
) -> tuple[GoodRows, int, int]:
    """(good rows, rows read, rows rejected) of a corpus; rejects quarantined first, into
    `rejects_path`. `validation`: where this corpus's validations are kept (validation_entry),
    taken instead of reading its rows again where its files and rules are the same. `driver`:
    whether the moved files' rows may be checked in this process's threads, where they are few
    or Ray is one machine (DRIVER_ROWS); False keeps it idle (JobSettings.driver_rows 0), every
    row checked by Ray tasks."""
    known = None if validation is None else known_validation(validation.whole, rejects_path, corpus.max_reject_ratio)
    if known is None:
        known = validate_files(corpus, arrow_dataset(corpus), rejects_path, validation, driver)
    return GoodRows(corpus, known.duplicates), known.rows, known.rejects


Step = Callable[[pa.Table], pa.Table]


@dataclass(frozen=True)
class GoodRows:
    """A validated corpus's good rows, `id` and `text` as strings, each of `steps` applied, read
    either way a job reads them: streamed through Ray Data (`dataset`: a full night's, into the
    model's actors), or once into Ray's object store by plain tasks, one per run of a file's row
    groups (`blocks`: a nightly run's, compared with its cache). The same pass runs several
    times faster as tasks than through Ray Data's operators (`precompute bench scale`)."""

    corpus: CorpusInput
    duplicates: set[str]
    """The ids the corpus repeats (KnownValidation): their rows are rejects."""
    steps: tuple[Step, ...] = ()

    def then(self, step: Step) -> GoodRows:
        return replace(self, steps=(*self.steps, step))

    def dataset(self) -> ray.data.Dataset:
        renames = canonical_columns(self.corpus)
        dataset = read_input(self.corpus)
        if renames:
            dataset = dataset.rename_columns(renames)
        schema = good_schema(arrow_dataset(self.corpus).schema, self.corpus)
        return dataset.map_batches(self.of, batch_format="pyarrow", fn_kwargs={"schema": schema})

    def blocks(self) -> list[ObjectRef]:
        """The good rows as blocks in Ray's object store, a task a part of a file (parts)."""
        source = arrow_dataset(self.corpus)
        rows, schema = ray.put(self), good_schema(source.schema, self.corpus)  # put: the duplicates once
        return [good_part.remote(p, source.schema, schema, rows) for f in source.get_fragments() for p in parts(f)]

    def of(self, batch: pa.Table, schema: pa.Schema) -> pa.Table:
        """A batch of the files' rows (canonical names) as good rows, in `schema` (good_schema: a
        good row's bytes are UTF-8), then each of `steps`."""
        tagged = tag_rejects(batch, self.duplicates, self.corpus.max_text_bytes)
        good = tagged.filter(pc.is_null(tagged[REASON])).drop_columns([REASON]).cast(schema)
        for step in self.steps:
            good = step(good)
        return good


def good_schema(source: pa.Schema, corpus: CorpusInput) -> pa.Schema:
    """The corpus's columns (`source`: as its files hold them) as its good rows hold them before
    any step: canonical names, and `id` and `text` as strings whatever their type in the files."""
    renames = canonical_columns(corpus)
    named = pa.schema([f.with_name(renames.get(f.name, f.name)) for f in source], source.metadata)
    return as_text(named, ["id", "text"])


@ray.remote
def good_part(part: pads.Fragment, source: pa.Schema, schema: pa.Schema, rows: GoodRows) -> pa.Table:
    """One part of a file (`source`: the corpus's schema as its files hold it) as `rows` takes
    it; `schema`: good_schema."""
    named = named_batches(part, source, canonical_columns(rows.corpus))
    return pa.concat_tables([rows.of(batch, schema) for batch in named])


def validate_files(
    corpus: CorpusInput,
    source: pads.FileSystemDataset,
    rejects_path: WorkPath,
    validation: Validation | None,
    driver: bool,
) -> KnownValidation:
    """Quarantine the corpus's rejects into `rejects_path`, file by file (the module's docstring),
    failing past its max_reject_ratio; record what was found in `validation`."""
    fragments = {fragment.path: fragment for fragment in source.get_fragments()}
    before = None if validation is None else unmoved(validation.whole.parent, validation.files)
    moved_files = {path: f for path, f in fragments.items() if before is None or path not in before.files}
    ids = corpus_ids(source, moved_files, corpus.id)
    repeated = None if validation is None else same_ids(validation.whole.parent / FILES, before, list(fragments), ids)
    if repeated is None or before is None:
        ids |= corpus_ids(source, {p: f for p, f in fragments.items() if p not in moved_files}, corpus.id)
        duplicates = corpus_duplicates(ids, before)
        repeated = dict(repeated_in(ids, duplicates))
    else:
        duplicates = before.duplicates
    found: dict[str, tuple[int, pa.Table | None]] = {}
    kwargs = {"renames": canonical_columns(corpus), "duplicates": duplicates, "max_text_bytes": corpus.max_text_bytes}
    moved = []
    for path, fragment in fragments.items():
        recorded = None if validation is None else known_file(validation.files[path], repeated[path])
        if recorded is None:
            moved += [(path, part) for part in parts(fragment)]
        else:
            found[path] = recorded
    few = sum(ids[path].num_rows for path in {path for path, _ in moved}) <= DRIVER_ROWS
    if driver and (few or one_node()):
        with ThreadPoolExecutor(len(os.sched_getaffinity(0))) as threads:
            results = list(threads.map(partial(check_part, schema=source.schema, **kwargs), [p for _, p in moved]))
    else:
        results = ray.get([check_task.remote(part, source.schema, **kwargs) for _, part in moved])
    checked: dict[str, tuple[int, list[pa.Table]]] = {}
    for (path, _), (rows, rejects) in zip(moved, results, strict=True):
        before, tables = checked.get(path, (0, []))
        checked[path] = (before + rows, [*tables, rejects])
    for path, (rows, tables) in checked.items():
        found[path] = (rows, pa.concat_tables(tables))
        if validation is not None:
            record_file(validation.files[path], *found[path], repeated[path] or [], ids_digest(ids[path]))
    rows = sum(r for r, _ in found.values())
    count = keep_rejects([t for _, t in found.values() if t is not None], rows, corpus.max_reject_ratio, rejects_path)
    known = KnownValidation(rows, count, duplicates)
    if validation is not None:
        record_validation(validation.whole, known, rejects_path, {p: validation.files[p].name for p in fragments})
    return known


def known_file(entry: WorkPath, repeated: list[str] | None) -> tuple[int, pa.Table | None] | None:
    """A file's recorded (rows, rejects) where it was found repeating the same ids (None: the
    corpus repeats what it did, same_ids); else None."""
    if not (entry / FIGURES).is_file():
        return None
    figures = json.loads((entry / FIGURES).read_text())
    if repeated is not None and figures["duplicates"] != repeated:
        return None
    rejects = pq.read_table((entry / REJECTS).path, filesystem=entry.fs) if figures["rejects"] else None
    return figures["rows"], rejects


def record_file(entry: WorkPath, rows: int, rejects: pa.Table | None, repeated: list[str], ids: str) -> None:
    entry.mkdir()
    count = 0 if rejects is None else rejects.num_rows
    if count:
        pq.write_table(rejects, (entry / REJECTS).path, filesystem=entry.fs)
    (entry / FIGURES).write_text(json.dumps({"rows": rows, "rejects": count, "duplicates": repeated, "ids": ids}))


def parts(fragment: pads.Fragment) -> list[pads.Fragment]:
    """A Parquet file as runs of its row groups (jobs/row_groups.py), so that a large file is
    checked by several tasks; any other file whole."""
    if not isinstance(fragment, pads.ParquetFileFragment):
        return [fragment]
    return [fragment.subset(row_group_ids=ids) for ids, _, _ in runs(fragment.metadata) if ids] or [fragment]


def check_part(
    part: pads.Fragment, schema: pa.Schema, renames: dict[str, str], duplicates: set[str], max_text_bytes: int
) -> tuple[int, pa.Table]:
    """(rows, rejects with their reasons, string columns as their bytes) of one part of a file."""
    rows, rejects = 0, []
    for batch in named_batches(part, schema, renames):
        tagged = tag_rejects(batch, duplicates, max_text_bytes)
        rows += tagged.num_rows
        rejects.append(tagged.filter(pc.is_valid(tagged[REASON])))
    return rows, pa.concat_tables(rejects)


def named_batches(part: pads.Fragment, schema: pa.Schema, renames: dict[str, str]) -> Iterator[pa.Table]:
    """A part's rows (`schema`: the corpus's, as its files hold it) under the canonical names
    (canonical_columns), a batch at a time (row_groups.batches); one empty table where it has
    none, so that a caller's result always has the columns."""
    names = [renames.get(name, name) for name in schema.names]
    read = False
    for batch in batches(part, schema):
        read = True
        yield batch.rename_columns(names)
    if not read:
        yield schema.empty_table().rename_columns(names)


check_task = ray.remote(check_part)
"""check_part in a Ray task: a corpus's files checked in parallel, where the workers are."""
