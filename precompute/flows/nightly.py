"""The nightly flow: every output of the pipeline file through the same lifecycle (lifecycle.py),
its kind's hooks doing the work (precompute/kinds/), then a run report.

Outputs run after the outputs they need (recs need the item vectors their embeddings output
published in this night), otherwise in the file's order. Nothing a reader sees changes before an
output's publish, which is one atomic switch, and an output that fails leaves the others
published: the flow fails after the report.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prefect import flow

from precompute.flows.failures import failure_line
from precompute.flows.lifecycle import OutputFailedError, run_output
from precompute.flows.run_report import RunReport, write_report
from precompute.jobs.ray_session import ray_stopped_last, stop_deferred
from precompute.jobs.work_dir import WorkPath
from precompute.kinds import RunContext
from precompute.pipeline import Pipeline, load_pipeline
from precompute.settings import Machine
from precompute.stores.versions import new_version

log = logging.getLogger(__name__)


class RunFailedError(Exception):
    """Some outputs failed (the others are published): one line each, and the report's path."""

    def __init__(self, failed: dict[str, str], report: Path) -> None:
        self.failed, self.report = failed, report
        lines = "; ".join(f"{output} failed at {why}" for output, why in failed.items())
        super().__init__(f"{lines}; report: {report}")


class RunInProgressError(Exception):
    """Another run holds the work directory's lock."""


@flow(name="nightly", log_prints=True)
def nightly(pipeline: str | None = None, keep_versions: int | None = None) -> dict[str, Any]:
    """Precompute every output of the pipeline file, each validated and published on its own, and report.

    pipeline: the pipeline file (default: PRECOMPUTE_PIPELINE, else ./precompute.toml, else the demo's).
    keep_versions: previous versions kept for rollback, for every output (default: each output's own).
    """
    spec = load_pipeline(pipeline)
    spec.check()  # a bad file fails here, in one line, before any job starts
    machine = Machine.from_environment()
    with one_run_at_a_time(machine.job.work_dir):
        return run_outputs(spec, machine, keep_versions)


@contextlib.contextmanager
def one_run_at_a_time(work_dir: WorkPath) -> Iterator[None]:
    """Refuse a second run on the same work directory while one is running: each run's garbage
    collection would take the other's unpublished versions for a killed run's. The lock goes with
    the process, so a killed run never leaves it held. It is a file lock on the local machine, also for
    a work directory on object storage, which has none: runs of one deployment are one at a time
    anyway (`precompute schedule` sets its concurrency limit to 1)."""
    folder = work_dir.machine_dir()
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "run.lock", "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunInProgressError(f"another run is in progress (it holds {lock.name})") from None
        yield


def run_outputs(spec: Pipeline, machine: Machine, keep_versions: int | None) -> dict[str, Any]:
    """Each output in turn. The first job that needs Ray starts it and the night's end stops it
    (each start and stop is seconds on a small machine); after an output failed, the next job
    starts a Ray of its own, so a failure never hands on a broken one."""
    started, run_id = time.time(), new_version()
    run = RunContext(machine, spec.declared, keep_versions)
    failed: dict[str, str] = {}
    with ray_stopped_last():
        for name in spec.run_order():
            try:
                run.reports[name] = run_output(run, spec.declared[name])
            except OutputFailedError as e:  # reported, and the flow fails after the other outputs ran
                stop_deferred()
                log.error("output %s failed at %s", name, e.stage, exc_info=e.cause)
                failed[name] = e.report.error = f"{e.stage}: {failure_line(e.cause)}"
                run.reports[name] = e.report
    report = RunReport(run_id, str(spec.path), run.reports, failed)
    finished = time.time()
    path = write_report(report, machine.job.work_dir, spec.path, finished - started, finished, machine.job.pushgateway_url)
    print(json.dumps(report.json()))
    if failed:
        raise RunFailedError(failed, path)
    return report.json()
