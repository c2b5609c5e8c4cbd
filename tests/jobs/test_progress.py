"""Progress lines (jobs/progress.py, precompute/terminal_run.py): rows done of total while a stage
runs, on real Ray; redrawn on a terminal, plain lines at an interval elsewhere."""

from __future__ import annotations

import io
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pyarrow as pa
import pytest
import ray
from ray.actor import ActorHandle

from precompute.flows.terminal import progress_on
from precompute.jobs import progress


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.seen: list[progress.Progress] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append(record.progress)  # type: ignore[attr-defined]


@contextmanager
def collected() -> Iterator[Collect]:
    """The progress records logged meanwhile, DEBUG ones (the running lines) included."""
    collect = Collect()
    progress.LOG.addHandler(collect)
    progress.LOG.setLevel(logging.DEBUG)
    try:
        yield collect
    finally:
        progress.LOG.removeHandler(collect)
        progress.LOG.setLevel(logging.NOTSET)


class SlowActor:
    """An inference actor as the jobs write one: it counts each batch it is done with."""

    def __init__(self, counter: ActorHandle | None) -> None:
        self.counter = counter

    def __call__(self, batch: pa.Table) -> pa.Table:
        time.sleep(0.3)
        progress.add(self.counter, batch.num_rows)
        return batch


@pytest.mark.slow
def test_a_stage_reports_rows_done_of_total_while_it_runs(ray_local) -> None:
    with collected() as collect, progress.stage("docs", "embed", 1000, counted="actors") as counter:
        ray.data.range(1000, override_num_blocks=10).map_batches(
            SlowActor,
            fn_constructor_kwargs={"counter": counter},
            batch_size=100,
            batch_format="pyarrow",
            concurrency=1,
        ).materialize()
    *running, last = collect.seen
    assert any(0 < p.rows < 1000 for p in running if p.rows is not None)  # seen mid-way
    assert [p.rows for p in running if p.rows is not None] == sorted(
        p.rows for p in running if p.rows is not None
    )
    assert last.ended and not last.failed and last.rows == 1000
    assert last.line().startswith("docs embed: 1,000 rows in ")


def test_a_stage_the_driver_does_counts_its_rows_itself() -> None:
    """No counter actor (whose start a short stage would wait for at its end): the driver's own
    count, read by the stage's reporting thread while it runs."""
    with collected() as collect, progress.stage("recs", "top-k", 300, counted="driver") as counter:
        assert isinstance(counter, progress.DriverCount)
        for _ in range(3):
            progress.add(counter, 100)
            time.sleep(0.6)
    *running, last = collect.seen
    assert any(0 < p.rows < 300 for p in running)  # seen mid-way
    assert last.ended and not last.failed and last.rows == 300
    assert last.line().startswith("recs top-k: 300 rows in ")


def test_off_a_terminal_progress_is_plain_lines_at_an_interval() -> None:
    out = io.StringIO()  # not a terminal
    with progress_on(out):
        for rows in (10, 20, 30):
            progress.LOG.debug("", extra={"progress": progress.Progress("docs", "embed", 1.0, rows, 100)})
        progress.LOG.info(
            "", extra={"progress": progress.Progress("docs", "embed", 2.0, 100, 100, ended=True)}
        )
    lines = out.getvalue().splitlines()
    assert lines == [
        "docs embed: 10/100 rows (10%), 10 rows/s, ETA 9 s",
        "docs embed: 100 rows in 2.0 s (50 rows/s)",
    ]
    assert "\r" not in out.getvalue()


def test_a_failed_stage_ends_its_line() -> None:
    line = progress.Progress("labels", "label", 12.0, 50, 100, ended=True, failed=True).line()
    assert line == "labels label: failed after 12 s"
