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
    load_encoder,
)
from precompute.models.errors import BackendUnavailableError


def test_auto_picks_onnxruntime_on_a_cpu_and_starts_its_ladder_at_int8(encoder) -> None:
    """Which rung serves is the gate's to say (test_gate.py): MiniLM's moves neighbours until FP32."""
    report = encoder.report
    assert (report.backend, report.device, report.gates[0].precision) == ("onnxruntime", "cpu", "int8")


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
    with load_encoder(settings.replace(backend="torch", device="cpu")) as reference:
        assert (reference.report.precision, reference.report.gates) == ("fp32", [])
        assert reference.encode(corpus_texts[:2]).shape == (2, 384)


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
    graph as the corpus; its vectors must sit where the corpus's do."""
    with load_encoder(settings.replace(graph="query", streams=1, threads=1)) as query:
        all_int8 = query.report.precision == "int8"
        assert (query.report.engine_dir != encoder.report.engine_dir) == all_int8 and query.report.gates[-1].passed
        titles = [text.split(".")[0][:80] for text in corpus_texts[:20]]
        fused = np.stack([query.encode_query(t) for t in titles])
        assert np.min(np.sum(fused * np.stack([encoder.encode_query(t) for t in titles]), axis=1)) > 0.98
