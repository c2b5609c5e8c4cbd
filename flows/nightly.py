"""The nightly flow: every output of the pipeline file, each validated and published on its own, then a run report.

    embeddings: embed -> validate (count, canaries, recall@10) -> publish (Qdrant) -> GC
    labels:     label -> publish (Redis: count, sample reads) -> GC
    recs:       (after its items' embeddings) recommend -> validate (hit-rate@10) -> publish -> GC

Outputs run in the file's order by kind: embeddings, then labels, then recs (which need
the item vectors their embeddings output published in this run).

Each step is a Prefect task; transient store failures are retried with backoff, while
bad data (reject ratio, accuracy gate, validation) fails at once: retrying cannot fix it.
Nothing a reader sees changes before a `publish`, which is one atomic pointer swap, and
an output that fails leaves the others published: the flow fails after the report.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeVar

from precompute.flows.failures import failure_line, root_cause
from precompute.flows.run_metrics import publish_run_metrics
from precompute.flows.run_page import render
from precompute.flows.validate import Validation, validate_version
from precompute.jobs import progress
from precompute.jobs.content_cache import promote
from precompute.jobs.embed import EmbedJobReport, run_embed_job
from precompute.jobs.labels import LabelsJobReport, run_labels_job
from precompute.jobs.own_towers import own_towers
from precompute.jobs.ray_session import ray_session
from precompute.jobs.recommend import RecsJobReport, run_recs_job
from precompute.jobs.recs_quality import (
    RecsQuality,
    beats_most_popular,
    evaluate,
    interactions_table,
    valid_interactions,
)
from precompute.jobs.recs_settings import RecsJobSettings
from precompute.jobs.recs_state import CopyPlan, Previous, bucket_fit, staged_items
from precompute.jobs.settings import JobSettings
from precompute.models import EngineSettings
from precompute.models.labels import LabelSettings, label_names
from precompute.models.towers import TowersSpec
from precompute.stores.errors import StoreUnavailableError
from precompute.stores.key_value import KeyValueStore
from precompute.stores.redis_settings import RedisSettings
from precompute.stores.vector_settings import VectorStoreSettings
from precompute.stores.vectors import new_version, open_vector_store
from prefect import flow, task
from prefect.artifacts import create_link_artifact, create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.tasks import exponential_backoff
from ray.data.datasource import Datasink

from precompute.pipeline import CorpusInput, InteractionsInput, Pipeline, load_pipeline

Job = TypeVar("Job", LabelsJobReport, RecsJobReport)

log = logging.getLogger(__name__)

TRANSIENT = (StoreUnavailableError, ConnectionError, TimeoutError)


def is_transient(task: Any, task_run: Any, state: Any) -> bool:
    """Retry what a store's outage raised, also from inside a Ray task; never bad data."""
    try:
        state.result()
    except Exception as e:
        return isinstance(root_cause(e), TRANSIENT)
    return False


retrying = {
    "retries": 3,
    "retry_delay_seconds": exponential_backoff(backoff_factor=5),
    "retry_condition_fn": is_transient,
    "cache_policy": NO_CACHE,
}


@task(**retrying)
def embed(
    output: str, corpus: CorpusInput, stores: VectorStoreSettings, job: JobSettings, engine: EngineSettings
) -> EmbedJobReport:
    """Each attempt writes a version of its own: a retry never appends to a failed one's parts."""
    with open_vector_store(stores) as store:
        return run_embed_job(new_version(), store, corpus, job, engine, output)


@task(cache_policy=NO_CACHE)
def validate(version: str, stores: VectorStoreSettings, run_dir: Path, min_recall: float) -> Validation:
    with open_vector_store(stores) as store:
        return validate_version(store, version, run_dir, queries=100, min_recall=min_recall)


@task(**retrying)
def publish(version: str, stores: VectorStoreSettings) -> None:
    with open_vector_store(stores) as store:
        store.publish(version)


@task(**retrying)
def collect_garbage(output: str, stores: VectorStoreSettings, job: JobSettings) -> list[str]:
    """Delete old versions whole, with their staged runs (the cache is the newest run)."""
    with open_vector_store(stores) as store:
        deleted = store.gc(stores.keep_versions)
        collect_runs(job.work_dir / "runs" / output, store.current(), set(store.versions()))
    return deleted


def into_redis(
    redis: RedisSettings,
    output: str,
    store_key: str,
    vocabulary: list[str],
    work_dir: Path,
    job: Callable[[Datasink, Path, Callable[..., None]], Job],
) -> tuple[Job, str, list[str]]:
    """Run `job` into a new Redis version of `output` (keys under `store_key`) and publish it
    (count and sample reads first).

    `job(sink, run_dir, create)` writes through `sink`, keeps its rejects in `run_dir`, and
    calls `create(records)` before its first write, or `create(records, copy)` to start the
    version as a server-side copy of `copy.version` less the records `copy.gone` (the sink
    then overwrites the records it writes). A failed attempt's version is deleted whole.
    Returns (job report, version, versions deleted by the publish's GC).
    """
    version = new_version()
    runs = work_dir / "runs" / output
    with KeyValueStore(redis) as store:

        def create(rows: int, copy: CopyPlan | None = None) -> None:
            meta = {"vocabulary": vocabulary}
            if copy is None:
                store.create_version(store_key, version, rows, meta)
                return
            store.create_version(
                store_key, version, rows, meta, buckets=store.buckets(store_key, copy.version)
            )
            store.copy_version(store_key, copy.version, version)
            store.delete(store_key, version, copy.gone)

        try:
            report = job(store.sink(store_key, version), runs / version, create)
            deleted = store.publish(store_key, version, report.samples)
        except BaseException:
            drop_unpublished(store, store_key, version)
            raise
        collect_runs(runs, version, {v.name for v in store.versions(store_key)})
    return report, version, deleted


@task(**retrying)
def label(
    output: str,
    store_key: str,
    corpus: CorpusInput,
    job: JobSettings,
    labels: LabelSettings,
    engine: EngineSettings,
    redis: RedisSettings,
) -> tuple[LabelsJobReport, str, list[str]]:
    """Label the corpus into a new Redis version and publish it; its staged values then become
    the cache of the next run (never before: a failed run must not replace it)."""
    vocabulary = label_names(labels, engine)  # trains a head on a cache miss
    cache_dir = job.work_dir / "cache" / output
    labelled, version, deleted = into_redis(
        redis,
        output,
        store_key,
        vocabulary,
        job.work_dir,
        lambda sink, run_dir, size: run_labels_job(
            corpus, job, labels, engine, sink, run_dir, before_write=size, cache_dir=cache_dir, output=output
        ),
    )
    promote(cache_dir, Path(labelled.staged))
    return labelled, version, deleted


class SkippedError(Exception):
    """An output that could not start because one it depends on failed."""


class RunFailedError(Exception):
    """Some outputs failed (the others are published): one line each, and the report's path."""

    def __init__(self, failed: dict[str, str], report: Path) -> None:
        self.failed, self.report = failed, report
        lines = "; ".join(f"{output} failed at {why}" for output, why in failed.items())
        super().__init__(f"{lines}; report: {report}")


def report_path(work_dir: Path, run: str) -> Path:
    return work_dir / "reports" / f"{run}.json"


class QualityError(Exception):
    """The new recommendations are worse than the most-popular baseline; the current version stays."""


def published_recs(redis: RedisSettings, store_key: str, runs: Path) -> Previous | None:
    """The published version of a recs output, which an incremental run copies from."""
    with KeyValueStore(redis) as store:
        current = store.current(store_key)
        if current is None:
            return None
        fit = bucket_fit(store.buckets(store_key, current), redis.entries_per_bucket)
    return Previous(current, runs / current, fit)


@task(**retrying)
def recommend(
    output: str,
    store_key: str,
    interactions: InteractionsInput,
    recs: RecsJobSettings,
    items_model: str,
    embeddings_dir: Path,
    redis: RedisSettings,
    work_dir: Path,
    min_lift: float,
    towers: TowersSpec | None,
    cache_dir: Path,
) -> tuple[RecsJobReport, str, RecsQuality, list[str]]:
    """Recommend from the published embeddings into a new Redis version, rescoring only the users
    whose inputs moved since the published one (jobs/recs_state.py); publish it only if the
    model's held-out NDCG@10 beats most-popular's by `min_lift` (jobs/recs_quality.py). With
    `towers` (the model "towers"), both towers' vectors are computed first, engines gated and
    cached in `cache_dir` (jobs/own_towers.py). Returns (report, version, quality, versions deleted)."""
    items = staged_items(embeddings_dir)
    previous = published_recs(redis, store_key, work_dir / "runs" / output)
    quality: RecsQuality | None = None

    def job(sink: Datasink, run_dir: Path, create: Callable[..., None]) -> RecsJobReport:
        """The job first: bad interactions fail on their reject ratio, with reasons, not as poor quality."""
        nonlocal quality
        with ray_session(recs.ray_address):
            own = None if towers is None else own_towers(towers, items.ids, run_dir, cache_dir)
            report = run_recs_job(
                interactions,
                recs,
                items,
                sink,
                run_dir,
                create,
                items_model=items_model,
                previous=previous,
                own=own,
                output=output,
            )
        good = valid_interactions(interactions_table(interactions), items.ids)
        quality = evaluate(good, items.vectors, recs, own=own)
        if refusal := beats_most_popular(quality, min_lift):
            raise QualityError(refusal)
        return report

    report, version, deleted = into_redis(redis, output, store_key, items.ids, work_dir, job)
    return report, version, quality, deleted  # type: ignore[return-value]  # set by job


def drop_unpublished(store: KeyValueStore, output: str, version: str) -> None:
    """Delete a failed attempt's version, if it got as far as existing."""
    with contextlib.suppress(Exception):
        if store.current(output) != version:
            store.drop_version(output, version)


def collect_runs(runs: Path, current: str | None, kept: set[str]) -> None:
    """Delete the run folders (staged parts, rejects) of versions the store no longer holds,
    and of runs killed before they made one; newer folders are runs in progress."""
    if current is None or not runs.is_dir():
        return
    for run in runs.iterdir():
        if run.is_dir() and run.name < current and run.name not in kept:
            shutil.rmtree(run, ignore_errors=True)


ROW_STAGES = ("validate", "embed", "load")
"""Stages that pass over every row; docs/s of the others (engine build, publish) means nothing."""


def embeddings_report(
    embedded: EmbedJobReport, validation: Validation, deleted: list[str], seconds: dict[str, float]
) -> dict[str, Any]:
    per_second = {stage: round(embedded.rows / embedded.seconds[stage], 1) for stage in ROW_STAGES}
    return {
        "kind": "embeddings",
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


def labels_report(labelled: LabelsJobReport, version: str, deleted: list[str]) -> dict[str, Any]:
    engine = labelled.labeler["engine"]
    accuracy = labelled.labeler["held_out_accuracy"]
    return {
        "kind": "labels",
        "version": version,
        "published": True,
        "rows": labelled.rows,
        "rejects": labelled.rejects,
        "rejects_path": labelled.rejects_path,
        "items": labelled.items,
        "reused": labelled.reused,
        "computed": labelled.computed,
        "labels": len(labelled.vocabulary),
        "seconds": labelled.seconds,
        "docs_per_s": round(labelled.items / labelled.seconds["label"], 1),
        "engine": {k: engine[k] for k in ("backend", "device", "precision")},
        "gate": labelled.labeler["gates"],
        "gate_texts_from": engine["gates"][-1]["texts_from"] if engine["gates"] else "",
        "head_held_out_accuracy": None if accuracy is None else round(accuracy, 4),
        "deleted_versions": deleted,
    }


def recs_report(
    recs: RecsJobReport, version: str, quality: RecsQuality, deleted: list[str]
) -> dict[str, Any]:
    return {
        "kind": "recs",
        "version": version,
        "published": True,
        "rows": recs.rows,
        "rejects": recs.rejects,
        "rejects_path": recs.rejects_path,
        "users": recs.users,
        "rescored": recs.rescored,
        "copied": recs.copied,
        "mode": recs.mode,
        "mode_reason": recs.mode_reason,
        "k": recs.k,
        "seconds": recs.seconds,
        "users_per_s": recs.users_per_s,
        **({"towers": recs.towers} if recs.towers is not None else {}),
        "validation": asdict(quality),
        "deleted_versions": deleted,
    }


def markdown(report: dict[str, Any]) -> str:
    sections = []
    for output, fields in report["outputs"].items():
        rows = "\n".join(f"| {key} | {json.dumps(value)} |" for key, value in fields.items())
        sections.append(f"## {output}\n\n| field | value |\n| --- | --- |\n{rows}\n")
        if models := fields.get("validation", {}).get("models"):
            sections.append(models_table(fields["validation"], models))
    return f"# Nightly run {report['run']}\n\n" + "\n".join(sections)


def models_table(quality: dict[str, Any], models: dict[str, dict[str, Any]]) -> str:
    """A recs output's models side by side on the held-out split."""
    k = quality["k"]
    head = f"| model | HR@{k} | NDCG@{k} | coverage | cold users served |\n| --- | --- | --- | --- | --- |\n"
    rows = "\n".join(
        f"| {quality['published'] if name == 'published' else name} | {m['hit_rate']} | {m['ndcg']} | "
        f"{m['coverage']} | {'-' if m['cold_served'] is None else m['cold_served']} |"
        for name, m in models.items()
    )
    return (
        f"Held-out quality ({quality['split']} split, {quality['users']} users, "
        f"{quality['cold_users']} cold):\n\n{head}{rows}\n"
    )


@flow(name="nightly", log_prints=True)
def nightly(pipeline: str | None = None, keep_versions: int | None = None) -> dict[str, Any]:
    """Precompute every output of the pipeline file, each validated and published on its own, and report.

    pipeline: the pipeline file (default: PRECOMPUTE_PIPELINE, else ./precompute.toml, else the demo's).
    keep_versions: previous versions kept for rollback, for every output (default: each output's own).
    """
    spec = load_pipeline(pipeline)
    spec.check()  # a bad file fails here, in one line, before any job starts
    job = JobSettings()
    with one_run_at_a_time(job.work_dir):
        return run_outputs(spec, job, keep_versions)


class RunInProgressError(Exception):
    """Another run holds the work directory's lock."""


@contextlib.contextmanager
def one_run_at_a_time(work_dir: Path) -> Iterator[None]:
    """Refuse a second run on the same work directory while one is running: each run's garbage
    collection would take the other's unpublished versions for a killed run's. The lock goes with
    the process, so a killed run never leaves it held. (Scheduled runs are one at a time anyway:
    `precompute schedule` sets the deployment's concurrency limit to 1.)"""
    work_dir.mkdir(parents=True, exist_ok=True)
    with open(work_dir / "run.lock", "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunInProgressError(f"another run is in progress (it holds {lock.name})") from None
        yield


def run_outputs(spec: Pipeline, job: JobSettings, keep_versions: int | None) -> dict[str, Any]:
    engine, labels = EngineSettings(), LabelSettings()
    started = time.time()
    run = new_version()
    outputs: dict[str, Any] = {}
    failed: dict[str, str] = {}

    def keep(settings: Any) -> Any:
        return (
            settings
            if keep_versions is None
            else settings.model_copy(update={"keep_versions": keep_versions})
        )

    at = {"step": ""}  # the step each output is in, for its failure line

    def attempt(output: str, run_output: Callable[[], dict[str, Any]]) -> None:
        try:
            outputs[output] = run_output()
        except Exception as e:  # reported, and the flow fails after the other outputs ran
            log.error("output %s failed at %s", output, at["step"], exc_info=e)
            failed[output] = f"{at['step']}: {failure_line(e)}"
            outputs[output] = {"kind": spec.outputs[output].kind, "published": False, "error": failed[output]}

    def now_at(step: str) -> None:
        at["step"] = step

    def embeddings(name: str) -> dict[str, Any]:
        stores = keep(spec.vector_settings(name))
        now_at("embed")
        embedded = embed(name, spec.outputs[name].input, stores, job, spec.engine_settings(name, engine))
        version = embedded.version
        seconds: dict[str, float] = {}
        start = time.perf_counter()
        staged = job.work_dir / "runs" / name / version / "embeddings"
        now_at("validate")
        with progress.stage(name, "check index"):
            validation = validate(version, stores, staged, spec.outputs[name].min_recall)
        seconds["validate_version"] = round(time.perf_counter() - start, 2)
        start = time.perf_counter()
        now_at("publish")
        with progress.stage(name, "publish"):
            publish(version, stores)
        seconds["publish"] = round(time.perf_counter() - start, 2)
        now_at("collect garbage")
        return embeddings_report(embedded, validation, collect_garbage(name, stores, job), seconds)

    def labelled(name: str) -> dict[str, Any]:
        now_at("label")
        return labels_report(
            *label(
                name,
                spec.store(name),
                spec.outputs[name].input,
                job,
                spec.label_settings(name, labels),
                spec.engine_settings(name, engine),
                keep(spec.redis_settings(name)),
            )
        )

    def recommended(name: str) -> dict[str, Any]:
        items = spec.outputs[name].items
        now_at("recommend")
        if not outputs[items]["published"]:
            raise SkippedError(f"the embeddings it recommends from ({items}) were not published")
        staged = job.work_dir / "runs" / items / outputs[items]["version"] / "embeddings"
        output = spec.outputs[name]
        return recs_report(
            *recommend(
                name,
                spec.store(name),
                output.input,
                spec.recs_settings(name),
                spec.sources[items].hash,
                staged,
                keep(spec.redis_settings(name)),
                job.work_dir,
                output.min_lift,
                output.towers,
                engine.cache_dir,
            )
        )

    steps = {"embeddings": embeddings, "labels": labelled, "recs": recommended}
    for kind, step in steps.items():
        for name in spec.of_kind(kind):
            attempt(name, lambda step=step, name=name: step(name))

    report = {"run": run, "pipeline": str(spec.path), "outputs": outputs, "failed": failed}
    path = report_path(job.work_dir, run)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2))
    page = path.with_suffix(".html")
    try:
        page.write_text(render(report))
    except Exception:  # a view of the JSON beside it: a bug here must not fail a run that published
        log.exception("the run's page %s was not written", page)
    create_markdown_artifact(markdown(report), key="nightly-run-report", description=f"run {run}")
    create_link_artifact(page.as_uri(), link_text=f"run {run} report", key="nightly-run-page")
    finished = time.time()
    publish_run_metrics(
        report, spec.path.stem, finished - started, finished, job.work_dir, job.pushgateway_url
    )
    print(json.dumps(report))
    if failed:
        raise RunFailedError(failed, path)
    return report
