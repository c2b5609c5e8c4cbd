"""Run the lookup service: in the foreground (`precompute serve`) or as a child process (demo, bench).

The child is a separate process, as in production: its latency is not shared with the
caller's interpreter, and it reads the published version from the store like any reader.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import uvicorn
from pydantic_settings import BaseSettings

from lookup.app import create_app
from lookup.settings import ServiceSettings
from precompute.pipeline import Pipeline

READY_TIMEOUT_S = 300


def serve(settings: ServiceSettings, pipeline: Pipeline | None = None) -> None:
    app = create_app(settings, pipeline=pipeline)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level="warning")


def as_environment(*settings: BaseSettings) -> dict[str, str]:
    """Settings objects as the PRECOMPUTE_* variables that rebuild them in a child process."""
    env = {}
    for group in settings:
        prefix = group.model_config["env_prefix"]
        for name, value in group.model_dump().items():
            if value is not None:
                env[f"{prefix}{name.upper()}"] = str(value)
    return env


@contextmanager
def running(
    settings: ServiceSettings, *others: BaseSettings, pipeline: Pipeline | None = None
) -> Iterator[str]:
    """Start `precompute serve` with these settings (and pipeline file), wait until /readyz is 200,
    yield its base URL."""
    env = {**os.environ, **as_environment(settings, *others)}
    if pipeline is not None:
        env["PRECOMPUTE_PIPELINE"] = str(pipeline.path)
    child = subprocess.Popen([sys.executable, "-m", "precompute", "serve"], env=env)
    base = f"http://{settings.host}:{settings.port}"
    deadline = time.monotonic() + READY_TIMEOUT_S
    try:
        while True:
            try:
                if httpx.get(f"{base}/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or child.poll() is not None:
                raise RuntimeError(f"the lookup service at {base} did not become ready")
            time.sleep(0.2)
        yield base
    finally:
        child.terminate()
        child.wait(timeout=30)
