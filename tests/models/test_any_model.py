"""Any encoder or classifier a user brings as a folder: read, exported exactly, quantized and gated.

Tiny random-initialised models of each supported architecture (tests/models/tiny.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from sentence_transformers import SentenceTransformer
from transformers import AutoModel, AutoModelForSequenceClassification

from precompute.demo_data import DEMO_CORPUS
from precompute.models import Engine, load_encoder
from precompute.models.backends.onnxruntime import OnnxRuntimeRunner
from precompute.models.errors import ModelError
from precompute.models.labels.head import LabelPolicy, LabelTask
from precompute.models.labels.labeler import load_labeler
from precompute.models.source import read_classifier, read_encoder
from precompute.models.text.reference import TextSample
from precompute.models.text.tokenize import TextTokenizer
from tests.models.tiny import (
    ARCHITECTURES,
    HIDDEN,
    LABELS,
    saved_by_sentence_transformers,
    tiny_classifier,
    tiny_encoder,
)


@pytest.fixture(scope="module")
def texts(corpus_texts: list[str]) -> list[str]:
    """Mixed lengths, so every batch is padded: a short text, real ones, one truncated."""
    return ["short", *corpus_texts[:30], "word " * 300]


def exported(settings: Engine, source) -> OnnxRuntimeRunner:
    with load_encoder(settings.replace(model=source, precision="fp32")) as encoder:
        path = Path(encoder.report.engine_dir) / "model.onnx"
    return OnnxRuntimeRunner(path, "cpu", 2)


def hidden_states(folder: Path, ids: np.ndarray, mask: np.ndarray) -> torch.Tensor:
    model = AutoModel.from_pretrained(folder).eval()
    with torch.inference_mode():
        return model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).last_hidden_state


@pytest.mark.parametrize("architecture", ARCHITECTURES)
@pytest.mark.parametrize("pooling", ["mean", "cls", "max"])
def test_export_matches_transformers_fp32(
    architecture: str, pooling: str, settings: Engine, texts: list[str], tmp_path: Path
) -> None:
    """Max abs diff <= 1e-4 against transformers' own model, pooled as stated, on padded batches."""
    folder = tiny_encoder(tmp_path / architecture, architecture)
    source = read_encoder(folder, pooling=pooling, normalize=False)
    assert (source.architecture, source.dim, source.task) == (architecture, HIDDEN, "embed")
    with exported(settings, source) as runner:
        for batch in TextTokenizer(source).batches(texts, 8):
            hidden = hidden_states(folder, batch.input_ids, batch.attention_mask)
            mask = torch.from_numpy(batch.attention_mask)[..., None].float()
            want = {
                "mean": (hidden * mask).sum(1) / mask.sum(1),
                "cls": hidden[:, 0],
                "max": (hidden + (1 - mask) * -1e9).max(1).values,
            }[pooling].numpy()
            got = runner.infer(batch.feeds)
            assert np.abs(got - want).max() <= 1e-4


@pytest.mark.parametrize(("architecture", "pooling"), [("bert", "cls"), ("xlm-roberta", "mean")])
def test_a_sentence_transformers_folder_states_its_own_pooling(
    architecture: str, pooling: str, settings: Engine, texts: list[str], tmp_path: Path
) -> None:
    """modules.json (Transformer, Pooling, Normalize) is read, and we match sentence-transformers."""
    folder = tiny_encoder(tmp_path / "st", architecture, pooling=pooling, normalize=False)
    source = read_encoder(folder)
    assert (source.pooling, source.normalize, source.max_seq_length) == (pooling, False, 128)
    want = SentenceTransformer(str(folder), device="cpu").encode(texts, batch_size=8)
    with load_encoder(settings.replace(model=source, precision="fp32")) as encoder:
        assert np.abs(encoder.encode(texts) - want).max() <= 1e-4


def test_a_folder_saved_by_the_installed_sentence_transformers_is_read(
    settings: Engine, texts: list[str], tmp_path: Path
) -> None:
    """Its Pooling config names the mode in one key ("pooling_mode": "cls"), not a flag per mode."""
    source = read_encoder(saved_by_sentence_transformers(tmp_path / "saved"))
    assert (source.pooling, source.normalize) == ("cls", True)
    want = SentenceTransformer(str(tmp_path / "saved"), device="cpu").encode(texts, batch_size=8)
    with load_encoder(settings.replace(model=source, precision="fp32")) as encoder:
        assert np.abs(encoder.encode(texts) - want).max() <= 1e-4
    config = tmp_path / "saved" / "1_Pooling" / "config.json"
    config.write_text(config.read_text().replace('"cls"', '"lasttoken"'))
    with pytest.raises(ModelError, match=r"pooling must be exactly one of mean, cls, max \(found \['lasttoken'\]\)"):
        read_encoder(tmp_path / "saved")


def test_a_folder_saved_in_fp16_has_an_fp32_reference_and_export(
    settings: Engine, texts: list[str], tmp_path: Path
) -> None:
    """transformers loads weights in the dtype they were saved in: the reference and the export
    ask for FP32, so the gate measures FP16 and INT8 against FP32, not against FP16."""
    source = read_encoder(saved_by_sentence_transformers(tmp_path / "saved", half=True))
    want = SentenceTransformer(str(tmp_path / "saved"), device="cpu").float().encode(texts, batch_size=8)
    with load_encoder(settings.replace(model=source, precision="fp32")) as encoder:
        graph = onnx.load(Path(encoder.report.engine_dir) / "model.onnx")
        assert {i.data_type for i in graph.graph.initializer} <= {onnx.TensorProto.FLOAT, onnx.TensorProto.INT64}
        assert np.abs(encoder.encode(texts) - want).max() <= 1e-4


def test_a_tiny_encoder_is_quantized_and_gated(settings: Engine, tmp_path: Path) -> None:
    source = read_encoder(tiny_encoder(tmp_path / "bert", "distilbert", pooling="mean"))
    with load_encoder(settings.replace(model=source)) as encoder:
        report = encoder.report
        assert encoder.encode(["a text", "another, longer text"]).shape == (2, HIDDEN)
    assert report.gates[0].precision == "int8" and report.gates[-1].passed
    assert report.gates[0].texts_from == settings.reference.path
    assert source.hash in report.model


@pytest.mark.parametrize("multi_label", [False, True])
def test_a_classifier_labels_through_its_gated_engine(
    multi_label: bool, settings: Engine, texts: list[str], tmp_path: Path
) -> None:
    folder = tiny_classifier(tmp_path / "classifier", multi_label)
    source = read_classifier(folder)
    assert (source.labels, source.multi_label, source.dim) == (LABELS, multi_label, len(LABELS))
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    with exported(settings, source) as runner:
        for batch in TextTokenizer(source).batches(texts, 8):
            with torch.inference_mode():
                ids, mask = torch.from_numpy(batch.input_ids), torch.from_numpy(batch.attention_mask)
                logits = model(input_ids=ids, attention_mask=mask).logits
            want = (torch.sigmoid(logits) if multi_label else torch.softmax(logits, -1)).numpy()
            assert np.abs(runner.infer(batch.feeds) - want).max() <= 1e-4

    engine = settings.replace(model=source)
    task = LabelTask(corpus=TextSample(path=str(DEMO_CORPUS)), policy=LabelPolicy(top=2))
    with load_labeler(task, engine) as labeler:
        assert labeler.labels == list(LABELS) and labeler.head is None
        gates = labeler.report.gates
        assert gates[0].precision == "int8"
        # The ladder climbs past each precision its gate refuses and serves the first one it passes:
        # a random classifier's scores lie close together, and on some CPUs (AVX2 only) INT8 flipped
        # every top label, on others none. Either way each gate's verdict follows its agreement.
        threshold = engine.policy.gate_agreement
        assert [g.passed for g in gates] == [False] * (len(gates) - 1) + [True]
        assert all(g.passed == (g.agreement >= threshold) for g in gates)
        assert labeler.report.engine.precision == gates[-1].precision
        indices, scores, _ = labeler.label(texts[:5])
    assert indices.shape == scores.shape == (5, 2) and np.all(np.diff(scores, axis=1) <= 0)


def test_bad_model_folders_are_named(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="does not exist"):
        read_encoder(tmp_path / "missing", pooling="mean")
    folder = tiny_encoder(tmp_path / "plain", "bert")
    with pytest.raises(ModelError, match="state its pooling"):
        read_encoder(folder)
    (folder / "config.json").write_text('{"model_type": "gpt2"}')
    with pytest.raises(ModelError, match="architecture 'gpt2' is not supported"):
        read_encoder(folder, pooling="mean")
    with pytest.raises(ModelError, match="has no id2label"):
        read_classifier(tiny_encoder(tmp_path / "encoder", "bert"))
