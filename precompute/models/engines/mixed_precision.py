"""Which MatMuls a mixed INT8 graph keeps in float: the ones most sensitive to quantization.

Dynamic INT8 quantizes every weight MatMul (activations per tensor at run time, weights per
output channel). A few of them carry activations with outliers that one INT8 scale cannot hold
(MPNet's FFN down-projections), and those few move a text's vector enough to reorder its
nearest neighbours. Each MatMul's sensitivity is computed on the calibration texts: the
relative error of its own output when its input and weight are quantized as ONNX Runtime
would, everything upstream exact, per token and then averaged: one scale per tensor serves a
few outlier tokens and crushes the rest, which a norm over the whole tensor would hide. The
mixed rung keeps the worst of them in float.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper


def weight_matmuls(model: onnx.ModelProto) -> dict[str, tuple[str, np.ndarray]]:
    """MatMul nodes whose second input is a weight: {node name: (activation input, weight)}."""
    weights = {init.name: init for init in model.graph.initializer}
    return {
        node.name: (node.input[0], numpy_helper.to_array(weights[node.input[1]]))
        for node in model.graph.node
        if node.op_type == "MatMul" and node.input[1] in weights
    }


def quantized_activation(x: np.ndarray) -> np.ndarray:
    """DynamicQuantizeLinear: uint8, asymmetric, one scale per tensor, range through zero."""
    low, high = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
    scale = (high - low) / 255 or 1.0
    zero = np.clip(np.round(-low / scale), 0, 255)
    return (np.clip(np.round(x / scale) + zero, 0, 255) - zero) * scale


def quantized_weight(w: np.ndarray) -> np.ndarray:
    """Signed INT8, symmetric, one scale per output channel (the last axis)."""
    scale = np.abs(w).max(axis=0, keepdims=True) / 127
    scale[scale == 0] = 1.0
    return np.clip(np.round(w / scale), -127, 127) * scale


def matmul_sensitivity(fp32: Path, feeds: Iterable[Mapping[str, np.ndarray]]) -> dict[str, float]:
    """Each weight MatMul's relative output error under INT8, worst first."""
    model = onnx.load(fp32)
    matmuls = weight_matmuls(model)
    inputs = sorted({x for x, _ in matmuls.values()})
    known = {output.name for output in model.graph.output}
    model.graph.output.extend(
        onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None) for name in inputs if name not in known
    )
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    error, tokens = dict.fromkeys(matmuls, 0.0), 0
    for feed in feeds:
        activations = dict(zip(inputs, session.run(inputs, dict(feed)), strict=True))
        real = np.asarray(feed["attention_mask"], dtype=bool).reshape(-1)
        tokens += int(real.sum())
        for name, (x_name, w) in matmuls.items():
            x = activations[x_name]
            x = x.reshape(-1, x.shape[-1])
            exact = x @ w
            off = np.linalg.norm(quantized_activation(x) @ quantized_weight(w) - exact, axis=1)
            error[name] += float(np.sum((off / np.maximum(np.linalg.norm(exact, axis=1), 1e-12))[real]))
    ranked = {name: error[name] / max(tokens, 1) for name in matmuls}
    return dict(sorted(ranked.items(), key=lambda item: -item[1]))
