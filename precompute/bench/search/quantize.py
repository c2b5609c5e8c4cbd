"""`precompute bench quantize`: which CPU INT8 graph keeps search answers, and at what speed.

Each candidate graph of a text model (models/engines/quantize.py), built from the engine cache as
the ladder builds it, against the model's FP32 graph on the same backend in the same run:

- answers: the known-item set of `bench fidelity` (fidelity_data.py), DOCUMENTS documents and
  QUERIES queries, searched exactly with each graph's own vectors: recall@10 and MRR@10 of the
  known answer, and their ratio to FP32's (what the gate bars, on the user's own texts);
- batches: documents per second as a job runs them (length-sorted batches of the engine's batch
  size, a single-threaded stream per core), each graph and FP32 taking turns per repeat;
- single queries: p50 and p99 of 64-token texts one at a time on one thread, as the service
  embeds them.

The first graph of the CPU ladder (int8-dynamic) is the record's headline against FP32.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from precompute.bench.records import Figure, write_record
from precompute.bench.search.fidelity import cut_queries, one_at_a_time, taking_turns
from precompute.bench.search.fidelity_data import retrieval_set
from precompute.jobs.settings import JobSettings
from precompute.models import Engine
from precompute.models.backends import BuildSpec
from precompute.models.backends.onnxruntime import OnnxRuntimeRunner
from precompute.models.engines.gate import known_item_recall
from precompute.models.engines.load import _Builder
from precompute.models.hardware import device_fingerprint
from precompute.models.source import bundled_encoder, read_encoder
from precompute.models.text.encoder import Encoder, EngineReport
from precompute.models.text.reference import TextSample
from precompute.models.text.tokenize import TextTokenizer

GRAPHS = ("int8-dynamic", "int8-dynamic-fused", "int8-static", "int8-mixed-12", "int8-mixed-25", "int8-qdq")
"""The CPU ladder's graphs (batch, query, static, mixed) and the GPU's Q/DQ graph on CPU kernels."""
DOCUMENTS, QUERIES = 2_000, 500
SPEED_DOCS, REPEATS = 500, 3
LATENCY_QUERIES = 200
BATCH = 16


def encoder_of(builder: _Builder, variant: str, streams: int, threads: int = 1) -> Encoder:
    runner = OnnxRuntimeRunner(builder.onnx(variant), "cpu", threads)
    report = EngineReport("onnxruntime", "cpu", variant, "", True)
    return Encoder(runner, TextTokenizer(builder.config.model), BATCH, streams, report)


def answers(encoder: Encoder, documents: list[str], queries: list[str], answer_rows: np.ndarray) -> tuple[float, float]:
    """(recall@10, MRR@10) of each query's known answer among all documents."""
    docs, asked = encoder.encode(documents), encoder.encode(queries)
    order = np.concatenate([answer_rows, np.setdiff1d(np.arange(len(documents)), answer_rows)])
    return known_item_recall(asked, docs[order])  # query i's answer first: document i


def latency(builder: _Builder, variant: str, queries: list[str]) -> dict[str, float]:
    with encoder_of(builder, variant, streams=1) as one:
        return one_at_a_time(one, queries)


def main(model: str | None = None) -> dict[str, Any]:
    job = JobSettings()
    data = retrieval_set(job.work_dir.machine_dir() / "datasets", DOCUMENTS, QUERIES)
    folder = job.work_dir.machine_dir() / "bench-quantize"
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(data.corpus, folder / "corpus.parquet")  # the calibration texts come from it
    source = bundled_encoder() if model is None else read_encoder(Path(model))
    settings = Engine(model=source, reference=TextSample(path=str(folder / "corpus.parquet")))
    builder = _Builder(settings, "cpu", OnnxRuntimeRunner, BuildSpec(BATCH, source.max_seq_length))
    documents = data.corpus["text"].to_pylist()
    row = {id_: i for i, id_ in enumerate(data.corpus["id"].to_pylist())}
    answer_rows = np.array([row[a] for a in data.answers])
    streams = len(os.sched_getaffinity(0))
    speed_texts = documents[-SPEED_DOCS:]
    probes = cut_queries(documents, 64, LATENCY_QUERIES, 0)

    with encoder_of(builder, "fp32", streams) as fp32:
        recall_fp32, mrr_fp32 = answers(fp32, documents, data.queries, answer_rows)
    figures: dict[str, dict[str, Any]] = {"fp32": {"recall_at_10": round(recall_fp32, 4), "mrr_at_10": round(mrr_fp32, 4)}}
    figures["fp32"]["latency_64tok_ms"] = latency(builder, "fp32", probes)
    for variant in GRAPHS:
        with encoder_of(builder, variant, streams) as graph, encoder_of(builder, "fp32", streams) as fp32:
            recall, mrr = answers(graph, documents, data.queries, answer_rows)
            ours_dps, fp32_dps = taking_turns(graph, fp32, speed_texts, REPEATS)
        query = latency(builder, variant, probes)
        figures[variant] = {
            "recall_at_10": round(recall, 4),
            "recall_ratio": round(recall / recall_fp32, 4),
            "mrr_ratio": round(mrr / mrr_fp32, 4),
            "docs_per_s": round(ours_dps, 1),
            "fp32_docs_per_s": round(fp32_dps, 1),
            "batch_speedup": round(ours_dps / fp32_dps, 3),
            "latency_64tok_ms": query,
            "latency_ratio_p50": round(query["p50_ms"] / figures["fp32"]["latency_64tok_ms"]["p50_ms"], 3),
        }
        f = figures[variant]
        print(
            f"{variant:20s} recall ratio {f['recall_ratio']:.4f}, MRR ratio {f['mrr_ratio']:.4f}; batches "
            f"{f['docs_per_s']} docs/s vs FP32 {f['fp32_docs_per_s']} ({f['batch_speedup']:.3f}x); 64-token query "
            f"p50 {query['p50_ms']:.2f} ms, p99 {query['p99_ms']:.2f} ms ({f['latency_ratio_p50']:.3f}x FP32's p50)"
        )
    result = {
        "bench": "quantize",
        "machine": device_fingerprint("cpu"),
        "model": f"{source.folder.name} ({source.architecture}, {source.dim}-d)",
        "documents": DOCUMENTS,
        "queries": QUERIES,
        "streams": streams,
        "graphs": figures,
    }
    print(f"FP32: recall@10 {recall_fp32:.4f}, MRR@10 {mrr_fp32:.4f}; machine {result['machine']}")
    print(json.dumps(result))
    first = figures[GRAPHS[0]]
    write_record(
        "quantize",
        result,
        dataset=f"20 Newsgroups known-item set, {DOCUMENTS:,} documents, {QUERIES} queries; {result['model']}",
        ours=Figure(f"{GRAPHS[0]} graph, batches of {BATCH}", first["docs_per_s"], "docs/s"),
        baseline=Figure(f"ONNX Runtime FP32 graph, batches of {BATCH}", first["fp32_docs_per_s"], "docs/s"),
        ratio=first["batch_speedup"],
    )
    return result
