"""The work directory's layout, and the clean-up that keeps it the size of what the stores hold.

    <work_dir>/runs/<output>/<version>/   a run's rejects and staged parts (jobs/staging.py)
    <work_dir>/cache/<output>/CURRENT     the run whose parts the next run reuses (jobs/content_cache.py)
    <work_dir>/reports/<run>.json|.html   run reports; logs/ and metrics/ beside them
"""

from __future__ import annotations

import shutil
from pathlib import Path


def runs(work_dir: Path, output: str) -> Path:
    return work_dir / "runs" / output


def run_dir(work_dir: Path, output: str, version: str) -> Path:
    return runs(work_dir, output) / version


def cache_dir(work_dir: Path, output: str) -> Path:
    return work_dir / "cache" / output


def collect_runs(runs: Path, current: str | None, kept: set[str]) -> None:
    """Delete the run folders (staged parts, rejects) of versions the store no longer holds,
    and of runs killed before they made one; newer folders are runs in progress."""
    if current is None or not runs.is_dir():
        return
    for run in runs.iterdir():
        if run.is_dir() and run.name < current and run.name not in kept:
            shutil.rmtree(run, ignore_errors=True)
