"""`precompute bench scale`: every stage of the nightly flow at growing sizes, and how each grows.

For each size N (rows of corpus; about N/10 users, bench/scale/data.py), a process of its own
runs the real nightly flow (bench/scale/run.py) on generated inputs with three outputs
(embeddings, labels, recs), a small random encoder (bench/scale/model.py) unless --model
names another, a throwaway redis-server and an in-process Qdrant under the bench directory.
Stage seconds come from the run report (and Prefect's task times for GC and the recs check);
the growth exponent of a stage between the two largest sizes is log(t2/t1) / log(n2/n1):
1 is linear, 2 quadratic. The largest size then runs again with 1% of its texts changed (in the
newest of the corpus's files, bench/scale/data.py) and 1% of its users' new interactions in a file
added to the interactions' log, to show what a nightly rerun recomputes, and a third time on the
same inputs: an unchanged night's wall time beside the full run's.

There is no baseline to run beside: the reference is linear growth (exponent 1), printed
next to every stage. The run's record (bench/records.py) sets the full night's wall seconds at
the largest size against the next size's scaled linearly, what exponent 1 predicts: a ratio
above 1, the night grew slower than linear (with one size, the night is its own baseline).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from precompute.bench.records import Figure, write_record
from precompute.bench.scale.data import write_inputs
from precompute.bench.scale.model import small_encoder
from precompute.bench.scale.stages import (
    STAGES,
    Run,
    corpus_rows,
    records_written,
    recs_report,
    recs_users,
    search_figures,
)
from precompute.models.hardware import device_fingerprint

SIZES = (10_000, 100_000, 1_000_000)
RERUN_SHARE = 0.01
RESOLUTION_S = 0.001
"""The run report rounds seconds to 0.001: a shorter stage counts as this long in an exponent."""
DEFAULT_DIR = Path.home() / ".local" / "share" / "precompute" / "bench-scale"
MB = 1e6
POPULARITY_WEIGHT = 10.0
"""A random model's content scores, and ALS on these sparse generated lists, rank items worse
than popularity (leave-one-out hit-rate at 100,000 rows with the default 0.4: ALS + content
0.063 against most-popular's 0.119), which the flow refuses to publish; ranked by popularity
first and the model within it, they come close (0.1188). The weight changes no cost: it is one
coordinate of the score's dot product."""
MIN_LIFT = 0.5
"""... but only close, and less so as the catalogue grows: NDCG@10 0.1181 against most-popular's
0.1198 at 100,000 rows (a 1% rerun), 0.0511 against 0.0604 at 1M, which the flow's default (1.0)
refuses, and with it every recs stage's time. This bench measures time, so it lowers the bar
far enough for the recs to publish at every size; the report's held-out figures say how far."""
MIN_ROWS = 400
"""The gate needs 16 texts of the corpus's held-out tenth, with room to spare."""

def exponent(n1: int, t1: float | None, n2: int, t2: float | None) -> float | None:
    if t1 is None or t2 is None or n1 == n2:
        return None
    return round(math.log(max(t2, RESOLUTION_S) / max(t1, RESOLUTION_S)) / math.log(n2 / n1), 2)


def pipeline_file(model: Path, rows: int) -> str:
    """Three outputs over the generated inputs. Every output keeps no older version, so a
    rerun's GC deletes the previous one: the GC figure is a whole version's deletion. The
    gate takes its usual 256 texts where the corpus's held-out tenth has them, fewer below."""
    gate = f"engine = {{ gate_texts = {min(256, max(16, rows // 20))}, calibration_texts = {min(128, max(8, rows // 20))} }}"
    return f"""[outputs.embeddings]
kind = "embeddings"
input = {{ path = "corpus", id = "id", text = "text" }}
model = {{ path = "{model}" }}
{gate}
store = "scale"
keep_versions = 0

[outputs.labels]
kind = "labels"
input = {{ path = "corpus", id = "id", text = "text", label = "section" }}
model = {{ path = "{model}" }}
{gate}
train_texts = 5000
fine_tune_seconds = 0
keep_versions = 0

[outputs.recs]
kind = "recs"
input = {{ path = "interactions", user = "user_id", item = "item_id", weight = "weight" }}
items = "embeddings"
popularity_weight = {POPULARITY_WEIGHT}
min_lift = {MIN_LIFT}
keep_versions = 0
"""


def run_size(size_dir: Path, rows: int, model: Path, rerun: bool) -> list[Run]:
    """Fresh inputs and stores for `rows`, the nightly flow in a child process; its runs."""
    shutil.rmtree(size_dir, ignore_errors=True)
    write_inputs(size_dir, rows)
    (size_dir / "precompute.toml").write_text(pipeline_file(model, rows))
    env = {
        **os.environ,
        "PRECOMPUTE_JOB_WORK_DIR": str(size_dir / "work"),
        "PRECOMPUTE_QDRANT_PATH": str(size_dir / "qdrant"),
    }
    command = [sys.executable, "-m", "precompute.bench.scale.run", str(size_dir)]
    if rerun:
        command += ["--rerun-share", str(RERUN_SHARE)]
    print(
        f"{rows:>9,} rows: running{' and rerunning' if rerun else ''} (logs under {size_dir / 'work' / 'logs'})",
        flush=True,
    )
    start = time.perf_counter()
    subprocess.run(command, env=env, check=True, cwd=Path(__file__).resolve().parents[1])
    print(f"{rows:>9,} rows: done in {time.perf_counter() - start:,.0f} s", flush=True)
    return json.loads((size_dir / "result.json").read_text())


def memory(run: Run) -> dict[str, Any]:
    records = records_written(run)
    redis_bytes = run["redis_used_memory_after"] - run["redis_used_memory_before"]
    ray = {name: rss for name, rss in run["rss_by_title"].items() if name.startswith("ray::")}

    def ray_mb(peaks: dict[str, int]) -> dict[str, float]:
        return {name: round(value / MB, 1) for name, value in sorted(peaks.items()) if name.startswith("ray::")}

    return {
        "driver_peak_rss_mb": round(run["driver_rss"] / MB, 1),
        "ray_peak_rss_mb": ray_mb(ray),
        "ray_peak_uss_mb": ray_mb(run["uss_by_title"]),
        "ray_peak_own_mb": ray_mb(run["own_by_title"]),
        "ray_peak_store_mb": ray_mb(run["store_by_title"]),
        "redis_server_peak_rss_mb": round(run["rss_by_title"].get("redis-server", 0) / MB, 1),
        "redis_used_memory_mb": round(redis_bytes / MB, 1),
        "redis_bytes_per_record": round(redis_bytes / records, 1) if records else None,
        "qdrant_disk_mb": round(run["qdrant_disk_bytes"] / MB, 1),
        "qdrant_disk_bytes_per_row": round(run["qdrant_disk_bytes"] / corpus_rows(run), 1)
        if corpus_rows(run)
        else None,
    }


def own_ratios(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
    """Each Ray process kind's peak USS outside the object store, larger size over smaller: the
    issue's "per-actor memory at 1M over 100k"."""
    own, grown = before["ray_peak_own_mb"], after["ray_peak_own_mb"]
    return {name: round(grown[name] / own[name], 2) for name in sorted(own.keys() & grown.keys()) if own[name]}


def engines(run: Run) -> dict[str, str]:
    """backend/device/precision each encoder output served, and whether a gate refused a faster one."""
    out = {}
    for name in ("embeddings", "labels"):
        fields = run["report"]["outputs"].get(name, {})
        engine = fields.get("engine")
        if engine:
            refused = [g.get("precision") for g in fields.get("gate") or [] if not g.get("passed", True)]
            note = f" ({', '.join(map(str, refused))} refused by the gate)" if refused else ""
            out[name] = f"{engine['backend']}/{engine['device']}/{engine['precision']}{note}"
    return out


def share(part: float | None, whole: float | None) -> float | None:
    """part / whole in percent, where both were measured."""
    return None if part is None or not whole else round(100 * part / whole, 1)


def rerun_figures(first: Run, rerun: Run) -> dict[str, Any]:
    outputs = rerun["report"]["outputs"]
    seconds = {name: stage.seconds(rerun) for name, stage in STAGES.items()}
    first_seconds = {name: stage.seconds(first) for name, stage in STAGES.items()}
    pick = {
        "embeddings": ("reused", "computed"),
        "labels": ("reused", "computed"),
        "recs": ("rescored", "copied", "mode", "mode_reason", "als"),
    }
    return {
        "rows": corpus_rows(rerun),
        **rerun.get("changed", {}),
        **{name: {key: outputs.get(name, {}).get(key) for key in keys} for name, keys in pick.items()},
        "seconds": seconds,
        "first_run_seconds": first_seconds,
        "percent_of_first": {name: share(seconds[name], first_seconds[name]) for name in STAGES},
        "wall_s": rerun["wall_s"],
        "first_wall_s": first["wall_s"],
        "wall_percent_of_first": share(rerun["wall_s"], first["wall_s"]),
    }


def table(sizes: list[int], runs: dict[int, Run], exponents: dict[str, float | None]) -> str:
    head = f"{'stage':<16}" + "".join(f"{n:>24,}" for n in sizes) + f"{'exponent':>10}"
    lines = [head + "   (seconds, rows/s; exponent between the two largest sizes, 1 = linear)"]
    for name, stage in STAGES.items():
        cells = []
        for n in sizes:
            seconds, rows = stage.seconds(runs[n]), stage.rows(runs[n])
            rate = f"{rows / max(seconds, RESOLUTION_S):,.0f}/s" if seconds is not None else ""
            cells.append(f"{'-' if seconds is None else f'{seconds:,.2f} s'} {rate:>11}")
        e = exponents[name]
        lines.append(
            f"{name:<16}"
            + "".join(f"{c:>24}" for c in cells)
            + f"{'-' if e is None else e:>10}   {stage.what}"
        )
    return "\n".join(lines)


def main(
    rows: list[int] | None = None, model: str | None = None, work_dir: str | None = None, rerun: bool = True
) -> dict[str, Any]:
    sizes = sorted(set(rows or SIZES))
    bench_dir = Path(work_dir) if work_dir else DEFAULT_DIR
    bench_dir.mkdir(parents=True, exist_ok=True)
    folder = Path(model).resolve() if model else small_encoder(bench_dir / "model")
    print(f"model {folder}; sizes {', '.join(f'{n:,}' for n in sizes)}; bench dir {bench_dir}")
    results = {n: run_size(bench_dir / f"rows-{n}", n, folder, rerun and n == sizes[-1]) for n in sizes}
    result = summary(results, folder)
    n1, n2 = sizes[-2:] if len(sizes) > 1 else (sizes[-1], sizes[-1])
    wall1, wall2 = results[n1][0]["wall_s"], results[n2][0]["wall_s"]
    write_record(
        "scale",
        result,
        dataset=f"generated corpus of {', '.join(f'{n:,}' for n in sizes)} rows, a tenth as many users",
        ours=Figure(f"nightly flow's wall time at {n2:,} rows", wall2, "s"),
        baseline=Figure(f"{n1:,} rows' wall time x {n2 / n1:g} (linear growth)", round(wall1 * n2 / n1, 2), "s"),
        higher_is_better=False,
    )
    return result


def summary(results: dict[int, list[Run]], folder: Path) -> dict[str, Any]:
    """Print the table, memory, recs and rerun lines of each size's runs (the first, and the
    rerun of the largest where there is one); return the figures, printed last as JSON."""
    sizes = sorted(results)
    runs = {n: result[0] for n, result in results.items()}
    n1, n2 = (sizes[-2], sizes[-1]) if len(sizes) > 1 else (sizes[-1], sizes[-1])
    exponents = {
        name: exponent(n1, stage.seconds(runs[n1]), n2, stage.seconds(runs[n2]))
        for name, stage in STAGES.items()
    }
    largest = runs[n2]
    rerun = rerun_figures(largest, results[n2][1]) if len(results[n2]) > 1 else None
    unchanged = rerun_figures(largest, results[n2][2]) if len(results[n2]) > 2 else None
    memories = {n: memory(runs[n]) for n in sizes}
    result: dict[str, Any] = {
        "bench": "scale",
        "machine": device_fingerprint("cpu"),
        "cpus": len(os.sched_getaffinity(0)),
        "model": str(folder),
        "engines": engines(largest),
        "sizes": sizes,
        "users": {n: recs_users(runs[n]) for n in sizes},
        "seconds": {name: {n: stage.seconds(runs[n]) for n in sizes} for name, stage in STAGES.items()},
        **{f"{name}_exponent": e for name, e in exponents.items()},
        "memory": memories,
        "own_memory_ratio": own_ratios(memories[n1], memories[n2]),
        "recs_published": {n: recs_report(runs[n]).get("validation", {}).get("published") for n in sizes},
        "recs_ranking": {n: recs_report(runs[n]).get("ranking") for n in sizes},
        "recall_at_10": {
            n: runs[n]["report"]["outputs"].get("embeddings", {}).get("validation", {}).get("recall_at_10")
            for n in sizes
        },
        "search": {n: search_figures(runs[n]) for n in sizes},
        "failed": {n: runs[n]["report"].get("failed", {}) for n in sizes if runs[n]["report"].get("failed")},
        "rerun": rerun,
        "unchanged": unchanged,
    }
    print(table(sizes, runs, exponents))
    for n in sizes:
        m = result["memory"][n]
        uss = m["ray_peak_uss_mb"]
        ray = ", ".join(
            f"{name.removeprefix('ray::')} {mb:,.0f} ({uss.get(name, 0):,.0f})"
            for name, mb in sorted(m["ray_peak_rss_mb"].items(), key=lambda item: -item[1])[:6]
        )
        print(
            f"memory at {n:,} rows: driver peak RSS {m['driver_peak_rss_mb']:,.0f} MB; Ray's largest peak RSS (USS) per process kind (MB): {ray}; "
            f"redis-server {m['redis_server_peak_rss_mb']:,.0f} MB; Redis used_memory +{m['redis_used_memory_mb']:,.1f} MB = "
            f"{m['redis_bytes_per_record']} B/record ({records_written(runs[n]):,} labels + recs records); "
            f"Qdrant disk {m['qdrant_disk_mb']:,.1f} MB = {m['qdrant_disk_bytes_per_row']} B/row"
        )
    if n1 != n2:
        before, after = result["memory"][n1], result["memory"][n2]
        print(
            f"per process kind, {n1:,} -> {n2:,} rows, peak USS outside Ray's object store (MB; the store's "
            "pages only it maps in brackets): "
            + ", ".join(
                f"{name.removeprefix('ray::')} {before['ray_peak_own_mb'][name]:,.0f} -> "
                f"{after['ray_peak_own_mb'][name]:,.0f} ({ratio}x; {before['ray_peak_store_mb'][name]:,.0f} -> "
                f"{after['ray_peak_store_mb'][name]:,.0f})"
                for name, ratio in result["own_memory_ratio"].items()
            )
        )
    for n in sizes:
        ranking = result["recs_ranking"][n] or {}
        print(
            f"recs at {n:,} rows: {recs_users(runs[n]):,} users, model {result['recs_published'][n]}, "
            f"{ranking.get('reason')}; index build {ranking.get('build_s')} s, curve {ranking.get('curve')}"
        )
    for n in sizes:
        chosen = result["search"][n]
        print(
            f"search at {n:,} rows: the index check chose {chosen.get('params')} (recall@10 "
            f"{chosen.get('recall_at_10')}, check queries p50 {chosen.get('median_ms')} ms, p99 {chosen.get('p99_ms')} ms "
            f"in process); curve {chosen.get('curve')}"
        )
    if rerun:
        print(
            f"rerun of {rerun['rows']:,} rows with {rerun.get('texts_changed')} texts and {rerun.get('users_changed')} users' "
            f"new interactions: embeddings reused {rerun['embeddings']['reused']}, computed {rerun['embeddings']['computed']}; "
            f"labels reused {rerun['labels']['reused']}, computed {rerun['labels']['computed']}; "
            f"recs rescored {rerun['recs']['rescored']}, copied {rerun['recs']['copied']} (mode {rerun['recs']['mode']}; "
            f"ALS {rerun['recs'].get('als')})"
        )
        print("rerun seconds: " + ", ".join(f"{k} {v}" for k, v in rerun["seconds"].items()))
        print("rerun / full run: " + ", ".join(f"{k} {v}%" for k, v in rerun["percent_of_first"].items()))
        print(f"wall: full run {rerun['first_wall_s']} s, 1% rerun {rerun['wall_s']} s ({rerun['wall_percent_of_first']}%)")
    if unchanged:
        print(
            f"unchanged night (the same inputs again): wall {unchanged['wall_s']} s, "
            f"{unchanged['wall_percent_of_first']}% of the full run's {unchanged['first_wall_s']} s; seconds: "
            + ", ".join(f"{k} {v}" for k, v in unchanged["seconds"].items())
        )
    for name, engine in result["engines"].items():
        print(f"engine {name}: {engine}")
    if result["failed"]:
        print(f"failed outputs: {result['failed']}")
    print(f"machine {result['machine']}, {result['cpus']} CPUs")
    print(json.dumps(result))
    return result
