"""`precompute bench recs`: the recommendations' quality against the field's baselines on public
data, and the exact top-k step's speed against a plain GEMM.

Quality, per data set, with the job's default settings (the model and weights a pipeline gets
when it names none; not tuned on these data sets). MovieLens 100K and 1M (bench/recs/data.py,
from the registry): what the lookup service serves after the nightly flow ran on all but each
user's true last interaction, scored against it, beside the job's own estimate and the
baselines (bench/recs/served.py). The demo's Debian relations, which have no timestamps:
jobs/recs/quality.py's split and models in this process (HR@10, NDCG@10, coverage and cold
users served for the published model, item-kNN, markov, content, most-popular and the
collaborative part alone). Item texts (title, year, genres) are embedded by the bundled encoder.

Speed, on the last data set: BlockedTopK of EASE's towers over every user, a
block at a time (matmul into the reused score buffer, prior, seen items masked, topk), against
one torch.mm of the same [users, d] x [d, items] shapes into a preallocated output, no top-k:
the ceiling for any exact scorer that multiplies every column. Both count 2·U·I·d flops and take
turns in each repeat; ours scores a block of users on the columns its histories use
(jobs/recs/topk/exact.py active_columns), so its GFLOP/s are the dense product's flops over its time.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from precompute.bench.records import Figure, write_record
from precompute.bench.recs.data import DATASETS, load
from precompute.bench.recs.served import served_quality
from precompute.bench.recs.shop import shop
from precompute.demo_data import DEMO_CORPUS, demo_engine
from precompute.jobs.recs.history.seen import seen_by_user
from precompute.jobs.recs.models import train_towers
from precompute.jobs.recs.quality import (
    RecsQuality,
    evaluate,
    interactions_table,
    valid_interactions,
)
from precompute.jobs.recs.spec import RecsSpec
from precompute.jobs.recs.topk.exact import BlockedTopK, popularity_prior
from precompute.jobs.settings import JobSettings
from precompute.jobs.staging import committed_dataset
from precompute.jobs.text import content_cache
from precompute.jobs.text.embedding_cache import EMBEDDING, embeddings_of
from precompute.models import load_encoder
from precompute.models.hardware import device_fingerprint
from precompute.pipeline import load_pipeline

DEFAULT = "ml-1m"
BASELINES = ("markov", "itemknn", "most_popular", "personal_top_frequency")
TITLES = {
    "demo": "demo corpus's package relations, a seeded random split",
    "ml-100k": "MovieLens 100K, each user's last interaction held out",
    "ml-1m": "MovieLens 1M, each user's last interaction held out",
    "shop": "a generated grocery shop's orders (bench/recs/shop.py), each user's last order held out",
}
BASKET_KEYS = (
    "basket_recall10",
    "personal_top_frequency_recall10",
    "recall_ratio_vs_personal_top_frequency",
    "new_item_ndcg10",
    "most_popular_new_item_ndcg10",
    "itemknn_new_item_ndcg10",
)
"""The shop's figures the last line carries beside the default data set's."""
"""How a bench record names each data set."""


def item_embeddings(texts: list[str]) -> tuple[np.ndarray, str]:
    """(vectors, where they came from)."""
    engine = demo_engine()
    keys = content_cache.content_keys(engine.model.hash, texts)
    cache = {}
    if previous := content_cache.previous_run(JobSettings().work_dir / "cache" / "embeddings"):
        table = committed_dataset(previous).to_table(columns=[content_cache.KEY, EMBEDDING])
        cache = dict(zip(table[content_cache.KEY].to_pylist(), embeddings_of(table), strict=True))
    if all(key in cache for key in keys):
        return np.stack([cache[key] for key in keys]), "the embedding job's cache"
    with load_encoder(engine) as encoder:
        report = encoder.report
        return encoder.encode(texts), f"computed by {report.backend}/{report.device}/{report.precision}"


def take_turns(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median seconds of each, after one warm-up call each."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():
        fn()
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def demo_data() -> tuple[list[str], np.ndarray, pa.Table, str]:
    corpus = pq.read_table(DEMO_CORPUS, columns=["id", "text"])
    ids = corpus["id"].to_pylist()
    vectors, source = item_embeddings(corpus["text"].to_pylist())
    pipeline = load_pipeline()
    table = interactions_table(pipeline.outputs[pipeline.default("recs") or "recs"].input)
    return ids, vectors, table, source


def print_quality(name: str, quality: RecsQuality, rows: int) -> None:
    print(
        f"{name}: {rows:,} interactions, {quality.split} split, {quality.users:,} users evaluated of "
        f"{quality.sampled_from:,}, {quality.cold_users} cold; published model {quality.published}"
    )
    print(f"  {'model':14} {'HR@10':>7} {'NDCG@10':>8} {'coverage':>9} {'cold served':>12}")
    for model, figures in quality.models.items():
        cold = "-" if figures.cold_served is None else f"{figures.cold_served:.3f}"
        print(f"  {model:14} {figures.hit_rate:7.4f} {figures.ndcg:8.4f} {figures.coverage:9.4f} {cold:>12}")


def speed(ids: list[str], good: pa.Table, settings: RecsSpec, repeats: int, block: int) -> dict[str, object]:
    """GFLOP/s of the top-k over every user against a plain GEMM of the same shapes, for EASE's
    towers (the widest here: a column per item)."""
    seen = seen_by_user(good)
    towers = train_towers("ease", seen, np.zeros((len(ids), 1), np.float32), settings)
    prior = popularity_prior(np.bincount(seen.items, minlength=len(ids)), settings.popularity_weight)
    ranker = BlockedTopK(towers.items, settings.k, block, prior)
    users = torch.from_numpy(towers.users(seen))
    full = torch.empty((len(users), len(ids)), device=ranker.device)

    def gemm() -> None:
        torch.mm(users, ranker.items.T, out=full)
        if full.is_cuda:
            torch.cuda.synchronize()

    seconds = take_turns({"ours": lambda: ranker(users, seen), "gemm": gemm}, repeats)
    gflop = 2 * len(users) * len(ids) * towers.items.shape[1] / 1e9
    return {
        "device": torch.cuda.get_device_name() if ranker.device.type == "cuda" else "cpu",
        "torch_threads": torch.get_num_threads(),
        "model": towers.name,
        "users": len(users),
        "items": len(ids),
        "dim": towers.items.shape[1],
        "block": block,
        "ours_gflops": round(gflop / seconds["ours"], 1),
        "ours_users_per_s": round(len(users) / seconds["ours"], 1),
        "baseline": "torch.mm [U,d]x[d,I] into a preallocated output, no top-k",
        "baseline_gflops": round(gflop / seconds["gemm"], 1),
        "ratio": round(seconds["gemm"] / seconds["ours"], 2),
    }


def ndcg10(figures: dict[str, Any]) -> dict[str, float]:
    """NDCG@10 of the published model and of each baseline measured, from a data set's figures:
    the demo's (jobs/recs/quality.py) or a served one's (bench/recs/served.py)."""
    if "models" in figures:
        return {model: q["ndcg"] for model, q in figures["models"].items() if model in ("published", *BASELINES)}
    return {model: figures[f"{model}_ndcg10"] for model in ("published", *BASELINES)}


def print_served(figures: dict[str, Any]) -> None:
    print(
        f"{figures['dataset']}: {figures['users']:,} users' true last {figures['target']} held out, "
        f"{figures['served']:,} served by the lookup service; published model {figures['published_model']} "
        f"(trained in {figures['train_s']:.0f} s)"
    )
    print(f"  {'model':14} {'HR@10':>7} {'NDCG@10':>8}")
    for model in ("published", "markov", "itemknn", "most_popular", "personal_top_frequency"):
        print(f"  {model:22} {figures[f'{model}_hr10']:7.4f} {figures[f'{model}_ndcg10']:8.4f}")
    print(f"  seen items: {figures['seen']}")
    if figures["target"] == "basket":
        print(
            f"  basket recall@10 {figures['basket_recall10']:.4f} against personal top-frequency's "
            f"{figures['personal_top_frequency_recall10']:.4f} ({figures['recall_ratio_vs_personal_top_frequency']}x); "
            f"new-item NDCG@10 {figures['new_item_ndcg10']:.4f} (seen excluded) against most-popular's "
            f"{figures['most_popular_new_item_ndcg10']:.4f} and item-kNN's {figures['itemknn_new_item_ndcg10']:.4f}"
        )
    print(f"  the job's own estimate: NDCG@10 {figures['job_estimate_ndcg10']:.4f}; its candidates:")
    for candidate, measured in figures["job_candidates"].items():
        print(f"  {candidate:14} {measured['hr10']:7.4f} {measured['ndcg10']:8.4f}")


def main(
    datasets: str = "demo,ml-100k,ml-1m",
    repeats: int = 5,
    block: int | None = None,
    cache: Path | None = None,
) -> dict[str, object]:
    """datasets: demo and names of bench/recs_data.DATASETS; the last one's speed is measured.
    The demo (no time column) is measured by the job's own split in this process; a public data
    set by what the service serves (bench/recs/served.py)."""
    settings, job = RecsSpec(), JobSettings()
    block = block or job.users_per_block
    cache = cache or job.work_dir.machine_dir() / "datasets"
    names = datasets.split(",")
    if unknown := set(names) - {"demo", "shop", *DATASETS}:
        raise ValueError(f"unknown data sets {sorted(unknown)}: choose from demo, shop, {', '.join(DATASETS)}")
    result: dict[str, Any] = {"bench": "recs", "machine": device_fingerprint("cpu"), "datasets": {}}
    print(
        f"default settings: model {settings.model}, content_weight {settings.content_weight}, "
        f"popularity_weight {settings.popularity_weight}"
    )
    for name in names:
        if name == "demo":
            ids, vectors, table, source = demo_data()
            good = valid_interactions(table, ids)
            quality, _ = evaluate(good, vectors, settings)
            print_quality(name, quality, good.num_rows)
            print(f"  item vectors: {source}")
            result["datasets"][name] = {"interactions": good.num_rows, "items": len(ids), **asdict(quality)}
            continue
        if name == "shop":
            items, interactions = shop()
            columns = ["user_id", "item_id", "time", "basket"]
        else:
            items, interactions = load(name, cache)
            columns = ["user_id", "item_id", "time"]
        ids = items["id"].to_pylist()
        good = valid_interactions(interactions.rename_columns(columns), ids)
        figures = served_quality(name, items, good, job.work_dir.machine_dir() / "bench-recs" / name, settings)
        print_served(figures)
        result["datasets"][name] = figures
    timing = speed(ids, good, settings, repeats, block)
    print(
        f"top-k speed on {name} ({timing['model']}, {timing['users']} users x {timing['items']} items x "
        f"{timing['dim']} dims, {timing['device']}, {timing['torch_threads']} threads, median of {repeats}): "
        f"ours {timing['ours_gflops']} GFLOP/s ({timing['ours_users_per_s']:.0f} users/s), "
        f"baseline {timing['baseline_gflops']} GFLOP/s ({timing['baseline']}), ratio {timing['ratio']}x"
    )
    result["speed"] = timing
    print(f"machine {result['machine']}")
    print(json.dumps(result))
    public = [name for name in names if name != "demo"]
    if public:  # the last line: the default data set's served figures (and the shop's), as the issue tracker reads them
        last = result["datasets"][DEFAULT if DEFAULT in public else public[-1]]
        line = {k: v for k, v in last.items() if k not in ("job_candidates", "sequence")}
        if "shop" in public:
            line |= {key: result["datasets"]["shop"][key] for key in BASKET_KEYS}
        print(json.dumps(line))
    scores = ndcg10(result["datasets"][name])
    rival = max((model for model in BASELINES if model in scores), key=scores.__getitem__)
    write_record(
        "recs",
        result,
        dataset=TITLES[name],
        ours=Figure("published model's NDCG@10", scores["published"], "NDCG@10"),
        baseline=Figure(f"best baseline's NDCG@10 ({rival})", scores[rival], "NDCG@10"),
        device="cpu" if timing["device"] == "cpu" else "cuda",
    )
    return result


if __name__ == "__main__":
    main()
