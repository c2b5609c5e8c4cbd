"""PyTorch FP32: the reference every quantized engine is gated against, never the fast path."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from precompute.models.backends.base import BuildSpec, ConcreteDevice, Runner
from precompute.models.errors import BackendUnavailableError
from precompute.models.export import load_reference
from precompute.models.source import ModelSource


class TorchRunner(Runner):
    """Runs the same module that export.py exports, so it is the ground truth for every engine."""

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
        """Nothing to build: the reference runs the PyTorch module itself."""

    def __init__(self, source: ModelSource, engine_path: Path, device: ConcreteDevice, threads: int) -> None:
        super().__init__(source, engine_path, device, threads)
        self._model = load_reference(source).to(device)

    @torch.inference_mode()
    def _infer(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        ids = torch.from_numpy(input_ids).to(self.device)
        mask = torch.from_numpy(attention_mask).to(self.device)
        return self._model(ids, mask).float().cpu().numpy()
