"""What an output kind's `run` is given: the night's pipeline and settings, and steps as Prefect tasks.

Each step is a Prefect task, so the flow's UI and logs show it, and a step that touches a store
is retried with backoff when its failure is transient (a store's outage, also from inside a Ray
task); bad data (a reject ratio, an accuracy gate, a failed validation) fails at once: retrying
cannot fix it. The step an output is in names its failure in the run's one line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.tasks import exponential_backoff

from precompute.flows.failures import root_cause
from precompute.jobs.work_dir import WorkPath
from precompute.pipeline import Pipeline
from precompute.settings import Machine
from precompute.stores.errors import StoreUnavailableError

T = TypeVar("T")
TRANSIENT = (StoreUnavailableError, ConnectionError, TimeoutError)


def is_transient(task: Any, task_run: Any, state: Any) -> bool:
    """Retry what a store's outage raised, also from inside a Ray task; never bad data."""
    try:
        state.result()
    except Exception as e:
        return isinstance(root_cause(e), TRANSIENT)
    return False


RETRYING = {
    "retries": 3,
    "retry_delay_seconds": exponential_backoff(backoff_factor=5),
    "retry_condition_fn": is_transient,
}


class SkippedError(Exception):
    """An output that could not start because one it needs was not published."""


@dataclass
class RunContext:
    """One night: its pipeline, this machine's settings, and what each output published so far."""

    pipeline: Pipeline
    machine: Machine
    keep_versions: int | None = None
    """The flow's override of every output's keep_versions."""
    reports: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Each output's block of the run report, as its run returned it (or failed)."""
    at: str = ""
    """The step the running output is in."""

    @property
    def work_dir(self) -> WorkPath:
        return self.machine.job.work_dir

    def keep(self, name: str) -> int:
        return self.pipeline.outputs[name].keep_versions if self.keep_versions is None else self.keep_versions

    def step(self, name: str, work: Callable[[], T], retry: bool = True) -> T:
        """Run `work` as the Prefect task `name` (retried on transient failures if `retry`)."""
        self.at = name
        options = {"name": name, "cache_policy": NO_CACHE, **(RETRYING if retry else {})}
        return task(**options)(work)()

    def published(self, name: str) -> dict[str, Any]:
        """The report block of an output this run published; SkippedError if it did not."""
        report = self.reports.get(name)
        if report is None or not report.get("published"):
            raise SkippedError(f"output {name!r}, which it needs, was not published in this run")
        return report
