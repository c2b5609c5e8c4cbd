"""Engines for the models precompute runs: export, quantize, build, gate, infer.

The data path reads top-down: `load_encoder()` (engine.py) exports the PyTorch model
to ONNX (export.py), quantizes it (quantize.py), builds or loads a cached engine
(engine_cache.py) for the selected backend (backends/), gates it against the FP32
reference (gate.py) and returns an `Encoder` (encoder.py) that turns texts into
embeddings.
"""

from precompute.models.engines.load import load_encoder
from precompute.models.errors import InvalidInputError, ModelError
from precompute.models.settings import Engine, EnginePolicy, EngineSettings
from precompute.models.text.encoder import Encoder

__all__ = ["Encoder", "Engine", "EnginePolicy", "EngineSettings", "InvalidInputError", "ModelError", "load_encoder"]
