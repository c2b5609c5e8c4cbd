"""`precompute schedule` against a real Prefect server, started here by `prefect server start`.

Its cron run fires and publishes. Then, while a run holds a written version inside a Ray session
(the test kind's `hold_s`), SIGTERM, as an orchestrator sends it, stops the command within
GRACE_S, and the held version is never published: the run deletes it on its way out, no process
of it is left to publish later, and it is marked crashed on the server (Ray's own SIGTERM handler
once left it "Running" forever, holding the schedule's one slot).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pyarrow.parquet as pq
import pytest

from precompute.demo_data import DEMO_CORPUS
from precompute.flows.schedule import GRACE_S
from precompute.pipeline import load_pipeline
from precompute.settings import Machine
from precompute.stores.key_value.server import free_port
from precompute.stores.versions import Version
from tests.conftest import LengthsNight
from tests.waiting import CEILING_S, wait_for

pytestmark = pytest.mark.slow  # seconds to minutes each: left out of `pytest -m "not slow"`

PREFECT = str(Path(sys.executable).with_name("prefect"))


def healthy(api: str) -> bool:
    try:
        return httpx.get(f"{api}/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def stop_session(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the process's session (it was started as its leader), SIGKILL past a minute."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def session_processes(leader: int) -> list[psutil.Process]:
    """What is still running of the session `leader` started: its children, Ray's included."""
    left = []
    for process in psutil.process_iter():
        try:
            if os.getsid(process.pid) == leader and process.status() != psutil.STATUS_ZOMBIE:
                left.append(process)
        except (OSError, psutil.Error):
            continue
    return left


@pytest.fixture
def prefect_server(tmp_path: Path) -> Iterator[str]:
    """A Prefect server of its own, in a new home (a new database), as production runs one."""
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env |= {"PREFECT_HOME": str(tmp_path / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    log = tmp_path / "prefect-server.log"
    with open(log, "w") as out:
        server = subprocess.Popen(
            [PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for(lambda: server.poll() is not None or healthy(api), "prefect server start to answer")
        assert server.poll() is None, log.read_text()
        yield api
    finally:
        stop_session(server)


def versions(pipeline: Path, output: str) -> tuple[str | None, list[Version]]:
    declared = load_pipeline(pipeline).declared[output]
    with declared.kind.versions(declared, Machine.from_environment()) as listed:
        return listed.current(), listed.listing()


def call(method: str, url: str, **kwargs: Any) -> httpx.Response:
    """A request to the Prefect server, again after a 503: the server answers that when its SQLite
    database is busy (a loaded machine), as a request its clients retry (Prefect's own client does)."""

    def answered() -> httpx.Response | None:
        answer = httpx.request(method, url, timeout=30, **kwargs)
        return None if answer.status_code == 503 else answer

    return wait_for(answered, f"{method} {url} to be answered other than 503", CEILING_S, 1)


def flow_runs(api: str) -> list[dict[str, Any]]:
    return call("POST", f"{api}/flow_runs/filter", json={"sort": "START_TIME_DESC"}).json()


def test_a_cron_run_publishes_and_sigterm_stops_the_schedule_with_no_version_half_published(
    prefect_server: str, lengths_night: LengthsNight, tmp_path: Path
) -> None:
    served, held = lengths_night.pipeline, tmp_path / "held.toml"
    served.write_text('[outputs.sizes]\nkind = "lengths"\ninput = { path = "corpus.parquet" }\n')
    held.write_text('[outputs.held]\nkind = "lengths"\ninput = { path = "corpus.parquet" }\nhold_s = 600\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env |= {"PREFECT_API_URL": prefect_server, "PREFECT_HOME": str(tmp_path / "prefect")}
    # The runner looks for due runs every 10 s by default; the cron minute is wait enough.
    env["PREFECT_RUNNER_POLL_FREQUENCY"] = "2"

    log = tmp_path / "schedule.log"
    with open(log, "w") as out:
        schedule = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "precompute",
                "schedule",
                "--pipeline",
                str(served),
                "--cron",
                "* * * * *",
            ],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        # The first run is the cron's, due at the next minute.
        first = wait_for(lambda: versions(served, "sizes")[0], "the cron run to publish", CEILING_S + 60, 1)
        # Published before its run reports its end: on a loaded machine the state comes seconds later.
        wait_for(
            lambda: any(
                run["auto_scheduled"] and run["state_type"] == "COMPLETED" for run in flow_runs(prefect_server)
            ),
            "the cron run to be marked completed",
            CEILING_S,
            1,
        )

        deployment = call("GET", f"{prefect_server}/deployments/name/nightly/nightly").json()
        created = call(
            "POST",
            f"{prefect_server}/deployments/{deployment['id']}/create_flow_run",
            json={"parameters": {"pipeline": str(held)}},
        )
        assert created.status_code == 201, created.text
        started = created.json()
        # It waits for any cron run due before it, then starts a subprocess and a local Ray, which
        # retries a start that timed out (30 s each) on a loaded machine.
        try:
            holding = wait_for(
                lambda: "holding " in log.read_text(), "the held run to hold its version", 3 * CEILING_S, 0.5
            )
        except AssertionError as e:
            run = call("GET", f"{prefect_server}/flow_runs/{started['id']}").json()
            state = {k: run.get(k) for k in ("state_type", "state_name", "expected_start_time", "next_scheduled_start_time")}
            raise AssertionError(f"{e}; the held run is {state}; the schedule's log ends:\n{log.read_text()[-3000:]}") from None
        assert holding
        (written,) = versions(held, "held")[1]
        assert written.count == lengths_night.rows and not written.current

        schedule.send_signal(signal.SIGTERM)
        wait_for(
            lambda: schedule.poll() is not None, f"SIGTERM to stop the schedule within {GRACE_S:g} s", GRACE_S
        )
    finally:
        stop_session(schedule)
    wait_for(lambda: not session_processes(schedule.pid), "the schedule's processes, Ray's included, to end")

    # Never published, and nothing is left to publish it: the run deleted what it wrote on its way out.
    assert versions(held, "held") == (None, [])
    states = {run["id"]: run["state_type"] for run in flow_runs(prefect_server)}
    assert states[started["id"]] == "CRASHED", log.read_text()[-3000:]
    assert "RUNNING" not in states.values()
    current, listing = versions(served, "sizes")
    assert current is not None and current >= first and all(v.count == lengths_night.rows for v in listing)


@pytest.mark.parametrize("api", [None, "http://127.0.0.1:{port}/api"])
def test_without_a_prefect_server_the_schedule_is_refused_in_one_line(
    api: str | None, lengths_kind: None, tmp_path: Path
) -> None:
    """No PREFECT_API_URL (Prefect would keep the schedule in a temporary server that dies with
    the command) is a setup error, exit code 2; a server that does not answer, exit code 1."""
    pq.write_table(pq.read_table(DEMO_CORPUS).slice(0, 40), tmp_path / "corpus.parquet")
    pipeline = tmp_path / "precompute.toml"
    pipeline.write_text('[outputs.sizes]\nkind = "lengths"\ninput = { path = "corpus.parquet" }\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env["PREFECT_HOME"] = str(tmp_path / "prefect")  # no profile naming a server
    if api:
        env["PREFECT_API_URL"] = api = api.format(port=free_port())
    done = subprocess.run(
        [sys.executable, "-m", "precompute", "schedule", "--pipeline", str(pipeline)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    expected = (
        (1, f"error: the Prefect API at {api} does not answer (ConnectError: ")
        if api
        else (2, "error: PREFECT_API_URL is not set: the schedule is kept by a Prefect server")
    )
    assert (done.returncode, done.stderr.splitlines()[0][: len(expected[1])]) == expected, done.stderr
    assert len(done.stderr.splitlines()) == 1 and done.stdout == ""
