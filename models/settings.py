"""Typed settings of the encoder engine, read from PRECOMPUTE_ENGINE_* variables."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from precompute.models.reference_texts import TextSample
from precompute.models.source import ModelSource, bundled_encoder
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

Backend = Literal["auto", "onnxruntime", "tensorrt", "torch"]
Device = Literal["auto", "cpu", "cuda"]
Precision = Literal["auto", "int8", "fp16", "fp32"]
Graph = Literal["batch", "query"]

DEMO_CORPUS = Path(__file__).resolve().parents[1] / "data" / "demo" / "corpus.parquet"


class EngineSettings(BaseSettings):
    """How the encoder is built and run; every field has an env var PRECOMPUTE_ENGINE_<NAME>."""

    model_config = SettingsConfigDict(env_prefix="PRECOMPUTE_ENGINE_", frozen=True)

    backend: Backend = "auto"
    """auto: TensorRT where it imports and a GPU is present, else ONNX Runtime. torch is
    the FP32 reference: exact but slowest."""

    device: Device = "auto"
    """auto: cuda when a CUDA GPU is visible, else cpu."""

    precision: Precision = "auto"
    """Where the precision ladder starts. auto: int8 (fastest); a precision that fails
    the accuracy gate falls back to the next one up (int8 -> fp16 on GPUs -> fp32)."""

    graph: Graph = "batch"
    """batch: the plain export, fastest on batches (jobs). query: ONNX Runtime's fused
    BERT graph, fastest for one short text at a time (the lookup service) and 13% slower
    on batches of 16. Only CPU INT8 has a fused variant; other precisions ignore this."""

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

    gate_mean_cosine: float = Field(0.99, gt=0, le=1)
    """Accuracy gate: a quantized engine is used only if its mean cosine to FP32 reaches this."""

    gate_min_cosine: float = Field(0.97, gt=0, le=1)
    """... and its worst text's cosine to FP32 reaches this."""

    gate_agreement: float = Field(0.99, gt=0, le=1)
    """Classifiers: a quantized engine is used only if its top label is FP32's on this share of texts."""

    gate_texts: int = Field(256, ge=16)
    """Held-out texts the gate compares on."""

    calibration_texts: int = Field(128, ge=8)
    """Texts that set the static INT8 activation ranges (disjoint from the gate's)."""

    model: ModelSource = Field(default_factory=bundled_encoder)
    """The model the engine runs (models/source.py reads it from its folder); the pipeline
    file sets it per output, all-MiniLM-L6-v2 by default."""

    reference: TextSample = TextSample(path=str(DEMO_CORPUS))
    """Where the gate's held-out texts and the calibration texts come from: the output's own
    input (the pipeline file sets it), so an engine for legal text is gated on legal text."""
