"""An unchanged night's index check, carried from the version it copies instead of measured.

On a night whose corpus, engine and settings are the published run's (jobs/nights.py), the new
vector version is a copy of the published one's files in which no point is written or deleted
(jobs/vectors/load.py, `same_rows`): its segments and graphs are the source's, so every search
answers as the source's did, and the source's check (jobs/vectors/index_check.py) stands. Its figures,
search parameters and exact neighbours are carried once the copy is seen to hold every staged
row, where tonight's check would be measured under the same conditions (its bar, ladder and
searches: checked_under). Run again, the same searches were a large share of an unchanged
night at scale, much of it then reopening the version the load had just closed (the load now
leaves it open: stores/vectors/edge.py finalize; `precompute bench scale`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from typing import Any

from precompute.jobs.nights import copy_files
from precompute.jobs.staging import committed_dataset
from precompute.jobs.vectors.check_sample import EXACT_FILE
from precompute.jobs.vectors.index_check import IndexCheckError, Validation
from precompute.jobs.work_dir import WorkPath
from precompute.stores.vectors.store import SearchParams, VectorStore

CHECKED_FILE = "check.json"
"""In a checked version's run folder: its Validation and the conditions it was measured under,
which a copy of it carries while tonight's are the same."""


def checked_under(
    store: VectorStore, min_recall: float, limits: dict[str, Any], queries: int, texts: tuple[list[str], list[str] | None]
) -> dict[str, Any]:
    """What a check's verdict depends on besides the version: the bar, the ladder (the store's
    default search and `limits`), the sample's size and the searches' texts (the gate's opening
    words, the queries file's). A night may change any of them without changing its corpus."""
    digest = hashlib.sha256(json.dumps(texts).encode()).hexdigest()
    ladder = {**asdict(store.default_search), **limits}
    return {"min_recall": min_recall, "ladder": ladder, "queries": queries, "texts": digest}


def keep_check(run_dir: WorkPath, validation: Validation, conditions: dict[str, Any]) -> None:
    (run_dir / CHECKED_FILE).write_text(json.dumps({"validation": asdict(validation), "conditions": conditions}))


def carried_check(
    store: VectorStore,
    version: str,
    run_dir: WorkPath,
    source: tuple[str, WorkPath],
    loaded: int,
    conditions: dict[str, Any],
) -> Validation | None:
    """The `source` version's check (its name and run folder) as `version`'s, an unchanged night's
    copy of it with `loaded` points (as its load counted them) and its staged rows in
    `run_dir`; IndexCheckError where the copy lacks a staged row; None where the source's check
    was not kept or measured under other `conditions` (checked_under): check_index then
    measures the copy."""
    staged = committed_dataset(run_dir).count_rows()
    if loaded != staged:
        raise IndexCheckError(f"version {version} holds {loaded} points, {staged} were staged")
    name, source_dir = source
    checked = source_dir / CHECKED_FILE
    kept = json.loads(checked.read_text()) if checked.is_file() else {}
    if kept.get("conditions") != conditions:
        return None
    copy_files(source_dir, run_dir, [EXACT_FILE])
    validation = Validation(**{**kept["validation"], "carried_from": name})
    store.record_search(version, SearchParams(**validation.search))
    return validation
