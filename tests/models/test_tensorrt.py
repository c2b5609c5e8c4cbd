"""The TensorRT backend: an engine built from the FP32 export agrees with the PyTorch reference.

Runs only where `tensorrt` imports and torch sees a CUDA GPU; elsewhere the module is
skipped with the reason.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from precompute.models.backends.base import BuildSpec
from precompute.models.backends.tensorrt import TensorRTRunner, seq_buckets
from precompute.models.backends.torch import TorchRunner
from precompute.models.engines.export import export_onnx
from precompute.models.errors import ModelError
from precompute.models.source import ModelSource, bundled_encoder
from precompute.models.text.tokenize import TextTokenizer

pytest.importorskip(
    "tensorrt",
    reason="TensorRT is not installed: its backend runs only where `tensorrt` imports (NVIDIA GPU machines)",
)
if not torch.cuda.is_available():
    pytest.skip("torch sees no CUDA GPU: the TensorRT backend runs only on one", allow_module_level=True)

MAX_BATCH = 8
MAX_SEQ = 256
SHORT = [
    "The cat sat on the mat.",
    "apt-get install python3",
    "A short sentence about Debian packages.",
    "Hello, world!",
    "Embeddings map text to vectors.",
    "The kernel was updated last night.",
    "Redis stores the precomputed lookups.",
    "Qdrant serves nearest-neighbour queries.",
]
LONG = [
    (
        "This package provides the command-line tools that build, sign and upload Debian source and "
        "binary packages; it depends on the archive tools, reads its configuration from the user home "
        "directory, and is used by maintainers who prepare uploads for the unstable distribution."
    ),
    (
        "TensorRT builds an engine for a fixed range of input shapes, chooses the fastest kernels it "
        "can find for each layer on the GPU it runs on, and serializes the result to a plan file that "
        "later loads in a fraction of the time the build took, as long as library and GPU stay the same."
    ),
]


@pytest.fixture(scope="module")
def source() -> ModelSource:
    return bundled_encoder()


@pytest.fixture(scope="module")
def engine_path(source: ModelSource, tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("tensorrt")
    path = directory / TensorRTRunner.engine_file
    TensorRTRunner.build(export_onnx(source, directory / "model.onnx"), path, BuildSpec(MAX_BATCH, MAX_SEQ))
    return path


def _profile(seq: int) -> int:
    return next(i for i, (lo, hi) in enumerate(seq_buckets(MAX_SEQ)) if lo <= seq <= hi)


@pytest.mark.gpu
@pytest.mark.slow
def test_fp32_engine_matches_the_reference(source: ModelSource, engine_path: Path) -> None:
    batches = list(TextTokenizer(source).batches(SHORT + LONG, batch_size=MAX_BATCH))
    # A full batch of short texts and a batch of long ones: two profiles run, one at max_batch.
    assert len({_profile(batch.input_ids.shape[1]) for batch in batches}) == 2
    reference = TorchRunner(source, "cpu", 2)
    with TensorRTRunner(engine_path, "cuda", 1) as runner:
        for batch in batches:
            got = runner.infer(batch.feeds)
            want = reference.infer(batch.feeds)
            assert got.dtype == np.float32
            assert got.shape == want.shape
            norms = np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1)
            cosine = np.sum(got * want, axis=1) / norms
            assert cosine.min() >= 0.999, f"rows {batch.rows}: cosines {cosine}"


@pytest.mark.gpu
@pytest.mark.slow
def test_a_batch_over_max_batch_names_the_setting(engine_path: Path) -> None:
    ids = np.ones((MAX_BATCH + 1, 8), dtype=np.int64)
    with TensorRTRunner(engine_path, "cuda", 1) as runner, pytest.raises(ModelError, match="max_batch"):
        runner.infer({"input_ids": ids, "attention_mask": ids})
