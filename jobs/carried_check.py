"""An unchanged night's index check, carried from the version it copies instead of measured.

On a night whose corpus, engine and settings are the published run's (jobs/nights.py), the new
vector version is a copy of the published one's files in which no point is written or deleted
(jobs/vector_load.py, `same_rows`): its segments and graphs are the source's, so every search
answers as the source's did, and the source's check (jobs/index_check.py) stands. Its figures,
search parameters and exact neighbours are carried once the copy is seen to hold every staged
row. Measured again, the same 400 searches took 2.3 s of an unchanged night at 1M rows, 1.4 s
of it opening the version the load had just closed (bench scale, 2026-12-01).
"""

from __future__ import annotations

import json
from dataclasses import asdict

from precompute.jobs.index_check import EXACT_FILE, IndexCheckError, Validation
from precompute.jobs.nights import copy_files
from precompute.jobs.staging import committed_dataset
from precompute.jobs.work_dir import WorkPath
from precompute.stores.vectors import SearchParams, VectorStore

CHECKED_FILE = "check.json"
"""In a checked version's run folder: its Validation, which a copy of it carries."""


def keep_check(run_dir: WorkPath, validation: Validation) -> None:
    (run_dir / CHECKED_FILE).write_text(json.dumps(asdict(validation)))


def carried_check(
    store: VectorStore, version: str, run_dir: WorkPath, source: str, source_dir: WorkPath, loaded: int
) -> Validation | None:
    """The `source` version's check (kept in `source_dir`) as `version`'s, an unchanged night's
    copy of it with `loaded` points (as its load counted them) and its staged rows in `run_dir`;
    IndexCheckError where the copy lacks a staged row; None where the source's check was not
    kept (check_index then measures the copy)."""
    staged = committed_dataset(run_dir).count_rows()
    if loaded != staged:
        raise IndexCheckError(f"version {version} holds {loaded} points, {staged} were staged")
    checked = source_dir / CHECKED_FILE
    if not checked.is_file():
        return None
    copy_files(source_dir, run_dir, [EXACT_FILE])
    validation = Validation(**{**json.loads(checked.read_text()), "carried_from": source})
    store.record_search(version, SearchParams(**validation.search))
    return validation
