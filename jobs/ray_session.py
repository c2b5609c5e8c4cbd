"""Join the Ray cluster named in settings, or start a local Ray for this process."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import ray


@contextmanager
def ray_session(address: str | None) -> Iterator[None]:
    """A caller that already initialised Ray (a test, a flow) keeps its session and owns its shutdown."""
    if ray.is_initialized():
        yield
        return
    if address:
        ray.init(address=address)
    else:
        ray.init(num_cpus=len(os.sched_getaffinity(0)), include_dashboard=False)
    try:
        yield
    finally:
        ray.shutdown()
