"""The accuracy gate: thresholds, and fallback to the next precision up."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from precompute.models import Engine, load_encoder
from precompute.models.engines import runtime
from precompute.models.engines.gate import cosine_gate
from precompute.models.engines.graphs import MIXED_SHARES
from precompute.models.engines.quantize import QUANTIZERS, int8_dynamic
from precompute.models.source import ModelSource


def with_cosines(cosine: list[float]) -> tuple[np.ndarray, np.ndarray]:
    """(embeddings, reference): orthonormal reference rows, each embedding row at its cosine to
    its own, turned towards an axis no row uses (so every row's neighbours stay the same)."""
    n = len(cosine)
    reference = np.eye(n + 1)[:n]
    c = np.array(cosine)[:, None]
    return c * reference + np.sqrt(np.clip(1 - c**2, 0, None)) * np.eye(n + 1)[n], reference


@pytest.mark.parametrize(
    ("cosine", "passed", "reason"),
    [
        ([0.995, 0.995, 0.985], True, ""),
        ([0.99, 0.99, 0.97], False, "mean cosine 0.9833 < 0.99"),
        ([1.0, 1.0, 1.0, 1.0, 0.96], False, "min cosine 0.9600 < 0.97"),
    ],
)
def test_cosine_thresholds(cosine: list[float], passed: bool, reason: str) -> None:
    result = cosine_gate("int8", *with_cosines(cosine), (0.99, 0.97, 0.95))
    assert (result.passed, result.reason) == (passed, reason)


def test_nan_fails_every_threshold() -> None:
    embeddings, reference = with_cosines([1.0, 1.0, 1.0])
    embeddings[1] = np.nan
    result = cosine_gate("int8", embeddings, reference, (0.99, 0.97, 0.0))
    assert not result.passed and result.reason.startswith("mean cosine nan < 0.99; min cosine nan < 0.97")


def test_vectors_close_in_cosine_can_still_move_neighbours() -> None:
    """Texts on one topic, their neighbours close together: every vector moved a little (cosine
    0.995 to its own) reorders them; cosine passes, the neighbour overlap does not."""
    rng = np.random.default_rng(0)
    centre = rng.standard_normal(64)
    reference = centre + 0.05 * np.linalg.norm(centre) * rng.standard_normal((40, 64))
    reference /= np.linalg.norm(reference, axis=1, keepdims=True)
    moved = reference + 0.01 * rng.standard_normal((40, 64))
    moved /= np.linalg.norm(moved, axis=1, keepdims=True)
    result = cosine_gate("int8", moved, reference, (0.99, 0.97, 0.95))
    assert result.min_cosine > 0.99 and not result.passed
    assert result.reason == f"top-10 neighbour overlap {result.overlap:.4f} < 0.95"
    assert cosine_gate("fp32", reference, reference, (0.9, 0.9, 0.95)).overlap == 1.0


def degraded_int8(fp32: Path, out: Path, calibration: list[str], source: ModelSource) -> None:
    """A broken quantizer: seeded noise of half a weight's spread on every MatMul weight."""
    model = onnx.load(fp32)
    rng = np.random.default_rng(0)
    for init in model.graph.initializer:
        weight = numpy_helper.to_array(init)
        if weight.ndim == 2 and weight.shape[0] == 384:
            noisy = weight + rng.normal(0, 0.5 * weight.std(), weight.shape).astype(weight.dtype)
            init.CopyFrom(numpy_helper.from_array(noisy, init.name))
    noisy_path = out.with_suffix(".noisy.onnx")
    onnx.save(model, noisy_path)
    int8_dynamic(noisy_path, out, calibration, source)
    noisy_path.unlink()


@pytest.mark.slow
@pytest.mark.usefixtures("cpu_without_bf16")  # a ladder with BF16 has no mixed graphs
def test_degraded_int8_falls_back_to_a_mixed_graph_of_its_most_sensitive_matmuls_in_float(
    settings: Engine, bundled_cache: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The all-INT8 graph fails; the first mixed graph that passes serves, and it kept in float
    the MatMuls its sensitivity ranking put first."""
    for entry in bundled_cache.values():  # reuse the FP32 export and reference, not the INT8 entry
        shutil.copytree(entry, tmp_path / entry.name)
    monkeypatch.setitem(QUANTIZERS, "int8-dynamic", degraded_int8)

    # At the default overlap (0.98) MiniLM's mixed graphs fail too and FP32 serves (the next test).
    with load_encoder(settings.replace(cache_dir=tmp_path, gate_min_overlap=0.9)) as mixed:
        report = mixed.report
    assert report.precision == "int8-mixed"
    failed, *tried = report.gates
    assert (failed.precision, failed.passed) == ("int8", False) and "cosine" in failed.reason
    assert [g.precision for g in tried] == list(MIXED_SHARES)[: len(tried)]
    assert tried[-1].passed and not any(g.passed for g in tried[:-1])
    (record,) = tmp_path.glob(f"onnx-{tried[-1].precision}-*/float_matmuls.json")
    kept = json.loads(record.read_text())
    assert kept["float"] == list(kept["sensitivity"])[: len(kept["float"])]
    assert len(kept["float"]) == math.ceil(MIXED_SHARES[tried[-1].precision] * len(kept["sensitivity"]))
    graph = onnx.load(Path(report.engine_dir) / "model.onnx", load_external_data=False)
    assert set(kept["float"]) <= {node.name for node in graph.graph.node if node.op_type == "MatMul"}


@pytest.mark.slow
@pytest.mark.parametrize("native_bf16", [False, True], ids=["to-fp32", "to-bf16"])
def test_an_engine_degraded_at_every_int8_graph_falls_back_to_the_next_rung(
    settings: Engine,
    bundled_cache: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    native_bf16: bool,
) -> None:
    """FP32, or BF16 on PyTorch where the CPU multiplies it in hardware (here made to say so)."""
    for entry in bundled_cache.values():
        shutil.copytree(entry, tmp_path / entry.name)
    for variant in ("int8-dynamic", *MIXED_SHARES):
        monkeypatch.setitem(QUANTIZERS, variant, degraded_int8)
    monkeypatch.setattr(runtime, "native_bf16", lambda: native_bf16)

    with load_encoder(settings.replace(cache_dir=tmp_path)) as fallback:
        report = fallback.report
    *failed, passed = report.gates
    # A ladder with BF16 has no mixed graphs: BF16 is nearer FP32 and faster than each (Builder.variants).
    assert [g.precision for g in failed] == ["int8", *(() if native_bf16 else MIXED_SHARES)]
    assert not any(g.passed for g in failed) and failed[0].mean_cosine < 0.99
    if native_bf16:
        assert (report.backend, report.precision, passed.precision) == ("torch", "bf16", "bf16")
        assert passed.passed
        assert passed.min_cosine > 0.999 and passed.overlap >= 0.98
    else:
        assert (report.backend, report.precision, passed.precision) == ("onnxruntime", "fp32", "fp32")
        assert passed.passed
        assert passed.min_cosine > 0.9999 and passed.overlap == 1.0


def test_the_real_engine_is_the_first_graph_to_keep_minilms_neighbours(encoder) -> None:
    """On the demo corpus's held-out texts MiniLM's all-INT8 graph keeps the cosine bar and still
    moves about one neighbour in ten, under the 0.98 overlap; what serves is the first graph on
    the ladder that keeps them (FP32 on the CPUs measured: README, "Search fidelity")."""
    int8, *_, served = encoder.report.gates
    assert (int8.precision, int8.passed) == ("int8", False) and int8.mean_cosine >= 0.99
    assert "overlap" in int8.reason and int8.overlap < 0.98
    assert served.passed and served.overlap >= 0.98 and not any(g.passed for g in encoder.report.gates[:-1])
