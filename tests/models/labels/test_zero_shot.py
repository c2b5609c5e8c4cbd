"""Zero-shot labels: a head made from label names and descriptions, on a tiny random encoder and
on the bundled one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from precompute.models.engines.load import load_encoder
from precompute.models.labels.head import LabelPolicy, LabelTask, load_head
from precompute.models.labels.labeler import Labeler
from precompute.models.labels.zero_shot import LOGIT_SCALE, LabelText, Taxonomy, zero_shot_weights
from precompute.models.settings import Engine
from precompute.models.source import read_encoder
from precompute.models.text.reference import TextSample
from tests.models.tiny import tiny_encoder

DESCRIBED = {
    "chess": "chess pieces king queen bishop checkmate",
    "kernel": "kernel driver module interrupt scheduler",
    "garden": "garden tomato seeds soil compost",
}
"""Three labels whose descriptions share no word: separable by any encoder that sees words."""


def test_the_logits_are_the_scaled_cosine_less_the_labels_mean_cosine_over_the_corpus() -> None:
    rng = np.random.default_rng(0)
    labels, corpus, rows = rng.normal(size=(4, 8)), rng.normal(size=(50, 8)), rng.normal(size=(6, 8))
    weight, bias = zero_shot_weights(3 * labels, corpus * rng.uniform(1, 5, (50, 1)))  # norms do not count

    def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return (a / np.linalg.norm(a, axis=1, keepdims=True)) @ (b / np.linalg.norm(b, axis=1, keepdims=True)).T

    unit = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    expected = LOGIT_SCALE * (cosine(rows, labels) - cosine(corpus, labels).mean(axis=0))
    np.testing.assert_allclose(unit @ weight.T + bias, expected, rtol=1e-5, atol=1e-5)


def test_a_label_text_is_the_prompt_with_its_description_or_its_name() -> None:
    taxonomy = Taxonomy(labels=(LabelText(label="games", description="video games"), LabelText(label="net")))
    assert taxonomy.texts() == ["This text is about video games.", "This text is about net."]
    named = Taxonomy(labels=taxonomy.labels, prompt="{label}: {description}")
    assert named.texts() == ["games: video games", "net: net"]
    with pytest.raises(ValueError, match=r"prompt must hold \{description\} or \{label\}"):
        Taxonomy(labels=taxonomy.labels, prompt="About this.")
    with pytest.raises(ValueError, match="labels are named once each: 'net' repeat"):
        Taxonomy(labels=(LabelText(label="net"), LabelText(label="net", description="networks")))


@pytest.fixture
def tiny(settings: Engine, tmp_path: Path) -> tuple[Engine, TextSample]:
    """A tiny random encoder (mean pooling: a text's vector leans to its words') and a corpus of
    texts, a few of them made of one label's description and filler, most about none of them (as
    a label is on a few rows of a corpus)."""
    folder = tiny_encoder(tmp_path / "tiny", "bert", pooling="mean")
    engine = settings.replace(model=read_encoder(folder))
    filler = ["the report says that", "we found", "notes on", "a short text about"]
    other = ["weather rain wind forecast", "invoice payment total due", "train station platform delay"]
    texts = [f"{filler[i % 4]} {DESCRIBED[label]}" for i, label in enumerate(sorted(DESCRIBED) * 5)]
    texts += [f"{filler[i % 4]} {other[i % 3]}" for i in range(90)]
    rows = [{"id": f"row-{i}", "text": text} for i, text in enumerate(texts)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "corpus.parquet")
    return engine, TextSample(path=str(tmp_path / "corpus.parquet"))


def zero_shot(corpus: TextSample, multi: bool = False, min_score: float = 0.0) -> LabelTask:
    taxonomy = Taxonomy(
        labels=tuple(LabelText(label=name, description=text) for name, text in DESCRIBED.items()),
        prompt="{description}",
        multi=multi,
    )
    return LabelTask(corpus=corpus, taxonomy=taxonomy, policy=LabelPolicy(min_score=min_score, top=3))


@pytest.mark.slow
def test_a_tiny_encoder_labels_each_text_by_the_description_it_shares(tiny: tuple[Engine, TextSample]) -> None:
    engine, corpus = tiny
    head = load_head(zero_shot(corpus), engine)
    assert head.labels == list(DESCRIBED) and head.held_out_accuracy is None
    assert head.training["chosen"] == "zero-shot" and head.training["baseline"] is None
    assert load_head(zero_shot(corpus), engine).directory == head.directory  # made once, then cached
    texts = [f"{filler} {DESCRIBED[name]}" for name in DESCRIBED for filler in ("see also", "my diary:")]
    with load_encoder(engine.replace(precision="fp32")) as encoder:
        labeler = Labeler(encoder, head, zero_shot(corpus).policy)
        indices, scores, _ = labeler.label(texts)
        total = labeler.probabilities(texts)[0].sum(axis=1)
    assert [head.labels[i] for i in indices[:, 0]] == [name for name in DESCRIBED for _ in range(2)]
    assert np.all(np.diff(scores, axis=1) <= 0) and np.allclose(total, 1, atol=1e-5)


@pytest.mark.slow
def test_several_labels_per_row_each_at_or_above_min_score(tiny: tuple[Engine, TextSample]) -> None:
    """With multi_label, each label's sigmoid stands alone: a text holding two descriptions gets
    both, one holding one gets that one, and min_score is the bar each label clears."""
    engine, corpus = tiny
    head = load_head(zero_shot(corpus, multi=True), engine)
    texts = [
        f"{DESCRIBED['chess']} and {DESCRIBED['garden']}",
        f"notes on {DESCRIBED['kernel']}",
        f"we found {DESCRIBED['garden']}",
    ]
    with load_encoder(engine.replace(precision="fp32")) as encoder:
        probabilities = head.probabilities(encoder.encode(texts), texts)
    assert not np.allclose(probabilities.sum(axis=1), 1)  # a sigmoid per label, not a softmax
    assert head.thresholds is not None and np.all(head.thresholds == 0.5)  # nearer than the label's typical row
    bar = float(np.sort(probabilities, axis=1)[0, -2])  # the first text's second-best label
    assert bar > float(np.sort(probabilities, axis=1)[1:, -2].max())  # above any single-topic text's second
    given = head.given(probabilities, bar)
    names = [[head.labels[i] for i in np.flatnonzero(row)] for row in given]
    assert names == [["chess", "garden"], ["kernel"], ["garden"]]
