"""Label heads chosen by evidence: candidates trained on the labelled rows, compared on held-out ones.

Rows split by a hash of their id (reference_texts.split_slot): the engine gate's slot is never
trained on; `test` (slot 1) is where the candidates and the baseline are compared and reported;
`validation` (slot 2) chooses each candidate's regularisation, class weights and embedding
weight, and calibrates its probabilities; the rest train. The published head is then fit again
on every labelled row with what validation chose.

Candidates: a linear head on each encoder's FP32 embeddings (the frozen encoder's, and the
encoder fine-tuned on the training rows: label_finetune.py), and one on those embeddings beside
sparse TF-IDF features (label_features.py). The baseline is what a data scientist tries first:
TF-IDF of words and word pairs, then a linear SVM.

Heads are linear SVMs (liblinear, one vs rest): on these features as accurate as logistic
regression and faster to fit (`precompute bench labels` reports each candidate's training
time). Validation turns their scores into
probabilities: a softmax at a fitted temperature for one label per row; for several, a sigmoid
of one fitted scale and offset, and a threshold per label. Both fold into the head's weights,
so serving computes one affine map.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp
from scipy.optimize import minimize_scalar
from scipy.special import log_softmax
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import f1_score, precision_recall_curve
from sklearn.svm import LinearSVC

from precompute.models.engines.gate import few_held_out
from precompute.models.errors import ModelError
from precompute.models.labels.features import TextFeatures

TEST_SLOT, VALIDATION_SLOT = 1, 2
SEARCH_ROWS = 10_000
"""Training rows (a seeded sample) that fit each point of a candidate's grid: the grid costs
the same at a million rows, and only the chosen point is fit on them all."""
THRESHOLD_POSITIVES = 10
"""Validation rows a label needs to set its own threshold."""
MAX_ITER = 5000
"""liblinear's passes over the rows, five times its default: dense embedding columns beside
sparse ones converge more slowly than either alone."""
GRIDS = {
    False: {"C": [0.1, 0.3, 1.0], "class_weight": [None, "balanced"], "embedding_weight": [1.0]},
    True: {"C": [0.5, 1.0], "class_weight": [None, "balanced"], "embedding_weight": [0.5, 1.0]},
}
"""Each candidate's grid, searched on validation: without TF-IDF features, and with them."""
TFIDF = "+tfidf"
"""A candidate's name is its embeddings' (`embeddings`: the frozen encoder's; `fine-tuned`),
then this when TF-IDF features stand beside them."""


@dataclass(frozen=True)
class Labelled:
    """The labelled rows a head learns from."""

    texts: list[str]
    targets: np.ndarray
    """Class index per row; or, with several labels per row, [rows, labels] booleans."""
    names: list[str]
    slots: np.ndarray
    """Each row's split slot of ten."""

    @property
    def multi(self) -> bool:
        return self.targets.ndim == 2


@dataclass(frozen=True)
class Head:
    """A fitted, calibrated head: logits = embeddings @ weight.T + features(texts) @ text_weight.T + bias."""

    weight: np.ndarray
    bias: np.ndarray
    features: TextFeatures | None = None
    text_weight: np.ndarray | None = None
    thresholds: np.ndarray | None = None
    """Several labels per row: a label is given at or above its probability here."""

    def logits(self, embeddings: np.ndarray, texts: list[str]) -> np.ndarray:
        logits = embeddings @ self.weight.T + self.bias
        if self.features is not None and self.text_weight is not None:
            logits += self.features.transform(texts) @ self.text_weight.T
        return logits


@dataclass(frozen=True)
class CandidateReport:
    name: str
    accuracy: float
    """Top-1 accuracy on the test rows; with several labels per row, micro F1."""
    macro_f1: float | None
    train_seconds: float
    """The grid on validation, the fit on the training rows and calibration; not the final refit."""
    params: dict[str, object]


@dataclass(frozen=True)
class TrainingReport:
    chosen: str
    encoder: str
    """The chosen candidate's embeddings: `embeddings` (the frozen encoder's) or `fine-tuned`."""
    rows: int
    """Labelled rows the published head was fit on."""
    test_rows: int
    baseline: CandidateReport
    candidates: list[CandidateReport] = field(default_factory=list)
    note: str = ""
    """Set when the test rows are few (models/engines/gate.py few_held_out): read the accuracies with care."""

    @property
    def accuracy(self) -> float:
        return next(c.accuracy for c in self.candidates if c.name == self.chosen)


def fit_linear(
    x: np.ndarray | sp.csr_matrix, targets: np.ndarray, classes: int, c: float, class_weight: str | None
) -> tuple[np.ndarray, np.ndarray]:
    """(coef [classes, features], intercept [classes]) of one-vs-rest linear SVMs. A class absent
    from the rows scores far below the rest; with several labels per row, a label without both
    positive and negative rows gets a constant score. Seeded: liblinear visits rows in a random
    order, and a head trained again on the same rows should be the same head."""
    coef, intercept = np.zeros((classes, x.shape[1]), np.float32), np.full(classes, -10.0, np.float32)
    if targets.ndim == 1:
        model = LinearSVC(C=c, class_weight=class_weight, max_iter=MAX_ITER, random_state=0).fit(x, targets)
        fitted, offsets = model.coef_, model.intercept_
        if len(model.classes_) == 2:  # liblinear fits one decision function for two classes
            fitted, offsets = np.vstack([-fitted, fitted]), np.concatenate([-offsets, offsets])
        coef[model.classes_], intercept[model.classes_] = fitted, offsets
        return coef, intercept
    for label in range(classes):
        column = targets[:, label]
        if column.all() or not column.any():
            intercept[label] = 1.0 if column.all() else -1.0
            continue
        model = LinearSVC(C=c, class_weight=class_weight, max_iter=MAX_ITER, random_state=0).fit(x, column)
        coef[label], intercept[label] = model.coef_[0], model.intercept_[0]
    return coef, intercept


@dataclass(frozen=True)
class Calibration:
    """Probabilities of scores: softmax(scale * s + offset), or with several labels per row
    sigmoid(scale * s + offset) given at or above each label's threshold."""

    scale: float
    offset: float
    thresholds: np.ndarray | None


def calibrate(labelled: Labelled, logits: np.ndarray, rows: np.ndarray) -> Calibration:
    """Fitted on `rows` (validation): a temperature by log loss, or a Platt sigmoid and thresholds."""
    truth = labelled.targets[rows]
    if not labelled.multi:

        def nll(log_t: float) -> float:
            return -float(np.mean(log_softmax(logits / np.exp(log_t), axis=1)[np.arange(len(truth)), truth]))

        return Calibration(
            float(np.exp(-minimize_scalar(nll, bounds=(-7, 7), method="bounded").x)), 0.0, None
        )
    scale, offset = 1.0, 0.0  # rows whose every label is on (or off) leave no slope to fit
    if 0 < truth.sum() < truth.size:
        platt = LogisticRegression(C=1e4).fit(logits.reshape(-1, 1), truth.reshape(-1))
        scale, offset = float(platt.coef_[0, 0]), float(platt.intercept_[0])
    return Calibration(scale, offset, best_thresholds(sigmoid(logits * scale + offset), truth))


def best_thresholds(probabilities: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """Per label, the probability at which its F1 on these rows is best, for a label with
    THRESHOLD_POSITIVES positive rows or more; for the rest, the one threshold that is best for
    micro F1 over all labels (a few rows would set a label's own threshold by chance)."""
    cuts = np.unique(np.quantile(probabilities, np.linspace(0, 1, 101)))
    micro = [f1_score(truth, probabilities >= cut, average="micro", zero_division=0) for cut in cuts]
    thresholds = np.full(truth.shape[1], cuts[int(np.argmax(micro))], np.float32)
    for label in np.flatnonzero(truth.sum(axis=0) >= THRESHOLD_POSITIVES):
        precision, recall, label_cuts = precision_recall_curve(truth[:, label], probabilities[:, label])
        f1 = 2 * precision[:-1] * recall[:-1] / np.maximum(precision[:-1] + recall[:-1], 1e-12)
        thresholds[label] = label_cuts[np.argmax(f1)]
    return thresholds


@dataclass(frozen=True)
class TextColumns:
    """TF-IDF features fit on the training rows, and each split's rows of them: computed once
    for every candidate that sets them beside its embeddings."""

    features: TextFeatures
    matrices: dict[str, sp.csr_matrix]


def text_columns(labelled: Labelled, rows: dict[str, np.ndarray]) -> TextColumns:
    # The vocabulary from the training rows alone: held-out rows must not shape the features.
    features = TextFeatures.fit([labelled.texts[i] for i in rows["train"]])
    matrices = {
        name: features.transform([labelled.texts[i] for i in part])
        for name, part in rows.items()
        if name != "search"
    }
    if "search" in rows:  # a sorted sample of the training rows: their rows of its matrix
        matrices["search"] = matrices["train"][np.searchsorted(rows["train"], rows["search"])]
    return TextColumns(features, matrices)


class Split:
    """One candidate's rows: indices per split, and each split's design matrix."""

    def __init__(
        self, labelled: Labelled, embeddings: np.ndarray, rows: dict[str, np.ndarray], text: TextColumns | None
    ) -> None:
        self.labelled, self.embeddings, self.rows = labelled, embeddings, rows
        self.features = text.features if text else None
        self.text = {name: text.matrices[name] if text else None for name in rows}

    def design(self, split: str, embedding_weight: float) -> np.ndarray | sp.csr_matrix:
        embeddings = self.embeddings[self.rows[split]]
        text = self.text[split]
        return (
            embeddings
            if text is None
            else sp.hstack([text, sp.csr_matrix(embeddings * embedding_weight)], "csr")
        )

    def fit(self, split: str, params: dict) -> tuple[np.ndarray, np.ndarray]:
        targets = self.labelled.targets[self.rows[split]]
        x = self.design(split, params["embedding_weight"])
        return fit_linear(x, targets, len(self.labelled.names), params["C"], params["class_weight"])

    def logits(self, split: str, params: dict, model: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        coef, intercept = model
        return np.asarray(self.design(split, params["embedding_weight"]) @ coef.T) + intercept


def held_out_split(labelled: Labelled, seed: int = 0) -> dict[str, np.ndarray]:
    """Row indices of train, search (a sample of train), validation and test."""
    train = np.flatnonzero((labelled.slots != TEST_SLOT) & (labelled.slots != VALIDATION_SLOT))
    validation = np.flatnonzero(labelled.slots == VALIDATION_SLOT)
    test = np.flatnonzero(labelled.slots == TEST_SLOT)
    if missing := [name for name, part in (("train", train), ("validation", validation), ("test", test)) if not len(part)]:
        raise ModelError(
            f"{len(labelled.texts)} labelled rows leave no {' or '.join(missing)} rows (a tenth of "
            "them each, by a hash of the id): label more rows"
        )
    search = train
    if len(train) > SEARCH_ROWS:
        search = np.sort(np.random.default_rng(seed).choice(train, SEARCH_ROWS, replace=False))
    return {
        "train": train,
        "search": search,
        "validation": validation,
        "test": test,
    }


def train_candidate(
    labelled: Labelled, embeddings: np.ndarray, name: str, rows: dict[str, np.ndarray], text: TextColumns | None
) -> tuple[CandidateReport, dict, Calibration]:
    """A candidate's grid searched on validation, its best point fit on the training rows,
    calibrated on validation and scored on test: (report, chosen point, calibration)."""
    start = time.perf_counter()
    split = Split(labelled, embeddings, rows, text)
    grid = GRIDS[name.endswith(TFIDF)]
    points = [dict(zip(grid, values, strict=True)) for values in itertools.product(*grid.values())]
    validation = labelled.targets[rows["validation"]]

    fitted: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def validated(params: dict) -> float:
        fitted[id(params)] = split.fit("search", params)
        return score(labelled.multi, split.logits("validation", params, fitted[id(params)]), validation, None)[0]

    params = max(points, key=validated)  # the first of equals: the grids list simpler points first
    # Up to SEARCH_ROWS training rows, the search fit the chosen point on all of them already.
    model = fitted[id(params)] if rows["search"] is rows["train"] else split.fit("train", params)
    calibration = calibrate(labelled, split.logits("validation", params, model), rows["validation"])
    logits = calibration.scale * split.logits("test", params, model) + calibration.offset
    accuracy, macro = score(labelled.multi, logits, labelled.targets[rows["test"]], calibration.thresholds)
    seconds = round(time.perf_counter() - start, 1)
    return CandidateReport(name, round(accuracy, 4), macro, seconds, params), params, calibration


def score(
    multi: bool, logits: np.ndarray, truth: np.ndarray, thresholds: np.ndarray | None
) -> tuple[float, float | None]:
    """(top-1 accuracy, None); with several labels per row, (micro F1, macro F1) at the thresholds."""
    if not multi:
        return float(np.mean(np.argmax(logits, axis=1) == truth)), None
    predicted = sigmoid(logits) >= (0.5 if thresholds is None else thresholds)
    micro = f1_score(truth, predicted, average="micro", zero_division=0)
    return float(micro), round(float(f1_score(truth, predicted, average="macro", zero_division=0)), 4)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-np.clip(x, -50, 50)))


def baseline_vectorizer(min_df: int) -> TfidfVectorizer:
    """The baseline's features: TF-IDF of words and word pairs, sublinear, in `min_df` rows or more."""
    return TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, min_df=min_df, dtype=np.float32)


def baseline(labelled: Labelled, rows: dict[str, np.ndarray]) -> CandidateReport:
    """TF-IDF of words and word pairs (sublinear, in two rows or more), then LinearSVC at
    scikit-learn's defaults: a data scientist's first try, on the candidates' rows."""
    start = time.perf_counter()
    vectorizer = baseline_vectorizer(min_df=2)
    x = vectorizer.fit_transform([labelled.texts[i] for i in rows["train"]])
    coef, intercept = fit_linear(x, labelled.targets[rows["train"]], len(labelled.names), 1.0, None)
    test = vectorizer.transform([labelled.texts[i] for i in rows["test"]])
    accuracy, macro = score(
        labelled.multi, np.asarray(test @ coef.T) + intercept, labelled.targets[rows["test"]], None
    )
    return CandidateReport(
        "tfidf+linear-svm", round(accuracy, 4), macro, round(time.perf_counter() - start, 1), {}
    )


def train_head(
    labelled: Labelled, embeddings: dict[str, np.ndarray], rows: dict[str, np.ndarray]
) -> tuple[Head, TrainingReport]:
    """Every candidate on the held-out split `rows` (held_out_split), with and without TF-IDF
    features beside each encoder's `embeddings` (by candidate name: `embeddings`, `fine-tuned`);
    then the best one fit on all labelled rows with its chosen point and validation's calibration."""
    text = text_columns(labelled, rows)
    trained = {
        f"{encoder}{suffix}": train_candidate(labelled, vectors, f"{encoder}{suffix}", rows, text if suffix else None)
        for encoder, vectors in embeddings.items()
        for suffix in ("", TFIDF)
    }
    chosen = max(trained, key=lambda name: trained[name][0].accuracy)
    _, params, calibration = trained[chosen]
    encoder = chosen.removesuffix(TFIDF)
    everything = {"train": np.arange(len(labelled.texts))}
    final_text = text_columns(labelled, everything) if chosen.endswith(TFIDF) else None
    split = Split(labelled, embeddings[encoder], everything, final_text)
    coef, intercept = split.fit("train", params)
    width = split.features.width if split.features else 0
    scale = calibration.scale
    head = Head(
        (coef[:, width:] * params["embedding_weight"] * scale).astype(np.float32),
        (intercept * scale + calibration.offset).astype(np.float32),
        split.features,
        (coef[:, :width] * scale).astype(np.float32) if split.features else None,
        calibration.thresholds,
    )
    report = TrainingReport(
        chosen,
        encoder,
        len(labelled.texts),
        len(rows["test"]),
        baseline(labelled, rows),
        [r for r, _, _ in trained.values()],
        few_held_out(len(rows["test"]), "rows"),
    )
    return head, report


def loses_to_baseline(training: dict, max_loss: float) -> str | None:
    """Why a head may not publish: its held-out accuracy below the baseline's by more than
    `max_loss` (None: it may). A zero-shot head has no labelled rows to compare on."""
    if training["baseline"] is None:
        return None
    chosen = next(c for c in training["candidates"] if c["name"] == training["chosen"])
    floor = training["baseline"]["accuracy"] - max_loss
    if chosen["accuracy"] >= floor:
        return None
    return (
        f"the label head's held-out accuracy {chosen['accuracy']:.4f} ({chosen['name']}) is below "
        f"the TF-IDF + linear SVM baseline's {training['baseline']['accuracy']:.4f} minus "
        f"max_baseline_loss {max_loss} on the same {training['test_rows']} rows"
    )
