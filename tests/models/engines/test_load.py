"""Backend and precision selection: automatic by hardware, overridable, refused with a reason."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from precompute.models import (
    Engine,
    EnginePolicy,
    EngineSettings,
    InvalidInputError,
    ModelError,
    hardware,
    load_encoder,
)
from precompute.models.engines import runtime
from precompute.models.engines.gate import row_cosine
from precompute.models.engines.load import peer_independent, reference_embeddings, rungs
from precompute.models.engines.runtime import precision_ladder, text_ladder
from precompute.models.errors import BackendUnavailableError


def test_auto_picks_onnxruntime_on_a_cpu_and_starts_its_ladder_at_int8(encoder) -> None:
    """Which rung serves is the gate's to say (test_gate.py): MiniLM's moves neighbours until FP32,
    or BF16 on PyTorch on a CPU with AMX-BF16."""
    report = encoder.report
    assert (report.device, report.gates[0].precision) == ("cpu", "int8")
    assert report.backend == ("torch" if report.precision == "bf16" else "onnxruntime")


@pytest.mark.parametrize(
    ("override", "error", "message"),
    [
        ({"precision": "fp16", "device": "cpu"}, ModelError, "precision='fp16' is not available"),
        ({"backend": "torch", "precision": "int8", "device": "cpu"}, ModelError, "precision='int8'"),
        ({"backend": "tensorrt", "device": "cpu"}, BackendUnavailableError, "cuda"),
        ({"backend": "onnxruntime", "device": "cuda"}, BackendUnavailableError, "onnxruntime-gpu"),
    ],
)
def test_impossible_choices_are_refused_by_name(settings, override, error, message) -> None:
    with pytest.raises(error, match=message):
        load_encoder(settings.replace(**override))


def test_torch_is_the_ungated_fp32_reference(settings: Engine, corpus_texts) -> None:
    with load_encoder(settings.replace(backend="torch", device="cpu", precision="fp32")) as reference:
        assert (reference.report.precision, reference.report.gates) == ("fp32", [])
        assert reference.encode(corpus_texts[:2]).shape == (2, 384)


@pytest.mark.parametrize("native", [True, False], ids=["amx-bf16", "no-bf16"])
def test_the_cpu_ladder_has_bf16_only_where_the_cpu_multiplies_it_in_hardware(
    monkeypatch: pytest.MonkeyPatch, settings: Engine, native: bool
) -> None:
    """Elsewhere PyTorch emulates BF16 slower than FP32: only precision='bf16' asks for it there.
    Graphs without a PyTorch module (label heads, towers) never have the rung."""
    monkeypatch.setattr(runtime, "native_bf16", lambda: native)
    bf16 = ("bf16",) if native else ()
    assert text_ladder("auto", "cpu", "onnxruntime") == ("int8", *bf16, "fp32")
    assert text_ladder("auto", "cpu", "torch") == (*bf16, "fp32")
    assert text_ladder("int8", "cpu", "onnxruntime") == ("int8", *bf16, "fp32")
    assert text_ladder("bf16", "cpu", "onnxruntime") == ("bf16", "fp32")
    assert text_ladder("auto", "cuda", "onnxruntime") == ("int8", "fp16", "fp32")
    assert precision_ladder("auto", "cpu", "onnxruntime") == ("int8", "fp32")
    # The query graph runs one short text per call: ONNX Runtime's rungs, mixed graphs and all.
    query = settings.replace(graph="query")
    assert rungs(query, "cpu", "onnxruntime") == ("int8", "fp32")
    assert rungs(query.replace(precision="bf16"), "cpu", "onnxruntime") == ("bf16", "fp32")
    assert rungs(settings, "cpu", "onnxruntime") == text_ladder("auto", "cpu", "onnxruntime")
    # Batched queries (whose rows must not move with their peers) take the static INT8 graph.
    assert peer_independent(settings).machine.graph == "static"
    with pytest.raises(ModelError, match="precision='bf16' is not available for backend onnxruntime on cuda"):
        text_ladder("bf16", "cuda", "onnxruntime")


@pytest.mark.slow
def test_the_bf16_rung_runs_the_module_on_pytorch_gated_like_any_other(
    settings: Engine, corpus_texts: list[str]
) -> None:
    """One stream over every core (PyTorch's own intra-op threads), and its vectors within the
    gate of FP32's; a vector of a text alone is the one it gets in a batch."""
    with load_encoder(settings.replace(precision="bf16", device="cpu")) as bf16:
        report = bf16.report
        assert (report.backend, report.device, report.precision, bf16.streams) == ("torch", "cpu", "bf16", 1)
        assert [(g.precision, g.passed) for g in report.gates] == [("bf16", True)]
        texts = corpus_texts[:40]
        vectors = bf16.encode(texts)
        assert row_cosine(vectors, reference_embeddings(settings, texts)).min() > 0.99
        np.testing.assert_allclose(bf16.encode_query(texts[3]), vectors[3], atol=0.02)


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRECOMPUTE_ENGINE_PRECISION", "fp32")
    monkeypatch.setenv("PRECOMPUTE_ENGINE_BATCH_SIZE", "64")
    assert (EnginePolicy().precision, EngineSettings().batch_size) == ("fp32", 64)
    monkeypatch.setenv("PRECOMPUTE_ENGINE_PRECISION", "int4")
    with pytest.raises(ValueError, match="precision"):
        EnginePolicy()


def test_the_single_query_path_embeds_as_a_batch_of_one(encoder, corpus_texts) -> None:
    """Its input buffers are reused: a short text after a long one must not see the long one's ids."""
    long_text, short_text = corpus_texts[0] * 20, "a chess engine"
    for text in (long_text, short_text, long_text[:300], short_text):
        np.testing.assert_array_equal(encoder.encode_query(text), encoder.encode([text])[0])
    with pytest.raises(InvalidInputError, match="row 0: text is empty"):
        encoder.encode_query("  ")


@pytest.mark.slow
def test_single_queries_on_several_threads_run_at_once_each_with_its_own_vector(encoder, corpus_texts) -> None:
    """Each search thread has its own input buffers: concurrent queries of different lengths
    never see each other's ids (the service runs one per search thread, unserialised)."""
    texts = [corpus_texts[i] * (1 + i % 3) for i in range(24)]
    alone = [encoder.encode_query(t) for t in texts]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(encoder.encode_query, texts * 3))
    for i, vector in enumerate(together):
        np.testing.assert_array_equal(vector, alone[i % len(texts)])


def test_the_query_graph_matches_the_batch_graph(settings: Engine, encoder, corpus_texts) -> None:
    """The service embeds queries on the fused graph, or where that fails the gate on the same mixed
    graph as the corpus (a corpus on BF16 has none: the query takes ONNX Runtime's, engine.rungs);
    its vectors must sit where the corpus's do."""
    with load_encoder(settings.replace(graph="query", streams=1, threads=1)) as query:
        own_graph = query.report.precision == "int8" or encoder.report.precision == "bf16"
        assert (query.report.engine_dir != encoder.report.engine_dir) == own_graph
        assert query.report.gates[-1].passed
        titles = [text.split(".")[0][:80] for text in corpus_texts[:20]]
        fused = np.stack([query.encode_query(t) for t in titles])
        assert np.min(np.sum(fused * np.stack([encoder.encode_query(t) for t in titles]), axis=1)) > 0.98


@pytest.mark.parametrize(
    ("machine", "flags", "saturates"),
    [
        ("x86_64", "avx avx2 fma", True),
        ("x86_64", "avx2 avx512f avx512_vnni", False),
        ("x86_64", "avx2 avx_vnni", False),
        ("x86_64", "avx2 avx512f amx_int8 amx_bf16", False),
        ("aarch64", "asimd asimddp", False),
    ],
)
def test_cpus_without_vnni_quantize_to_7_bit_weights(
    monkeypatch: pytest.MonkeyPatch, machine: str, flags: str, saturates: bool
) -> None:
    """ONNX Runtime's u8 x s8 kernels saturate on x86 without VNNI: 7-bit weights there."""
    monkeypatch.setattr(hardware, "cpu_model_and_flags", lambda: ("a CPU", frozenset(flags.split())))
    monkeypatch.setattr(hardware.platform, "machine", lambda: machine)
    assert hardware.int8_saturates() is saturates
