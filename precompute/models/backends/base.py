"""The contract every inference backend implements: build an engine file from an ONNX graph, then run it.

Modelled on Polygraphy's runners: the public `infer()` checks its feeds, subclasses implement
`_infer()`; a runner is a context manager that owns its session and buffers. Every model
precompute runs goes through a runner: text encoders and classifiers (input_ids and
attention_mask), label heads (embeddings), recommendation towers (feature columns).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

import numpy as np

from precompute.models.errors import ModelError
from precompute.models.source import ModelSource

ConcreteDevice = Literal["cpu", "cuda"]
ConcretePrecision = Literal["int8", "fp16", "bf16", "fp32"]
Feeds = Mapping[str, np.ndarray]
"""A graph's inputs by name, each with the batch as its first axis."""


@dataclass(frozen=True)
class BuildSpec:
    """What an engine must accept: the shapes of TensorRT's optimization profiles."""

    max_batch: int
    max_seq_length: int | None = None
    """Text graphs: the longest sequence (a profile per length bucket up to it); None for graphs
    whose inputs have fixed widths (heads, towers)."""


class Runner(ABC):
    """Runs one engine: named input arrays in, the graph's first output out as float32 [batch, ...]."""

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

    @classmethod
    def open(
        cls, entry: Path, device: ConcreteDevice, threads: int, source: ModelSource, precision: ConcretePrecision
    ) -> Runner:
        """The runner of a built engine: its cache entry, the model it was built from, and its
        precision (which an engine file already holds; PyTorch, which has none, needs it)."""
        return cls(entry / cls.engine_file, device, threads)

    def __init__(self, engine_path: Path, device: ConcreteDevice, threads: int) -> None:
        self.engine_path = engine_path
        self.device = device
        self.threads = threads

    @property
    @abstractmethod
    def input_names(self) -> tuple[str, ...]:
        """The engine's inputs, which every call feeds."""

    def infer(self, feeds: Feeds) -> np.ndarray:
        if set(feeds) != set(self.input_names):
            raise ModelError(f"the engine takes inputs {list(self.input_names)}, got {list(feeds)}")
        rows = {len(array) for array in feeds.values()}
        if len(rows) != 1:
            raise ModelError(f"every input must have one batch size, got {sorted(rows)}")
        return self._infer(feeds)

    @abstractmethod
    def _infer(self, feeds: Feeds) -> np.ndarray: ...

    def close(self) -> None:  # noqa: B027 - optional hook, not abstract
        """Release sessions and device memory; the default holds nothing to release."""

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
