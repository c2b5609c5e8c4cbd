"""What an engine is built from: the machine's settings, the output's policy, the model and its texts.

Three parts, each declared once:
- `EngineSettings`: how this machine runs engines (backend, device, threads, cache), from
  PRECOMPUTE_ENGINE_* variables; the same for every output.
- `EnginePolicy`: how good a quantized engine must be (where the precision ladder starts, the
  gate's thresholds and text counts). It is the pipeline file's `engine` table of an output;
  a field the table leaves out comes from its PRECOMPUTE_ENGINE_* variable, else its default.
- `Engine`: both, with the model (models/source.py) and the input whose texts gate and
  calibrate it: what `load_encoder` takes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from precompute.models.source import ModelSource
from precompute.models.text.reference import TextSample

Backend = Literal["auto", "onnxruntime", "tensorrt", "torch"]
Device = Literal["auto", "cpu", "cuda"]
Precision = Literal["auto", "int8", "fp16", "bf16", "fp32"]
Graph = Literal["batch", "query", "static"]


class EngineSettings(BaseSettings):
    """How this machine builds and runs engines; env PRECOMPUTE_ENGINE_<NAME>."""

    model_config = SettingsConfigDict(env_prefix="PRECOMPUTE_ENGINE_", frozen=True, use_attribute_docstrings=True)

    backend: Backend = "auto"
    """auto: on a GPU, TensorRT where it imports, else ONNX Runtime where it has its CUDA provider
    (onnxruntime-gpu), else PyTorch (FP16, gated); on a CPU, ONNX Runtime. torch on a CPU is the
    FP32 reference: exact but slowest."""

    device: Device = "auto"
    """auto: cuda when TensorRT or onnxruntime-gpu is installed and sees a GPU, else cpu. Set cuda
    where only PyTorch sees the GPU: text encoders then run on PyTorch FP16; label heads and
    towers (ONNX graphs) still need onnxruntime-gpu or TensorRT there."""

    graph: Graph = "batch"
    """batch: the plain export, fastest on batches (jobs). query: ONNX Runtime's fused
    BERT graph, fastest for one short text at a time (the lookup service) and slower on
    batches. static: CPU INT8 with activation ranges calibrated once, so a row's output never
    depends on its batch (micro-batched queries: models.engines.load.peer_independent). Only CPU
    INT8 has these variants; other precisions ignore this."""

    cache_dir: Path = Path.home() / ".cache" / "precompute" / "engines"
    """Exported models, quantized models, TensorRT plans and gate results. Outside git;
    an entry is rebuilt only when its key (model hash, precision, runtime, device) changes."""

    batch_size: int | None = Field(None, ge=1, le=4096)
    """Texts per inference call. None: 16 on CPU (best for the L2 cache of small cores),
    256 on GPU (fills the device). Batches are length-bucketed, so larger costs no padding."""

    streams: int | None = Field(None, ge=1, le=64)
    """Batches run concurrently. None: one per CPU core on CPU, each single-threaded
    (measured faster than one session using all cores); 1 on GPU."""

    threads: int | None = Field(None, ge=1, le=64)
    """ONNX Runtime threads per stream. None: CPU cores / streams. One thread suits a
    single-query service: waking a thread pool after an idle gap costs more than it saves."""


class EnginePolicy(BaseSettings):
    """How close to FP32 a quantized engine must be; the pipeline file's `engine` table of an
    output, each field left out there read from PRECOMPUTE_ENGINE_<NAME>, else its default."""

    model_config = SettingsConfigDict(env_prefix="PRECOMPUTE_ENGINE_", frozen=True, extra="forbid", use_attribute_docstrings=True)

    precision: Precision = "auto"
    """Where the precision ladder starts. auto: int8 (fastest); a precision that fails
    the accuracy gate falls back to the next one up (int8 -> fp16 on GPUs -> fp32; on CPUs with
    AMX-BF16 int8 -> bf16 -> fp32, BF16 run by PyTorch). On other CPUs int8 first tries mixed
    graphs that keep its most sensitive MatMuls in float."""

    gate_min_recall_ratio: float = Field(0.99, ge=0, le=1)
    """Encoders: a quantized engine serves only if it finds at least this share of what FP32 finds:
    recall@10 of known-item pairs cut from the output's own held-out texts (a text's opening words
    as the query, the rest as its answer), searched exactly, against FP32's on the same pairs. 0
    gates on `gate_mean_cosine` alone (a corpus of texts too short to make pairs needs it)."""

    gate_mean_cosine: float = Field(0.95, gt=0, le=1)
    """Encoders: a floor on the mean cosine of the engine's vectors to FP32's. Not what users feel
    (recall is, above): it refuses an engine that collapsed however its pairs rank."""

    gate_min_accuracy_ratio: float = Field(0.995, gt=0, le=1)
    """Label heads: a precision labels only if the head's held-out accuracy under it is at least
    this share of its accuracy under FP32."""

    gate_agreement: float = Field(0.99, gt=0, le=1)
    """Classifiers (a labels output's `classifier` folder, which brings no labelled rows): a
    precision labels only if its top label is FP32's on this share of the held-out texts."""

    gate_texts: int = Field(256, ge=16)
    """Held-out texts the gate compares on, drawn from the output's own input."""

    calibration_texts: int = Field(128, ge=8)
    """Texts that set the static INT8 activation ranges (disjoint from the gate's)."""


class Engine(BaseModel):
    """One output's engine: its model, the input its gate and calibration texts come from, its
    policy, and this machine's settings."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: ModelSource
    reference: TextSample
    """Where the gate's held-out texts and the calibration texts come from: the output's own
    input, so an engine for legal text is gated on legal text."""
    policy: EnginePolicy = Field(default_factory=EnginePolicy)
    machine: EngineSettings = Field(default_factory=EngineSettings)

    def replace(self, **changes: Any) -> Engine:
        """A copy with fields changed by name, wherever they are declared (`precision` is the
        policy's, `cache_dir` the machine's, `model` this one's)."""
        parts: dict[str, dict[str, Any]] = {"self": {}, "policy": {}, "machine": {}}
        for name, value in changes.items():
            if name in ("model", "reference"):
                parts["self"][name] = value
            elif name in EnginePolicy.model_fields:
                parts["policy"][name] = value
            elif name in EngineSettings.model_fields:
                parts["machine"][name] = value
            else:
                raise ValueError(f"an engine has no field {name!r}")
        return self.model_copy(
            update={
                **parts["self"],
                "policy": self.policy.model_copy(update=parts["policy"]),
                "machine": self.machine.model_copy(update=parts["machine"]),
            }
        )
