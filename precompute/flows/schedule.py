"""`precompute schedule`: the nightly flow served on a cron schedule through a Prefect server.

The deployment `nightly/nightly` is registered with the schedule and each scheduled flow run runs
in a subprocess of this one; the schedule stays active across restarts. One run at a time: a run
due while another is running waits, so two runs never race to publish and collect each other's
versions.

SIGTERM (what an orchestrator sends before killing) stops the command within GRACE_S: Prefect's
runner stops polling and sends SIGTERM to a run in progress, which ends before it publishes (a
publication is one atomic switch, so there is no half of one) and deletes the version it was
writing; the run is marked crashed on the server. (A run killed outright leaves its version to
the next run's collection.)
"""

from __future__ import annotations

import os

from precompute.pipeline import Pipeline

GRACE_S = 30.0
"""The longest SIGTERM takes to stop the command, a run in progress included: Kubernetes' default
terminationGracePeriodSeconds, which a stop well inside it leaves room for (tests/flows/test_schedule.py
times one)."""


class ScheduleError(Exception):
    """The schedule cannot be served: its message is one line for the terminal."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        """2: the command is set up wrong; 1: the server it names does not answer."""


def prefect_api() -> str:
    """The Prefect server's API URL, checked to answer: a schedule kept by Prefect's temporary
    server would vanish with this process, so none is started."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    if not url:
        raise ScheduleError(
            "PREFECT_API_URL is not set: the schedule is kept by a Prefect server (`prefect server start`)", 2
        )
    with get_client(sync_client=True) as client:
        problem = client.api_healthcheck()
    if problem is not None:
        raise ScheduleError(
            f"the Prefect API at {url} does not answer ({type(problem).__name__}: {problem})", 1
        )
    return url


def serve(pipeline: Pipeline, cron: str | None) -> None:
    """Register the schedule and run its flow runs until SIGTERM or Ctrl-C."""
    from prefect.deployments.runner import EntrypointType

    from precompute.flows.nightly import nightly

    prefect_api()
    # Through the environment, not a deployment parameter: Prefect keeps the parameters of the
    # runs it scheduled ahead, so a restart with another file would still run the old one.
    os.environ["PRECOMPUTE_PIPELINE"] = str(pipeline.path)
    nightly.serve(
        name="nightly",
        cron=cron or pipeline.flow.cron,
        global_limit=1,
        pause_on_shutdown=False,
        entrypoint_type=EntrypointType.MODULE_PATH,
    )
