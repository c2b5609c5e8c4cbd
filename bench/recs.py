"""`precompute bench recs`: the recommendations' quality against the field's baselines on public
data, and the exact top-k step's speed against a plain GEMM.

Quality, per data set (bench/recs_data.py: MovieLens 100K and 1M from the registry, and the
demo's Debian relations, which have no timestamps): jobs/recs_quality.py's split and models,
run with the job's default settings (the model and weights a pipeline gets when it names
none; not tuned on these data sets): HR@10, NDCG@10, coverage and cold users served for the
model the flow would publish, item-kNN, first-order transitions (markov), content, most-popular and the collaborative part alone.
Item texts (title, year, genres) are embedded by the bundled encoder.

Speed, on the default data set: BlockedTopK of the published model's towers over every user, a
block at a time (matmul into the reused score buffer, prior, seen items masked, topk), against
one torch.mm of the same [users, d] x [d, items] shapes into a preallocated output, no top-k:
the ceiling for any exact scorer here. Both count 2·U·I·d flops and take turns in each repeat.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from precompute.bench.recs_data import DATASETS, load
from precompute.demo_data import DEMO_CORPUS, demo_engine
from precompute.jobs import content_cache
from precompute.jobs.embedding_cache import EMBEDDING, embeddings_of
from precompute.jobs.recommend import popularity_prior, seen_by_user
from precompute.jobs.recs_models import train_towers
from precompute.jobs.recs_quality import (
    RecsQuality,
    evaluate,
    interactions_table,
    valid_interactions,
)
from precompute.jobs.recs_spec import RecsSpec
from precompute.jobs.settings import JobSettings
from precompute.jobs.staging import committed_dataset
from precompute.jobs.topk import BlockedTopK
from precompute.models import load_encoder
from precompute.models.hardware import device_fingerprint
from precompute.pipeline import load_pipeline

DEFAULT = "ml-1m"


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


def public_data(name: str, cache: Path) -> tuple[list[str], np.ndarray, pa.Table, str]:
    items, interactions = load(name, cache)
    with load_encoder(demo_engine()) as encoder:
        vectors = encoder.encode(items["text"].to_pylist())
        report = encoder.report
    source = f"titles, years and genres computed by {report.backend}/{report.device}/{report.precision}"
    return (
        items["id"].to_pylist(),
        vectors,
        interactions.rename_columns(["user_id", "item_id", "time"]),
        source,
    )


def print_quality(name: str, quality: RecsQuality, rows: int) -> None:
    print(
        f"{name}: {rows:,} interactions, {quality.split} split, {quality.users:,} users evaluated of "
        f"{quality.sampled_from:,}, {quality.cold_users} cold; published model {quality.published}"
    )
    print(f"  {'model':14} {'HR@10':>7} {'NDCG@10':>8} {'coverage':>9} {'cold served':>12}")
    for model, figures in quality.models.items():
        cold = "-" if figures.cold_served is None else f"{figures.cold_served:.3f}"
        print(f"  {model:14} {figures.hit_rate:7.4f} {figures.ndcg:8.4f} {figures.coverage:9.4f} {cold:>12}")


def speed(
    ids: list[str], vectors: np.ndarray, good: pa.Table, settings: RecsSpec, repeats: int, block: int
) -> dict[str, object]:
    """GFLOP/s of the published model's top-k over every user against a plain GEMM of the same shapes."""
    seen = seen_by_user(good)
    towers = train_towers(settings.model, seen, vectors, settings)
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


def main(
    datasets: str = "demo,ml-100k,ml-1m",
    repeats: int = 5,
    block: int | None = None,
    cache: Path | None = None,
) -> dict[str, object]:
    """datasets: demo and names of bench/recs_data.DATASETS; the last one's speed is measured."""
    settings, job = RecsSpec(), JobSettings()
    block = block or job.users_per_block
    cache = cache or job.work_dir / "datasets"
    names = datasets.split(",")
    if unknown := set(names) - {"demo", *DATASETS}:
        raise ValueError(f"unknown data sets {sorted(unknown)}: choose from demo, {', '.join(DATASETS)}")
    result: dict[str, object] = {"bench": "recs", "machine": device_fingerprint("cpu"), "datasets": {}}
    print(
        f"default settings: model {settings.model}, content_weight {settings.content_weight}, "
        f"popularity_weight {settings.popularity_weight}"
    )
    for name in names:
        ids, vectors, table, source = demo_data() if name == "demo" else public_data(name, cache)
        good = valid_interactions(table, ids)
        quality = evaluate(good, vectors, settings)
        print_quality(name, quality, good.num_rows)
        print(f"  item vectors: {source}")
        result["datasets"][name] = {"interactions": good.num_rows, "items": len(ids), **asdict(quality)}
    timing = speed(ids, vectors, good, settings, repeats, block)
    print(
        f"top-k speed on {name} ({timing['model']}, {timing['users']} users x {timing['items']} items x "
        f"{timing['dim']} dims, {timing['device']}, {timing['torch_threads']} threads, median of {repeats}): "
        f"ours {timing['ours_gflops']} GFLOP/s ({timing['ours_users_per_s']:.0f} users/s), "
        f"baseline {timing['baseline_gflops']} GFLOP/s ({timing['baseline']}), ratio {timing['ratio']}x"
    )
    default = result["datasets"].get(DEFAULT) or result["datasets"][names[-1]]
    result["speed"] = timing
    result["default_dataset"] = DEFAULT if DEFAULT in names else names[-1]
    result["published_ndcg10"] = default["models"]["published"]["ndcg"]
    result["itemknn_ndcg10"] = default["models"]["itemknn"]["ndcg"]
    result["published_hr10"] = default["models"]["published"]["hit_rate"]
    result["itemknn_hr10"] = default["models"]["itemknn"]["hit_rate"]
    result["markov_ndcg10"] = default["models"]["markov"]["ndcg"]
    result["markov_hr10"] = default["models"]["markov"]["hit_rate"]
    print(f"machine {result['machine']}")
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
