"""`precompute bench search`: search latency through the service at a fixed request rate.

Ours: `POST /v1/search` on the lookup service (uvicorn, the gated INT8 or mixed query engine, the
in-process Qdrant engine with HNSW) over the demo corpus, published by the nightly path.
Baseline, same queries and rate, in one process with no HTTP at all: what a user would
otherwise write, sentence-transformers FP32 for the query and qdrant-client's local mode.

Load: bench/load.py (open loop, due-time latencies, raw keep-alive HTTP/1.1), the same
client threads for both sides. Also prints recall@10 of the served index against exact
FP32 search over the same vectors, and end to end against FP32-model embeddings.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from qdrant_client import QdrantClient, models
from sentence_transformers import SentenceTransformer

from precompute.bench.load import CLIENT_THREADS, http, open_loop, percentiles, post_json
from precompute.bench.records import Figure, write_record
from precompute.demo_data import DEMO_CORPUS, demo_engine
from precompute.lookup.search import QUERY_ENGINE
from precompute.lookup.settings import ServiceSettings
from precompute.models import load_encoder
from precompute.models.hardware import device_fingerprint
from precompute.service.server import running
from precompute.stores.key_value.server import free_port
from precompute.stores.vectors import open_vector_store
from precompute.stores.vectors.settings import VectorStoreSettings

VERSION = "20000101T000000Z-bench0"
K = 10
TIE = 1e-6



def through_service(
    host: str, port: int, queries: list[str], rate: float
) -> tuple[np.ndarray, dict[str, list[str]]]:
    """Latencies in ms, and each query's hit ids (parsed after the timed run)."""
    requests = [post_json(host, "/v1/search", {"query": query, "k": K}) for query in queries]
    bodies: list[bytes] = [b""] * len(queries)
    connect = http(host, port, requests, bodies)
    open_loop(connect, CLIENT_THREADS * 4, rate)  # warm every thread's connection
    latencies, failed = open_loop(connect, len(queries), rate)
    if failed:
        raise RuntimeError(f"{failed} of {len(queries)} searches failed")
    answers = {q: [h["id"] for h in json.loads(b)["hits"]] for q, b in zip(queries, bodies, strict=True)}
    return latencies, answers


def main(rate: float, requests: int) -> dict[str, object]:
    corpus = pq.read_table(DEMO_CORPUS, columns=["id", "title", "text"]).to_pylist()
    rng = np.random.default_rng(0)
    queries = [corpus[i]["title"] for i in rng.choice(len(corpus), size=requests)]
    ids = [row["id"] for row in corpus]

    engine = demo_engine()
    reference = SentenceTransformer(str(engine.model.folder), device="cpu")
    reference.max_seq_length = engine.model.max_seq_length
    fp32_docs = reference.encode([r["text"] for r in corpus], batch_size=16, normalize_embeddings=True)
    fp32_queries = reference.encode(queries, batch_size=16, normalize_embeddings=True)

    with tempfile.TemporaryDirectory() as tmp:
        stores = VectorStoreSettings(type="edge", path=Path(tmp) / "qdrant")
        with load_encoder(engine) as encoder, open_vector_store(stores, "corpus") as store:
            vectors = encoder.encode([r["text"] for r in corpus])
            store.create_version(VERSION, encoder.dim)
            store.upsert(VERSION, ids, vectors, [{"title": r["title"]} for r in corpus])
            store.finalize(VERSION)
            store.publish(VERSION)
        # Each query alone on the service's engine (dynamic INT8 depends on batch peers).
        with load_encoder(engine.replace(**QUERY_ENGINE)) as encoder:
            int8_queries = np.stack([encoder.encode_query(query) for query in queries])

        service = ServiceSettings(port=free_port(), warmup_queries=50)
        with running(service, stores):
            our_latencies, answers = through_service(service.host, service.port, queries, rate)

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

    def connect() -> Callable[[int], bool]:
        return lambda i: bool(baseline(queries[i]))

    open_loop(connect, 20, rate)
    base_latencies, _ = open_loop(connect, len(queries), rate)

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
        "machine": device_fingerprint("cpu"),
        "docs": len(corpus),
        "rate_per_s": rate,
        "requests": requests,
        "ours": {
            **percentiles(our_latencies),
            "path": "HTTP /v1/search: gated query engine + Qdrant edge HNSW",
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
        f"recall@10 end to end (gated engine + index) against exact search with FP32 model embeddings: {result['recall_at_10_vs_fp32_model']}"
    )
    print(f"machine {result['machine']}")
    print(json.dumps(result))
    write_record(
        "search",
        result,
        dataset=f"demo corpus, {len(corpus):,} documents, {requests} title queries at {rate:g}/s",
        ours=Figure("POST /v1/search p50 through the service", result["ours"]["p50_ms"], "ms"),
        baseline=Figure("sentence-transformers FP32 + qdrant-client local p50", result["baseline"]["p50_ms"], "ms"),
        ratio=result["p50_ratio"],
        higher_is_better=False,
    )
    return result
