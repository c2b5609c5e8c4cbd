"""TensorRT: a strongly typed engine with one optimization profile per sequence-length bucket.

Written against NVIDIA's documented TensorRT 10 Python API; it runs wherever `tensorrt`
imports and has not been executed on this project's machines (no registry here serves
TensorRT).

Precision comes from the ONNX graph (FP16 tensors, or explicit Q/DQ INT8 nodes), so no
builder precision flag is set. Batches are padded only to their own longest text; a profile
per length bucket lets TensorRT pick kernels for short batches, not only for the longest.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch
from precompute.models.backends.base import BuildSpec, ConcreteDevice, Runner
from precompute.models.errors import BackendUnavailableError, ModelError
from precompute.models.source import INPUT_NAMES, OUTPUT_NAME, ModelSource

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
    """Buffers take the engine's I/O types: int64 ids and mask as exported, a float embedding."""
    dtypes = {
        trt.DataType.INT64: torch.int64,
        trt.DataType.INT32: torch.int32,
        trt.DataType.FLOAT: torch.float32,
        trt.DataType.HALF: torch.float16,
    }
    if dtype not in dtypes:
        raise ModelError(f"engine I/O tensor has unsupported data type {dtype}")
    return dtypes[dtype]


def _set_input_shapes(context: Any, shape: tuple[int, ...]) -> None:
    for name in INPUT_NAMES:
        if not context.set_input_shape(name, shape):
            raise ModelError(f"TensorRT rejected the shape {shape} for input {name}")


@dataclass
class _Profile:
    """A context bound to one profile, with flat device buffers for the profile's largest shape.

    Flat buffers hold any [batch, seq] input contiguously from their own start address.
    """

    context: Any
    min_seq: int
    max_seq: int
    max_batch: int
    dim: int
    buffers: dict[str, torch.Tensor]


class TensorRTRunner(Runner):
    """Runs the engine on its own CUDA stream, picking the profile by sequence length.

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
        if spec.max_batch < 1:
            raise ModelError(f"max_batch must be at least 1, got {spec.max_batch}")
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
        for lo, hi in seq_buckets(spec.max_seq_length):
            profile = builder.create_optimization_profile()
            for name in INPUT_NAMES:
                profile.set_shape(name, (1, lo), (spec.max_batch, hi), (spec.max_batch, hi))
            if config.add_optimization_profile(profile) < 0:
                raise ModelError(f"TensorRT rejected the optimization profile for lengths {lo}..{hi}")
        serialized = builder.build_serialized_network(network, config)
        if serialized is None:
            raise ModelError(f"TensorRT could not build an engine from {onnx_path}: see its log above")
        engine_path.write_bytes(serialized)

    def __init__(self, source: ModelSource, engine_path: Path, device: ConcreteDevice, threads: int) -> None:
        super().__init__(source, engine_path, device, threads)
        trt = _import_tensorrt()
        # The logger and runtime must outlive every engine and context made through them.
        self._logger = trt.Logger(trt.Logger.WARNING)
        self._runtime = trt.Runtime(self._logger)
        self._engine = self._runtime.deserialize_cuda_engine(engine_path.read_bytes())
        if self._engine is None:
            raise ModelError(f"TensorRT could not deserialize {engine_path}: built by another version?")
        names = [self._engine.get_tensor_name(i) for i in range(self._engine.num_io_tensors)]
        if sorted(names) != sorted((*INPUT_NAMES, OUTPUT_NAME)):
            raise ModelError(f"engine I/O tensors are {names}, expected {[*INPUT_NAMES, OUTPUT_NAME]}")
        dtypes = {name: _torch_dtype(trt, self._engine.get_tensor_dtype(name)) for name in names}
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
            for name in names
        }
        self._host_arrays = {name: tensor.numpy() for name, tensor in self._host.items()}

    def _open_profile(self, trt: ModuleType, index: int, dtypes: dict[str, torch.dtype]) -> _Profile:
        # ON_PROFILE_CHANGE: each context holds activations for its own profile, not the largest.
        strategy = trt.ExecutionContextAllocationStrategy.ON_PROFILE_CHANGE
        context = self._engine.create_execution_context(strategy)
        if context is None:
            raise ModelError(f"TensorRT could not create an execution context for profile {index}")
        context.set_optimization_profile_async(index, self._stream.cuda_stream)
        shapes = self._engine.get_tensor_profile_shape(INPUT_NAMES[0], index)
        lo, hi = tuple(shapes[0]), tuple(shapes[2])
        _set_input_shapes(context, hi)
        dim = int(tuple(context.get_tensor_shape(OUTPUT_NAME))[1])
        sizes = {name: hi[0] * hi[1] for name in INPUT_NAMES} | {OUTPUT_NAME: hi[0] * dim}
        buffers = {name: torch.empty(n, dtype=dtypes[name], device="cuda") for name, n in sizes.items()}
        return _Profile(context, min_seq=lo[1], max_seq=hi[1], max_batch=hi[0], dim=dim, buffers=buffers)

    def _infer(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        batch, seq = input_ids.shape
        profile = next((p for p in self._profiles if p.min_seq <= seq <= p.max_seq), None)
        if profile is None:
            raise ModelError(
                f"sequence length {seq} is outside the engine's 1..{self._profiles[-1].max_seq}: "
                "rebuild it with a larger max_seq_length"
            )
        if not 1 <= batch <= profile.max_batch:
            raise ModelError(
                f"batch of {batch} rows is outside the engine's 1..{profile.max_batch}: "
                "rebuild it with a larger max_batch"
            )
        context, rows, width = profile.context, batch * seq, batch * profile.dim
        with self._lock, torch.cuda.stream(self._stream):
            for name, array in zip(INPUT_NAMES, (input_ids, attention_mask), strict=True):
                np.copyto(self._host_arrays[name][:rows].reshape(batch, seq), array, casting="same_kind")
                profile.buffers[name][:rows].copy_(self._host[name][:rows], non_blocking=True)
            _set_input_shapes(context, (batch, seq))
            for name, buffer in profile.buffers.items():
                if not context.set_tensor_address(name, buffer.data_ptr()):
                    raise ModelError(f"TensorRT rejected the address of the {name} buffer")
            ok = context.execute_async_v3(self._stream.cuda_stream)
            self._host[OUTPUT_NAME][:width].copy_(profile.buffers[OUTPUT_NAME][:width], non_blocking=True)
            self._stream.synchronize()
            if not ok:
                raise ModelError("TensorRT execute_async_v3 failed: see its log above")
            out = self._host_arrays[OUTPUT_NAME][:width].reshape(batch, profile.dim)
            return out.astype(np.float32)  # a copy: the next call overwrites the staging buffer

    def close(self) -> None:
        """Free contexts and buffers before the engine, and the engine before its runtime."""
        self._stream.synchronize()
        del self._profiles, self._host, self._host_arrays
        del self._engine, self._runtime, self._logger
