"""The label head: training, its ONNX export, and the label-agreement gate on the real encoder."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from models.errors import ModelError
from models.labels import LABELS_FILE, LabelHead, LabelSettings, export_head, load_labeler, train_head
from models.source import EMBEDDING_DIM

TRAIN_TEXTS = 400
"""As in the flow's tests: the trained head is cached per training set, so they share it."""


def test_exported_head_is_softmax_of_the_affine_map(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    weight, bias = rng.normal(size=(5, EMBEDDING_DIM)), rng.normal(size=5)
    export_head(weight, bias, tmp_path / "head.onnx")
    (tmp_path / LABELS_FILE).write_text(json.dumps({"labels": list("abcde"), "held_out_accuracy": 1.0}))
    x = rng.normal(size=(7, EMBEDDING_DIM)).astype(np.float32)
    logits = x @ weight.T + bias
    expected = np.exp(logits - logits.max(axis=1, keepdims=True))
    expected /= expected.sum(axis=1, keepdims=True)
    head = LabelHead(tmp_path)
    np.testing.assert_allclose(head.probabilities(x), expected, atol=1e-5)
    indices, scores = head.top(x, 2)
    np.testing.assert_array_equal(indices, np.argsort(-expected, axis=1)[:, :2])
    np.testing.assert_allclose(scores, np.sort(expected, axis=1)[:, ::-1][:, :2], atol=1e-5)


def test_training_separates_separable_classes() -> None:
    rng = np.random.default_rng(1)
    centres = rng.normal(size=(3, 16)) * 3
    targets = rng.integers(0, 3, size=300)
    points = (centres[targets] + rng.normal(size=(300, 16))).astype(np.float32)
    weight, bias = train_head(points, targets, 3)
    assert np.mean(np.argmax(points @ weight.T + bias, axis=1) == targets) > 0.98


def test_a_precision_short_of_the_agreement_gate_falls_back(settings) -> None:
    """INT8 labels agree with FP32 on most, not all, of the held-out texts: the gate decides the engine."""
    with load_labeler(LabelSettings(max_train_texts=TRAIN_TEXTS, gate_agreement=0.5), settings) as lenient:
        [int8] = lenient.report.gates
        assert (int8.precision, int8.passed, lenient.report.engine.precision) == ("int8", True, "int8")
    assert int8.agreement < 1.0  # what makes the strict gate below a real fallback
    with load_labeler(LabelSettings(max_train_texts=TRAIN_TEXTS, gate_agreement=1.0), settings) as strict:
        failed, passed = strict.report.gates
        assert (failed.precision, failed.passed, failed.agreement) == ("int8", False, int8.agreement)
        assert failed.reason == f"label agreement {int8.agreement:.4f} < 1.0"
        assert (passed.precision, passed.agreement, strict.report.engine.precision) == ("fp32", 1.0, "fp32")
        texts = ["a chess engine with a graphical board", "a library for parsing XML"]
        indices, scores = strict.label(texts)
        assert indices.shape == scores.shape == (2, 3)
        assert np.all(np.diff(scores, axis=1) <= 0) and np.all(scores > 0)


def test_a_bad_label_column_is_named(settings, tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="cannot read id, text, no_such_column"):
        load_labeler(
            LabelSettings(column="no_such_column"), settings.model_copy(update={"cache_dir": tmp_path})
        )
