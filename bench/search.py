"""`precompute bench search`: search latency through the service at a fixed request rate.

Ours: `POST /v1/search` on the lookup service (uvicorn, INT8 query embedding, the
in-process Qdrant engine with HNSW) over the demo corpus, published by the nightly path.
Baseline, same queries and rate, in one process with no HTTP at all: what a user would
otherwise write, sentence-transformers FP32 for the query and qdrant-client's local mode.

Load is open-loop from 4 client threads: request i is due at start + i/rate, and its\nlatency counts from then,
so a slow answer delays no later measurement (no coordinated omission). Also prints
recall@10 of the served index against exact FP32 search over the same corpus.
"""

from __future__ import annotations

import http.client
import json
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import pyarrow.parquet as pq
from qdrant_client import QdrantClient, models
from sentence_transformers import SentenceTransformer

from lookup.server import running
from lookup.settings import ServiceSettings
from models import EngineSettings, load_encoder
from models.source import model_dir
from stores.vector_settings import VectorStoreSettings
from stores.vectors import open_vector_store

VERSION = "20000101T000000Z-bench0"
K = 10
TIE = 1e-6
CLIENT_THREADS = 4


def open_loop(call: Callable[[str], list[str]], queries: list[str], rate: float) -> list[float]:
    """Latency of each query in ms, each sent at its due time by a pool of client threads."""
    latencies = [0.0] * len(queries)
    start = time.perf_counter()

    def one(i: int) -> None:
        due = start + i / rate
        time.sleep(max(0.0, due - time.perf_counter()))
        call(queries[i])
        latencies[i] = (time.perf_counter() - due) * 1000

    with ThreadPoolExecutor(CLIENT_THREADS) as pool:
        list(pool.map(one, range(len(queries))))
    return latencies


def percentiles(latencies: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(float(np.median(latencies)), 2),
        "p99_ms": round(float(np.percentile(latencies, 99)), 2),
    }


def through_service(base: str, queries: list[str], rate: float) -> tuple[list[float], dict[str, list[str]]]:
    answers: dict[str, list[str]] = {}
    local = threading.local()
    address = urlsplit(base)

    def ours(query: str) -> list[str]:
        # http.client: one keep-alive connection per thread and the least client-side cost,
        # so the figure is the service's, not a heavy client's.
        if not hasattr(local, "connection"):
            local.connection = http.client.HTTPConnection(address.hostname, address.port)
        body = json.dumps({"query": query, "k": K})
        local.connection.request("POST", "/v1/search", body, {"Content-Type": "application/json"})
        answers[query] = [h["id"] for h in json.loads(local.connection.getresponse().read())["hits"]]
        return answers[query]

    open_loop(ours, queries[: CLIENT_THREADS * 4], rate)  # open every thread's connection
    return open_loop(ours, queries, rate), answers


def main(rate: float, requests: int) -> dict[str, object]:
    corpus = pq.read_table(EngineSettings().reference_corpus, columns=["id", "title", "text"]).to_pylist()
    rng = np.random.default_rng(0)
    queries = [corpus[i]["title"] for i in rng.choice(len(corpus), size=requests)]
    ids = [row["id"] for row in corpus]

    reference = SentenceTransformer(str(model_dir()), device="cpu")
    reference.max_seq_length = 256
    fp32_docs = reference.encode([r["text"] for r in corpus], batch_size=16, normalize_embeddings=True)
    fp32_queries = reference.encode(queries, batch_size=16, normalize_embeddings=True)

    with tempfile.TemporaryDirectory() as tmp:
        stores = VectorStoreSettings(type="edge", path=Path(tmp) / "qdrant")
        with load_encoder() as encoder, open_vector_store(stores) as store:
            vectors = encoder.encode([r["text"] for r in corpus])
            store.create_version(VERSION, encoder.dim)
            store.upsert(VERSION, ids, vectors, [{"title": r["title"]} for r in corpus])
            store.finalize(VERSION)
            store.publish(VERSION)
            # Each query alone, as the service embeds it (dynamic INT8 depends on batch peers).
            int8_queries = np.stack([encoder.encode([query])[0] for query in queries])

        service = ServiceSettings(port=8765, warmup_queries=50)
        with running(service, stores) as base:
            our_latencies, answers = through_service(base, queries, rate)

    local = QdrantClient(location=":memory:")
    local.create_collection(
        "corpus", vectors_config=models.VectorParams(size=384, distance=models.Distance.COSINE)
    )
    local.upload_points(
        "corpus", [models.PointStruct(id=i, vector=v.tolist()) for i, v in enumerate(fp32_docs)]
    )

    def baseline(query: str) -> list[str]:
        vector = reference.encode([query], normalize_embeddings=True)[0]
        hits = local.query_points("corpus", query=vector.tolist(), limit=K).points
        return [ids[h.id] for h in hits]

    open_loop(baseline, queries[:20], rate)
    base_latencies = open_loop(baseline, queries, rate)

    position = {id_: i for i, id_ in enumerate(ids)}

    def recall(query_vectors: np.ndarray, doc_vectors: np.ndarray) -> float:
        """Share of served hits within the exact top 10; ties at the 10th score count (the
        corpus has packages with identical descriptions, hence identical vectors)."""
        scores = query_vectors @ doc_vectors.T
        tenth = np.sort(scores, axis=1)[:, -K]
        found = [
            sum(scores[row, position[id_]] >= tenth[row] - TIE for id_ in answers[query]) / K
            for row, query in enumerate(queries)
        ]
        return float(np.mean(found))

    result = {
        "bench": "search",
        "docs": len(corpus),
        "rate_per_s": rate,
        "requests": requests,
        "ours": {
            **percentiles(our_latencies),
            "path": "HTTP /v1/search: INT8 query embedding + Qdrant edge HNSW",
        },
        "baseline": {
            **percentiles(base_latencies),
            "path": "in-process sentence-transformers FP32 + qdrant-client local",
        },
        "p50_ratio": round(float(np.median(base_latencies) / np.median(our_latencies)), 2),
        "recall_at_10_index": round(recall(int8_queries, vectors), 4),
        "recall_at_10_vs_fp32_model": round(recall(fp32_queries, fp32_docs), 4),
    }
    print(f"{len(corpus)} docs, {requests} queries at {rate}/s, open loop")
    print(
        f"ours      p50 {result['ours']['p50_ms']:6.2f} ms  p99 {result['ours']['p99_ms']:6.2f} ms  ({result['ours']['path']})"
    )
    print(
        f"baseline  p50 {result['baseline']['p50_ms']:6.2f} ms  p99 {result['baseline']['p99_ms']:6.2f} ms  ({result['baseline']['path']})"
    )
    print(f"p50 ratio {result['p50_ratio']:.2f}x (baseline / ours)")
    print(
        f"recall@10 of the served index against exact FP32 search over the same vectors: {result['recall_at_10_index']}"
    )
    print(
        f"recall@10 end to end (INT8 engine + index) against exact search with FP32 model embeddings: {result['recall_at_10_vs_fp32_model']}"
    )
    print(json.dumps(result))
    return result
