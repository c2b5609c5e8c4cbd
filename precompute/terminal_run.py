"""The nightly flow run for a person at a terminal (`precompute run`, `precompute demo`).

Its output (Prefect's, Ray's, the jobs', tracebacks) goes to a log file; the terminal gets one
line per failed output with the step and the cause, then the report's and the log's paths.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from flows.nightly import RunFailedError, nightly, report_path
from jobs.settings import JobSettings
from precompute.pipeline import Pipeline
from precompute.run_log import failure_line, output_to_file


def run_logged(pipeline: Pipeline) -> tuple[dict[str, Any], Path]:
    """(the run report with its `path`, the log file); SystemExit(1) after the failure lines."""
    work_dir = JobSettings().work_dir
    with output_to_file(work_dir / "logs") as (log, _, err):
        try:
            report = nightly(pipeline=str(pipeline.path))
        except RunFailedError as e:
            for output, why in e.failed.items():
                print(f"error: {output} failed at {why}", file=err)
            print(f"report: {e.report}, log: {log}", file=err)
            raise SystemExit(1) from None
        except Exception as e:  # the flow itself failed: another run in progress, Prefect's API, a bug
            logging.getLogger(__name__).exception("the run failed")
            print(f"error: the run failed: {failure_line(e)} (log: {log})", file=err)
            raise SystemExit(1) from None
    return {**report, "path": str(report_path(work_dir, report["run"]))}, log
