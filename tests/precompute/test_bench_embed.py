"""`precompute bench embed --model PATH` takes any sentence-transformers folder, however small or odd."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from precompute.bench.embed import main
from precompute.bench.records import RESULTS_ENV
from tests.models.tiny import HIDDEN, tiny_encoder

KEYS = {
    "bench",
    "docs",
    "mean_tokens",
    "repeats",
    "batch_size",
    "engine",
    "model",
    "machine",
    "streams",
    "torch_threads",
    "ours_docs_per_s",
    "baseline",
    "baseline_docs_per_s",
    "ratio",
    "cosine_mean",
    "cosine_min",
    "onnxruntime_fp32_docs_per_s",
    "speedup_vs_onnxruntime_fp32",
    "gate_recall_ratio",
    "gate_mrr_ratio",
    "gate_pairs",
    "gates",
    "gate_cosine_mean",
    "gate_cosine_min",
    "gate_overlap10",
}


def test_a_random_two_layer_bert_with_cls_pooling(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tiny_encoder(tmp_path / "cls", "bert", pooling="cls", normalize=False)
    monkeypatch.setenv("PRECOMPUTE_ENGINE_CACHE_DIR", str(tmp_path / "engines"))
    monkeypatch.setenv("PRECOMPUTE_ENGINE_GATE_TEXTS", "64")
    monkeypatch.setenv("PRECOMPUTE_ENGINE_CALIBRATION_TEXTS", "32")
    monkeypatch.setenv(RESULTS_ENV, str(tmp_path / "results"))
    result = main(docs=32, repeats=3, model=str(folder))
    assert set(result) == KEYS
    assert result["model"].endswith(f"(bert, {HIDDEN}-d)")
    assert result["ratio"] > 0 and result["cosine_min"] > 0.97  # against sentence-transformers itself
    assert result["baseline"] == "sentence-transformers FP32 (PyTorch)"  # on a CPU
    assert result["gate_cosine_min"] >= 0.97  # the engine that served passed its gate
    assert result["gates"][-1]["passed"] and result["gate_recall_ratio"] >= 0.99
    (path,) = (tmp_path / "results").iterdir()  # the run's record
    record = json.loads(path.read_text())
    assert record["bench"] == "embed" and record["result"] == result
    assert record["ours"]["value"] == result["ours_docs_per_s"] and record["ratio"] == result["ratio"]
    assert record["dataset"] == "demo corpus, 32 Debian package descriptions"
