"""Few-shot labels: a head from a handful of rows a label, centred on the zero-shot head, chosen
among candidates by cross-validation; and the contrastive pairs its fine-tuned encoder trains on."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sklearn.linear_model import LogisticRegression

from precompute.models.engines.load import load_encoder
from precompute.models.labels.contrastive import pairs
from precompute.models.labels.few_shot import FOLDS, Prior, fit_prior, folds, simplest_within_error, unit
from precompute.models.labels.head import LabelPolicy, LabelTask, load_head
from precompute.models.labels.training import CandidateReport
from precompute.models.labels.zero_shot import LabelText, Taxonomy
from precompute.models.settings import Engine
from precompute.models.source import read_encoder
from precompute.models.text.reference import TextSample
from tests.models.labels.test_zero_shot import DESCRIBED
from tests.models.tiny import tiny_encoder


def blobs(rows_per_label: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Unit vectors of three labels, each around its own direction."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(3, 16))
    targets = np.repeat(np.arange(3), rows_per_label)
    return unit(centres[targets] + 0.8 * rng.normal(size=(len(targets), 16))), targets


def test_without_a_prior_the_head_is_logistic_regression_at_c_one_over_rows_times_penalty() -> None:
    """mean cross-entropy + penalty/2 |W|^2 is scikit-learn's C * sum + 1/2 |W|^2 at C = 1/(n penalty),
    the intercept unpenalised in both: the same probabilities."""
    x, targets = blobs(20)
    penalty = 0.05
    weight, bias = fit_prior(x, targets, Prior.none(3, 16), penalty)
    reference = LogisticRegression(C=1 / (len(x) * penalty), tol=1e-10, max_iter=10_000).fit(x, targets)
    logits = x @ weight.T + bias
    ours = np.exp(logits - logits.max(axis=1, keepdims=True))
    np.testing.assert_allclose(ours / ours.sum(axis=1, keepdims=True), reference.predict_proba(x), atol=2e-4)


def test_a_large_penalty_keeps_the_prior_and_a_small_one_follows_the_rows() -> None:
    x, targets = blobs(8)
    rng = np.random.default_rng(1)
    prior = Prior(rng.normal(size=(3, 16)).astype(np.float32), np.zeros(3, np.float32))
    kept, _ = fit_prior(x, targets, prior, 1e6)
    np.testing.assert_allclose(kept, prior.weight, atol=1e-3)
    followed, bias = fit_prior(x, targets, prior, 1e-4)
    assert np.mean(np.argmax(x @ followed.T + bias, axis=1) == targets) == 1.0
    assert np.abs(followed - prior.weight).max() > 1.0


def test_several_labels_per_row_fit_a_sigmoid_each() -> None:
    x, first = blobs(10)
    targets = np.eye(3, dtype=bool)[first]
    targets[::4, 2] = True  # every fourth row has the third label too
    weight, bias = fit_prior(x, targets, Prior.none(3, 16), 1e-3)
    given = 1 / (1 + np.exp(-(x @ weight.T + bias))) >= 0.5
    assert given.sum(axis=1).max() >= 2 and np.mean(given == targets) > 0.9


def test_folds_deal_each_labels_rows_evenly_and_number_at_most_the_rarest_labels_rows() -> None:
    targets = np.array([0] * 9 + [1] * 8 + [2] * 3)
    fold = folds(targets)
    assert sorted(np.unique(fold)) == [0, 1, 2]  # the rarest label has three rows
    for label in range(3):
        counts = np.bincount(fold[targets == label], minlength=3)
        assert counts.max() - counts.min() <= 1
    assert np.array_equal(folds(targets), fold)  # seeded
    many = folds(np.repeat(np.arange(4), 20))
    assert len(np.unique(many)) == FOLDS
    assert len(np.unique(folds(np.array([0, 0, 1, 2, 2])))) == 2  # at least two, a label of one row in one


def test_pairs_alternate_sharing_a_label_and_sharing_none() -> None:
    members = np.zeros((7, 3), dtype=bool)
    members[[0, 1, 2], 0] = True
    members[[3, 4], 1] = True
    members[5, 2] = True  # a label of one text: in negative pairs only
    members[6, [0, 1]] = True  # two labels
    left, right, same = pairs(members, 400, np.random.default_rng(0))
    assert len(left) == 400 and same.sum() == 200
    assert np.all(left != right)
    shares = (members[left] & members[right]).any(axis=1)
    assert np.array_equal(shares, same)
    assert 5 in left[~same] or 5 in right[~same]
    assert Counter(same[::2]) == {True: 200}


@pytest.fixture
def few(settings: Engine, tmp_path: Path) -> tuple[Engine, TextSample]:
    """The tiny encoder; a corpus with eight labelled rows per label (their words the labels'
    descriptions, in a filler sentence) and unlabelled rows about none of them."""
    folder = tiny_encoder(tmp_path / "tiny", "bert", pooling="mean")
    engine = settings.replace(model=read_encoder(folder))
    filler = ["the report says that", "we found", "notes on", "a short text about", "see also", "my diary:", "and then", "so"]
    rows = [
        {"id": f"{name}-{i}", "text": f"{filler[i]} {DESCRIBED[name]}", "label": name}
        for name in DESCRIBED
        for i in range(8)
    ]
    rows += [{"id": f"other-{i}", "text": f"{filler[i % 8]} weather rain wind forecast", "label": None} for i in range(40)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "corpus.parquet")
    return engine, TextSample(path=str(tmp_path / "corpus.parquet"))


@pytest.mark.slow
def test_eight_rows_a_label_train_the_few_shot_head_chosen_by_its_folds(few: tuple[Engine, TextSample]) -> None:
    """Labels described by words no row holds (the names alone): the zero-shot head is a guess,
    the rows teach the labels, and the report says which candidate won on the same folds."""
    engine, corpus = few
    names = Taxonomy(labels=tuple(LabelText(label=name, description=f"topic {n}") for n, name in enumerate(DESCRIBED)))
    task = LabelTask(corpus=corpus, column="label", taxonomy=names, policy=LabelPolicy(fine_tune_seconds=0))
    head = load_head(task, engine)
    training = head.training
    found = {c["name"]: c["accuracy"] for c in training["candidates"]}
    assert set(found) == {"zero-shot", "few-shot", "rows-only"}
    reports = [CandidateReport(**c) for c in training["candidates"]]
    assert training["chosen"] == simplest_within_error(reports, training["rows"]).name != "zero-shot"
    assert found[training["chosen"]] >= 0.9 > found["zero-shot"]
    assert training["baseline"]["name"] == "tfidf+linear-svm" and "cross-validated" in training["note"]
    assert head.labels == list(DESCRIBED) and head.held_out_accuracy == found[training["chosen"]]
    texts = [f"in short: {DESCRIBED[name]}" for name in DESCRIBED]
    with load_encoder(engine.replace(precision="fp32")) as encoder:
        top = np.argmax(head.probabilities(encoder.encode(texts), texts), axis=1)
    assert [head.labels[i] for i in top] == list(DESCRIBED)


@pytest.mark.slow
def test_the_contrastive_candidate_trains_within_its_budget_and_competes(few: tuple[Engine, TextSample]) -> None:
    """The fine-tuning budget is shared by every fold's encoder and the final one: none runs over
    its share, and the fine-tuned encoder is a candidate like the others."""
    engine, corpus = few
    seconds = 8.0
    task = LabelTask(corpus=corpus, column="label", policy=LabelPolicy(fine_tune_seconds=seconds))
    head = load_head(task, engine)
    training = head.training
    runs = training["fine_tune"]["folds"] + ([training["fine_tune"]["final"]] if "final" in training["fine_tune"] else [])
    share = seconds / (len(training["fine_tune"]["folds"]) + 1)
    assert len(training["fine_tune"]["folds"]) >= 2
    assert all(run["steps"] >= 1 and run["seconds"] <= share + 2.0 for run in runs)  # a step past the budget at most
    assert "fine-tuned" in {c["name"] for c in training["candidates"]}
    assert (head.encoder is not None) == (training["chosen"] == "fine-tuned")


@pytest.mark.slow
def test_with_rows_enough_the_declared_labels_zero_shot_head_competes_on_the_same_test_rows(
    settings: Engine, tmp_path: Path
) -> None:
    """Past FEW_SHOT_ROWS a label, the held-out split of training.py: the zero-shot head is listed
    beside the trained candidates, and the best of them all publishes."""
    folder = tiny_encoder(tmp_path / "tiny", "bert", pooling="mean")
    engine = settings.replace(model=read_encoder(folder))
    words = ["the", "we", "notes", "a", "see", "my", "and", "so", "then", "also"]
    rows = [
        {"id": f"{name}-{i}", "text": f"{words[i % 10]} {words[i // 10 % 10]} {DESCRIBED[name]}", "label": name}
        for name in DESCRIBED
        for i in range(80)
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "corpus.parquet")
    taxonomy = Taxonomy(labels=tuple(LabelText(label=n, description=d) for n, d in DESCRIBED.items()), prompt="{description}")
    task = LabelTask(
        corpus=TextSample(path=str(tmp_path / "corpus.parquet")), column="label", taxonomy=taxonomy,
        policy=LabelPolicy(fine_tune_seconds=0),
    )
    training = load_head(task, engine).training
    found = {c["name"]: c["accuracy"] for c in training["candidates"]}
    assert set(found) == {"embeddings", "embeddings+tfidf", "zero-shot"} and found["zero-shot"] >= 0.9
    assert found[training["chosen"]] == max(found.values()) and "cross-validated" not in training["note"]


def test_the_simplest_candidate_within_one_standard_error_of_the_best_is_chosen() -> None:
    def candidates(*figures: float) -> list[CandidateReport]:
        names = ("zero-shot", "few-shot", "rows-only", "fine-tuned")
        return [CandidateReport(name, figure, None, 0.0, {}) for name, figure in zip(names, figures, strict=False)]

    # 160 rows at 0.69: one standard error is 0.0366.
    assert simplest_within_error(candidates(0.62, 0.68, 0.64, 0.69), 160).name == "few-shot"
    assert simplest_within_error(candidates(0.62, 0.65, 0.64, 0.69), 160).name == "fine-tuned"
    # 24 rows at 0.79: 0.083; a lead of 0.17 is more than that.
    assert simplest_within_error(candidates(0.46, 0.62, 0.58, 0.79), 24).name == "fine-tuned"
    assert simplest_within_error(candidates(0.7, 0.7, 0.7), 50).name == "zero-shot"

