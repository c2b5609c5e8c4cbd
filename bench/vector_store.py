"""`bench vector_store`: qdrant-edge (in-process Rust engine) against qdrant-client's local mode.

Both run behind the same `VectorStore` calls the flow and the service make (create,
upsert, finalize, publish, search), on the same vectors and queries. Corpus vectors are
the demo corpus's texts embedded by our encoder; queries are item titles embedded the
same way, each filtered by its item's section for the filtered run. Recall@k is against
exact top-k by numpy over the same vectors (and the same filter).
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from qdrant_client import QdrantClient

from models.hardware import device_fingerprint
from models.settings import DEMO_CORPUS
from stores.qdrant_edge_store import QdrantEdgeStore
from stores.qdrant_server_store import QdrantServerStore
from stores.vector_settings import VectorStoreSettings
from stores.vectors import VectorStore

VERSION = "20261122T031500-bench"
WARMUP_QUERIES = 20


def embed(texts: Sequence[str], titles: Sequence[str]) -> tuple[np.ndarray, np.ndarray, str]:
    """Real embeddings: random vectors give misleadingly low HNSW recall (STACK.md)."""
    from models import load_encoder

    with load_encoder() as encoder:
        return encoder.encode(texts), encoder.encode(titles), f"encoder {encoder.report.precision}"


def exact_top_k(
    docs: np.ndarray, queries: np.ndarray, k: int, masks: np.ndarray | None = None
) -> list[set[int]]:
    """Row indices of the true top-k per query; `masks` [queries, docs] keeps only matching rows."""
    scores = queries @ docs.T
    if masks is not None:
        scores = np.where(masks, scores, -np.inf)
    top = np.argsort(-scores, axis=1)[:, :k]
    return [{int(j) for j in row if np.isfinite(s[j])} for row, s in zip(top, scores, strict=False)]


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


def run_backend(
    store: VectorStore,
    ids: list[str],
    docs: np.ndarray,
    sections: list[str],
    queries: np.ndarray,
    query_sections: list[str],
    truth: dict[str, list[set[int]]],
    k: int,
) -> dict[str, object]:
    start = time.perf_counter()
    store.create_version(VERSION, docs.shape[1])
    store.upsert(VERSION, ids, docs, [{"section": s} for s in sections])
    store.finalize(VERSION)
    load_s = time.perf_counter() - start
    store.publish(VERSION)
    row: dict[str, object] = {"points": store.count(VERSION), "upsert_finalize_s": round(load_s, 2)}
    position = {item: i for i, item in enumerate(ids)}
    for label in ("unfiltered", "filtered"):

        def query(i: int, filtered: bool = label == "filtered") -> list[str]:
            flt = {"section": query_sections[i]} if filtered else None
            return [h.id for h in store.search(queries[i], k, filter=flt)]

        times, answers = timed_queries(query, len(queries))
        recall = statistics.fmean(
            len({position[a] for a in answer} & want) / len(want)
            for answer, want in zip(answers, truth[label], strict=False)
        )
        row |= {
            f"{label}_p50_ms": ms(times, 0.5),
            f"{label}_p99_ms": ms(times, 0.99),
            f"{label}_recall": round(recall, 4),
        }
    return row


def main(docs: int = 5000, queries: int = 200, k: int = 10) -> dict[str, object]:
    table = pq.read_table(DEMO_CORPUS, columns=["id", "title", "text", "section"]).slice(0, docs)
    ids, sections = table["id"].to_pylist(), table["section"].to_pylist()
    rng = np.random.default_rng(1)
    picks = rng.choice(len(ids), size=queries, replace=False)
    titles = [table["title"][int(i)].as_py() or table["text"][int(i)].as_py()[:80] for i in picks]
    start = time.perf_counter()
    vectors, query_vectors, source = embed(table["text"].to_pylist(), titles)
    embed_s = time.perf_counter() - start
    query_sections = [sections[int(i)] for i in picks]
    masks = np.array(sections)[None, :] == np.array(query_sections)[:, None]
    truth = {
        "unfiltered": exact_top_k(vectors, query_vectors, k),
        "filtered": exact_top_k(vectors, query_vectors, k, masks),
    }

    results: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-vectors-") as tmp:
        settings = VectorStoreSettings(path=Path(tmp) / "edge", name="bench")
        backends: dict[str, Callable[[], VectorStore]] = {
            "qdrant-edge (HNSW)": lambda: QdrantEdgeStore(settings),
            # Qdrant's default threshold (10 MB), under which the demo corpus is scanned exactly.
            "qdrant-edge, exact scan": lambda: QdrantEdgeStore(
                settings.model_copy(update={"name": "bench-scan", "full_scan_threshold_kb": 10_000})
            ),
            "qdrant-client local (path)": lambda: QdrantServerStore(
                settings, client=QdrantClient(path=str(Path(tmp) / "local"))
            ),
        }
        for name, make in backends.items():
            with make() as store:
                results[name] = run_backend(
                    store, ids, vectors, sections, query_vectors, query_sections, truth, k
                )
    header = f"{'backend':28} {'load s':>7} {'p50 ms':>7} {'p99 ms':>7} {'recall':>7} {'flt p50':>8} {'flt p99':>8} {'flt rec':>8}"
    print(
        f"{len(ids)} x {vectors.shape[1]} vectors ({source}, embedded in {embed_s:.1f} s), {queries} top-{k} queries"
    )
    print(header)
    for name, r in results.items():
        print(
            f"{name:28} {r['upsert_finalize_s']:7.2f} {r['unfiltered_p50_ms']:7.3f} {r['unfiltered_p99_ms']:7.3f}"
            f" {r['unfiltered_recall']:7.4f} {r['filtered_p50_ms']:8.3f} {r['filtered_p99_ms']:8.3f} {r['filtered_recall']:8.4f}"
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
    }
    print(f"machine {result['machine']}")
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
