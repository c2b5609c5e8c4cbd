"""The nightly flow: embed -> validate -> publish -> GC -> run report.

Each step is a Prefect task; transient store failures are retried with backoff, while
bad data (reject ratio, accuracy gate, validation) fails at once: retrying cannot fix it.
Nothing a reader sees changes before `publish`, which is one atomic pointer swap.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.tasks import exponential_backoff

from flows.validate import Validation, validate_version
from jobs.embed import EmbedJobReport, run_embed_job
from jobs.settings import EmbedJobSettings
from models import EngineSettings
from stores.errors import StoreUnavailableError
from stores.vector_settings import VectorStoreSettings
from stores.vectors import new_version, open_vector_store

TRANSIENT = (StoreUnavailableError, ConnectionError, TimeoutError)


def is_transient(task: Any, task_run: Any, state: Any) -> bool:
    try:
        state.result()
    except TRANSIENT:
        return True
    except Exception:
        return False
    return False


retrying = {
    "retries": 3,
    "retry_delay_seconds": exponential_backoff(backoff_factor=5),
    "retry_condition_fn": is_transient,
    "cache_policy": NO_CACHE,
}


@task(**retrying)
def embed(stores: VectorStoreSettings, job: EmbedJobSettings, engine: EngineSettings) -> EmbedJobReport:
    """Each attempt writes a version of its own: a retry never appends to a failed one's parts."""
    with open_vector_store(stores) as store:
        return run_embed_job(new_version(), store, job, engine)


@task(cache_policy=NO_CACHE)
def validate(version: str, stores: VectorStoreSettings, run_dir: Path, min_recall: float) -> Validation:
    with open_vector_store(stores) as store:
        return validate_version(store, version, run_dir, queries=100, min_recall=min_recall)


@task(**retrying)
def publish(version: str, stores: VectorStoreSettings) -> None:
    with open_vector_store(stores) as store:
        store.publish(version)


@task(**retrying)
def collect_garbage(stores: VectorStoreSettings, job: EmbedJobSettings) -> list[str]:
    """Delete old versions whole, with their staged runs (the cache is the newest run)."""
    with open_vector_store(stores) as store:
        deleted = store.gc(stores.keep_versions)
    for version in deleted:
        shutil.rmtree(job.work_dir / "runs" / version, ignore_errors=True)
    return deleted


ROW_STAGES = ("validate", "embed", "load")
"""Stages that pass over every row; docs/s of the others (engine build, publish) means nothing."""


def run_report(
    embedded: EmbedJobReport, validation: Validation, deleted: list[str], seconds: dict[str, float]
) -> dict[str, Any]:
    per_second = {stage: round(embedded.rows / embedded.seconds[stage], 1) for stage in ROW_STAGES}
    return {
        "version": embedded.version,
        "published": True,
        "rows": embedded.rows,
        "rejects": embedded.rejects,
        "rejects_path": embedded.rejects_path,
        "reused": embedded.reused,
        "computed": embedded.computed,
        "seconds": {**embedded.seconds, **seconds},
        "docs_per_s": per_second,
        "engine": {k: embedded.engine[k] for k in ("backend", "device", "precision")},
        "gate": embedded.engine["gates"],
        "validation": asdict(validation),
        "deleted_versions": deleted,
    }


def markdown(report: dict[str, Any]) -> str:
    rows = "\n".join(f"| {key} | {json.dumps(value)} |" for key, value in report.items())
    return f"# Nightly run, version {report['version']}\n\n| field | value |\n| --- | --- |\n{rows}\n"


@flow(name="nightly", log_prints=True)
def nightly(
    corpus: str | None = None, keep_versions: int | None = None, min_recall: float = 0.99
) -> dict[str, Any]:
    """Embed the corpus into a new version, validate, publish, GC, and report.

    corpus: Parquet path or URI (default: PRECOMPUTE_JOB_INPUT, else the demo corpus).
    keep_versions: previous versions kept for rollback (default: PRECOMPUTE_QDRANT_KEEP_VERSIONS).
    """
    job = EmbedJobSettings(**({"input": corpus} if corpus else {}))
    stores = VectorStoreSettings(**({"keep_versions": keep_versions} if keep_versions is not None else {}))
    engine = EngineSettings()
    embedded = embed(stores, job, engine)
    version = embedded.version
    seconds: dict[str, float] = {}
    start = time.perf_counter()
    validation = validate(version, stores, job.work_dir / "runs" / version / "embeddings", min_recall)
    seconds["validate_version"] = round(time.perf_counter() - start, 2)
    start = time.perf_counter()
    publish(version, stores)
    seconds["publish"] = round(time.perf_counter() - start, 2)
    deleted = collect_garbage(stores, job)

    report = run_report(embedded, validation, deleted, seconds)
    path = job.work_dir / "reports" / f"{version}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2))
    create_markdown_artifact(markdown(report), key="nightly-run-report", description=f"version {version}")
    print(json.dumps(report))
    return report
