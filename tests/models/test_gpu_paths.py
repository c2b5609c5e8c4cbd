"""The GPU backends' code up to the device call, on a CPU: a change of signature or shape logic fails
here, not the first time a GPU machine runs tests/models/test_tensorrt.py."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from precompute.models.backends import BACKENDS, BuildSpec
from precompute.models.backends.tensorrt import TensorRTRunner, profile_shapes, seq_buckets
from precompute.models.backends.torch import TorchRunner
from precompute.models.engines.gate import row_cosine
from precompute.models.engines.runtime import precision_ladder, resolve_backend, resolve_graph_backend
from precompute.models.errors import BackendUnavailableError, ModelError
from precompute.models.settings import EngineSettings
from precompute.models.source import bundled_encoder
from precompute.models.text.encoder import encode_texts
from precompute.models.text.tokenize import TextTokenizer
from tests.models.tiny import tiny_towers


def input_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Each graph input's shape as TensorRT's ONNX parser reports it: -1 where it is dynamic."""
    graph = onnx.load(path, load_external_data=False).graph
    return {
        i.name: tuple(d.dim_value if d.HasField("dim_value") else -1 for d in i.type.tensor_type.shape.dim)
        for i in graph.input
    }


def test_a_text_graph_gets_a_profile_per_length_bucket(bundled_cache: dict[str, Path]) -> None:
    shapes = input_shapes(bundled_cache["export"] / "model.onnx")
    assert shapes == {"input_ids": (-1, -1), "attention_mask": (-1, -1)}
    profiles = profile_shapes(shapes, BuildSpec(max_batch=8, max_seq_length=256))
    assert [p["input_ids"] for p in profiles] == [
        ((1, lo), (8, hi), (8, hi)) for lo, hi in seq_buckets(256)
    ]
    assert all(p["input_ids"] == p["attention_mask"] for p in profiles)


def test_a_fixed_width_graph_gets_one_profile_over_the_batch(tmp_path: Path) -> None:
    user, item = tiny_towers(tmp_path)
    assert profile_shapes(input_shapes(user), BuildSpec(max_batch=4096)) == [
        {"age": ((1,), (4096,), (4096,)), "taste": ((1, 8), (4096, 8), (4096, 8))}
    ]
    assert profile_shapes(input_shapes(item), BuildSpec(4096))[0]["category"] == ((1,), (4096,), (4096,))
    with pytest.raises(ModelError, match="only its batch"):
        profile_shapes({"x": (-1, -1)}, BuildSpec(4096))  # a varying width, not a text graph
    with pytest.raises(ModelError, match="max_batch"):
        profile_shapes({"x": (-1,)}, BuildSpec(0))


def test_tensorrt_is_refused_by_name_until_the_device_call(tmp_path: Path) -> None:
    """Every entry point a GPU run takes: availability, build, open, construction."""
    with pytest.raises(BackendUnavailableError, match="only on device 'cuda'"):
        TensorRTRunner.check_available("cpu")
    with pytest.raises(BackendUnavailableError, match="tensorrt is not installed"):
        TensorRTRunner.check_available("cuda")
    with pytest.raises(BackendUnavailableError, match="tensorrt is not installed"):
        TensorRTRunner.build(tmp_path / "model.onnx", tmp_path / TensorRTRunner.engine_file, BuildSpec(8, 256))
    with pytest.raises(BackendUnavailableError, match="tensorrt is not installed"):
        TensorRTRunner.open(tmp_path, "cuda", 1, bundled_encoder(), "fp16")
    assert BACKENDS["tensorrt"]() is TensorRTRunner


def test_the_ladders_and_backends_a_gpu_machine_would_pick() -> None:
    cuda = EngineSettings(device="cuda")
    assert precision_ladder("auto", "cuda", "onnxruntime") == ("int8", "fp16", "fp32")
    assert precision_ladder("fp16", "cuda", "tensorrt") == ("fp16", "fp32")
    assert precision_ladder("auto", "cuda", "torch") == ("fp16", "fp32")
    assert precision_ladder("auto", "cpu", "torch") == ("fp32",)
    # Neither tensorrt nor onnxruntime-gpu imports here: a GPU would run the encoder on PyTorch FP16.
    assert resolve_backend(cuda, "cuda").name == "torch"
    assert resolve_backend(cuda, "cpu").name == "onnxruntime"
    assert resolve_backend(EngineSettings(backend="tensorrt"), "cuda") is TensorRTRunner
    assert resolve_graph_backend(EngineSettings(backend="torch"), "cuda").name == "onnxruntime"
    with pytest.raises(BackendUnavailableError, match="onnxruntime-gpu"):
        BACKENDS["onnxruntime"]().check_available("cuda")
    with pytest.raises(BackendUnavailableError, match="no CUDA GPU"):
        TorchRunner.check_available("cuda")


@pytest.mark.slow
def test_the_fp16_module_a_gpu_runs_agrees_with_fp32_on_a_cpu(corpus_texts: list[str]) -> None:
    """TorchRunner's FP16 rung casts the module a GPU would run (there with SDPA attention); on a
    CPU the same cast runs with eager attention, and must stay within the gate's cosine."""
    source, texts = bundled_encoder(), corpus_texts[:32]
    tokenizer = TextTokenizer(source)
    with TorchRunner(source, "cpu", 2) as fp32, TorchRunner(source, "cpu", 2, "fp16") as fp16:
        want, got = (encode_texts(runner, tokenizer, texts, 8) for runner in (fp32, fp16))
    assert row_cosine(got, want).min() >= 0.999
