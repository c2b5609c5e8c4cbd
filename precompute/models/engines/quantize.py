"""Derive each precision's ONNX graph from the FP32 export.

- int8-dynamic (CPU): weights INT8 per output channel, activations quantized per batch
  at run time. Signed per-channel weights keep accuracy; unsigned per-tensor did not. On x86
  CPUs without VNNI the CPU graphs take 7-bit weights (hardware.int8_saturates).
- int8-mixed-<share> (CPU): int8-dynamic with the share of weight MatMuls most sensitive to
  quantization kept in float (mixed_precision.py), for models whose INT8 moves neighbours.
- int8-dynamic-fused (CPU, one text at a time): the same over ONNX Runtime's fused BERT
  graph, where attention, LayerNorm and GELU are single kernels (79 nodes instead of 252).
- int8-static (CPU, batched queries): activation ranges fixed by calibration texts of the
  output's input (MinMax), unsigned and asymmetric as ONNX Runtime's CPU kernels run fastest,
  weights signed per channel; Q/DQ around the weight MatMuls only, so LayerNorm, Softmax and
  GELU inputs stay float, and the attention-score and FFN down-projection MatMuls unquantized
  (outlier_matmuls). A row's output never depends on its batch: what micro-batched queries need.
  Slower in batches than int8-dynamic on the CPUs measured (`precompute bench quantize`).
- int8-qdq (GPU, TensorRT): explicit QuantizeLinear/DequantizeLinear pairs with ranges
  from calibration texts, symmetric as TensorRT requires. TensorRT 10 deprecated and 11
  removed implicit INT8 calibration: strongly typed networks take precision from Q/DQ.
- fp16 (GPU): FP16 weights and compute, FP32 inputs and outputs.
- int8-qdq-features (towers, CPU and GPU): static INT8 with Q/DQ around Gemm and MatMul,
  calibrated on feature rows. Dynamic INT8 would leave Gemm, the op torch exports nn.Linear
  as, in float.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import lru_cache, partial
from pathlib import Path

import numpy as np
import onnx
from onnxruntime.quantization import (
    CalibrationDataReader,
    CalibrationMethod,
    QuantFormat,
    QuantType,
    quantize_dynamic,
    quantize_static,
)
from onnxruntime.quantization.shape_inference import quant_pre_process
from onnxruntime.transformers import optimizer
from onnxruntime.transformers.float16 import convert_float_to_float16

from precompute.models.backends.base import Feeds
from precompute.models.engines.graphs import MIXED_SHARES
from precompute.models.hardware import int8_saturates
from precompute.models.source import INPUT_NAMES, ModelSource
from precompute.models.text.tokenize import TextTokenizer

CALIBRATION_BATCH = 8


def int8_dynamic(
    fp32: Path, out: Path, calibration: Sequence[str], source: ModelSource, keep_float: Sequence[str] = ()
) -> None:
    """`keep_float`: MatMul nodes left in float (a mixed graph's).

    The graph goes in loaded: given a path, ONNX Runtime writes its shape-inferred copy beside
    the FP32 model under a fixed name and deletes it, so two builds from one export (a failed
    run's engine task still building as the next run starts one) removed each other's file."""
    quantize_dynamic(
        onnx.load(str(fp32)),
        out,
        weight_type=QuantType.QInt8,
        per_channel=True,
        reduce_range=int8_saturates(),
        op_types_to_quantize=["MatMul"],
        nodes_to_exclude=list(keep_float),
    )


SENSITIVITY_TEXTS = 32
"""Calibration texts the sensitivities are computed on: the ranking is stable well before."""


@lru_cache(maxsize=2)
def sensitivity(fp32: Path, texts: tuple[str, ...], source: ModelSource) -> dict[str, float]:
    """The ranking, once per model and texts: the ladder's mixed graphs all start from it."""
    from precompute.models.engines.mixed_precision import matmul_sensitivity

    batches = TextTokenizer(source).batches(texts, CALIBRATION_BATCH)
    return matmul_sensitivity(fp32, [dict(zip(INPUT_NAMES, (b.input_ids, b.attention_mask), strict=True)) for b in batches])


def int8_mixed(fp32: Path, out: Path, calibration: Sequence[str], source: ModelSource, share: float) -> None:
    """Rank the weight MatMuls by sensitivity on the calibration texts, keep the worst `share` in
    float; the ranking is saved beside the graph (float_matmuls.json) for the record."""
    ranked = sensitivity(fp32, tuple(calibration[:SENSITIVITY_TEXTS]), source)
    kept = list(ranked)[: math.ceil(share * len(ranked))]
    out.with_name("float_matmuls.json").write_text(
        json.dumps({"share": share, "float": kept, "sensitivity": ranked}, indent=1)
    )
    int8_dynamic(fp32, out, calibration, source, keep_float=kept)


def int8_dynamic_fused(fp32: Path, out: Path, calibration: Sequence[str], source: ModelSource) -> None:
    """For a single short text, per-node overhead outweighs arithmetic: fusing makes a query
    faster, and batches slower (hence not for jobs; `precompute bench query-engines`).
    Attention becomes QAttention; accuracy to FP32 is the same as int8-dynamic's."""
    config = json.loads((source.folder / "config.json").read_text())
    fused = out.with_suffix(".fused.onnx")
    optimizer.optimize_model(
        str(fp32),
        model_type="bert",
        num_heads=config["num_attention_heads"],
        hidden_size=config["hidden_size"],
        opt_level=1,
    ).save_model_to_file(str(fused))
    quantize_dynamic(
        fused,
        out,
        weight_type=QuantType.QInt8,
        per_channel=True,
        reduce_range=int8_saturates(),
        op_types_to_quantize=["MatMul", "Attention"],
        # The fused ops are contrib ops that ONNX shape inference cannot type.
        extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
    )
    fused.unlink()


class _TextBatches(CalibrationDataReader):
    """Feeds calibration texts to ONNX Runtime's calibrator as length-bucketed batches."""

    def __init__(self, texts: Sequence[str], source: ModelSource) -> None:
        batches = TextTokenizer(source).batches(texts, CALIBRATION_BATCH)
        self._feeds: Iterator[dict[str, np.ndarray]] = (
            dict(zip(INPUT_NAMES, (b.input_ids, b.attention_mask), strict=True)) for b in batches
        )

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._feeds, None)


def outlier_matmuls(model: onnx.ModelProto) -> list[str]:
    """MatMuls kept in float: attention scores and values (both operands are activations)
    and the FFN down-projection, whose GELU input has outliers that one INT8 scale cannot
    hold: quantizing them too fails any cosine gate (docs/engines.md)."""
    return [
        node.name
        for node in model.graph.node
        if node.op_type == "MatMul"
        and (
            node.name.endswith(("self/MatMul", "self/MatMul_1"))
            or ("/output/dense/" in node.name and "/attention/" not in node.name)
        )
    ]


def static_int8(
    fp32: Path, out: Path, calibration: Sequence[str], source: ModelSource, activations: QuantType, reduce_range: bool
) -> None:
    """Q/DQ around the weight MatMuls but outlier_matmuls, ranges from the calibration texts
    (MinMax), weights signed and symmetric per channel; signed activations are symmetric too."""
    prepared = out.with_suffix(".prepared.onnx")
    quant_pre_process(fp32, prepared, skip_symbolic_shape=True)
    quantize_static(
        prepared,
        out,
        _TextBatches(calibration, source),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        activation_type=activations,
        weight_type=QuantType.QInt8,
        reduce_range=reduce_range,
        op_types_to_quantize=["MatMul"],
        nodes_to_exclude=outlier_matmuls(onnx.load(prepared, load_external_data=False)),
        calibrate_method=CalibrationMethod.MinMax,
        extra_options={"ActivationSymmetric": activations == QuantType.QInt8, "WeightSymmetric": True},
    )
    prepared.unlink()


def int8_qdq(fp32: Path, out: Path, calibration: Sequence[str], source: ModelSource) -> None:
    static_int8(fp32, out, calibration, source, QuantType.QInt8, reduce_range=False)  # as TensorRT takes it


def int8_static(fp32: Path, out: Path, calibration: Sequence[str], source: ModelSource) -> None:
    static_int8(fp32, out, calibration, source, QuantType.QUInt8, reduce_range=int8_saturates())


def fp16(fp32: Path, out: Path, calibration: Sequence[str], source: ModelSource) -> None:
    onnx.save(convert_float_to_float16(onnx.load(fp32), keep_io_types=True), out)


Quantizer = Callable[[Path, Path, Sequence[str], ModelSource], None]

QUANTIZERS: dict[str, Quantizer] = {
    "int8-dynamic": int8_dynamic,
    "int8-dynamic-fused": int8_dynamic_fused,
    **{variant: partial(int8_mixed, share=share) for variant, share in MIXED_SHARES.items()},
    "int8-qdq": int8_qdq,
    "int8-static": int8_static,
    "fp16": fp16,
}


class _Feeds(CalibrationDataReader):
    """Feeds prepared batches (a tower's feature rows) to ONNX Runtime's calibrator."""

    def __init__(self, feeds: Iterable[Feeds]) -> None:
        self._feeds = iter(feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        feeds = next(self._feeds, None)
        return None if feeds is None else dict(feeds)


def int8_qdq_features(fp32: Path, out: Path, calibration: Iterable[Feeds]) -> None:
    """Static INT8 of a feature graph: symmetric Q/DQ on Gemm and MatMul, per channel."""
    prepared = out.with_suffix(".prepared.onnx")
    quant_pre_process(fp32, prepared, skip_symbolic_shape=True)
    quantize_static(
        prepared,
        out,
        _Feeds(calibration),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        activation_type=QuantType.QInt8,
        weight_type=QuantType.QInt8,
        op_types_to_quantize=["MatMul", "Gemm"],
        extra_options={"ActivationSymmetric": True, "WeightSymmetric": True},
    )
    prepared.unlink()
