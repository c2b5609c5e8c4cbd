"""`precompute bench embed`: our best engine against what a user would otherwise run on the
same device, on the same texts: sentence-transformers FP32 on a CPU, FP16 on a GPU; and, where
ours is quantized, against the same model's ONNX Runtime FP32 graph on the same backend (what
the quantization itself buys: `speedup_vs_onnxruntime_fp32`).

Both sides go from raw text to normalised embeddings (tokenization included), use the
same batch size and take turns in each repeat, so machine noise hits both alike.
Our engine's cosine to FP32 is its gate's (held-out texts against the FP32 PyTorch reference).
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch
from sentence_transformers import SentenceTransformer

from precompute.bench.records import Figure, write_record
from precompute.demo_data import DEMO_CORPUS
from precompute.models import Encoder, Engine, load_encoder
from precompute.models.engines.gate import row_cosine
from precompute.models.hardware import device_fingerprint
from precompute.models.source import bundled_encoder, read_encoder
from precompute.models.text.reference import TextSample

WARMUP_TEXTS = 64


def timed(fn: Callable[[], np.ndarray]) -> tuple[float, np.ndarray]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def mean_tokens(encoder: Encoder, texts: Sequence[str]) -> float:
    batches = encoder.tokenizer.batches(texts, encoder.batch_size)
    return sum(int(b.attention_mask.sum()) for b in batches) / len(texts)


def baseline_model(settings: Engine, device: str) -> tuple[SentenceTransformer, str]:
    """sentence-transformers as its documentation runs it on `device`: FP32 on a CPU, FP16 on a
    GPU, whatever dtype the folder's weights were saved in."""
    model = SentenceTransformer(str(settings.model.folder), device=device)
    model.max_seq_length = settings.model.max_seq_length
    if device == "cuda":
        return model.half(), "sentence-transformers FP16 (PyTorch, CUDA)"
    return model.float(), "sentence-transformers FP32 (PyTorch)"


def run(texts: Sequence[str], repeats: int, settings: Engine) -> dict[str, object]:
    encoder = load_encoder(settings)
    report = encoder.report
    baseline, baseline_name = baseline_model(settings, report.device)
    batch_size = encoder.batch_size

    def ours() -> np.ndarray:
        return encoder.encode(texts)

    def theirs() -> np.ndarray:
        return baseline.encode(list(texts), batch_size=batch_size, normalize_embeddings=True)

    quantized = report.backend == "onnxruntime" and report.precision != "fp32"
    fp32 = load_encoder(settings.replace(precision="fp32")) if quantized else None
    encoder.encode(texts[:WARMUP_TEXTS])
    baseline.encode(list(texts[:WARMUP_TEXTS]), batch_size=batch_size)
    our_times, base_times, fp32_times = [], [], []
    for _ in range(repeats):
        seconds, embeddings = timed(ours)
        our_times.append(seconds)
        seconds, reference = timed(theirs)
        base_times.append(seconds)
        if fp32 is not None:
            fp32_times.append(timed(lambda: fp32.encode(texts))[0])
    cosine = row_cosine(embeddings, reference)
    ours_dps = len(texts) / statistics.median(our_times)
    base_dps = len(texts) / statistics.median(base_times)
    fp32_dps = len(texts) / statistics.median(fp32_times) if fp32_times else ours_dps
    if fp32 is not None:
        fp32.close()
    gate = report.gates[-1] if report.gates else None  # none where the FP32 reference itself serves
    result = {
        "bench": "embed",
        "machine": device_fingerprint(report.device),
        "docs": len(texts),
        "mean_tokens": round(mean_tokens(encoder, texts), 1),
        "repeats": repeats,
        "batch_size": batch_size,
        "engine": f"{report.backend}/{report.device}/{report.precision}",
        "model": f"{settings.model.folder} ({settings.model.architecture}, {settings.model.dim}-d)",
        "streams": encoder.streams,
        "torch_threads": torch.get_num_threads(),
        "ours_docs_per_s": round(ours_dps, 1),
        "baseline": baseline_name,
        "baseline_docs_per_s": round(base_dps, 1),
        "ratio": round(ours_dps / base_dps, 2),
        "cosine_mean": round(float(cosine.mean()), 4),
        "cosine_min": round(float(cosine.min()), 4),
        "onnxruntime_fp32_docs_per_s": round(fp32_dps, 1),
        "speedup_vs_onnxruntime_fp32": round(ours_dps / fp32_dps, 3),
        "gate_recall_ratio": gate and gate.recall_ratio,
        "gate_mrr_ratio": gate and gate.mrr_ratio,
        "gate_pairs": gate and gate.pairs,
        "gates": [
            {"precision": g.precision, "passed": g.passed, "recall_ratio": g.recall_ratio, "mean_cosine": g.mean_cosine}
            for g in report.gates
        ],
        "gate_cosine_mean": gate and gate.mean_cosine,
        "gate_cosine_min": gate and gate.min_cosine,
        "gate_overlap10": gate and gate.overlap,
    }
    encoder.close()
    return result


def main(docs: int, repeats: int, corpus: str | None = None, model: str | None = None) -> dict[str, object]:
    """`model`: a sentence-transformers folder (default: the bundled model); gated on `corpus`."""
    path = corpus or str(DEMO_CORPUS)
    source = bundled_encoder() if model is None else read_encoder(Path(model))
    settings = Engine(model=source, reference=TextSample(path=path))
    texts = pq.read_table(path, columns=["text"])["text"].to_pylist()[:docs]
    result = run(texts, repeats, settings)
    print(f"model {result['model']}")
    print(
        f"engine {result['engine']}, batch {result['batch_size']}, {result['docs']} docs "
        f"of {result['mean_tokens']} tokens on average, median of {repeats} repeats"
    )
    print(f"ours      {result['ours_docs_per_s']:8.1f} docs/s")
    print(f"baseline  {result['baseline_docs_per_s']:8.1f} docs/s  ({result['baseline']})")
    print(f"ratio     {result['ratio']:8.2f}x")
    print(
        f"against the ONNX Runtime FP32 graph: {result['onnxruntime_fp32_docs_per_s']:.1f} docs/s, "
        f"ours {result['speedup_vs_onnxruntime_fp32']:.3f}x"
    )
    print(f"cosine to the baseline: mean {result['cosine_mean']:.4f}, min {result['cosine_min']:.4f}")
    for gate in result["gates"]:
        print(f"gate {gate['precision']}: {'passed' if gate['passed'] else 'failed'}, known-item recall ratio {gate['recall_ratio']}, mean cosine {gate['mean_cosine']:.4f}")
    if result["gate_recall_ratio"] is not None:
        print(
            f"served gate against FP32 on {path}: known-item recall ratio {result['gate_recall_ratio']:.4f} "
            f"({result['gate_pairs']} pairs), MRR ratio {result['gate_mrr_ratio']}, cosine mean "
            f"{result['gate_cosine_mean']:.4f}, min {result['gate_cosine_min']:.4f}, top-10 overlap {result['gate_overlap10']:.4f}"
        )
    print(f"machine {result['machine']}")
    print(json.dumps(result))
    batch = f"batch {result['batch_size']}"
    demo = Path(path).parts[-2:] == DEMO_CORPUS.parts[-2:]  # the demo corpus, wherever it lies
    write_record(
        "embed",
        result,
        dataset=f"demo corpus, {len(texts):,} Debian package descriptions" if demo else f"{path}, {len(texts):,} texts",
        ours=Figure(f"our encoder, {result['engine']}, {batch}", result["ours_docs_per_s"], "docs/s"),
        baseline=Figure(f"{result['baseline']}, {batch}", result["baseline_docs_per_s"], "docs/s"),
        ratio=result["ratio"],
        device="cuda" if str(result["machine"]).startswith("cuda:") else "cpu",
    )
    return result
