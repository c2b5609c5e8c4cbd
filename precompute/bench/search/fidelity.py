"""`precompute bench fidelity`: search as a user gets it, against its own model in FP32 with exact search.

Data: bench/search/fidelity_data.py (10,000 documents, 5,000 queries with one known answer each).
Ours: `precompute run` with every default on a pipeline file over the documents (the engine
ladder and its gate, the self-tuned index), the lookup service, and `POST /v1/search` per query
(one client, closed loop). Reference: the same model in sentence-transformers FP32 for
documents and queries, and exact search (one matrix product): what the quantized, indexed path
stands in for.

Figures: overlap10_vs_fp32_exact (mean share of our top 10 that is the reference's top 10,
ties at the reference's 10th score counted), recall@10 of the known answer on both sides and
their ratio (recall_ratio), with a 95% paired bootstrap interval over the queries
(recall_ratio_ci95: a few dozen queries that one side finds and the other misses decide the
ratio, so its noise is that of a few dozen coin flips). Where the answers go: the same queries,
embedded in this process by the service's query engine, searched exactly over the published
version's own vectors (recall_ratio_exact_search: what quantization alone costs) and through its
index at the search parameters the nightly check recorded (recall_ratio_indexed). Latency by query length: queries cut from the documents to 16, 64,
128 and 256 tokens, each asked once (no cache answers), p50 and p99 over HTTP, one client; then
the 16-token ones again while a second client sends 256-token queries without pause (a long
query must not delay a short one). The query engine is the one /readyz names.

What the service costs: SERVICE_QUERIES 64-token queries over HTTP (p99_ms_64tok), then the same
texts through the same query engine called in this process, the service stopped
(p99_ms_64tok_in_process); service_overhead_p99 is their ratio: tokenizing, searching, HTTP and
JSON on top of the engine. Its parts: each served answer's Server-Timing (embed, index: the
service's own clock) and the round trip of `GET /healthz` through the same client (HTTP with
nothing behind it); no service can cost less than those two. What quantization buys: the job's engine against the ONNX Runtime
FP32 graph of the same model, in batches as the job runs them, taking turns on SPEED_DOCS
documents (embed_speedup_vs_fp32).
"""

from __future__ import annotations

import json
import shutil
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pyarrow.parquet as pq
from sentence_transformers import SentenceTransformer

from precompute.bench.load import percentiles
from precompute.bench.records import Figure, write_record
from precompute.bench.search.fidelity_data import retrieval_set
from precompute.bench.served import served_run
from precompute.jobs.settings import JobSettings
from precompute.lookup.search import QUERY_ENGINE
from precompute.models import Engine, load_encoder
from precompute.models.hardware import device_fingerprint
from precompute.models.source import bundled_encoder
from precompute.models.text.encoder import Encoder
from precompute.models.text.reference import TextSample
from precompute.models.text.tokenize import TextTokenizer
from precompute.stores.vectors import open_vector_store
from precompute.stores.vectors.settings import VectorStoreSettings
from precompute.stores.vectors.store import SearchParams

PIPELINE = """\
[outputs.docs]
kind = "embeddings"
input = { path = "corpus.parquet" }
"""
K = 10
TIE = 1e-5
LENGTHS = (16, 64, 128, 256)
PER_LENGTH = 100
SERVICE_QUERIES = 300
"""64-token queries for the service's overhead: its p99 rests on the worst three."""
BOOTSTRAP = 2_000
SPEED_DOCS = 500
SPEED_REPEATS = 3


def ask(http: httpx.Client, query: str) -> tuple[float, dict[str, Any]]:
    ms, answer = timed(http, query)
    return ms, answer.json()


def timed(http: httpx.Client, query: str) -> tuple[float, httpx.Response]:
    start = time.perf_counter()
    answer = http.post("/v1/search", json={"query": query, "k": K})
    seconds = time.perf_counter() - start
    answer.raise_for_status()
    return seconds * 1000, answer


def cut_queries(texts: list[str], tokens: int, count: int, offset: int) -> list[str]:
    """`count` texts of exactly `tokens` tokens (special ones included), cut from documents."""
    tokenizer = TextTokenizer(bundled_encoder())
    found = []
    for text in texts[offset:]:
        ids = tokenizer.ids(text + (" more" * tokens))[1:-1][: tokens - 2]
        found.append(tokenizer._tokenizer.decode(ids))
        if len(found) == count:
            return found
    raise ValueError(f"too few documents for {count} queries of {tokens} tokens")


def by_length(http: httpx.Client, texts: list[str]) -> dict[str, dict[str, float]]:
    figures = {}
    for n, tokens in enumerate(LENGTHS):
        latencies = [ask(http, q)[0] for q in cut_queries(texts, tokens, PER_LENGTH, n * PER_LENGTH)]
        figures[f"{tokens}tok"] = percentiles(np.array(latencies))
    return figures


def short_beside_long(base: str, texts: list[str]) -> dict[str, float]:
    """16-token queries while another client sends 256-token ones back to back."""
    stop = threading.Event()
    longs = cut_queries(texts, 256, PER_LENGTH, len(LENGTHS) * PER_LENGTH)

    def flood() -> None:
        with httpx.Client(base_url=base, timeout=60) as other:
            for i in range(10**6):
                if stop.is_set():
                    return
                other.post("/v1/search", json={"query": f"{longs[i % len(longs)]} {i}", "k": K})

    shorts = cut_queries(texts, 16, PER_LENGTH, (len(LENGTHS) + 1) * PER_LENGTH)
    flooder = threading.Thread(target=flood)
    flooder.start()
    try:
        with httpx.Client(base_url=base, timeout=60) as http:
            time.sleep(0.5)
            latencies = [ask(http, q)[0] for q in shorts]
    finally:
        stop.set()
        flooder.join()
    return percentiles(np.array(latencies))


def served_64tok(http: httpx.Client, queries: list[str]) -> dict[str, dict[str, float]]:
    """Percentiles of the client's wait, of the answers' Server-Timing steps, and of an empty
    round trip (`GET /healthz`) through the same client."""
    waits, steps = [], []
    for query in queries:
        ms, answer = timed(http, query)
        waits.append(ms)
        steps.append(server_timing(answer.headers["server-timing"]))
    empty = []
    for _ in queries:
        start = time.perf_counter()
        http.get("/healthz").raise_for_status()
        empty.append((time.perf_counter() - start) * 1000)
    return {
        "served": percentiles(np.array(waits)),
        "embed": percentiles(np.array([step["embed"] for step in steps])),
        "index": percentiles(np.array([step["index"] for step in steps])),
        "round_trip": percentiles(np.array(empty)),
    }


def server_timing(header: str) -> dict[str, float]:
    """'embed;dur=7.1, index;dur=0.4' -> {'embed': 7.1, 'index': 0.4}."""
    steps = (step.split(";dur=") for step in header.split(", "))
    return {name: float(ms) for name, ms in steps}


def ratio_interval(found_ours: np.ndarray, found_fp32: np.ndarray, seed: int = 0) -> list[float]:
    """95% interval of recall ours / recall FP32, resampling the queries (paired: each resample
    keeps a query's two outcomes together)."""
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(found_ours), size=(BOOTSTRAP, len(found_ours)))
    ratios = found_ours[picks].mean(axis=1) / found_fp32[picks].mean(axis=1)
    return [round(float(q), 4) for q in np.percentile(ratios, [2.5, 97.5])]


def in_process_64tok(engine: Engine, queries: list[str]) -> tuple[dict[str, float], str]:
    """The service's query engine (lookup/search.py QUERY_ENGINE) on the same queries, called
    here: (percentiles, the engine's name, to check it is the one the service ran)."""
    with load_encoder(engine.replace(**QUERY_ENGINE)) as encoder:
        report = encoder.report
        return one_at_a_time(encoder, queries), f"{report.backend}/{report.device}/{report.precision}"


def one_at_a_time(encoder: Encoder, queries: list[str]) -> dict[str, float]:
    """p50 and p99 of each query embedded alone, as the service does, after 20 to warm up."""
    for query in queries[:20]:
        encoder.encode_query(query)
    latencies = []
    for query in queries:
        start = time.perf_counter()
        encoder.encode_query(query)
        latencies.append((time.perf_counter() - start) * 1000)
    return percentiles(np.array(latencies))


def found_in_store(engine: Engine, qdrant: Path, queries: list[str], answers: list[str]) -> dict[str, np.ndarray]:
    """Whether each query's answer is in its top K, searched exactly over the published version's
    vectors and through its index, each query embedded by the service's query engine here."""
    found: dict[str, list[bool]] = {"exact": [], "indexed": []}
    with load_encoder(engine.replace(**QUERY_ENGINE)) as encoder, open_vector_store(VectorStoreSettings(path=qdrant), "docs") as store:
        version = store.serving()
        recorded = store.searched_with(version)
        for query, answer in zip(queries, answers, strict=True):
            vector = encoder.encode_query(query)
            for how, params in (("exact", SearchParams(recorded.hnsw_ef, exact=True)), ("indexed", recorded)):
                found[how].append(answer in [hit.id for hit in store.search(vector, K, version=version, params=params)])
    return {how: np.array(hits, dtype=float) for how, hits in found.items()}


def batch_speedup(engine: Engine, texts: list[str]) -> dict[str, float]:
    """Documents per second of the job's engine and of the FP32 graph, taking turns."""
    with load_encoder(engine) as ours, load_encoder(engine.replace(precision="fp32")) as fp32:
        ours_dps, fp32_dps = taking_turns(ours, fp32, texts, SPEED_REPEATS)
    return {"ours_docs_per_s": round(ours_dps, 1), "fp32_docs_per_s": round(fp32_dps, 1), "ratio": round(ours_dps / fp32_dps, 3)}


def taking_turns(ours: Encoder, theirs: Encoder, texts: list[str], repeats: int) -> tuple[float, float]:
    """(ours, theirs) documents per second over `texts`, the median of `repeats` runs that take
    turns, so machine noise hits both alike; after a warm-up on 64 texts each."""
    ours.encode(texts[:64]), theirs.encode(texts[:64])
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for encoder, taken in zip((ours, theirs), times, strict=True):
            start = time.perf_counter()
            encoder.encode(texts)
            taken.append(time.perf_counter() - start)
    return len(texts) / statistics.median(times[0]), len(texts) / statistics.median(times[1])


def reference(corpus: list[str], queries: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """FP32 sentence-transformers vectors of documents and queries (normalised)."""
    model = SentenceTransformer(str(bundled_encoder().folder), device="cpu")
    model.max_seq_length = bundled_encoder().max_seq_length
    docs = model.encode(corpus, batch_size=32, normalize_embeddings=True)
    return docs, model.encode(queries, batch_size=32, normalize_embeddings=True)


def main(documents: int = 10_000, queries: int = 5_000) -> dict[str, Any]:
    job = JobSettings()
    folder = job.work_dir.machine_dir() / "bench-fidelity"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    data = retrieval_set(job.work_dir.machine_dir() / "datasets", documents, queries)
    pq.write_table(data.corpus, folder / "corpus.parquet")
    (folder / "precompute.toml").write_text(PIPELINE)
    environment = {"PRECOMPUTE_JOB_WORK_DIR": str(folder / "work"), "PRECOMPUTE_QDRANT_PATH": str(folder / "qdrant")}
    ids, texts = data.corpus["id"].to_pylist(), data.corpus["text"].to_pylist()
    overhead_queries = cut_queries(texts, 64, SERVICE_QUERIES, (len(LENGTHS) + 2) * PER_LENGTH)
    with served_run(folder, environment) as (report, base):
        with httpx.Client(base_url=base, timeout=60) as http:
            engine = http.get("/readyz").json()["engines"]["docs"]
            answers, latencies = [], []
            for query in data.queries:
                ms, body = ask(http, query)
                latencies.append(ms)
                answers.append([hit["id"] for hit in body["hits"]])
            lengths = by_length(http, texts)
            served = served_64tok(http, overhead_queries)
        beside = short_beside_long(base, texts)
    settings = Engine(model=bundled_encoder(), reference=TextSample(path=str(folder / "corpus.parquet")))
    in_process, in_process_engine = in_process_64tok(settings, overhead_queries)
    speed = batch_speedup(settings, texts[:SPEED_DOCS])
    stored = found_in_store(settings, folder / "qdrant", data.queries, data.answers)
    docs, asked = reference(texts, data.queries)
    scores = asked @ docs.T
    tenth = np.sort(scores, axis=1)[:, -K]
    row = {id_: i for i, id_ in enumerate(ids)}
    overlap = statistics.mean(
        sum(scores[q, row[i]] >= tenth[q] - TIE for i in hits) / K for q, hits in enumerate(answers)
    )
    exact_top = np.argsort(-scores, axis=1)[:, :K]
    found_fp32 = np.array([row[a] in top for a, top in zip(data.answers, exact_top, strict=True)], dtype=float)
    found_ours = np.array([a in hits for a, hits in zip(data.answers, answers, strict=True)], dtype=float)
    recall_fp32, recall_ours = float(found_fp32.mean()), float(found_ours.mean())
    output = report["outputs"]["docs"]
    result = {
        "bench": "fidelity",
        "machine": device_fingerprint("cpu"),
        "documents": len(ids),
        "queries": len(data.queries),
        "job_engine": output["engine"],
        "gates": [
            {k: g.get(k) for k in ("precision", "passed", "recall_ratio", "mrr_ratio", "pairs", "mean_cosine", "min_cosine", "overlap")}
            for g in output["gate"]
        ],
        "query_engine": engine,
        "search": output["validation"]["search"],
        "index_recall_at_10": output["validation"]["recall_at_10"],
        "recall_at_10_ours": round(recall_ours, 4),
        "recall_at_10_fp32_exact": round(recall_fp32, 4),
        "queries_ms": percentiles(np.array(latencies)),
        "by_length_ms": lengths,
        "16tok_beside_256tok_ms": beside,
        "engine": "{backend}/{device}/{precision}".format(**output["engine"]),
        "overlap10_vs_fp32_exact": round(float(overlap), 4),
        "recall_ratio": round(recall_ours / recall_fp32, 4),
        "recall_ratio_ci95": ratio_interval(found_ours, found_fp32),
        "queries_found_by_one_side": int(np.sum(found_ours != found_fp32)),
        "recall_ratio_exact_search": round(float(stored["exact"].mean()) / recall_fp32, 4),
        "recall_ratio_exact_search_ci95": ratio_interval(stored["exact"], found_fp32),
        "recall_ratio_indexed": round(float(stored["indexed"].mean()) / recall_fp32, 4),
        "embed_speedup_vs_fp32": speed["ratio"],
        "embed_docs_per_s": speed,
        "p99_ms_64tok": served["served"]["p99_ms"],
        "p99_ms_64tok_in_process": in_process["p99_ms"],
        "p50_ms_64tok": served["served"]["p50_ms"],
        "p50_ms_64tok_in_process": in_process["p50_ms"],
        "in_process_engine": in_process_engine,
        "service_overhead_p99": round(served["served"]["p99_ms"] / in_process["p99_ms"], 3),
        "service_overhead_ms_p50": round(served["served"]["p50_ms"] - in_process["p50_ms"], 3),
        "server_timing_64tok_ms": {"embed": served["embed"], "index": served["index"]},
        "round_trip_ms": served["round_trip"],
    }
    print(f"{len(ids)} documents, {len(data.queries)} queries (20 Newsgroups, known item); machine {result['machine']}")
    print(f"job engine {output['engine']['precision']}, query engine {engine}; index search {result['search']}")
    print(
        f"recall@10 of the known answer: ours {recall_ours:.4f}, FP32 exact {recall_fp32:.4f}: ratio "
        f"{result['recall_ratio']:.4f}, 95% interval {result['recall_ratio_ci95']} "
        f"({result['queries_found_by_one_side']} queries found by one side only)"
    )
    print(
        f"  the same queries here: exact search over the published vectors {result['recall_ratio_exact_search']:.4f} "
        f"(95% {result['recall_ratio_exact_search_ci95']}), through its index {result['recall_ratio_indexed']:.4f}"
    )
    print(f"top-10 overlap with FP32 exact search: {overlap:.4f}")
    for length, figures in lengths.items():
        print(f"{length:>7} p50 {figures['p50_ms']:7.2f} ms  p99 {figures['p99_ms']:7.2f} ms")
    print(f"16tok beside 256tok p50 {beside['p50_ms']:7.2f} ms  p99 {beside['p99_ms']:7.2f} ms")
    print(
        f"64tok x {SERVICE_QUERIES}: served p99 {result['p99_ms_64tok']:.2f} ms, the same engine in process "
        f"{in_process['p99_ms']:.2f} ms ({in_process_engine}): service overhead {result['service_overhead_p99']:.3f}x"
    )
    print(
        f"  p50: served {result['p50_ms_64tok']:.2f} ms = in process {in_process['p50_ms']:.2f} + "
        f"{result['service_overhead_ms_p50']:.2f} ms; in the service (Server-Timing) embed "
        f"{served['embed']['p50_ms']:.2f}, index {served['index']['p50_ms']:.2f}; an empty round trip "
        f"{served['round_trip']['p50_ms']:.2f} ms"
    )
    print(
        f"batch embedding: {result['engine']} {speed['ours_docs_per_s']} docs/s, ONNX Runtime FP32 "
        f"{speed['fp32_docs_per_s']} docs/s: {speed['ratio']:.3f}x"
    )
    print(json.dumps(result))
    write_record(
        "fidelity",
        result,
        dataset=f"20 Newsgroups known-item set, {len(ids):,} documents, {len(data.queries):,} queries",
        ours=Figure("recall@10 of the known answer, served search", result["recall_at_10_ours"], "recall"),
        baseline=Figure("recall@10, FP32 model + exact search", result["recall_at_10_fp32_exact"], "recall"),
        ratio=result["recall_ratio"],
    )
    return result
