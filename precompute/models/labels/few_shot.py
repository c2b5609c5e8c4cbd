"""Few-shot label heads: a handful of labelled rows per label (FEW_SHOT_ROWS or fewer on average).

A head fit on eight rows a label learns their accidents. The label texts (zero_shot.py: the
prompt with each label's description, or its name) make a head before any row is seen, so the
few-shot head starts there and moves only as far as the rows pull it: logistic regression on unit
embeddings whose weights are the zero-shot head's plus a change penalised in proportion to
`penalty` (a Gaussian prior centred on the zero-shot head; the label texts are its anchors).

Rows are scarce, so no rows are set aside: every candidate is scored by cross-validation on
the same stratified folds (its test rows are each fold's), and the simplest one within one
standard error of the best publishes (simplest_within_error), fit on every row. Candidates,
simplest first:
- `zero-shot`: the label texts alone (no row trains it);
- `few-shot`: the prior plus the rows, its penalty chosen on the folds from PENALTIES;
- `rows-only`: the rows alone (no prior), its penalty chosen the same way;
- `fine-tuned`: the encoder fine-tuned contrastively on pairs of rows and label texts
  (contrastive.py: the SetFit recipe), then the few-shot head on its embeddings, where
  `fine_tune_seconds` allows; each fold's encoder and the final one share that budget.
The baseline is TF-IDF + a linear SVM on the same folds.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize
from scipy.special import log_softmax, softmax

from precompute.models.engines.cache import EngineCache
from precompute.models.engines.load import load_encoder
from precompute.models.engines.runtime import resolve_device
from precompute.models.labels.contrastive import PairTrainer, contrastive_tuned
from precompute.models.labels.training import (
    CandidateReport,
    Labelled,
    TrainingReport,
    baseline_vectorizer,
    fit_linear,
    score,
    sigmoid,
)
from precompute.models.labels.zero_shot import CENTER_TEXTS, LOGIT_SCALE, Taxonomy, zero_shot_weights
from precompute.models.settings import Engine
from precompute.models.source import ModelSource
from precompute.models.text.reference import TextSample, reference_texts

RECIPE = "few-shot/zero-shot-prior/cv-one-standard-error/v2"
FEW_SHOT_ROWS = 64
"""Labelled rows per label (on average) up to which the few-shot head is trained; above it, the
held-out split of training.py has rows enough to set some aside."""
FOLDS = 4
"""Cross-validation folds (fewer when a label has fewer rows)."""
PENALTIES = (0.0003, 0.003, 0.03)
"""The penalty on the weights' change (per unit of mean loss), from a head that follows the rows
to one that stays near its prior: chosen on the folds."""


@dataclass(frozen=True)
class Prior:
    """A head's starting point: logits = unit(embedding) @ weight.T + bias (zero: no prior)."""

    weight: np.ndarray
    bias: np.ndarray

    @staticmethod
    def none(labels: int, dim: int) -> Prior:
        return Prior(np.zeros((labels, dim), np.float32), np.zeros(labels, np.float32))


def unit(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)


def fit_prior(
    x: np.ndarray, targets: np.ndarray, prior: Prior, penalty: float
) -> tuple[np.ndarray, np.ndarray]:
    """(weight, bias) minimising the rows' mean cross-entropy (softmax; with several labels per
    row, a sigmoid per label) plus penalty / 2 * |weight - prior's|^2. `x` unit embeddings."""
    labels, dim = prior.weight.shape
    multi = targets.ndim == 2
    truth = targets.astype(np.float64) if multi else np.eye(labels)[targets]
    x = x.astype(np.float64)

    def loss(flat: np.ndarray) -> tuple[float, np.ndarray]:
        change, bias = flat[: labels * dim].reshape(labels, dim), flat[labels * dim :]
        logits = x @ (prior.weight + change).T + prior.bias + bias
        if multi:
            value = np.mean(np.sum(np.logaddexp(0, logits) - truth * logits, axis=1))
            error = (sigmoid(logits) - truth) / len(x)
        else:
            value = -np.mean(np.sum(truth * log_softmax(logits, axis=1), axis=1))
            error = (softmax(logits, axis=1) - truth) / len(x)
        value += penalty / 2 * float(np.sum(change**2))
        gradient = np.concatenate([(error.T @ x + penalty * change).ravel(), error.sum(axis=0)])
        return value, gradient

    found = minimize(loss, np.zeros(labels * dim + labels), jac=True, method="L-BFGS-B", options={"maxiter": 500})
    change, bias = found.x[: labels * dim].reshape(labels, dim), found.x[labels * dim :]
    return (prior.weight + change).astype(np.float32), (prior.bias + bias).astype(np.float32)


def folds(targets: np.ndarray, seed: int = 0) -> np.ndarray:
    """Each row's fold: rows of each label (its first label, with several) dealt in a seeded
    order, so every fold holds about as many of each; at most FOLDS, at least two."""
    first = np.argmax(targets, axis=1) if targets.ndim == 2 else targets
    counts = np.bincount(first)
    count = int(np.clip(counts[counts > 0].min(), 2, FOLDS))
    fold = np.zeros(len(first), np.int64)
    rng = np.random.default_rng(seed)
    start = 0
    for label in np.flatnonzero(counts):
        rows = rng.permutation(np.flatnonzero(first == label))
        fold[rows] = (start + np.arange(len(rows))) % count
        start += len(rows)  # the next label's first row goes to the next fold
    return fold


def cross_validated(labelled: Labelled, fold: np.ndarray, predict: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> float:
    """Accuracy (micro F1 with several labels per row) over every row, each predicted by
    `predict(train rows, test rows) -> logits` from the other folds."""
    logits = np.zeros(labelled.targets.shape if labelled.multi else (len(fold), len(labelled.names)))
    for k in np.unique(fold):
        logits[fold == k] = predict(np.flatnonzero(fold != k), np.flatnonzero(fold == k))
    return score(labelled.multi, logits, labelled.targets, None)[0]


def prior_candidate(
    labelled: Labelled, embeddings: np.ndarray, prior: Prior, fold: np.ndarray, name: str
) -> tuple[CandidateReport, float]:
    """A prior-centred head's best penalty on the folds: (its report, the penalty)."""
    start = time.perf_counter()

    def predict(penalty: float) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
        def fold_logits(train: np.ndarray, test: np.ndarray) -> np.ndarray:
            weight, bias = fit_prior(embeddings[train], labelled.targets[train], prior, penalty)
            return embeddings[test] @ weight.T + bias

        return fold_logits

    found = {penalty: cross_validated(labelled, fold, predict(penalty)) for penalty in PENALTIES}
    penalty = max(found, key=found.get)  # the first of equals: the head that follows its rows most
    seconds = round(time.perf_counter() - start, 1)
    return CandidateReport(name, round(found[penalty], 4), None, seconds, {"penalty": penalty}), penalty


def zero_shot_candidate(labelled: Labelled, embeddings: np.ndarray, prior: Prior) -> CandidateReport:
    """The label texts alone, scored on every row: none trains it."""
    logits = embeddings @ prior.weight.T + prior.bias
    return CandidateReport("zero-shot", round(score(labelled.multi, logits, labelled.targets, None)[0], 4), None, 0.0, {})


def folds_baseline(labelled: Labelled, fold: np.ndarray) -> CandidateReport:
    """TF-IDF of words and word pairs + a linear SVM (training.py baseline) on the same folds;
    every term kept (min_df 1): a handful of rows leaves few terms in two of them."""
    start = time.perf_counter()

    def predict(train: np.ndarray, test: np.ndarray) -> np.ndarray:
        vectorizer = baseline_vectorizer(min_df=1)
        x = vectorizer.fit_transform([labelled.texts[i] for i in train])
        coef, intercept = fit_linear(x, labelled.targets[train], len(labelled.names), 1.0, None)
        return np.asarray(vectorizer.transform([labelled.texts[i] for i in test]) @ coef.T) + intercept

    accuracy = cross_validated(labelled, fold, predict)
    return CandidateReport("tfidf+linear-svm", round(accuracy, 4), None, round(time.perf_counter() - start, 1), {})


def members(labelled: Labelled, rows: np.ndarray) -> np.ndarray:
    """[rows + label texts, labels] booleans: each of `rows`' labels, then each label text its own."""
    targets = labelled.targets[rows]
    own = targets if labelled.multi else np.eye(len(labelled.names), dtype=bool)[targets]
    return np.vstack([own, np.eye(len(labelled.names), dtype=bool)])


def anchored(label_vectors: np.ndarray) -> Prior:
    """The prior of an encoder fine-tuned with the label texts as anchors: the zero-shot head's
    weights, uncentred (fit_prior fits the bias freely, and centring would cost 1,000 texts
    through each fold's encoder)."""
    return Prior((LOGIT_SCALE * unit(label_vectors)).astype(np.float32), np.zeros(len(label_vectors), np.float32))


def fine_tuned_candidate(
    labelled: Labelled, source: ModelSource, label_texts: list[str], fold: np.ndarray, penalty: float, seconds: float, device: str
) -> tuple[CandidateReport, list[dict[str, object]]]:
    """The contrastively fine-tuned encoder and the few-shot head on its vectors, on the folds:
    each fold's encoder trained on the other folds' rows and the label texts for `seconds`.
    (report, each fold's training)."""
    start = time.perf_counter()
    trainings: list[dict[str, object]] = []

    def predict(train: np.ndarray, test: np.ndarray) -> np.ndarray:
        texts = [labelled.texts[i] for i in train] + label_texts
        trainer = PairTrainer(source, device)
        trainings.append(trainer.train(texts, members(labelled, train), seconds))
        vectors = trainer.encode(texts)
        weight, bias = fit_prior(vectors[: len(train)], labelled.targets[train], anchored(vectors[len(train) :]), penalty)
        return trainer.encode([labelled.texts[i] for i in test]) @ weight.T + bias

    accuracy = cross_validated(labelled, fold, predict)
    elapsed = round(time.perf_counter() - start, 1)
    return CandidateReport("fine-tuned", round(accuracy, 4), None, elapsed, {"penalty": penalty}), trainings


def simplest_within_error(reports: list[CandidateReport], rows: int) -> CandidateReport:
    """The first candidate (they come simplest first) whose cross-validated figure is within one
    standard error of the best's: the "one standard error" rule (Hastie, Tibshirani and Friedman,
    The Elements of Statistical Learning, 7.10). On a few dozen rows the best figure is partly
    luck, and the more a candidate learns from the rows (a fine-tuned encoder most), the more of
    its lead is: a lead smaller than the noise of the folds' own figure does not choose it."""
    best = max(report.accuracy for report in reports)
    return next(report for report in reports if report.accuracy >= best - standard_error(reports, rows))


def standard_error(reports: list[CandidateReport], rows: int) -> float:
    """The best candidate's figure's standard error on `rows` rows (a proportion's)."""
    best = max(report.accuracy for report in reports)
    return math.sqrt(best * (1 - best) / max(rows, 1))


@dataclass(frozen=True)
class FewShotHead:
    """The published few-shot head: logits = unit(embedding) @ weight.T + bias."""

    weight: np.ndarray
    bias: np.ndarray
    encoder: ModelSource | None
    """The fine-tuned encoder whose embeddings the head takes (None: the engine's own)."""
    report: TrainingReport
    fine_tune: dict[str, object] | None


def build_few_shot(labelled: Labelled, taxonomy: Taxonomy, corpus: TextSample, engine: Engine, seconds: float) -> FewShotHead:
    """Every candidate on the folds, then the best fit on every row (module docstring).
    `seconds`: the fine-tuning budget, shared by each fold's encoder and the final one."""
    fold = folds(labelled.targets)
    label_texts = taxonomy.texts()
    centring = reference_texts(corpus, "calibration", CENTER_TEXTS, at_least=1)
    with load_encoder(engine.replace(precision="fp32")) as encoder:
        frozen = unit(encoder.encode(labelled.texts))
        prior = Prior(*zero_shot_weights(encoder.encode(label_texts), encoder.encode(centring)))
    reports = [zero_shot_candidate(labelled, frozen, prior)]
    centres = {"few-shot": prior, "rows-only": Prior.none(*prior.weight.shape)}
    penalties: dict[str, float] = {}
    for name, centre in centres.items():
        report, penalties[name] = prior_candidate(labelled, frozen, centre, fold, name)
        reports.append(report)
    share = seconds / (len(np.unique(fold)) + 1)
    fine_tune = None
    if seconds > 0:
        device = resolve_device(engine.machine)
        report, trainings = fine_tuned_candidate(
            labelled, engine.model, label_texts, fold, penalties["few-shot"], share, device
        )
        reports.append(report)
        fine_tune = {"folds": trainings}
    chosen = simplest_within_error(reports, len(labelled.texts))
    everything = np.arange(len(labelled.texts))
    tuned = None
    if chosen.name == "zero-shot":
        weight, bias = prior.weight, prior.bias
    elif chosen.name == "fine-tuned":
        cache = EngineCache(engine.machine.cache_dir)
        tuned, fine_tune["final"] = contrastive_tuned(
            engine.model, labelled.texts + label_texts, members(labelled, everything), share, device, cache
        )
        with load_encoder(engine.replace(model=tuned, precision="fp32")) as encoder:
            vectors, anchors = unit(encoder.encode(labelled.texts)), encoder.encode(label_texts)
        weight, bias = fit_prior(vectors, labelled.targets, anchored(anchors), penalties["few-shot"])
    else:
        weight, bias = fit_prior(frozen, labelled.targets, centres[chosen.name], penalties[chosen.name])
    report = TrainingReport(
        chosen.name,
        "fine-tuned" if tuned else "embeddings",
        len(everything),
        len(everything),
        folds_baseline(labelled, fold),
        reports,
        f"few rows: every candidate cross-validated on {len(everything)} rows in {len(np.unique(fold))} folds; "
        f"{chosen.name} is the simplest within one standard error ({standard_error(reports, len(everything)):.3f}) "
        f"of the best",
    )
    return FewShotHead(weight, bias, tuned, report, fine_tune)
