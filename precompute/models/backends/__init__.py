"""The backend registry: name -> loader of its Runner class.

Loaders import lazily, so a CPU process never imports TensorRT, and a process that
only serves ONNX Runtime engines never imports torch.
"""

from __future__ import annotations

from collections.abc import Callable

from precompute.models.backends.base import BuildSpec, ConcreteDevice, ConcretePrecision, Runner


def _onnxruntime() -> type[Runner]:
    from precompute.models.backends.onnxruntime import OnnxRuntimeRunner

    return OnnxRuntimeRunner


def _tensorrt() -> type[Runner]:
    from precompute.models.backends.tensorrt import TensorRTRunner

    return TensorRTRunner


def _torch() -> type[Runner]:
    from precompute.models.backends.torch import TorchRunner

    return TorchRunner


BACKENDS: dict[str, Callable[[], type[Runner]]] = {
    "onnxruntime": _onnxruntime,
    "tensorrt": _tensorrt,
    "torch": _torch,
}

__all__ = ["BACKENDS", "BuildSpec", "ConcreteDevice", "ConcretePrecision", "Runner"]
