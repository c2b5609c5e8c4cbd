"""Where every engine runs, and the one precision ladder they all climb.

Text encoders and classifiers (engine.py), label heads (label_head.py) and recommendation
towers (towers.py) pick their device and backend here, try the precisions of one ladder
fastest first, and open their engines through the same backends (backends/).
"""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

from precompute.models.backends import BACKENDS, BuildSpec, ConcreteDevice, Runner
from precompute.models.engines.cache import EngineCache
from precompute.models.errors import ModelError
from precompute.models.hardware import detect_device, device_fingerprint, native_bf16, onnxruntime_cuda
from precompute.models.settings import EngineSettings, Precision

LADDERS: dict[ConcreteDevice, tuple[str, ...]] = {
    "cpu": ("int8", "fp32"),
    "cuda": ("int8", "fp16", "fp32"),
}
"""Precisions by device, fastest first; the last is the reference every other is gated against."""
TORCH_LADDERS: dict[ConcreteDevice, tuple[str, ...]] = {"cpu": ("fp32",), "cuda": ("fp16", "fp32")}
"""PyTorch runs the module as it is (FP32), or cast to FP16 on a GPU; it quantizes nothing."""
BF16 = "bf16"
"""A text model's rung on CPUs (text_ladder): PyTorch runs the module cast to BF16, since ONNX
Runtime's CPU provider has no BF16 kernels. It keeps FP32's exponent, so no activation outlier
saturates it as one does INT8 (MPNet's FFN: docs/engines.md)."""


def resolve_device(machine: EngineSettings) -> ConcreteDevice:
    return detect_device() if machine.device == "auto" else machine.device


def resolve_backend(machine: EngineSettings, device: ConcreteDevice) -> type[Runner]:
    """The machine's backend; auto: on a GPU TensorRT where it imports, else ONNX Runtime where
    it has its CUDA provider (onnxruntime-gpu), else PyTorch; on a CPU ONNX Runtime."""
    if machine.backend != "auto":
        return BACKENDS[machine.backend]()
    if device == "cuda" and importlib.util.find_spec("tensorrt") is not None:
        return BACKENDS["tensorrt"]()
    if device == "cuda" and not onnxruntime_cuda():
        return BACKENDS["torch"]()
    return BACKENDS["onnxruntime"]()


def resolve_graph_backend(machine: EngineSettings, device: ConcreteDevice) -> type[Runner]:
    """The backend of a graph that has no PyTorch module (a label head, a tower): the machine's,
    except the torch reference, which only text models have; ONNX Runtime runs the FP32 graph then."""
    runner_cls = resolve_backend(machine, device)
    return BACKENDS["onnxruntime"]() if runner_cls.name == "torch" else runner_cls


def precision_ladder(precision: Precision, device: ConcreteDevice, backend: str) -> tuple[str, ...]:
    """A graph's precisions to try, fastest first, from `precision` up (auto: all of them)."""
    return _climb(precision, _backend_ladder(device, backend), device, backend)


def text_ladder(precision: Precision, device: ConcreteDevice, backend: str) -> tuple[str, ...]:
    """A text model's precisions, from `precision` up: a graph's, and on a CPU BF16 before FP32.

    The ladder has BF16 where the CPU multiplies it in hardware (native_bf16); elsewhere PyTorch
    emulates it slower than FP32, and only precision='bf16' asks for it."""
    ladder = _backend_ladder(device, backend)
    if device == "cpu" and (precision == BF16 or native_bf16()):
        ladder = (*ladder[:-1], BF16, ladder[-1])
    return _climb(precision, ladder, device, backend)


def rung_backend(runner_cls: type[Runner], device: ConcreteDevice, precision: str) -> type[Runner]:
    """The backend that runs a rung of a text model's ladder: the machine's, but PyTorch for BF16."""
    return BACKENDS["torch"]() if (device, precision) == ("cpu", BF16) else runner_cls


def _backend_ladder(device: ConcreteDevice, backend: str) -> tuple[str, ...]:
    return (TORCH_LADDERS if backend == "torch" else LADDERS)[device]


def _climb(
    precision: Precision, ladder: tuple[str, ...], device: ConcreteDevice, backend: str
) -> tuple[str, ...]:
    if precision == "auto":
        return ladder
    if precision not in ladder:
        raise ModelError(
            f"precision={precision!r} is not available for backend {backend} on {device}; "
            f"choose one of {', '.join(ladder)} or auto"
        )
    return ladder[ladder.index(precision) :]


def graph_digest(graph: bytes) -> str:
    return hashlib.blake2b(graph, digest_size=16).hexdigest()


def open_graph(graph: bytes, machine: EngineSettings, device: ConcreteDevice, spec: BuildSpec) -> Runner:
    """A runner for an ONNX graph (already at its precision: FP32, FP16 or Q/DQ), its engine built
    on this machine on first use and cached by the graph's digest, backend, runtime and device.

    The graph travels as bytes (a Ray object) and each node builds its own engine from it: a
    cluster's nodes run the same gated graph, each with kernels for its own hardware."""
    runner_cls = resolve_graph_backend(machine, device)
    runner_cls.check_available(device)
    key = {
        "graph": graph_digest(graph),
        "backend": runner_cls.name,
        "runtime": runner_cls.runtime_version(),
        "device": device_fingerprint(device),
        "max_batch": str(spec.max_batch),
    }

    def build(directory: Path) -> None:
        source = directory / "graph.onnx"
        source.write_bytes(graph)
        runner_cls.build(source, directory / runner_cls.engine_file, spec)

    entry = EngineCache(machine.cache_dir).get_or_build(f"graph-{runner_cls.name}", key, build)
    return runner_cls(entry.path / runner_cls.engine_file, device, machine.threads or 1)
