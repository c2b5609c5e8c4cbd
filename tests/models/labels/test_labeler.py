"""The label head: training, its ONNX export, and the label-agreement gate on the real encoder."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from precompute.demo_data import DEMO_CORPUS
from precompute.models.engines.cache import EngineCache
from precompute.models.engines.load import MOVED_SHARE
from precompute.models.errors import ModelError
from precompute.models.labels.head import (
    HEAD_FILE,
    LABELS_FILE,
    LabelHead,
    LabelPolicy,
    LabelTask,
    export_head,
    load_head,
)
from precompute.models.labels.labeler import Labeler, load_labeler, top_of
from precompute.models.text.encoder import Encoder
from precompute.models.text.reference import TextSample, reference_texts, split_slot

EMBEDDING_DIM = 384

TRAIN_TEXTS = 900
"""A head whose INT8 labels flip on a near tie of the gate's texts, which FP32 rechecks mend."""
SECTIONS = LabelTask(
    corpus=TextSample(path=str(DEMO_CORPUS)), column="section", policy=LabelPolicy(train_texts=TRAIN_TEXTS, fine_tune_seconds=0)
)
"""A head trained on the demo corpus's Debian sections."""


def write_head(directory: Path, weight: np.ndarray, bias: np.ndarray, multi: bool = False) -> None:
    export_head(weight, bias, directory / HEAD_FILE, multi)
    labels = [f"label-{i}" for i in range(len(bias))]
    meta = {"labels": labels, "multi": multi, "thresholds": [0.5] * len(bias) if multi else None, "encoder": None}
    (directory / LABELS_FILE).write_text(json.dumps({**meta, "held_out_accuracy": 1.0, "training": {}}))


def test_exported_head_is_the_softmax_or_sigmoid_of_the_affine_map(settings, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    weight, bias = rng.normal(size=(5, EMBEDDING_DIM)), rng.normal(size=5)
    x = rng.normal(size=(7, EMBEDDING_DIM)).astype(np.float32)
    logits = x @ weight.T + bias
    expected = np.exp(logits - logits.max(axis=1, keepdims=True))
    expected /= expected.sum(axis=1, keepdims=True)
    write_head(tmp_path, weight, bias)
    head = LabelHead(tmp_path, settings)
    np.testing.assert_allclose(head.probabilities(x, ["a text"] * 7), expected, atol=1e-5)
    indices, scores = top_of(head.probabilities(x, ["a text"] * 7), 2)
    np.testing.assert_array_equal(indices, np.argsort(-expected, axis=1)[:, :2])
    np.testing.assert_allclose(scores, np.sort(expected, axis=1)[:, ::-1][:, :2], atol=1e-5)

    (multi := tmp_path / "multi").mkdir()
    write_head(multi, weight, bias, multi=True)
    sigmoid = LabelHead(multi, settings).probabilities(x, ["a text"] * 7)
    np.testing.assert_allclose(sigmoid, 1 / (1 + np.exp(-logits)), atol=1e-5)
    assert LabelHead(multi, settings).given(sigmoid, 0.0).tolist() == (sigmoid >= 0.5).tolist()


@pytest.mark.slow
@pytest.mark.usefixtures("cpu_without_bf16")
def test_near_ties_are_rechecked_at_fp32_before_the_ladder_falls_back(settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """INT8 labels agree with FP32 on most, not all, held-out texts: the gate decides what labels.
    On 256 of them, the default: on the suite's 64, INT8 on an AVX2-only CPU agreed on all."""
    settings = settings.replace(gate_texts=256)
    with load_labeler(SECTIONS, settings.replace(gate_agreement=0.5)) as lenient:
        [int8] = lenient.report.gates
        assert (int8.precision, int8.passed, int8.recheck_margin) == ("int8", True, None)
        assert lenient.report.engine.precision == "int8" and lenient.recheck is None
    assert int8.agreement < 1.0  # so the stricter gates below are real

    just_above = settings.replace(gate_agreement=min(int8.agreement + 0.01, 1.0))
    with load_labeler(SECTIONS, just_above) as rechecking:
        alone, rechecked = rechecking.report.gates
        assert (alone.precision, alone.passed, alone.agreement) == ("int8", False, int8.agreement)
        assert (rechecked.precision, rechecked.passed) == ("int8+fp32-recheck", True)
        assert rechecked.agreement >= just_above.policy.gate_agreement and 0 < rechecked.rechecked < 0.5
        texts = ["a chess engine with a graphical board", "a library for parsing XML"]
        indices, scores, given = rechecking.label(texts)
        assert indices.shape == scores.shape == given.shape == (2, 3) and given.all()  # min_score 0
        assert np.all(np.diff(scores, axis=1) <= 0) and np.all(scores > 0)
        sure = Labeler(rechecking.encoder, rechecking.head, LabelPolicy(min_score=0.5))
        assert sure.label(texts)[2].tolist() == (scores >= 0.5).tolist()  # the rest abstain
    # A second load takes each rung's gates from the engine cache: the same labeler.
    head = Path(rechecking.report.head_dir).name
    assert any(key["head"] == head for _, key in EngineCache(settings.machine.cache_dir).entries("label-gate"))
    with load_labeler(SECTIONS, just_above) as again:
        assert again.report.gates == rechecking.report.gates and again.margin == rechecking.margin
    # Given the head its caller chose (a job's, whose flow chose it), no labelled row is read again.
    with monkeypatch.context() as patched:
        patched.setattr("precompute.models.labels.labeler.load_head", None)
        with load_labeler(SECTIONS, just_above, Path(rechecking.report.head_dir)) as given:
            assert given.report == rechecking.report

    # Ten calibration texts show no flip, so nothing is rechecked and INT8 falls back to FP32.
    few = SECTIONS.model_copy(update={"policy": LabelPolicy(train_texts=TRAIN_TEXTS, recheck_texts=10, fine_tune_seconds=0)})
    with load_labeler(few, settings.replace(gate_agreement=1.0)) as exact:
        alone, rechecked, fp32 = exact.report.gates
        assert not alone.passed and not rechecked.passed and rechecked.rechecked == 0.0
        assert rechecked.reason == f"label agreement {int8.agreement:.4f} < 1.0"
        assert (fp32.precision, fp32.agreement, exact.report.engine.precision) == ("fp32", 1.0, "fp32")


@pytest.mark.slow
@pytest.mark.usefixtures("cpu_without_bf16")
def test_gate_texts_that_moved_are_encoded_by_the_engines_gates_alone_not_again_by_the_label_gate(
    settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More of the 256 gate texts edited than a gate leaves out (engine.MOVED_SHARE), and a gate
    that walks every try (INT8 alone, INT8 with its near ties rechecked at FP32 after
    calibration, FP32): each engine's cosine gate encodes the edited texts into the file its
    outputs are kept in (test_text_vectors), so the label gate scores kept outputs alone
    (KeptOutputs) and encodes nothing itself; the same gates decide."""
    few = SECTIONS.model_copy(update={"policy": LabelPolicy(train_texts=TRAIN_TEXTS, recheck_texts=10, fine_tune_seconds=0)})
    strict = settings.replace(gate_texts=256, gate_agreement=1.0)
    with load_labeler(few, strict) as before:
        assert [g.precision for g in before.report.gates] == ["int8", "int8+fp32-recheck", "fp32"]
    moved = reference_texts(strict.reference, "gate", 256)[: int(MOVED_SHARE * 256) + 1]
    corpus = pq.read_table(DEMO_CORPUS)
    chosen = pc.is_in(corpus["text"], pa.array(moved))
    relabelled = pc.binary_join_element_wise(corpus["text"], " (edited for labels)", "")  # not test_text_vectors' edit
    edited = pc.if_else(chosen, relabelled, corpus["text"])
    pq.write_table(corpus.set_column(corpus.schema.get_field_index("text"), "text", edited), tmp_path / "c.parquet")
    asked: list[str] = []
    real = Encoder.encode

    def counted(self: Encoder, texts: list[str]) -> np.ndarray:
        asked.extend(texts)
        return real(self, texts)

    monkeypatch.setattr(Encoder, "encode", counted)
    with load_labeler(few, strict.replace(reference=TextSample(path=str(tmp_path / "c.parquet")))) as after:
        assert [(g.precision, g.passed) for g in after.report.gates] == [
            (g.precision, g.passed) for g in before.report.gates
        ]
        assert after.report.engine.gates[-1].texts == 256
    assert asked == []


def test_a_bad_label_column_is_named(settings, tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="cannot read columns id, text, no_such_column"):
        load_labeler(SECTIONS.model_copy(update={"column": "no_such_column"}), settings.replace(cache_dir=tmp_path))


@pytest.mark.slow
def test_a_head_is_kept_through_small_changes_of_its_training_rows_and_retrained_past_them(
    settings, tmp_path: Path
) -> None:
    """The head is part of every label's identity: kept, the rerun reuses its labels."""
    rows = [r for r in pq.read_table(DEMO_CORPUS).to_pylist()[::20] if split_slot(r["id"]) != 0]
    rows = rows[:200]  # none of the gate's: all train or held out

    def head(changed: int, retrain_share: float = 0.05, name: str = "corpus") -> Path:
        edited = [{**r, "text": r["text"] + " (edited)"} if i < changed else r for i, r in enumerate(rows)]
        path = tmp_path / f"{name}-{changed}.parquet"
        pq.write_table(pa.Table.from_pylist(edited), path)
        policy = LabelPolicy(train_texts=200, retrain_share=retrain_share, fine_tune_seconds=0)
        return load_head(LabelTask(corpus=TextSample(path=str(path)), column="section", policy=policy), settings).directory

    first = head(0)
    assert head(4) == first  # 4 rows of 200 changed: 2%
    assert head(0, name="moved") == first  # the same rows in another file: the same head
    assert head(4, retrain_share=0.0) != first  # any change retrains
    assert head(30) not in (first, head(4, retrain_share=0.0))  # 15%: retrained
