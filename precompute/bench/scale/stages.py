"""The stages `precompute bench scale` times, each read from a run's report and Prefect task
times (bench/scale/run.py writes both), and the report fields its summary prints."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Run = dict[str, Any]


def report_seconds(run: Run, output: str, *keys: str) -> float | None:
    """Sum of the output's report seconds under `keys`; None if the output or a key is missing."""
    seconds = run["report"]["outputs"].get(output, {}).get("seconds", {})
    if not all(key in seconds for key in keys):
        return None
    return round(sum(seconds[key] for key in keys), 3)


def engines_seconds(run: Run) -> float | None:
    """Both encoder outputs' engine waits; None where either copied its night and built none."""
    embeddings, labels = report_seconds(run, "embeddings", "engine"), report_seconds(run, "labels", "engine")
    return None if embeddings is None or labels is None else round(embeddings + labels, 3)


def recs_check_seconds(run: Run) -> float | None:
    """The recommend task's time less its job's: leave-one-out hit-rate and the Redis publish."""
    task, job = run["tasks"].get("recommend"), run["report"]["outputs"].get("recs", {}).get("seconds")
    return None if task is None or job is None else round(max(task - sum(job.values()), 0.0), 3)


def corpus_validation_seconds(run: Run) -> float | None:
    """Both text jobs' corpus validation: the embeddings job validates the corpus and keeps its
    validation; the labels job finds it kept (jobs/text/corpus_validation.py), a lookup of a
    millisecond that is no stage of its own."""
    embeddings, labels = report_seconds(run, "embeddings", "validate"), report_seconds(run, "labels", "validate")
    return None if embeddings is None and labels is None else round((embeddings or 0.0) + (labels or 0.0), 3)


def redis_write_seconds(run: Run) -> float | None:
    labels, recs = report_seconds(run, "labels", "write"), report_seconds(run, "recs", "write")
    return None if labels is None or recs is None else round(labels + recs, 3)


def report_field(run: Run, output: str, key: str) -> int:
    return int(run["report"]["outputs"].get(output, {}).get(key) or 0)


def recs_report(run: Run) -> dict[str, Any]:
    return run["report"]["outputs"].get("recs", {})


def search_figures(run: Run) -> dict[str, Any]:
    """The search parameters the index check recorded with the version, and its chosen rung's figures."""
    validation = run["report"]["outputs"].get("embeddings", {}).get("validation") or {}
    curve = validation.get("curve") or [{}]
    chosen = {key: curve[-1].get(key) for key in ("recall_at_10", "median_ms", "p99_ms")}
    steps = [(step.get("hnsw_ef"), step.get("exact"), step.get("recall_at_10")) for step in curve]
    return {"params": validation.get("search"), **chosen, "curve": steps}


def corpus_rows(run: Run) -> int:
    return report_field(run, "embeddings", "rows")


def recs_users(run: Run) -> int:
    return report_field(run, "recs", "users")


def records_written(run: Run) -> int:
    return report_field(run, "labels", "items") + recs_users(run)


@dataclass(frozen=True)
class Stage:
    what: str
    seconds: Callable[[Run], float | None]
    rows: Callable[[Run], int]


def reported(what: str, rows: Callable[[Run], int], output: str, *keys: str) -> Stage:
    """A stage the run report times: `output`'s seconds under `keys`, summed."""
    return Stage(what, lambda run: report_seconds(run, output, *keys), rows)


STAGES = {
    "validate": Stage(
        "corpus validation (the embeddings job's, which the labels job reads kept)", corpus_validation_seconds, corpus_rows
    ),
    "embed": reported("Ray Data embedding, staged Parquet", corpus_rows, "embeddings", "embed"),
    "qdrant_load": reported("Qdrant bulk load and HNSW build", corpus_rows, "embeddings", "load"),
    "qdrant_validate": reported(
        "count, canaries, recall@10 of the new version", corpus_rows, "embeddings", "validate_version"
    ),
    "engines": Stage(
        "the embeddings and labels engines built and gated, past the validation they overlap",
        engines_seconds,
        corpus_rows,
    ),
    "labels": reported("labels actor pool (gated encoder + head)", corpus_rows, "labels", "label"),
    "recs_validate": reported(
        "interactions validation, valid rows to the driver, item counts", recs_users, "recs", "validate", "popularity"
    ),
    "recs_train": reported(
        "recs training, held-out check (auto: ALS past 20,000 items)", recs_users, "recs", "train"
    ),
    "recs_group": reported(
        "users' histories and fingerprints, who to rescore, state for the next night", recs_users, "recs", "group"
    ),
    "recs": reported(
        "recs top-k (past 50,000 items and 2,000 users: IVF index, recall check, candidates)",
        recs_users,
        "recs",
        "index",
        "recommend",
    ),
    "recs_check": Stage("recs leave-one-out check and publish", recs_check_seconds, recs_users),
    "redis_publish": Stage("Redis writes of labels and recs", redis_write_seconds, records_written),
    "gc": Stage(
        "the outputs' GC tasks (old versions, run folders)",
        lambda r: r["tasks"].get("collect_garbage"),
        corpus_rows,
    ),
}
