"""One JSON record per bench run, committed to git, from which `precompute bench report` renders
docs/benchmarks.md: the figures a page or a README quotes name the run they rest on.

A record (`write_record`) holds the bench's headline figure (`ours`) beside its in-run baseline,
their ratio (above 1: ours is ahead; ours / baseline where higher is better, baseline / ours
where lower is), the machine, the data set, the command line and the commit, and under `result`
the dict the bench printed, less any list over MAX_LIST items, so records stay small.

Where records go (`results_dir`): the folder PRECOMPUTE_BENCH_RESULTS names if set; else
bench/results/ of the checkout this package is imported from (the folder holding pyproject.toml
above precompute/); else, for a package installed elsewhere, bench/results/ under the current
directory. A record is never overwritten: its name carries the UTC time to the second,
`<date>T<HHMMSS>-<bench>-<machine>.json`.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from precompute.models.backends.base import ConcreteDevice
from precompute.models.hardware import CPU_FLAGS, cpu_model_and_flags, device_fingerprint

RESULTS_ENV = "PRECOMPUTE_BENCH_RESULTS"
MAX_LIST = 100
"""A list longer than this (per-request latencies, per-user figures) is left out of a record's `result`."""
GIB = 2**30


@dataclass(frozen=True)
class Figure:
    """One measured figure: what was measured, its value and its unit."""

    name: str
    value: float
    unit: str


def checkout() -> Path | None:
    """The repository this package runs from, or None where it is installed elsewhere."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").is_file() else None


def results_dir() -> Path:
    if folder := os.environ.get(RESULTS_ENV):
        return Path(folder)
    return (checkout() or Path.cwd()) / "bench" / "results"


def commit() -> str:
    """The checkout's short HEAD, "-dirty" when tracked files changed; "unknown" outside a checkout.
    git's optional locks are off: reading the state must not write the index."""
    root = checkout()
    if root is None:
        return "unknown"
    git = ["git", "--no-optional-locks", "-C", str(root)]
    try:
        head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        status = subprocess.run(
            [*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head.stdout.strip() + ("-dirty" if status.stdout.strip() else "")


def command() -> str:
    """The command line as typed: `precompute ...` when the CLI (or `python -m precompute`) runs."""
    program, args = Path(sys.argv[0]), sys.argv[1:]
    if program.name == "precompute" or (program.name == "__main__.py" and program.parent.name == "precompute"):
        return shlex.join(["precompute", *args])
    return shlex.join([program.name, *args])


def machine(device: ConcreteDevice) -> dict[str, Any]:
    """`class` groups records in the report: the device fingerprint engines are keyed by."""
    model, flags = cpu_model_and_flags()
    gpu, gpu_memory = None, None
    if device == "cuda":
        import torch

        gpu = torch.cuda.get_device_name()
        gpu_memory = round(torch.cuda.get_device_properties(0).total_memory / GIB, 1)
    return {
        "class": device_fingerprint(device),
        "cpu": model,
        "isa": [flag for flag in CPU_FLAGS if flag in flags],
        "cores": len(os.sched_getaffinity(0)),
        "gpu": gpu,
        "gpu_memory_gib": gpu_memory,
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB, 1),
    }


def slug(fields: dict[str, Any]) -> str:
    """The machine's part of a record's file name: its GPU or CPU model, lower case, trademarks,
    "CPU", "Processor" and the clock dropped (`nvidia-h200`, `amd-epyc-9454-48-core`)."""
    name = re.sub(r"\((r|tm)\)|\b(cpu|processor)\b|@.*", " ", (fields["gpu"] or fields["cpu"] or "").lower())
    return "-".join(re.findall(r"[a-z0-9]+", name)) or "unknown"


def compact(value: Any) -> Any:
    """`value` without the lists over MAX_LIST items, at any depth."""
    if isinstance(value, dict):
        return {
            key: compact(item)
            for key, item in value.items()
            if not (isinstance(item, list | tuple) and len(item) > MAX_LIST)
        }
    if isinstance(value, list | tuple):
        return [compact(item) for item in value]
    return value


def ratio_of(ours: Figure, baseline: Figure, higher_is_better: bool) -> float | None:
    """Above 1 when ours is ahead; None where the divisor is zero."""
    top, bottom = (ours.value, baseline.value) if higher_is_better else (baseline.value, ours.value)
    return round(top / bottom, 4) if bottom else None


def write_record(
    bench: str,
    result: dict[str, Any],
    *,
    dataset: str,
    ours: Figure,
    baseline: Figure,
    ratio: float | None = None,
    higher_is_better: bool = True,
    device: ConcreteDevice = "cpu",
) -> Path:
    """Write the run's record into `results_dir()` and return its path. `bench`: the command's
    name (`precompute bench <bench>`); `ratio`: the bench's own where it prints one, else
    computed from the two figures; `device`: where the measured side ran."""
    now = datetime.now(UTC)
    fields = machine(device)
    record = {
        "bench": bench,
        "command": command(),
        "commit": commit(),
        "date": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": fields,
        "dataset": dataset,
        "ours": asdict(ours),
        "baseline": asdict(baseline),
        "ratio": ratio_of(ours, baseline, higher_is_better) if ratio is None else ratio,
        "higher_is_better": higher_is_better,
        "result": compact(result),
    }
    folder = results_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{now:%Y-%m-%dT%H%M%S}-{bench}-{slug(fields)}.json"
    with path.open("x") as out:  # "x": an earlier record of the same second is never replaced
        out.write(json.dumps(record, indent=1) + "\n")
    print(f"record {path}", file=sys.stderr)
    return path
