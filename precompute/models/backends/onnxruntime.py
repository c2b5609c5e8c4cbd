"""ONNX Runtime: the CPU engine everywhere, and CUDA / TensorRT execution providers on GPUs."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort

from precompute.models.backends.base import BuildSpec, ConcreteDevice, Feeds, Runner
from precompute.models.errors import BackendUnavailableError, ModelError
from precompute.models.hardware import onnxruntime_cuda

GPU_PROVIDERS = ("TensorrtExecutionProvider", "CUDAExecutionProvider")


class OnnxRuntimeRunner(Runner):
    """The engine is the precision's ONNX file; ONNX Runtime applies its graph fusions at load."""

    name = "onnxruntime"
    engine_file = "model.onnx"

    @classmethod
    def check_available(cls, device: ConcreteDevice) -> None:
        if device == "cuda" and not onnxruntime_cuda():
            raise BackendUnavailableError(
                "onnxruntime has no CUDAExecutionProvider here: pip install 'precompute[gpu]' "
                "(onnxruntime-gpu) on a machine with an NVIDIA GPU"
            )

    @classmethod
    def runtime_version(cls) -> str:
        return ort.__version__

    @classmethod
    def build(cls, onnx_path: Path, engine_path: Path, spec: BuildSpec) -> None:
        shutil.copyfile(onnx_path, engine_path)

    def __init__(self, engine_path: Path, device: ConcreteDevice, threads: int) -> None:
        super().__init__(engine_path, device, threads)
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        try:
            self._session = ort.InferenceSession(
                str(engine_path), options, providers=self._providers(engine_path.parent)
            )
        except Exception as e:  # ONNX Runtime raises its own types for graphs it cannot run
            raise ModelError(f"{engine_path}: not a graph ONNX Runtime can run ({e})") from None
        self._inputs = tuple(arg.name for arg in self._session.get_inputs())

    @property
    def input_names(self) -> tuple[str, ...]:
        return self._inputs

    @property
    def session(self) -> ort.InferenceSession:
        """The session itself, for what only ONNX Runtime reports (input types and shapes)."""
        return self._session

    def _providers(self, cache_dir: Path) -> list[str | tuple[str, dict[str, object]]]:
        if self.device == "cpu":
            return ["CPUExecutionProvider"]
        available = ort.get_available_providers()
        providers: list[str | tuple[str, dict[str, object]]] = []
        if "TensorrtExecutionProvider" in available:
            # Precision comes from the graph (FP16 tensors, explicit Q/DQ), as in strongly typed TensorRT.
            providers.append(
                (
                    "TensorrtExecutionProvider",
                    {"trt_engine_cache_enable": True, "trt_engine_cache_path": str(cache_dir)},
                )
            )
        providers += ["CUDAExecutionProvider", "CPUExecutionProvider"]
        return providers

    def _infer(self, feeds: Feeds) -> np.ndarray:
        return np.asarray(self._session.run(None, dict(feeds))[0], np.float32)

    def close(self) -> None:
        del self._session
