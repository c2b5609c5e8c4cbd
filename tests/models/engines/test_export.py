"""The ONNX export computes what the PyTorch model computes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from sentence_transformers import SentenceTransformer

from precompute.models.backends.onnxruntime import OnnxRuntimeRunner
from precompute.models.backends.torch import TorchRunner
from precompute.models.source import bundled_encoder
from precompute.models.text.tokenize import TextTokenizer


@pytest.mark.slow
def test_fp32_onnx_runtime_matches_pytorch(bundled_cache: dict[str, Path], corpus_texts) -> None:
    """Max abs diff <= 1e-4 on real texts, in padded batches of mixed lengths."""
    export = bundled_cache["export"] / "model.onnx"
    texts = [*corpus_texts[:48], "short", "x " * 400]  # one text is truncated at 256 tokens
    source = bundled_encoder()
    with (
        OnnxRuntimeRunner(export, "cpu", 2) as ours,
        TorchRunner(source, "cpu", 2) as reference,
    ):
        for batch in TextTokenizer(source).batches(texts, 16):
            got = ours.infer(batch.feeds)
            want = reference.infer(batch.feeds)
            assert np.abs(got - want).max() <= 1e-4


def test_reference_is_sentence_transformers(corpus_texts) -> None:
    """Our PyTorch reference (pooling and normalisation in the graph) is the published model."""
    texts = corpus_texts[:16]
    source = bundled_encoder()
    published = SentenceTransformer(str(source.folder), device="cpu")
    assert published.max_seq_length == source.max_seq_length == 256
    want = published.encode(texts, normalize_embeddings=True)
    with TorchRunner(source, "cpu", 2) as reference:
        batch = next(TextTokenizer(source).batches(texts, 16))
        got = np.empty_like(want)
        got[batch.rows] = reference.infer(batch.feeds)
    assert np.abs(got - want).max() <= 1e-5


def test_export_has_dynamic_batch_and_sequence_axes(bundled_cache: dict[str, Path]) -> None:
    graph = onnx.load(bundled_cache["export"] / "model.onnx", load_external_data=False).graph
    for tensor in graph.input:
        dims = [d.dim_param or d.dim_value for d in tensor.type.tensor_type.shape.dim]
        assert dims == ["batch", "sequence"]
    assert graph.output[0].type.tensor_type.shape.dim[0].dim_param == "batch"
