"""Join the Ray cluster named in settings, or start a local Ray for this process; the
resources every inference actor pool asks for."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import ray
from ray.data import ActorPoolStrategy


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


def actor_pool(size: int, gpus: bool) -> dict[str, Any]:
    """`map_batches` options of an inference actor pool: one GPU per actor where there are
    GPUs. On CPU the engine's threads use every core anyway; half a CPU in Ray's books leaves
    room for the read tasks, while an actor taking all CPUs of a node hangs the dataset
    silently (STACK.md)."""
    return {
        "compute": ActorPoolStrategy(size=size),
        "num_gpus": 1 if gpus else 0,
        "num_cpus": 1 if gpus else 0.5,
    }
