"""The ONNX graph each rung of a text model's ladder runs (load.py), and the graphs quantize.py makes.

Constants only: the service and the jobs read them on every engine's start, and quantize.py's
tools are slow to import (needed on a cache miss only).
"""

from __future__ import annotations

from precompute.models.backends import ConcreteDevice

# The ONNX graph each (device, precision) runs; fp32 runs the export itself, bf16 (PyTorch) none.
ONNX_VARIANTS: dict[tuple[ConcreteDevice, str], str] = {
    ("cpu", "int8"): "int8-dynamic",
    ("cuda", "int8"): "int8-qdq",
    ("cuda", "fp16"): "fp16",
    ("cpu", "bf16"): "bf16",
    ("cpu", "fp32"): "fp32",
    ("cuda", "fp32"): "fp32",
}
# The single-query graph of a variant, where one exists (EngineSettings.graph): ONNX Runtime's
# BERT fusions, for BERT encoders.
FUSED = {"int8-dynamic": "int8-dynamic-fused"}
FUSABLE = ("bert",)
# The static graph of a variant (EngineSettings.graph = "static"): activation ranges calibrated
# once, so a row's output never depends on its batch peers.
STATIC = {"int8-dynamic": "int8-static"}
MIXED_SHARES = {"int8-mixed-12": 0.125, "int8-mixed-25": 0.25, "int8-mixed-38": 0.375, "int8-mixed-50": 0.5}
"""The mixed graphs dynamic INT8 falls back to before the next precision on CPUs without BF16, by
the share of weight MatMuls each keeps in float (quantize.py int8_mixed), fewest first: slower,
nearer to FP32."""
CALIBRATED = ("int8-static", "int8-qdq", *MIXED_SHARES)
"""Graphs built from the output's calibration texts (ranges, or the sensitivity ranking): their
cache key names those texts."""
