"""The label head: training, its ONNX export, and the label gate on the real encoder."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from precompute.demo_data import DEMO_CORPUS
from precompute.models import load_encoder
from precompute.models.engines.cache import EngineCache
from precompute.models.errors import ModelError
from precompute.models.labels.head import (
    HEAD_FILE,
    LABELS_FILE,
    LabelHead,
    LabelPolicy,
    LabelTask,
    export_head,
    held_out_rows,
    load_head,
)
from precompute.models.labels.labeler import GATE_ROWS_PER_TEXT, Labeler, load_labeler, top_of
from precompute.models.text.reference import TextSample, split_slot

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
def test_the_label_gate_holds_the_heads_held_out_accuracy_under_the_engine_to_fp32s(settings) -> None:
    """What label users feel: the head's accuracy on the gate slot's labelled rows (no head trains
    on them), under INT8 against FP32. INT8 flips some near ties (agreement under the old 0.99
    bar) and labels as accurately: it serves."""
    with load_labeler(SECTIONS, settings) as labeler:
        [int8] = labeler.report.gates
        head = labeler.head
    texts, truth = held_out_rows(SECTIONS, head.labels, settings.policy.gate_texts * GATE_ROWS_PER_TEXT)
    assert int8.texts == len(texts) == settings.policy.gate_texts * GATE_ROWS_PER_TEXT
    assert int8.accuracy_fp32 > 0.5  # 57 sections: chance is under 0.1
    with load_encoder(settings.replace(precision="fp32")) as fp32:
        exact = np.mean(np.argmax(head.probabilities(fp32.encode(texts), texts), axis=1) == truth)
    assert int8.accuracy_fp32 == pytest.approx(exact, abs=2 / len(texts))  # ONNX Runtime FP32 vs the reference
    assert int8.agreement < 0.99 and (int8.precision, int8.passed) == ("int8", True)
    assert int8.accuracy / int8.accuracy_fp32 >= 0.995 and labeler.report.engine.precision == "int8"
    strict = settings.replace(gate_min_accuracy_ratio=1.0)
    with load_labeler(SECTIONS, strict) as labeler:
        assert labeler.report.gates[0].passed == (int8.accuracy >= int8.accuracy_fp32)


@pytest.fixture(scope="module")
def unlabelled_gate_slot(tmp_path_factory: pytest.TempPathFactory) -> LabelTask:
    """SECTIONS with the gate slot's labels removed: the same head (it never trained on them), gated
    on agreement with FP32, as a classifier is."""
    corpus = pq.read_table(DEMO_CORPUS)
    gate_slot = pa.array([split_slot(id_) == 0 for id_ in corpus["id"].to_pylist()])
    sections = pc.if_else(gate_slot, pa.scalar(None, pa.string()), corpus["section"])
    path = tmp_path_factory.mktemp("labels") / "corpus.parquet"
    pq.write_table(corpus.set_column(corpus.schema.get_field_index("section"), "section", sections), path)
    return SECTIONS.model_copy(update={"corpus": TextSample(path=str(path))})


@pytest.mark.slow
@pytest.mark.usefixtures("cpu_without_bf16")
def test_near_ties_are_rechecked_at_fp32_before_the_ladder_falls_back(
    settings, unlabelled_gate_slot: LabelTask, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no labelled held-out row, INT8 labels agree with FP32 on most, not all, held-out
    texts: the agreement bar decides what labels."""
    sections = unlabelled_gate_slot
    settings = settings.replace(gate_texts=256)
    with load_labeler(sections, settings.replace(gate_agreement=0.5)) as lenient:
        [int8] = lenient.report.gates
        assert (int8.precision, int8.passed, int8.recheck_margin, int8.accuracy) == ("int8", True, None, None)
        assert lenient.report.engine.precision == "int8" and lenient.recheck is None
    assert int8.agreement < 1.0  # so the stricter gates below are real

    just_above = settings.replace(gate_agreement=min(int8.agreement + 0.01, 1.0))
    with load_labeler(sections, just_above) as rechecking:
        alone, rechecked = rechecking.report.gates
        assert (alone.precision, alone.passed, alone.agreement) == ("int8", False, int8.agreement)
        assert (rechecked.precision, rechecked.passed) == ("int8+fp32-recheck", True)
        assert rechecked.agreement >= just_above.policy.gate_agreement and 0 < rechecked.rechecked < 0.5
        texts = ["a chess engine with a graphical board", "a library for parsing XML"]
        indices, scores, given = rechecking.label(texts)
        assert indices.shape == scores.shape == given.shape == (2, 3) and given.all()  # min_score 0
        assert [rechecking.labels[i] for i in indices[:, 0]] == ["games", "libs"]  # what the texts are
        assert np.all(np.diff(scores, axis=1) <= 0) and np.all(scores > 0)
        sure = Labeler(rechecking.encoder, rechecking.head, LabelPolicy(min_score=0.5))
        assert sure.label(texts)[2].tolist() == (scores >= 0.5).tolist()  # the rest abstain
    # A second load takes each rung's gates from the engine cache: the same labeler.
    head = Path(rechecking.report.head_dir).name
    assert any(key["head"] == head for _, key in EngineCache(settings.machine.cache_dir).entries("label-gate"))
    with load_labeler(sections, just_above) as again:
        assert again.report.gates == rechecking.report.gates and again.margin == rechecking.margin
    # Given the head its caller chose (a job's, whose flow chose it), no labelled row is read again.
    with monkeypatch.context() as patched:
        patched.setattr("precompute.models.labels.labeler.load_head", None)
        with load_labeler(sections, just_above, Path(rechecking.report.head_dir)) as given:
            assert given.report == rechecking.report

    # Ten calibration texts show no flip, so nothing is rechecked and INT8 falls back to FP32.
    few = sections.model_copy(update={"policy": LabelPolicy(train_texts=TRAIN_TEXTS, recheck_texts=10, fine_tune_seconds=0)})
    with load_labeler(few, settings.replace(gate_agreement=1.0)) as exact:
        alone, rechecked, fp32 = exact.report.gates
        assert not alone.passed and not rechecked.passed and rechecked.rechecked == 0.0
        assert rechecked.reason == f"label agreement {int8.agreement:.4f} < 1.0 (no labelled held-out row)"
        assert (fp32.precision, fp32.agreement, exact.report.engine.precision) == ("fp32", 1.0, "fp32")


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


def test_the_label_gates_rows_are_the_gate_slots_labelled_rows_with_labels_the_head_knows(tmp_path: Path) -> None:
    ids = [f"r{i}" for i in range(200)]
    gate = [i for i in ids if split_slot(i) == 0]
    labels = {i: (["b", "zz"] if n % 3 == 0 else ["a"] if n % 3 == 1 else ["zz"]) for n, i in enumerate(ids)}
    texts = {i: f"text of {i}" for i in ids}
    texts[gate[0]] = " "  # no text: left out
    table = pa.table({"id": ids, "text": [texts[i] for i in ids], "tags": [labels[i] for i in ids]})
    pq.write_table(table, tmp_path / "multi.parquet")
    task = LabelTask(corpus=TextSample(path=str(tmp_path / "multi.parquet")), column="tags")
    found, truth = held_out_rows(task, ["a", "b"], 100)
    kept = [i for i in gate[1:] if labels[i] != ["zz"]]  # "zz" alone: no label the head knows
    assert found == [texts[i] for i in kept]
    assert truth.tolist() == [[labels[i] == ["a"], "b" in labels[i]] for i in kept]
    assert held_out_rows(task, ["a", "b"], 2)[0] == [texts[i] for i in kept[:2]]

    single = pa.table({"id": ids, "text": [texts[i] for i in ids], "tag": [labels[i][0] for i in ids]})
    pq.write_table(single, tmp_path / "single.parquet")
    task = LabelTask(corpus=TextSample(path=str(tmp_path / "single.parquet")), column="tag")
    found, truth = held_out_rows(task, ["a", "b", "zz"], 100)
    assert found == [texts[i] for i in gate[1:]] and truth.tolist() == [["a", "b", "zz"].index(labels[i][0]) for i in gate[1:]]
