"""`precompute bench recs`: the recommendations' exact top-k step against a plain GEMM, and their quality.

Ours: BlockedTopK over the demo users, a block at a time (matmul into the reused score
buffer, popularity prior, seen items masked, topk). Baseline: one torch.mm of the same
[users, d] x [d, items] shapes into a preallocated output, no top-k at all: the ceiling for
any exact scorer on this machine. Both count 2·U·I·d flops and take turns in each repeat.
Item vectors are the corpus embeddings: from the embedding job's cache when it holds every
corpus text, else computed here by load_encoder(). Quality: leave-one-out hit-rate@k of
ours, content only and most-popular, on the same split.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict

import numpy as np
import pyarrow.parquet as pq
import torch

from jobs import content_cache
from jobs.embedding_cache import EMBEDDING, embeddings_of
from jobs.recommend import BlockedTopK, popularity_prior
from jobs.recs_quality import leave_one_out, read_seen
from jobs.recs_settings import RecsJobSettings
from jobs.settings import JobSettings
from jobs.staging import committed_dataset
from models import EngineSettings, load_encoder
from models.hardware import device_fingerprint
from models.settings import DEMO_CORPUS
from precompute.pipeline import load_pipeline


def item_embeddings(texts: list[str]) -> tuple[np.ndarray, str]:
    """(vectors, where they came from)."""
    engine = EngineSettings()
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


def main(repeats: int = 5, block: int | None = None) -> dict[str, object]:
    settings = RecsJobSettings()
    block = block or settings.users_per_block
    corpus = pq.read_table(DEMO_CORPUS, columns=["id", "text"])
    item_ids = corpus["id"].to_pylist()
    vectors, source = item_embeddings(corpus["text"].to_pylist())
    pipeline = load_pipeline()
    seen = read_seen(pipeline.outputs[pipeline.default("recs") or "recs"].input, item_ids)
    prior = popularity_prior(np.bincount(seen.items, minlength=len(item_ids)), settings.popularity_weight)
    ranker = BlockedTopK(vectors, settings.k, block, prior)
    users = ranker.user_vectors(seen)
    full = torch.empty((len(users), len(item_ids)), device=ranker.device)

    def gemm() -> None:
        torch.mm(users, ranker.items.T, out=full)
        if full.is_cuda:
            torch.cuda.synchronize()

    seconds = take_turns({"ours": lambda: ranker(users, seen), "gemm": gemm}, repeats)
    gflop = 2 * len(users) * len(item_ids) * vectors.shape[1] / 1e9
    quality = leave_one_out(seen, vectors, settings.popularity_weight, k=settings.k, block=block)
    device = torch.cuda.get_device_name() if ranker.device.type == "cuda" else "cpu"
    result = {
        "bench": "recs",
        "machine": device_fingerprint("cpu"),
        "device": device,
        "torch_threads": torch.get_num_threads(),
        "users": len(users),
        "items": len(item_ids),
        "dim": vectors.shape[1],
        "k": settings.k,
        "block": block,
        "repeats": repeats,
        "item_vectors": source,
        "ours_gflops": round(gflop / seconds["ours"], 1),
        "ours_users_per_s": round(len(users) / seconds["ours"], 1),
        "baseline": "torch.mm [U,d]x[d,I] into a preallocated output, no top-k",
        "baseline_gflops": round(gflop / seconds["gemm"], 1),
        "ratio": round(seconds["gemm"] / seconds["ours"], 2),
        "quality": asdict(quality),
    }
    print(
        f"{device}, {torch.get_num_threads()} threads: {len(users)} users x {len(item_ids)} items x "
        f"{vectors.shape[1]} dims, block {block}, k {settings.k}, median of {repeats} repeats"
    )
    print(f"item vectors: {source}")
    print(
        f"ours      {result['ours_gflops']:8.1f} GFLOP/s  (blocked matmul + prior + mask + topk; "
        f"{result['ours_users_per_s']:.0f} users/s)"
    )
    print(f"baseline  {result['baseline_gflops']:8.1f} GFLOP/s  ({result['baseline']})")
    print(f"ratio     {result['ratio']:8.2f}x")
    print(
        f"leave-one-out hit-rate@{quality.k} over {quality.users} users: ours {quality.ours:.3f} "
        f"(content + popularity prior, weight {quality.popularity_weight}), content only "
        f"{quality.content_only:.3f}, most-popular {quality.most_popular:.3f}"
    )
    print(f"machine {result['machine']}")
    print(json.dumps(result))
    return result
