"""The accuracy gate: thresholds, and fallback to the next precision up."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from precompute.models import Engine, load_encoder
from precompute.models.gate import cosine_gate
from precompute.models.quantize import QUANTIZERS, int8_dynamic
from precompute.models.source import ModelSource


@pytest.mark.parametrize(
    ("cosine", "passed", "reason"),
    [
        ([0.995, 0.995, 0.985], True, ""),
        ([0.99, 0.99, 0.97], False, "mean cosine 0.9833 < 0.99"),
        ([1.0, 1.0, 1.0, 1.0, 0.96], False, "min cosine 0.9600 < 0.97"),
        ([1.0, float("nan")], False, "mean cosine nan < 0.99; min cosine nan < 0.97"),
    ],
)
def test_thresholds(cosine: list[float], passed: bool, reason: str) -> None:
    result = cosine_gate("int8", np.array(cosine), 0.99, 0.97)
    assert (result.passed, result.reason) == (passed, reason)


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


def test_degraded_engine_fails_gate_and_falls_back(
    settings: Engine, bundled_cache: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for entry in bundled_cache.values():  # reuse the FP32 export and reference, not the INT8 entry
        shutil.copytree(entry, tmp_path / entry.name)
    monkeypatch.setitem(QUANTIZERS, "int8-dynamic", degraded_int8)

    with load_encoder(settings.replace(cache_dir=tmp_path)) as fallback:
        report = fallback.report
    assert report.precision == "fp32"
    failed, passed = report.gates
    assert (failed.precision, failed.passed) == ("int8", False)
    assert "cosine" in failed.reason and failed.mean_cosine < 0.99
    assert (passed.precision, passed.passed) == ("fp32", True)
    assert passed.min_cosine > 0.9999


def test_the_real_int8_engine_passes(encoder) -> None:
    assert encoder.report.precision == "int8"
    (gate,) = encoder.report.gates
    assert gate.passed and gate.mean_cosine >= 0.99 and gate.min_cosine >= 0.97
