"""`precompute bench query-engines`: which engine should embed the service's queries, batched or not.

Micro-batching (lookup/query_batcher.py) needs an engine whose output for a query does not depend
on the other queries of its batch, and runs fixed-shape calls (rows x a length bucket). Measured
on the demo's titles, each engine on one thread, as the service runs it:

- served today on CPU (the baseline): dynamic INT8 over the fused graph, one query per call;
- FP32, in fixed-shape batches;
- static INT8 (Q/DQ, calibrated: graphs.STATIC), in fixed-shape batches, gated: what the batcher
  runs on CPU (models.engines.load.peer_independent).

For each: ms per query alone (a batch of one: the fixed shape's cost) and in full batches,
how many queries came out bit-identical alone and in a batch, and the mean cosine to FP32.
The ratio printed is the best batched cost per query over the baseline's.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pyarrow.parquet as pq

from precompute.bench.records import Figure, write_record
from precompute.demo_data import DEMO_CORPUS, demo_engine
from precompute.lookup.query_batcher import QueryBatcher
from precompute.lookup.search import QUERY_ENGINE
from precompute.models import load_encoder
from precompute.models.engines.load import peer_independent
from precompute.models.hardware import device_fingerprint

ROWS = 8


def median_ms(times: list[float]) -> float:
    return round(float(np.median(times)) * 1000, 3)


def batched(batcher: QueryBatcher, ids: list[list[int]]) -> tuple[dict[str, float], np.ndarray]:
    """Figures of fixed-shape calls over `ids`, and each query's vector alone."""
    alone, alone_s = [], []
    for query in ids:
        t0 = time.perf_counter()
        alone.append(batcher.embed([query], batcher.bucket(len(query)))[0])
        alone_s.append(time.perf_counter() - t0)
    by_bucket: dict[int, list[int]] = {}
    for k, query in enumerate(ids):
        by_bucket.setdefault(batcher.bucket(len(query)), []).append(k)
    per_query_s, identical = [], 0
    for length, members in by_bucket.items():
        for start in range(0, len(members) - ROWS + 1, ROWS):  # full batches only
            group = members[start : start + ROWS]
            t0 = time.perf_counter()
            vectors = batcher.embed([ids[k] for k in group], length)
            per_query_s.append((time.perf_counter() - t0) / ROWS)
            identical += sum(np.array_equal(v, alone[k]) for v, k in zip(vectors, group, strict=True))
    checked = len(per_query_s) * ROWS
    figures = {
        "alone_ms": median_ms(alone_s),
        "batched_ms_per_query": median_ms(per_query_s),
        "identical_alone_and_batched": f"{identical}/{checked}",
    }
    return figures, np.array(alone)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.mean((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)))


def main(queries: int = 400) -> dict[str, object]:
    settings = demo_engine()
    titles = pq.read_table(DEMO_CORPUS, columns=["title"])["title"].to_pylist()
    texts = list(dict.fromkeys(titles))[:queries]
    result: dict[str, object] = {
        "bench": "query-engines",
        "machine": device_fingerprint("cpu"),
        "queries": len(texts),
        "rows": ROWS,
        "engines": {},
    }
    engines: dict[str, dict[str, object]] = result["engines"]  # type: ignore[assignment]
    with load_encoder(settings.replace(**QUERY_ENGINE)) as served:
        for text in texts[:20]:
            served.encode_query(text)
        times, vectors = [], []
        for text in texts:
            t0 = time.perf_counter()
            vectors.append(served.encode_query(text))
            times.append(time.perf_counter() - t0)
        baseline = median_ms(times)
        served_vectors = np.array(vectors)
    batch = {"streams": 1, "threads": 1, "batch_size": ROWS}
    reference = None
    for name, encoder in (
        ("fp32, batched", load_encoder(settings.replace(precision="fp32", **batch))),
        ("int8 static, batched", load_encoder(peer_independent(settings).replace(**batch))),
    ):
        batcher = QueryBatcher(encoder, ROWS, 0.0)
        try:
            ids = [encoder.tokenizer.ids(t) for t in texts]
            batcher.embed(ids[:ROWS], batcher.bucket(max(map(len, ids[:ROWS]))))  # warm-up
            figures, alone = batched(batcher, ids)
        finally:
            batcher.close()
        reference = alone if reference is None else reference
        figures["cosine_to_fp32"] = round(cosine(alone, reference), 4)
        engines[name] = figures
    engines["int8 dynamic, one query a call (served on CPU)"] = {
        "alone_ms": baseline,
        "cosine_to_fp32": round(cosine(served_vectors, reference), 4),  # type: ignore[arg-type]
    }
    best = min(e["batched_ms_per_query"] for e in engines.values() if "batched_ms_per_query" in e)
    result["best_batched_over_served"] = round(best / baseline, 2)  # type: ignore[operator]
    print(f"machine {result['machine']}; {len(texts)} demo titles; batches of {ROWS} rows")
    for name, figures in engines.items():
        print(f"{name:48s} {figures}")
    print(f"best batched cost per query / served single query: {result['best_batched_over_served']}x")
    print(json.dumps(result))
    fastest = next(name for name, e in engines.items() if e.get("batched_ms_per_query") == best)
    write_record(
        "query-engines",
        result,
        dataset=f"demo corpus titles, {len(texts)} queries",
        ours=Figure(f"{fastest}, {ROWS} rows a call: cost per query", best, "ms"),  # type: ignore[arg-type]
        baseline=Figure("int8 dynamic, one query a call (served on CPU)", baseline, "ms"),
        higher_is_better=False,
    )
    return result
