"""The nightly flow run for a person at a terminal (`precompute run`, `precompute demo`).

Its output (Prefect's, Ray's, the jobs', tracebacks) goes to a log file; the terminal gets one
live line per stage (jobs/progress.py: rows done of total, rows/s, ETA), then a summary table,
or one line per failed output with the step and the cause, then the report's and the log's
paths. `verbose` leaves everything on the terminal instead. Off a terminal (CI, cron), progress
comes as plain lines every PLAIN_INTERVAL_S, not redraws.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

from rich import box
from rich.console import Console
from rich.table import Table

from precompute.flows.failures import failure_line
from precompute.flows.nightly import RunFailedError, nightly
from precompute.flows.run_log import output_to_file
from precompute.flows.run_report import report_path
from precompute.jobs.progress import LOG, Progress
from precompute.jobs.settings import JobSettings
from precompute.jobs.work_dir import WorkPath
from precompute.pipeline import Pipeline

PLAIN_INTERVAL_S = 10.0


class ProgressLines(logging.Handler):
    """Draws jobs.progress records on `stream`: redrawn in place on a terminal, else plain lines."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__(logging.DEBUG)
        self.stream = stream
        self.redraw = stream.isatty()
        self.last = 0.0

    def emit(self, record: logging.LogRecord) -> None:
        progress: Progress | None = getattr(record, "progress", None)
        if progress is None:
            return
        if self.redraw:
            self.stream.write(f"\r{progress.line()}\x1b[K{chr(10) if progress.ended else ''}")
        elif progress.ended or time.monotonic() - self.last >= PLAIN_INTERVAL_S:
            self.stream.write(progress.line() + "\n")
            self.last = time.monotonic()
        self.stream.flush()


@contextmanager
def progress_on(stream: TextIO) -> Iterator[None]:
    """Progress records to `stream` only (each second's would bury a log file)."""
    handler = ProgressLines(stream)
    level, propagate = LOG.level, LOG.propagate
    LOG.addHandler(handler)
    LOG.setLevel(logging.DEBUG)
    LOG.propagate = False
    try:
        yield
    finally:
        LOG.removeHandler(handler)
        LOG.setLevel(level)
        LOG.propagate = propagate


@contextmanager
def terminal(work_dir: WorkPath, verbose: bool) -> Iterator[tuple[Path | None, TextIO, TextIO]]:
    """(the log file, None when verbose; the terminal's stdout and stderr)."""
    if verbose:
        with progress_on(sys.stdout):
            yield None, sys.stdout, sys.stderr
        return
    with output_to_file(work_dir.machine_dir() / "logs") as (log, out, err), progress_on(out):
        yield log, out, err


def run_logged(pipeline: Pipeline, verbose: bool = False) -> tuple[dict[str, Any], Path | None]:
    """(the run report with its `path`, the log file); SystemExit(1) after the failure lines."""
    work_dir = JobSettings().work_dir
    with terminal(work_dir, verbose) as (log, _, err):
        where = f"log: {log}" if log else "log: above"
        try:
            report = nightly(pipeline=str(pipeline.path))
        except RunFailedError as e:
            for output, why in e.failed.items():
                print(f"error: {output} failed at {why}", file=err)
            print(f"report: {e.report}, {where}", file=err)
            raise SystemExit(1) from None
        except Exception as e:  # the flow itself failed: another run in progress, Prefect's API, a bug
            logging.getLogger(__name__).exception("the run failed")
            print(f"error: the run failed: {failure_line(e)} ({where})", file=err)
            raise SystemExit(1) from None
    return {**report, "path": str(report_path(work_dir, report["run"]))}, log


def summary_table(report: dict[str, Any]) -> Table:
    """One row per output: what was published, from how many rows, and how long it took (its
    night's steps, in seconds). Fits 80 columns: no versions cut short."""
    table = Table(
        title=f"run {report['run']}",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        padding=(0, 1, 0, 0),
    )
    table.add_column("output", no_wrap=True)
    table.add_column("version", no_wrap=True)
    for column in ("rows", "rejects", "reused", "computed", "s"):
        table.add_column(column, justify="right", no_wrap=True)
    for output, fields in report["outputs"].items():
        table.add_row(
            output,
            fields["version"],
            f"{fields['rows']:,}",
            f"{fields['rejects']:,}",
            f"{fields['reused']:,}",
            f"{fields['computed']:,}",
            f"{sum(fields['steps'].values()):.0f}",
        )
    return table


def print_summary(report: dict[str, Any], log: Path | None) -> None:
    Console().print(summary_table(report))
    page = Path(report["path"]).with_suffix(".html")
    print(f"report: {page} (and {report['path']}){f', log: {log}' if log else ''}")
