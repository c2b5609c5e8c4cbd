"""Backend and precision selection: automatic by hardware, overridable, refused with a reason."""

from __future__ import annotations

import pytest

from models import EngineSettings, ModelError, load_encoder
from models.errors import BackendUnavailableError


def test_auto_picks_onnxruntime_int8_on_a_cpu(encoder) -> None:
    report = encoder.report
    assert (report.backend, report.device, report.precision) == ("onnxruntime", "cpu", "int8")


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
        load_encoder(settings.model_copy(update=override))


def test_torch_is_the_ungated_fp32_reference(settings: EngineSettings, corpus_texts) -> None:
    with load_encoder(settings.model_copy(update={"backend": "torch", "device": "cpu"})) as reference:
        assert (reference.report.precision, reference.report.gates) == ("fp32", [])
        assert reference.encode(corpus_texts[:2]).shape == (2, 384)


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRECOMPUTE_ENGINE_PRECISION", "fp32")
    monkeypatch.setenv("PRECOMPUTE_ENGINE_BATCH_SIZE", "64")
    assert (EngineSettings().precision, EngineSettings().batch_size) == ("fp32", 64)
    monkeypatch.setenv("PRECOMPUTE_ENGINE_PRECISION", "int4")
    with pytest.raises(ValueError, match="precision"):
        EngineSettings()
