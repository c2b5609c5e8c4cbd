"""The embedded default holds on a busy machine: a flow run through the CLI's settings starts
Prefect's temporary API server while every core is busy (its default 20 s start-up timeout
failed whole runs before any work on loaded machines; flows/__init__.py gives it 180 s)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # seconds to minutes each: left out of `pytest -m "not slow"`

FLOW = """
import precompute.flows  # sets the start-up timeout, as every `precompute` command does
from prefect import flow

@flow
def hello() -> str:
    return "ran"

print(hello())
"""


def test_a_flow_starts_its_temporary_prefect_server_under_cpu_load(tmp_path: Path) -> None:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")
    }  # no server: the temporary one
    env["PREFECT_HOME"] = str(tmp_path / "prefect")  # a new database, migrated at start: the slowest start
    hogs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(len(os.sched_getaffinity(0)))
    ]
    try:
        run = subprocess.run(
            [sys.executable, "-c", FLOW], env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path
        )
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert run.returncode == 0 and run.stdout.strip().endswith("ran"), run.stderr[-3000:]
