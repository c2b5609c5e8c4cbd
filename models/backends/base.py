"""The contract every inference backend implements: build an engine file, then run it.

Modelled on Polygraphy's runners: the public `infer()` checks inputs, subclasses
implement `_infer()`; a runner is a context manager that owns its session and buffers.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

import numpy as np
from precompute.models.errors import ModelError
from precompute.models.source import ModelSource

ConcreteDevice = Literal["cpu", "cuda"]
ConcretePrecision = Literal["int8", "fp16", "fp32"]


@dataclass(frozen=True)
class BuildSpec:
    """What an engine must accept: shapes for TensorRT's optimization profiles."""

    max_batch: int
    max_seq_length: int


class Runner(ABC):
    """Runs an exported model: (input_ids, attention_mask) int64 [B, L] -> float32 [B, source.dim]."""

    name: ClassVar[str]
    engine_file: ClassVar[str]
    """File name of the built engine inside its cache entry."""

    @classmethod
    @abstractmethod
    def check_available(cls, device: ConcreteDevice) -> None:
        """Raise BackendUnavailableError, with an install hint, if this backend cannot run here."""

    @classmethod
    @abstractmethod
    def runtime_version(cls) -> str:
        """Version of the runtime library: part of the engine cache key."""

    @classmethod
    @abstractmethod
    def build(cls, onnx_path: Path, engine_path: Path, spec: BuildSpec) -> None:
        """Turn a precision's ONNX graph into this backend's engine file."""

    def __init__(self, source: ModelSource, engine_path: Path, device: ConcreteDevice, threads: int) -> None:
        self.source = source
        self.engine_path = engine_path
        self.device = device
        self.threads = threads

    def infer(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        if input_ids.dtype != np.int64 or attention_mask.dtype != np.int64:
            raise ModelError(f"inputs must be int64, got {input_ids.dtype} and {attention_mask.dtype}")
        if input_ids.ndim != 2 or input_ids.shape != attention_mask.shape:
            raise ModelError(
                f"inputs must be two [batch, sequence] arrays of one shape, got "
                f"{input_ids.shape} and {attention_mask.shape}"
            )
        return self._infer(input_ids, attention_mask)

    @abstractmethod
    def _infer(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray: ...

    def close(self) -> None:  # noqa: B027 - optional hook, not abstract
        """Release sessions and device memory; the default holds nothing to release."""

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
