"""TensorRT: a strongly typed engine with optimization profiles for the shapes it will see.

Written against NVIDIA's documented TensorRT 10 Python API; it runs wherever `tensorrt`
imports and has not been executed on this project's machines (no registry here serves
TensorRT).

Precision comes from the ONNX graph (FP16 tensors, or explicit Q/DQ INT8 nodes), so no
builder precision flag is set. A text graph ([batch, sequence] inputs) gets one profile per
sequence-length bucket, so TensorRT picks kernels for short batches, not only for the longest,
and batches are padded only to their own longest text. A graph whose inputs have fixed widths
(a label head, a recommendation tower) gets one profile over the batch size.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch

from precompute.models.backends.base import BuildSpec, ConcreteDevice, Feeds, Runner
from precompute.models.errors import BackendUnavailableError, ModelError

WORKSPACE_BYTES = 4 << 30


def seq_buckets(max_seq_length: int) -> list[tuple[int, int]]:
    """Inclusive (shortest, longest) lengths per profile: powers of two from 32, the last capped.

    seq_buckets(256) == [(1, 32), (33, 64), (65, 128), (129, 256)].
    """
    if max_seq_length < 1:
        raise ModelError(f"max_seq_length must be at least 1, got {max_seq_length}")
    buckets: list[tuple[int, int]] = []
    lo, hi = 1, 32
    while lo <= max_seq_length:
        buckets.append((lo, min(hi, max_seq_length)))
        lo, hi = hi + 1, hi * 2
    return buckets


def profile_shapes(
    inputs: dict[str, tuple[int, ...]], spec: BuildSpec
) -> list[dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]]:
    """(min, opt, max) shape of every input, per optimization profile.

    inputs: each input's shape as the ONNX parser reports it, -1 where it is dynamic. The batch
    axis runs from 1 to max_batch; a text graph's sequence axis gets one profile per bucket of
    seq_buckets; every other axis must be fixed.
    """
    if spec.max_batch < 1:
        raise ModelError(f"max_batch must be at least 1, got {spec.max_batch}")
    for name, shape in inputs.items():
        fixed = shape[2:] if spec.max_seq_length is not None else shape[1:]
        if any(d < 0 for d in fixed):
            raise ModelError(
                f"input {name!r} has shape {shape}: only its batch (and a text's sequence) may vary"
            )
    if spec.max_seq_length is None:
        buckets: list[tuple[int, ...]] = [()]
    else:
        buckets = [(lo, hi) for lo, hi in seq_buckets(spec.max_seq_length)]
    profiles = []
    for bucket in buckets:
        lo, hi = bucket[:1], bucket[1:]
        rest = 1 if spec.max_seq_length is None else 2
        profiles.append(
            {
                name: (
                    (1, *lo, *shape[rest:]),
                    (spec.max_batch, *hi, *shape[rest:]),
                    (spec.max_batch, *hi, *shape[rest:]),
                )
                for name, shape in inputs.items()
            }
        )
    return profiles


def _import_tensorrt() -> ModuleType:
    """Import tensorrt only when the backend is used: this module loads on CPU-only machines."""
    try:
        import tensorrt
    except ImportError as e:
        raise BackendUnavailableError(
            "tensorrt is not installed: pip install 'precompute[gpu]' on a machine with an NVIDIA GPU"
        ) from e
    return tensorrt


def _torch_dtype(trt: ModuleType, dtype: Any) -> torch.dtype:
    """Buffers take the engine's I/O types: int64 ids and features as exported, float outputs."""
    dtypes = {
        trt.DataType.INT64: torch.int64,
        trt.DataType.INT32: torch.int32,
        trt.DataType.FLOAT: torch.float32,
        trt.DataType.HALF: torch.float16,
    }
    if dtype not in dtypes:
        raise ModelError(f"engine I/O tensor has unsupported data type {dtype}")
    return dtypes[dtype]


@dataclass
class _Profile:
    """A context bound to one profile, with flat device buffers for the profile's largest shapes.

    Flat buffers hold any smaller input contiguously from their own start address.
    """

    context: Any
    min_shapes: dict[str, tuple[int, ...]]
    max_shapes: dict[str, tuple[int, ...]]
    buffers: dict[str, torch.Tensor]

    def fits(self, feeds: Feeds) -> bool:
        """Every input's shape lies within this profile's range, axis by axis."""
        return all(
            len(array.shape) == len(self.max_shapes[name])
            and all(
                low <= d <= high
                for d, low, high in zip(
                    array.shape, self.min_shapes[name], self.max_shapes[name], strict=True
                )
            )
            for name, array in feeds.items()
        )


class TensorRTRunner(Runner):
    """Runs the engine on its own CUDA stream, picking the first profile whose shapes fit the batch.

    A lock serializes calls: they share the stream and the pinned staging buffers.
    """

    name = "tensorrt"
    engine_file = "engine.plan"

    @classmethod
    def check_available(cls, device: ConcreteDevice) -> None:
        if device != "cuda":
            raise BackendUnavailableError(
                f"the tensorrt backend runs only on device 'cuda', got '{device}': "
                "use the onnxruntime or torch backend on CPU"
            )
        _import_tensorrt()
        if not torch.cuda.is_available():
            raise BackendUnavailableError("tensorrt imports, but torch sees no CUDA GPU on this machine")

    @classmethod
    def runtime_version(cls) -> str:
        return _import_tensorrt().__version__

    @classmethod
    def build(cls, onnx_path: Path, engine_path: Path, spec: BuildSpec) -> None:
        trt = _import_tensorrt()
        logger = trt.Logger(trt.Logger.WARNING)
        builder = trt.Builder(logger)
        network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
        parser = trt.OnnxParser(network, logger)
        if not parser.parse_from_file(str(onnx_path)):
            errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
            raise ModelError(f"TensorRT could not parse {onnx_path}: {errors}")
        config = builder.create_builder_config()
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, WORKSPACE_BYTES)
        inputs = {
            network.get_input(i).name: tuple(network.get_input(i).shape) for i in range(network.num_inputs)
        }
        for shapes in profile_shapes(inputs, spec):
            profile = builder.create_optimization_profile()
            for name, (low, opt, high) in shapes.items():
                profile.set_shape(name, low, opt, high)
            if config.add_optimization_profile(profile) < 0:
                raise ModelError(f"TensorRT rejected the optimization profile {shapes}")
        serialized = builder.build_serialized_network(network, config)
        if serialized is None:
            raise ModelError(f"TensorRT could not build an engine from {onnx_path}: see its log above")
        engine_path.write_bytes(serialized)

    def __init__(self, engine_path: Path, device: ConcreteDevice, threads: int) -> None:
        super().__init__(engine_path, device, threads)
        trt = _import_tensorrt()
        # The logger and runtime must outlive every engine and context made through them.
        self._logger = trt.Logger(trt.Logger.WARNING)
        self._runtime = trt.Runtime(self._logger)
        self._engine = self._runtime.deserialize_cuda_engine(engine_path.read_bytes())
        if self._engine is None:
            raise ModelError(f"TensorRT could not deserialize {engine_path}: built by another version?")
        names = [self._engine.get_tensor_name(i) for i in range(self._engine.num_io_tensors)]
        self._inputs = tuple(n for n in names if self._engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT)
        outputs = [n for n in names if n not in self._inputs]
        if not outputs:
            raise ModelError(f"engine {engine_path} has no output tensor")
        self._output = outputs[0]
        dtypes = {
            name: _torch_dtype(trt, self._engine.get_tensor_dtype(name))
            for name in (*self._inputs, self._output)
        }
        self._stream = torch.cuda.Stream()
        self._lock = threading.Lock()
        profiles = range(self._engine.num_optimization_profiles)
        self._profiles = [self._open_profile(trt, index, dtypes) for index in profiles]
        self._stream.synchronize()
        # Pinned staging buffers, shared by the profiles, let the copies run asynchronously.
        self._host = {
            name: torch.empty(
                max(p.buffers[name].numel() for p in self._profiles), dtype=dtypes[name], pin_memory=True
            )
            for name in (*self._inputs, self._output)
        }
        self._host_arrays = {name: tensor.numpy() for name, tensor in self._host.items()}

    @property
    def input_names(self) -> tuple[str, ...]:
        return self._inputs

    def _open_profile(self, trt: ModuleType, index: int, dtypes: dict[str, torch.dtype]) -> _Profile:
        # ON_PROFILE_CHANGE: each context holds activations for its own profile, not the largest.
        strategy = trt.ExecutionContextAllocationStrategy.ON_PROFILE_CHANGE
        context = self._engine.create_execution_context(strategy)
        if context is None:
            raise ModelError(f"TensorRT could not create an execution context for profile {index}")
        context.set_optimization_profile_async(index, self._stream.cuda_stream)
        low, high = {}, {}
        for name in self._inputs:
            shapes = self._engine.get_tensor_profile_shape(name, index)
            low[name], high[name] = tuple(shapes[0]), tuple(shapes[2])
            if not context.set_input_shape(name, high[name]):
                raise ModelError(f"TensorRT rejected the shape {high[name]} for input {name}")
        sizes = {name: int(np.prod(shape)) for name, shape in high.items()}
        sizes[self._output] = int(np.prod(tuple(context.get_tensor_shape(self._output))))
        buffers = {name: torch.empty(n, dtype=dtypes[name], device="cuda") for name, n in sizes.items()}
        return _Profile(context, low, high, buffers)

    def _infer(self, feeds: Feeds) -> np.ndarray:
        profile = next((p for p in self._profiles if p.fits(feeds)), None)
        if profile is None:
            shapes = {name: array.shape for name, array in feeds.items()}
            largest = self._profiles[-1].max_shapes
            raise ModelError(
                f"input shapes {shapes} are outside the engine's (largest {largest}): rebuild it with "
                "a larger max_batch or max_seq_length"
            )
        context = profile.context
        with self._lock, torch.cuda.stream(self._stream):
            for name, array in feeds.items():
                size = array.size
                np.copyto(self._host_arrays[name][:size].reshape(array.shape), array, casting="same_kind")
                profile.buffers[name][:size].copy_(self._host[name][:size], non_blocking=True)
                if not context.set_input_shape(name, array.shape):
                    raise ModelError(f"TensorRT rejected the shape {array.shape} for input {name}")
            for name, buffer in profile.buffers.items():
                if not context.set_tensor_address(name, buffer.data_ptr()):
                    raise ModelError(f"TensorRT rejected the address of the {name} buffer")
            shape = tuple(context.get_tensor_shape(self._output))
            width = int(np.prod(shape))
            ok = context.execute_async_v3(self._stream.cuda_stream)
            self._host[self._output][:width].copy_(profile.buffers[self._output][:width], non_blocking=True)
            self._stream.synchronize()
            if not ok:
                raise ModelError("TensorRT execute_async_v3 failed: see its log above")
            # A copy: the next call overwrites the staging buffer.
            return self._host_arrays[self._output][:width].reshape(shape).astype(np.float32)

    def close(self) -> None:
        """Free contexts and buffers before the engine, and the engine before its runtime."""
        self._stream.synchronize()
        del self._profiles, self._host, self._host_arrays
        del self._engine, self._runtime, self._logger
