"""One size of `precompute bench scale`, in a process of its own: `python -m precompute.bench.scale.run SIZE_DIR`.

Runs the real nightly flow on SIZE_DIR/precompute.toml with a throwaway redis-server, the
work directory and the Qdrant edge store under SIZE_DIR (set by the parent through
PRECOMPUTE_JOB_WORK_DIR and PRECOMPUTE_QDRANT_PATH), and writes SIZE_DIR/result.json: per run,
the run report (each output's steps and stages timed), peak RSS, Redis memory and
Qdrant disk. With --rerun-share, a second run follows on the same stores after that share
of the corpus texts changed and of the users got new interactions (what a nightly rerun recomputes),
then a third on the same inputs again: an unchanged night.
A process per size keeps the sizes independent and the driver's peak RSS its own.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from precompute.bench.scale.data import change_inputs
from precompute.bench.scale.memory import PeakRss, disk_bytes, redis_used_memory
from precompute.stores.key_value.server import redis_server

# As `precompute run` does (precompute/cli.py): Prefect's temporary server, offline, on a loaded machine.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")


def run_once(pipeline: Path, redis_url: str) -> dict[str, Any]:
    # Imported here, after the Prefect settings above are in the environment.
    from precompute.flows.nightly import RunFailedError, nightly
    from precompute.flows.run_log import output_to_file
    from precompute.jobs.settings import JobSettings
    from precompute.stores.vectors.settings import VectorStoreSettings

    before = redis_used_memory(redis_url)
    start = time.perf_counter()
    with PeakRss() as rss, output_to_file(JobSettings().work_dir.machine_dir() / "logs") as (log, _, _):
        state = nightly(pipeline=str(pipeline), return_state=True)
        report = state.result(raise_on_failure=False)
    if not isinstance(report, dict):  # some outputs failed: the report file still has every output's fields
        if not isinstance(report, RunFailedError):
            raise SystemExit(f"the nightly flow failed: {report!r} (log: {log})")
        report = json.loads(report.report.read_text())
    return {
        "report": report,
        "wall_s": round(time.perf_counter() - start, 2),
        "driver_rss": rss.driver,
        "rss_by_title": rss.by_title,
        "uss_by_title": rss.uss_by_title,
        "own_by_title": rss.own_by_title,
        "store_by_title": rss.store_by_title,
        "redis_used_memory_before": before,
        "redis_used_memory_after": redis_used_memory(redis_url),
        "qdrant_disk_bytes": disk_bytes(VectorStoreSettings().path),
        "log": str(log),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("size_dir", type=Path)
    parser.add_argument("--rerun-share", type=float, default=0.0)
    args = parser.parse_args()
    size_dir: Path = args.size_dir
    pipeline = size_dir / "precompute.toml"
    runs: list[dict[str, Any]] = []
    result = size_dir / "result.json"
    with redis_server(size_dir / "redis") as url:
        os.environ["PRECOMPUTE_REDIS_URL"] = url
        runs.append(run_once(pipeline, url))
        result.write_text(json.dumps(runs, indent=2))  # kept if the rerun is interrupted
        if args.rerun_share > 0:
            changed = change_inputs(size_dir, args.rerun_share)
            runs.append({**run_once(pipeline, url), "changed": changed})
            result.write_text(json.dumps(runs, indent=2))
            runs.append({**run_once(pipeline, url), "changed": {"texts_changed": 0, "users_changed": 0}})
            result.write_text(json.dumps(runs, indent=2))


if __name__ == "__main__":
    main()
