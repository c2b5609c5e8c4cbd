"""PyTorch FP32: the reference every quantized engine is gated against, never the fast path."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from precompute.models.backends.base import BuildSpec, ConcreteDevice, Feeds, Runner
from precompute.models.errors import BackendUnavailableError
from precompute.models.export import load_reference
from precompute.models.source import INPUT_NAMES, ModelSource


class TorchRunner(Runner):
    """Runs the same module that export.py exports, so it is the ground truth for every engine of
    a text model (an encoder or a classifier); it builds nothing and reads no engine file."""

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

    @classmethod
    def open(cls, entry: Path, device: ConcreteDevice, threads: int, source: ModelSource) -> Runner:
        return cls(source, device, threads)

    def __init__(self, source: ModelSource, device: ConcreteDevice, threads: int) -> None:
        super().__init__(Path(), device, threads)
        self._model = load_reference(source).to(device)

    @property
    def input_names(self) -> tuple[str, ...]:
        return INPUT_NAMES

    @torch.inference_mode()
    def _infer(self, feeds: Feeds) -> np.ndarray:
        ids, mask = (torch.from_numpy(feeds[name]).to(self.device) for name in INPUT_NAMES)
        return self._model(ids, mask).float().cpu().numpy()
