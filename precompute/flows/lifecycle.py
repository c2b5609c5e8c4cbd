"""Every output's night, the same for every kind: plan -> new version -> compute -> check ->
publish -> collect -> report. The kind supplies the hooks (precompute/kinds/); the lifecycle owns
the version, the steps, their retries and timings, and the cleanup.

    plan      the outputs it needs published this night, else it is skipped (SkippedError)
    compute   a new version, written by the kind (each attempt its own version: a retry never
              appends to a failed attempt's parts); retried on a store's outage
    check     the kind's validate on the written version; never retried (bad data stays bad)
    publish   the store's atomic switch; retried; then the kind's `published` (a cache promoted)
    collect   old versions deleted whole with their run folders; a step of its own, so that an
              outage here retries the collection, never the compute of a version already published

Nothing a reader sees changes before the publish. A version that fails before it is dropped
whole, also when the night is stopped (SIGTERM), before Ray goes (jobs/ray_session.py
ray_stopped_last).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from precompute.flows.steps import step
from precompute.jobs import progress, work_dir
from precompute.jobs.ray_session import ray_stopped_last
from precompute.kinds import Output, RunContext, Target
from precompute.kinds.report import Computed, OutputReport
from precompute.stores.versions import Versioned, new_version

T = TypeVar("T")


class OutputFailedError(Exception):
    """An output's night failed at `stage`; `report` says how far it got."""

    def __init__(self, stage: str, report: OutputReport, cause: Exception) -> None:
        super().__init__(f"{stage}: {cause}")
        self.stage, self.report, self.cause = stage, report, cause


def run_output(run: RunContext, output: Output) -> OutputReport:
    """Compute, check and publish a new version of `output`, then collect its old ones; each
    step a Prefect task named after the output. OutputFailedError names the step that failed."""
    kind, name = output.kind, output.name
    report = OutputReport(kind=kind.name)
    stage = "plan"
    try:
        for needed in kind.needs(output):
            run.published(needed)  # SkippedError: an output it needs did not publish this night
        stage = "compute"
        with ray_stopped_last(), kind.versions(output, run.machine) as store:

            def compute() -> tuple[Target, Computed]:
                return attempt(run, output, store)

            target, computed = timed(report, stage, lambda: step(f"{name} compute", compute))
            report.version, report.computed = target.version, computed

            def check() -> Any:
                return kind.validate(run, output, target, computed)

            def publish() -> None:
                with progress.stage(name, "publish"):
                    store.publish(target.version)

            with dropped_unless_published(store, target.version):
                stage = "check"
                report.validation = timed(report, stage, lambda: step(f"{name} check", check, retry=False))
                stage = "publish"
                timed(report, stage, lambda: step(f"{name} publish", publish))
            report.published = True
            kind.published(run, output, target, computed)
            stage = "collect"
            report.deleted_versions = timed(
                report, stage, lambda: step(f"{name} collect", lambda: collect(run, output, store))
            )
    except Exception as e:
        raise OutputFailedError(stage, report, e) from e
    return report


def attempt(run: RunContext, output: Output, store: Versioned) -> tuple[Target, Computed]:
    """One attempt of the kind's compute, into a version of its own that is dropped if it fails."""
    version = new_version()
    target = Target(version, store, run.run_dir(output.name, version))
    with dropped_unless_published(store, version):
        return target, output.kind.compute(run, output, target)


@contextlib.contextmanager
def dropped_unless_published(store: Versioned, version: str) -> Iterator[None]:
    """Drop `version` whole if the block fails (or is stopped) before it is published. A drop that
    fails is left to a later night's collect: the block's own failure is the one to report."""
    try:
        yield
    except BaseException:
        with contextlib.suppress(Exception):
            store.drop(version)
        raise


def collect(run: RunContext, output: Output, store: Versioned) -> list[str]:
    """Delete all but the published version and the kept ones, with their run folders (the
    output's cache is the newest published night's); the versions deleted, oldest first."""
    deleted = store.collect(run.keep(output))
    kept = set(store.versions())
    work_dir.collect_runs(work_dir.runs(run.work_dir, output.name), store.current(), kept)
    return deleted


def timed(report: OutputReport, stage: str, work: Callable[[], T]) -> T:
    """`work`'s result, its seconds in the report's steps under `stage`."""
    start = time.perf_counter()
    result = work()
    report.steps[stage] = round(time.perf_counter() - start, 3)
    return result
