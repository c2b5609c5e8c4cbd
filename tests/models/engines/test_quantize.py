"""The GPU precisions' graphs, checked on the CPU: ONNX Runtime executes Q/DQ and FP16 exactly
as the graph says, so their accuracy is known before any GPU runs them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from precompute.models.backends.onnxruntime import OnnxRuntimeRunner
from precompute.models.engines.gate import row_cosine
from precompute.models.engines.load import reference_embeddings
from precompute.models.engines.quantize import QUANTIZERS
from precompute.models.settings import Engine
from precompute.models.source import bundled_encoder
from precompute.models.text.encoder import encode_texts
from precompute.models.text.reference import reference_texts
from precompute.models.text.tokenize import TextTokenizer

pytestmark = pytest.mark.slow  # seconds to minutes each: left out of `pytest -m "not slow"`


@pytest.fixture(scope="module")
def gate_set(settings: Engine) -> tuple[list[str], np.ndarray]:
    texts = reference_texts(settings.reference, "gate", settings.policy.gate_texts)
    return texts, reference_embeddings(settings, texts)


def quantized(settings: Engine, export: Path, variant: str, tmp_path: Path) -> Path:
    calibration = reference_texts(settings.reference, "calibration", settings.policy.calibration_texts)
    out = tmp_path / f"{variant}.onnx"
    QUANTIZERS[variant](export / "model.onnx", out, calibration, settings.model)
    return out


def agreement(path: Path, gate_set: tuple[list[str], np.ndarray]) -> np.ndarray:
    texts, reference = gate_set
    source = bundled_encoder()
    with OnnxRuntimeRunner(path, "cpu", 2) as runner:
        return row_cosine(encode_texts(runner, TextTokenizer(source), texts, 16), reference)


def test_int8_qdq_is_explicit_symmetric_and_accurate(
    settings, bundled_cache, gate_set, tmp_path: Path
) -> None:
    path = quantized(settings, bundled_cache["export"], "int8-qdq", tmp_path)
    graph = onnx.load(path).graph
    quantize_nodes = [n for n in graph.node if n.op_type == "QuantizeLinear"]
    assert len(quantize_nodes) >= 24  # 4 weight MatMuls per layer, 6 layers
    zero_points = {i.name: i for i in graph.initializer if i.name.endswith("zero_point")}
    assert zero_points and all(
        onnx.numpy_helper.to_array(z).dtype == np.int8 and not onnx.numpy_helper.to_array(z).any()
        for z in zero_points.values()
    ), "TensorRT needs symmetric INT8: every zero point 0"
    cosine = agreement(path, gate_set)
    assert cosine.mean() >= 0.99 and cosine.min() >= 0.97


def test_fp16_keeps_fp32_io_and_agrees(settings, bundled_cache, gate_set, tmp_path: Path) -> None:
    path = quantized(settings, bundled_cache["export"], "fp16", tmp_path)
    model = onnx.load(path)
    assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.INT64
    assert model.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert any(i.data_type == onnx.TensorProto.FLOAT16 for i in model.graph.initializer)
    cosine = agreement(path, gate_set)
    assert cosine.min() >= 0.999
