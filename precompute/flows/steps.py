"""A night's steps as Prefect tasks, retried where a retry can help.

Each step is a Prefect task, so the flow's UI and logs show it, and a step that touches a store
is retried with backoff when its failure is transient (a store's outage, also from inside a Ray
task); bad data (a reject ratio, an accuracy gate, a failed validation) fails at once: retrying
cannot fix it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.tasks import exponential_backoff

from precompute.flows.failures import root_cause
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


def step(name: str, work: Callable[[], T], retry: bool = True) -> T:
    """Run `work` as the Prefect task `name` (retried on transient failures if `retry`)."""
    options = {"name": name, "cache_policy": NO_CACHE, **(RETRYING if retry else {})}
    return task(**options)(work)()
