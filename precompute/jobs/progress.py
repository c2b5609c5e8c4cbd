"""How far a job's stage is: rows done of total, rows/s, ETA, as log records a terminal draws.

A job runs each stage inside `stage(output, name, total)`. Where it counts rows, its inference
actors `add` each batch's rows to a counter actor (fire and forget: nothing waits on it), or the
driver to a count of its own where it does the stage's work itself (DriverCount), and a thread
on the driver logs a `precompute.progress` record once a second (DEBUG) and one when the stage
ends (INFO). precompute/terminal_run.py draws them as one live line per stage;
anywhere else only the end of each stage reaches the log.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import ray
from ray.actor import ActorHandle
from ray.exceptions import GetTimeoutError, RayActorError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

LOG = logging.getLogger("precompute.progress")
INTERVAL_S = 1.0
CURRENT: contextvars.ContextVar[tuple[str, str, float] | None] = contextvars.ContextVar("stage", default=None)
"""The stage the driver is in: (output, stage, its start), for `note`."""


@ray.remote(num_cpus=0)
class RowCounter:
    def __init__(self) -> None:
        self._rows = 0

    def add(self, rows: int) -> None:
        self._rows += rows

    def rows(self) -> int:
        return self._rows


class DriverCount:
    """Rows counted by the driver, where it does a stage's work itself: no counter actor, whose
    start a stage waits for at its end, and which can outlast all of an incremental night's
    top-k (`precompute bench scale`, its 1% rerun)."""

    def __init__(self) -> None:
        self.rows = 0


Counter = ActorHandle | DriverCount


def add(counter: Counter | None, rows: int) -> None:
    """Count `rows` as done: an inference actor calls this per batch (fire and forget), the
    driver per block it did."""
    if isinstance(counter, DriverCount):
        counter.rows += rows
    elif counter is not None:
        counter.add.remote(rows)


@dataclass(frozen=True)
class Progress:
    output: str
    stage: str
    seconds: float
    rows: int | None = None
    """Rows done; None where the stage counts none (or the count could not be read)."""
    total: int | None = None
    ended: bool = False
    failed: bool = False
    note: str | None = None
    """A step of a stage that counts no rows, in words (`note`)."""

    def line(self) -> str:
        head = f"{self.output} {self.stage}"
        if self.note is not None:
            return f"{head}: {self.note}"
        if self.failed:
            return f"{head}: failed after {self.seconds:.0f} s"
        if self.rows is None or not self.total:
            return f"{head}: {'done in ' if self.ended else ''}{self.seconds:.1f} s"
        rate = self.rows / self.seconds if self.seconds > 0 else 0.0
        if self.ended:
            return f"{head}: {self.rows:,} rows in {self.seconds:.1f} s ({rate:,.0f} rows/s)"
        eta = f"{(self.total - self.rows) / rate:.0f} s" if rate > 0 else "-"
        return (
            f"{head}: {self.rows:,}/{self.total:,} rows ({self.rows / self.total:.0%}), "
            f"{rate:,.0f} rows/s, ETA {eta}"
        )


@contextmanager
def stage(
    output: str, name: str, total: int | None = None, counted: Literal["actors", "driver"] | None = None
) -> Iterator[Counter | None]:
    """Report the stage while it runs; yields the counter its actors, or the driver, add rows to
    (as `counted`; None where it counts none)."""
    driver = DriverCount() if counted == "driver" else None
    actor = on_this_node(RowCounter) if counted == "actors" else None
    start = time.monotonic()

    def rows() -> int | None:
        if driver is not None:
            return driver.rows
        if actor is None:
            return None
        try:
            return ray.get(actor.rows.remote(), timeout=INTERVAL_S)
        except (GetTimeoutError, RayActorError):
            return None

    def report(level: int, **end: bool) -> None:
        progress = Progress(output, name, time.monotonic() - start, rows(), total, **end)
        LOG.log(level, "%s", progress.line(), extra={"progress": progress})

    def tick() -> None:
        if LOG.isEnabledFor(logging.DEBUG):
            report(logging.DEBUG)

    failed = False
    token = CURRENT.set((output, name, start))
    try:
        with every_interval(f"progress-{output}-{name}", tick):
            yield driver if driver is not None else actor
    except BaseException:
        failed = True
        raise
    finally:
        CURRENT.reset(token)
        if actor is not None and not failed:
            with contextlib.suppress(RayActorError):  # progress never fails a stage
                ray.get(actor.add.remote(0))  # behind it in the actor's queue: most writers' last adds
        report(logging.INFO, ended=True, failed=failed)
        if actor is not None:
            ray.kill(actor)


def on_this_node(actor_cls: Any) -> ActorHandle:
    """An actor of `actor_cls` on the driver's node: a worker node lost mid-stage must not take
    what it holds (a count, lines to relay) with it."""
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)
    return actor_cls.options(scheduling_strategy=here).remote()


@contextmanager
def every_interval(name: str, call: Callable[[], None]) -> Iterator[None]:
    """`call` on a thread of its own every INTERVAL_S while the block runs; the thread is joined
    before the block's caller goes on."""
    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(INTERVAL_S):
            call()

    thread = threading.Thread(target=tick, name=name, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def note(part: str, text: str) -> None:
    """One line on a step of the running stage that counts no rows (a candidate model trained, a
    training check), at INFO: in the log, and on the terminal as its own line. Outside a stage
    (a bench calling a job's parts, a Ray Train worker) it says nothing: there is no output to name."""
    if (current := CURRENT.get()) is None:
        return
    output, stage_name, start = current
    progress = Progress(output, f"{stage_name} {part}", time.monotonic() - start, ended=True, note=text)
    LOG.info("%s", progress.line(), extra={"progress": progress})


@ray.remote(num_cpus=0)
class Lines:
    """Lines a remote task logged, for the driver to relay (`relayed`)."""

    def __init__(self) -> None:
        self._lines: list[str] = []

    def add(self, line: str) -> None:
        self._lines.append(line)

    def since(self, seen: int) -> list[str]:
        return self._lines[seen:]


class _ToLines(logging.Handler):
    def __init__(self, lines: ActorHandle) -> None:
        super().__init__(logging.INFO)
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.add.remote(record.getMessage())


@contextmanager
def forwarded(lines: ActorHandle | None, logger: str) -> Iterator[None]:
    """In a remote task: `logger`'s INFO records go to `lines` (a `relayed` context's), the last
    of them delivered before the task returns."""
    if lines is None:
        yield
        return
    handler, log = _ToLines(lines), logging.getLogger(logger)
    log.addHandler(handler)
    level = log.level
    log.setLevel(min(level or logging.INFO, logging.INFO))
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
        with contextlib.suppress(RayActorError):
            ray.get(lines.since.remote(0))  # behind this task's adds in the actor's queue


@contextmanager
def relayed(output: str, part: str) -> Iterator[ActorHandle]:
    """Yields the Lines a remote task forwards its log to (`forwarded`); each line is logged here
    as a note of `output`'s `part` once a second, and the rest at the end: the engine ladder runs
    in its own task while the driver validates rows, and it takes minutes before a row is
    embedded on a cold cache."""
    lines = on_this_node(Lines)
    start = time.monotonic()
    seen = 0

    def relay() -> None:
        nonlocal seen
        with contextlib.suppress(GetTimeoutError, RayActorError):
            for text in ray.get(lines.since.remote(seen), timeout=10 * INTERVAL_S):
                seen += 1
                progress = Progress(output, part, time.monotonic() - start, ended=True, note=text)
                LOG.info("%s", progress.line(), extra={"progress": progress})

    try:
        with every_interval(f"relay-{output}-{part}", relay):
            yield lines
    finally:
        relay()
        ray.kill(lines)
