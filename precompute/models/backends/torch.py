"""PyTorch: the FP32 reference every quantized engine is gated against, the GPU's FP16
encoder where neither TensorRT nor onnxruntime-gpu is installed, and the CPU's BF16 rung."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from precompute.models.backends.base import BuildSpec, ConcreteDevice, ConcretePrecision, Feeds, Runner
from precompute.models.engines.export import load_reference
from precompute.models.errors import BackendUnavailableError
from precompute.models.source import INPUT_NAMES, ModelSource

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


class TorchRunner(Runner):
    """Runs the same module that export.py exports, so at FP32 it is the ground truth for every
    engine of a text model (an encoder or a classifier); it builds nothing and reads no engine file.

    On CUDA it also runs FP16, gated like any other engine, with PyTorch's fused attention
    (SDPA: flash or memory-efficient kernels) in place of the eager attention the export needs;
    on a CPU, BF16 (runtime.BF16), gated too. On a CPU it sets PyTorch's intra-op threads,
    which are the process's, to `threads`: Ray starts an actor with OMP_NUM_THREADS=1, and the
    engine's one stream uses every core (engine.load_encoder)."""

    name = "torch"
    engine_file = ""

    @classmethod
    def check_available(cls, device: ConcreteDevice) -> None:
        if device == "cuda" and not torch.cuda.is_available():
            raise BackendUnavailableError("torch sees no CUDA GPU on this machine")

    @classmethod
    def runtime_version(cls) -> str:
        return torch.__version__

    @classmethod
    def build(cls, onnx_path: Path, engine_path: Path, spec: BuildSpec) -> None:
        """Nothing to build: PyTorch runs the module itself."""

    @classmethod
    def open(
        cls, entry: Path, device: ConcreteDevice, threads: int, source: ModelSource, precision: ConcretePrecision
    ) -> Runner:
        return cls(source, device, threads, precision)

    def __init__(
        self, source: ModelSource, device: ConcreteDevice, threads: int, precision: ConcretePrecision = "fp32"
    ) -> None:
        super().__init__(Path(), device, threads)
        if device == "cpu":
            torch.set_num_threads(threads)
        attention = "sdpa" if device == "cuda" else "eager"
        self._model = load_reference(source, attention).to(device, DTYPES[precision])

    @property
    def input_names(self) -> tuple[str, ...]:
        return INPUT_NAMES

    @torch.inference_mode()
    def _infer(self, feeds: Feeds) -> np.ndarray:
        ids, mask = (torch.from_numpy(feeds[name]).to(self.device, non_blocking=True) for name in INPUT_NAMES)
        return self._model(ids, mask).float().cpu().numpy()
