"""`bench vectors`: our vector stores against exact search and qdrant-client's local mode.

Every backend runs behind the same `VectorStore` calls the flow and the service make (create,
upsert, finalize, publish, search), on the same vectors and queries: qdrant-edge (the
in-process Rust engine) with FP32 vectors and with scalar INT8 quantization (rescored in
FP32), and past `qdrant.graph_points` also as one graph over every point (Qdrant's own way,
which the bounded graphs replace). Baseline: exact brute-force numpy search over the same
vectors, which is also the truth recall@k is measured against (with the same filter for the
filtered run); at demo size qdrant-client's local mode and an exact-scan edge version run too.

Vectors are real: the demo corpus's texts embedded by our encoder (cached under the temp
dir), queries are item titles embedded the same way, each filtered by its item's section
for the filtered run. `points` beyond the corpus are synthesized from the real embeddings
(random vectors give misleadingly low HNSW recall, STACK.md): point j is the normalised
mixture w*a + (1-w)*b + noise of real embedding a = j mod docs (whose section it takes), a
random real b, w uniform in [0.6, 1] and Gaussian noise of norm about NOISE, seeded.

Memory is the resident set a fresh reader process gains by opening the published version
and answering the queries (the service's view); disk is the version's directory.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from qdrant_client import QdrantClient

from precompute.bench.records import Figure, write_record
from precompute.demo_data import DEMO_CORPUS
from precompute.models.hardware import device_fingerprint
from precompute.stores.vectors.edge import QdrantEdgeStore
from precompute.stores.vectors.server import QdrantServerStore
from precompute.stores.vectors.settings import Quantization, VectorStoreSettings
from precompute.stores.vectors.store import VectorStore

VERSION = "20261122T031500-bench"
WARMUP_QUERIES = 20
NOISE = 0.1
"""Norm of the Gaussian noise added to each synthesized vector (unit vectors, 384-d)."""
SYNTH_CHUNK = 65_536
TRUTH_CHUNK = 16
"""Queries per exact top-k step: 16 x 1M scores is 64 MB."""
LOCAL_MODE_MAX = 50_000
"""qdrant-client's local mode is a pure-Python scan: past this it takes minutes to load (STACK.md)."""
CACHE = Path(tempfile.gettempdir()) / "precompute-bench-vectors"


def embed(texts: Sequence[str], titles: Sequence[str]) -> tuple[np.ndarray, np.ndarray, str]:
    """Real embeddings: random vectors give misleadingly low HNSW recall (STACK.md)."""
    from precompute.demo_data import demo_engine
    from precompute.models import load_encoder

    with load_encoder(demo_engine()) as encoder:
        return encoder.encode(texts), encoder.encode(titles), f"encoder {encoder.report.precision}"


def cached_embed(texts: Sequence[str], titles: Sequence[str]) -> tuple[np.ndarray, np.ndarray, str]:
    """`embed`, kept under the temp dir by corpus size: a 1M-point run need not re-embed."""
    path = CACHE / f"demo-{len(texts)}-{len(titles)}.npz"
    if path.exists():
        cached = np.load(path)
        return cached["vectors"], cached["queries"], f"{cached['source']}, cached in {path}"
    vectors, queries, source = embed(texts, titles)
    CACHE.mkdir(parents=True, exist_ok=True)
    np.savez(path, vectors=vectors, queries=queries, source=np.array(source))
    return vectors, queries, source


def synthesize(real: np.ndarray, points: int, seed: int = 2) -> np.ndarray:
    """`points` unit vectors near the real ones (see the module docstring); float32, chunked."""
    rng = np.random.default_rng(seed)
    out = np.empty((points, real.shape[1]), dtype=np.float32)
    for start in range(0, points, SYNTH_CHUNK):
        rows = np.arange(start, min(start + SYNTH_CHUNK, points))
        w = rng.uniform(0.6, 1.0, size=(len(rows), 1)).astype(np.float32)
        mixed = w * real[rows % len(real)] + (1 - w) * real[rng.integers(0, len(real), len(rows))]
        mixed += rng.standard_normal(mixed.shape, dtype=np.float32) * (NOISE / np.sqrt(real.shape[1]))
        out[rows] = mixed / np.linalg.norm(mixed, axis=1, keepdims=True)
    return out


def exact_top_k(
    docs: np.ndarray,
    queries: np.ndarray,
    k: int,
    codes: np.ndarray | None = None,
    want: np.ndarray | None = None,
) -> list[set[int]]:
    """Row indices of the true top-k per query; with `codes`, only rows whose code is the query's `want`."""
    top: list[set[int]] = []
    for start in range(0, len(queries), TRUTH_CHUNK):
        scores = queries[start : start + TRUTH_CHUNK] @ docs.T
        if codes is not None and want is not None:
            scores[codes[None, :] != want[start : start + TRUTH_CHUNK, None]] = -np.inf
        best = np.argpartition(-scores, k, axis=1)[:, :k]
        top += [{int(j) for j in row if np.isfinite(s[j])} for row, s in zip(best, scores, strict=True)]
    return top


def timed_queries(fn: Callable[[int], list[str]], n: int) -> tuple[list[float], list[list[str]]]:
    for i in range(WARMUP_QUERIES):
        fn(i % n)
    times, answers = [], []
    for i in range(n):
        start = time.perf_counter()
        answers.append(fn(i))
        times.append(time.perf_counter() - start)
    return times, answers


def ms(times: list[float], q: float) -> float:
    return round(float(np.quantile(times, q)) * 1e3, 3)


def recall(answers: list[list[int]], truth: list[set[int]]) -> float:
    return round(statistics.fmean(len(set(a) & t) / len(t) for a, t in zip(answers, truth, strict=True)), 4)


def run_numpy(
    docs: np.ndarray,
    codes: np.ndarray,
    queries: np.ndarray,
    want: np.ndarray,
    truth: dict[str, list[set[int]]],
    k: int,
) -> dict[str, object]:
    """The baseline: exact brute force, one query at a time as a service would answer it."""
    row: dict[str, object] = {"points": len(docs), "load_s": 0.0, "build_s": 0.0}
    for label in ("unfiltered", "filtered"):

        def query(i: int, filtered: bool = label == "filtered") -> list[int]:
            scores = docs @ queries[i]
            if filtered:
                scores[codes != want[i]] = -np.inf
            best = np.argpartition(-scores, k)[:k]
            return best[np.argsort(-scores[best])].tolist()

        times, answers = timed_queries(query, len(queries))
        row |= {
            f"{label}_p50_ms": ms(times, 0.5),
            f"{label}_p99_ms": ms(times, 0.99),
            f"{label}_recall": recall(answers, truth[label]),
        }
    row |= {"disk_mb": round(docs.nbytes / 2**20, 1), "reader_rss_mb": round(docs.nbytes / 2**20, 1)}
    return row


def rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def reader_rss_mb(settings: VectorStoreSettings, name: str, queries: np.ndarray, k: int) -> float:
    """In a fresh process (spawned): resident MB gained by opening the published version and answering."""
    before = rss_kb()
    with QdrantEdgeStore(settings, name) as store:
        for q in queries:
            store.search(q, k)
        return round((rss_kb() - before) / 1024, 1)


def disk_mb(path: Path) -> float:
    """Allocated, not apparent, size: Qdrant preallocates sparse files."""
    return round(sum(p.stat().st_blocks * 512 for p in path.rglob("*") if p.is_file()) / 2**20, 1)


def run_backend(
    store: VectorStore,
    ids: list[str],
    docs: np.ndarray,
    sections: list[str],
    queries: np.ndarray,
    query_sections: list[str],
    truth: dict[str, list[set[int]]],
    k: int,
    quantization: Quantization = "none",
) -> dict[str, object]:
    start = time.perf_counter()
    store.create_version(VERSION, docs.shape[1], quantization=quantization)
    for first in range(0, len(ids), SYNTH_CHUNK):  # payload dicts a chunk at a time
        rows = slice(first, first + SYNTH_CHUNK)
        store.upsert(VERSION, ids[rows], docs[rows], [{"section": s} for s in sections[rows]])
    load_s = time.perf_counter() - start
    start = time.perf_counter()
    store.finalize(VERSION)
    build_s = time.perf_counter() - start
    store.publish(VERSION)
    row: dict[str, object] = {
        "points": store.count(VERSION),
        "load_s": round(load_s, 2),
        "build_s": round(build_s, 2),
    }
    position = {item: i for i, item in enumerate(ids)}
    for label in ("unfiltered", "filtered"):

        def query(i: int, filtered: bool = label == "filtered") -> list[int]:
            flt = {"section": query_sections[i]} if filtered else None
            return [position[h.id] for h in store.search(queries[i], k, filter=flt)]

        times, answers = timed_queries(query, len(queries))
        row |= {
            f"{label}_p50_ms": ms(times, 0.5),
            f"{label}_p99_ms": ms(times, 0.99),
            f"{label}_recall": recall(answers, truth[label]),
        }
    return row


def main(docs: int = 5000, queries: int = 200, k: int = 10, points: int | None = None) -> dict[str, object]:
    """`points`: index that many vectors synthesized from the `docs` real ones (default: the real ones)."""
    table = pq.read_table(DEMO_CORPUS, columns=["id", "title", "text", "section"]).slice(0, docs)
    real_ids, real_sections = table["id"].to_pylist(), table["section"].to_pylist()
    rng = np.random.default_rng(1)
    picks = rng.choice(len(real_ids), size=queries, replace=False)
    titles = [table["title"][int(i)].as_py() or table["text"][int(i)].as_py()[:80] for i in picks]
    start = time.perf_counter()
    real, query_vectors, source = cached_embed(table["text"].to_pylist(), titles)
    embed_s = time.perf_counter() - start
    points = points or len(real_ids)
    if points == len(real_ids):
        ids, sections, vectors = real_ids, real_sections, real
    else:
        vectors = synthesize(real, points)
        ids = [f"{real_ids[j % docs]}~{j}" for j in range(points)]
        sections = [real_sections[j % docs] for j in range(points)]
        source += f"; {points:,} synthesized: mixtures of two real embeddings + noise {NOISE}, seeded"
    query_sections = [real_sections[int(i)] for i in picks]
    vocabulary = {s: n for n, s in enumerate(sorted(set(real_sections)))}
    codes = np.array([vocabulary[s] for s in sections], dtype=np.int32)
    want = np.array([vocabulary[s] for s in query_sections], dtype=np.int32)
    start = time.perf_counter()
    truth = {
        "unfiltered": exact_top_k(vectors, query_vectors, k),
        "filtered": exact_top_k(vectors, query_vectors, k, codes, want),
    }
    truth_s = time.perf_counter() - start

    results: dict[str, dict[str, object]] = {
        "numpy exact (baseline)": run_numpy(vectors, codes, query_vectors, want, truth, k)
    }
    print(
        f"{len(ids):,} x {vectors.shape[1]} vectors ready ({source}); exact truth in {truth_s:.1f} s",
        flush=True,
    )
    print(f"numpy exact (baseline): {json.dumps(results['numpy exact (baseline)'])}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-vectors-") as tmp:
        edge = VectorStoreSettings(path=Path(tmp) / "edge")
        # (settings, collection, quantization) of an edge store, or a store of another kind.
        backends: dict[str, tuple[VectorStoreSettings, str, Quantization] | Callable[[], VectorStore]] = {
            "qdrant-edge (HNSW)": (edge, "bench", "none"),
            "qdrant-edge (HNSW, INT8)": (edge, "bench-int8", "int8"),
        }
        if points > edge.graph_points:  # what the default's bounded graphs replace
            one_graph = edge.model_copy(update={"graph_points": points})
            backends["qdrant-edge (HNSW, one graph)"] = (one_graph, "bench-one-graph", "none")
        if points == len(real_ids):
            # Qdrant's default threshold (10 MB), under which the demo corpus is scanned exactly.
            scan = edge.model_copy(update={"full_scan_threshold_kb": 10_000})
            backends["qdrant-edge, exact scan"] = (scan, "bench-scan", "none")
        if points <= LOCAL_MODE_MAX:
            backends["qdrant-client local (path)"] = lambda: QdrantServerStore(
                edge, "bench", client=QdrantClient(path=str(Path(tmp) / "local"))
            )
        spawn = multiprocessing.get_context("spawn")
        for name, how in backends.items():
            settings, collection, quantization = how if isinstance(how, tuple) else (edge, "", "none")
            with QdrantEdgeStore(settings, collection) if isinstance(how, tuple) else how() as store:
                results[name] = run_backend(
                    store, ids, vectors, sections, query_vectors, query_sections, truth, k, quantization
                )
            if isinstance(how, tuple):
                results[name]["disk_mb"] = disk_mb(settings.path / collection / VERSION)
                with ProcessPoolExecutor(1, mp_context=spawn) as reader:
                    results[name]["reader_rss_mb"] = reader.submit(
                        reader_rss_mb, settings, collection, query_vectors, k
                    ).result()
            else:
                results[name]["disk_mb"] = disk_mb(Path(tmp) / "local")
            print(f"{name}: {json.dumps(results[name])}", flush=True)  # a long run's partial results
    print(
        f"{len(ids):,} x {vectors.shape[1]} vectors ({source}; embedded in {embed_s:.1f} s), "
        f"{queries} top-{k} queries; exact truth in {truth_s:.1f} s"
    )
    print(
        f"{'backend':30} {'load s':>7} {'build s':>8} {'p50 ms':>7} {'p99 ms':>7} {'recall':>7}"
        f" {'flt p50':>8} {'flt p99':>8} {'flt rec':>8} {'disk MB':>8} {'RSS MB':>7}"
    )
    for name, r in results.items():
        print(
            f"{name:30} {r['load_s']:7.2f} {r['build_s']:8.2f} {r['unfiltered_p50_ms']:7.3f}"
            f" {r['unfiltered_p99_ms']:7.3f} {r['unfiltered_recall']:7.4f} {r['filtered_p50_ms']:8.3f}"
            f" {r['filtered_p99_ms']:8.3f} {r['filtered_recall']:8.4f} {r['disk_mb']:8.1f} {r.get('reader_rss_mb', '-'):>7}"
        )
    baseline = results["numpy exact (baseline)"]
    ratios = {
        name: round(float(baseline["unfiltered_p50_ms"]) / float(r["unfiltered_p50_ms"]), 1)
        for name, r in results.items()
        if name != "numpy exact (baseline)"
    }
    print("p50 speed-up over numpy exact: " + ", ".join(f"{n} {x}x" for n, x in ratios.items()))
    print(
        "RSS MB: a fresh reader process after opening the version and answering the queries (numpy: the array)"
    )
    result = {
        "bench": "vector_store",
        "machine": device_fingerprint("cpu"),
        "points": len(ids),
        "dim": int(vectors.shape[1]),
        "vectors": source,
        "queries": queries,
        "k": k,
        "backends": results,
        "p50_speedup_over_numpy": ratios,
    }
    result["load_average_1m"] = round(os.getloadavg()[0], 1)
    print(f"machine {result['machine']}, load average (1 min) at the end {result['load_average_1m']}")
    print(json.dumps(result))
    served = "qdrant-edge (HNSW)"  # the store's defaults: FP32 vectors, bounded graphs
    write_record(
        "vectors",
        result,
        dataset=f"demo corpus embeddings, {len(ids):,} x {vectors.shape[1]}"
        + ("" if points == len(real_ids) else f", synthesized from {docs:,} real ones")
        + f", {queries} title queries",
        ours=Figure(f"{served} top-{k} p50", float(results[served]["unfiltered_p50_ms"]), "ms"),  # type: ignore[arg-type]
        baseline=Figure(f"numpy exact top-{k} p50", float(baseline["unfiltered_p50_ms"]), "ms"),  # type: ignore[arg-type]
        higher_is_better=False,
    )
    return result


if __name__ == "__main__":
    main()
