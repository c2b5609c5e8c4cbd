"""A pipeline run as a user runs it, then served: what the served benches (recs, labels) score.

In `folder`: a redis-server of its own, `precompute run`'s flow on the pipeline file there
(with `environment` set for the run and restored after), then the lookup service on a free
port, until the caller has read what it needs.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from precompute.lookup.settings import ServiceSettings
from precompute.service.server import running
from precompute.stores.key_value.server import free_port, redis_server


@contextmanager
def served_run(folder: Path, environment: dict[str, str]) -> Iterator[tuple[dict[str, Any], str]]:
    """(the run report, the service's base URL) of folder/precompute.toml."""
    from precompute.flows.terminal import run_logged
    from precompute.pipeline import load_pipeline

    before = {key: os.environ.get(key) for key in [*environment, "PRECOMPUTE_REDIS_URL"]}
    try:
        with redis_server(folder / "redis") as url:
            os.environ.update({**environment, "PRECOMPUTE_REDIS_URL": url})
            pipeline = load_pipeline(folder / "precompute.toml")
            report, _ = run_logged(pipeline)
            with running(ServiceSettings(port=free_port()), pipeline=pipeline, log=folder / "service.log") as base:
                yield report, base
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
