"""The stages `precompute bench scale` times, each read from a run's report (bench/scale/run.py
writes it): the kinds' own stages (`seconds`) and the framework's steps (`steps`), and the report
fields its summary prints."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Run = dict[str, Any]


def report_seconds(run: Run, output: str, *keys: str, field: str = "seconds") -> float | None:
    """Sum of the output's report seconds under `keys` (of its compute's stages, or with
    field="steps" of its night's steps); None if the output or a key is missing."""
    seconds = run["report"]["outputs"].get(output, {}).get(field) or {}
    if not all(key in seconds for key in keys):
        return None
    return round(sum(seconds[key] for key in keys), 3)


def engines_seconds(run: Run) -> float | None:
    """Both encoder outputs' engine waits; None where either copied its night and built none."""
    embeddings, labels = report_seconds(run, "embeddings", "engine"), report_seconds(run, "labels", "engine")
    return None if embeddings is None or labels is None else round(embeddings + labels, 3)


def recs_check_seconds(run: Run) -> float | None:
    """The recs compute step's time less its job's stages (the held-out check's scoring), and its
    check and publish steps."""
    steps, job = (run["report"]["outputs"].get("recs", {}).get(key) for key in ("steps", "seconds"))
    if not steps or job is None or not {"compute", "check", "publish"} <= set(steps):
        return None
    return round(max(steps["compute"] - sum(job.values()), 0.0) + steps["check"] + steps["publish"], 3)


def collect_seconds(run: Run) -> float | None:
    """Every output's collect step (old versions, run folders); None where one did not collect."""
    steps = [report_seconds(run, output, "collect", field="steps") for output in run["report"]["outputs"]]
    return None if None in steps else round(sum(s for s in steps if s is not None), 3)


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


def reported(what: str, rows: Callable[[Run], int], output: str, *keys: str, field: str = "seconds") -> Stage:
    """A stage the run report times: `output`'s seconds (or steps) under `keys`, summed."""
    return Stage(what, lambda run: report_seconds(run, output, *keys, field=field), rows)


STAGES = {
    "validate": Stage(
        "corpus validation (the embeddings job's, which the labels job reads kept)", corpus_validation_seconds, corpus_rows
    ),
    "embed": reported("Ray Data embedding, staged Parquet", corpus_rows, "embeddings", "embed"),
    "qdrant_load": reported("Qdrant bulk load and HNSW build", corpus_rows, "embeddings", "load"),
    "qdrant_validate": reported(
        "count, canaries, recall@10 of the new version", corpus_rows, "embeddings", "check", field="steps"
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
    "gc": Stage("the outputs' collect steps (old versions, run folders)", collect_seconds, corpus_rows),
}
