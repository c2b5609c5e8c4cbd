"""The one way a test waits: for a condition, not for a time.

A test that asserts on elapsed time fails on a loaded machine; one that sleeps and then looks
fails the same way. `wait_for` polls a condition and returns as soon as it holds; its ceiling is
generous and only guards against a hang, so how long anything took is never what a test checks
(speed is for bench/).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
CEILING_S = 120.0
"""Far past any expected wait on a busy 2-core machine: reaching it means a hang, not slowness."""


def wait_for(condition: Callable[[], T], what: str, ceiling_s: float = CEILING_S, every_s: float = 0.02) -> T:
    """Poll `condition` until it returns something truthy, and return that; fail naming `what`
    past the ceiling."""
    deadline = time.monotonic() + ceiling_s
    while not (result := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"still waiting after {ceiling_s:g} s for {what}")
        time.sleep(every_s)
    return result
