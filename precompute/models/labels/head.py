"""A label head over an encoder: trained on the corpus's own label column (and corrections), the
best of several linear heads by held-out evidence (training.py), its probabilities calibrated;
from a handful of rows a label, the few-shot head chosen by cross-validation (few_shot.py); or
made from the output's label names and descriptions alone (zero_shot.py).

The head is trained on every labelled row (the gate's held-out texts excluded), exported to
ONNX and cached like an engine, keyed by model, training rows and recipe, and kept while its
training rows change little (`retrain_share`): `load_head` trains it on first use, so a fresh
machine needs no step of its own. Its graph takes the text's embedding and the logits of its
sparse TF-IDF features (zeros for a head without them) and adds them, then a softmax (one label
per row) or a sigmoid (several); it runs through the backends every engine uses
(models/engines/runtime.py open_graph). Weights never go into git.
"""

from __future__ import annotations

import hashlib
import heapq
import json
from collections import Counter
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from pydantic import BaseModel, ConfigDict, Field

from precompute.models.backends.base import BuildSpec
from precompute.models.engines.cache import EngineCache
from precompute.models.engines.load import load_encoder
from precompute.models.engines.runtime import open_graph, resolve_device
from precompute.models.errors import ModelError
from precompute.models.labels.features import TextFeatures
from precompute.models.labels.few_shot import FEW_SHOT_ROWS, build_few_shot, unit
from precompute.models.labels.few_shot import RECIPE as FEW_SHOT_RECIPE
from precompute.models.labels.finetune import fine_tuned
from precompute.models.labels.training import (
    CandidateReport,
    Labelled,
    TrainingReport,
    held_out_split,
    score,
    train_head,
)
from precompute.models.labels.zero_shot import LabelText, Taxonomy, build_zero_shot
from precompute.models.settings import Engine
from precompute.models.source import read_encoder
from precompute.models.text.reference import SPLIT_SLOT, TextSample, sample_batches, split_slot

RECIPE = "linear-svm/embeddings|fine-tuned(+tfidf)/calibrated/v4"
HEAD_FILE = "head.onnx"
LABELS_FILE = "labels.json"
TEXT_WEIGHT_FILE = "text_weight.npy"
TRAINING_FILE = "training.npy"
"""The sorted fingerprints of the rows a head was trained on (row_fingerprints)."""
PROBABILITIES = "probabilities"
HEAD_INPUT = "embedding"
TEXT_LOGITS = "text_logits"
HEAD_ROWS = 4096
"""Embeddings per head call: the batch its engine is built for."""


class LabelPolicy(BaseModel):
    """How an output's labels are made: the pipeline file's fields of a labels output."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    top: int = Field(3, ge=1, le=10)
    """Labels stored per item, best first."""

    min_score: float = Field(0.0, ge=0, le=1)
    """A label is stored only at or above this calibrated probability: an item whose best label
    is less sure gets none (abstains). With several labels per row, each label's own threshold
    (chosen on held-out rows) applies too."""

    train_texts: int | None = Field(None, ge=10)
    """Trained head: at most this many labelled rows train it (None: all), the gate's held-out ones
    excluded: those of the smallest row fingerprints, so a night that changes a few rows changes
    as few of them; the report says how many did."""

    fine_tune_seconds: float = Field(600, ge=0)
    """Trained head: the encoder is also fine-tuned on the labelled rows for at most this long
    (on the GPU where the engine runs on one), and heads on its embeddings compete with the
    frozen encoder's; 0 trains no fine-tuned candidate. Cached: an unchanged night reuses it.
    With a few rows a label, the contrastive candidate's budget, shared by each cross-validation
    fold's encoder and the final one (few_shot.py)."""

    max_baseline_loss: float = Field(0.02, ge=0, le=1)
    """A version is published only if its head's held-out accuracy is at least the TF-IDF +
    linear SVM baseline's (trained and tested on the same rows) minus this."""

    retrain_share: float = Field(0.05, ge=0, le=1)
    """A cached head is kept while at most this share of its training rows changed; past it, a
    new head is trained (and every label computed again). 0 retrains on any change."""

    recheck_texts: int = Field(400, ge=10)
    """Calibration texts (disjoint from the gate's; at most this many, as many as the corpus
    has) that set the near-tie margin of a precision that falls short of the gate: the widest
    margin at which it flipped a label."""


class LabelTask(BaseModel):
    """What a labeler is made for: the corpus and the label column a head learns from, or the
    taxonomy a zero-shot head is made from (neither: a classifier folder labels by itself), and
    the output's policy."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    corpus: TextSample
    column: str | None = None
    taxonomy: Taxonomy | None = None
    policy: LabelPolicy = LabelPolicy()
    corrections: tuple[tuple[str, str], ...] = ()
    """(id, label) a person corrected, sorted by id: labelled rows that always train (whatever their
    slot), and override the head where they are served (jobs/text/labels.py)."""

    def corrected(self) -> dict[str, str]:
        return dict(self.corrections)

    def trains(self) -> bool:
        """Whether a head is trained on labelled rows: a label column, or corrections enough for
        a few-shot head's folds (two labels with two rows each); else zero-shot."""
        if self.column is not None:
            return True
        counts = Counter(label for _, label in self.corrections)
        return sum(count >= 2 for count in counts.values()) >= 2


def export_head(
    weight: np.ndarray, bias: np.ndarray, path: Path, multi: bool = False, unit: bool = False
) -> None:
    """embedding [B, dim], text_logits [B, labels] -> probabilities [B, labels]: Gemm, Add, then
    Softmax (one label per row) or Sigmoid (several). `unit`: the embedding is normalised first
    (a zero-shot head's weights are made for cosines, whatever the encoder's pooling)."""
    activation = (
        helper.make_node("Sigmoid", ["logits"], [PROBABILITIES])
        if multi
        else (helper.make_node("Softmax", ["logits"], [PROBABILITIES], axis=-1))
    )
    normalised = [helper.make_node("LpNormalization", [HEAD_INPUT], ["unit"], axis=-1, p=2)] if unit else []
    graph = helper.make_graph(
        [
            *normalised,
            helper.make_node("Gemm", ["unit" if unit else HEAD_INPUT, "weight", "bias"], ["embedding_logits"], transB=1),
            helper.make_node("Add", ["embedding_logits", TEXT_LOGITS], ["logits"]),
            activation,
        ],
        "label_head",
        [
            helper.make_tensor_value_info(HEAD_INPUT, TensorProto.FLOAT, ["batch", weight.shape[1]]),
            helper.make_tensor_value_info(TEXT_LOGITS, TensorProto.FLOAT, ["batch", len(bias)]),
        ],
        [helper.make_tensor_value_info(PROBABILITIES, TensorProto.FLOAT, ["batch", len(bias)])],
        [
            numpy_helper.from_array(weight.astype(np.float32), "weight"),
            numpy_helper.from_array(bias.astype(np.float32), "bias"),
        ],
    )
    # IR version 10: what the ONNX Runtime releases we pin load (onnx writes a newer one by default).
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    onnx.checker.check_model(model)
    onnx.save(model, path)


class LabelHead:
    """The exported head through the engines' backends: label probabilities of (embeddings, texts)."""

    def __init__(self, directory: Path, engine: Engine) -> None:
        self.directory = directory
        device = resolve_device(engine.machine)
        self.runner = open_graph(
            (directory / HEAD_FILE).read_bytes(), engine.machine, device, BuildSpec(HEAD_ROWS)
        )
        meta = json.loads((directory / LABELS_FILE).read_text())
        self.labels: list[str] = meta["labels"]
        self.multi: bool = meta["multi"]
        self.thresholds = None if meta["thresholds"] is None else np.array(meta["thresholds"], np.float32)
        self.training: dict = meta["training"]
        """The candidates, the baseline and the chosen one, on held-out rows (label_training.TrainingReport)."""
        self.held_out_accuracy: float = meta["held_out_accuracy"]
        self.encoder: str | None = meta["encoder"]
        """The fine-tuned encoder's cache entry whose embeddings the head takes (None: the engine's own)."""
        self.features = TextFeatures.load(directory) if (directory / TEXT_WEIGHT_FILE).exists() else None
        self.text_weight = np.load(directory / TEXT_WEIGHT_FILE) if self.features else None

    def probabilities(self, embeddings: np.ndarray, texts: list[str]) -> np.ndarray:
        parts = []
        for start in range(0, len(embeddings), HEAD_ROWS):
            batch = embeddings[start : start + HEAD_ROWS]
            text_logits = np.zeros((len(batch), len(self.labels)), np.float32)
            if self.features is not None:
                text_logits = np.asarray(
                    self.features.transform(texts[start : start + HEAD_ROWS]) @ self.text_weight.T, np.float32
                )
            parts.append(self.runner.infer({HEAD_INPUT: batch, TEXT_LOGITS: text_logits}))
        return np.concatenate(parts) if parts else np.zeros((0, len(self.labels)), np.float32)

    def given(self, probabilities: np.ndarray, min_score: float) -> np.ndarray:
        """Which labels a row is given: at or above `min_score`, and with several labels per
        row, at or above each label's threshold."""
        floor = np.float32(min_score)
        return probabilities >= (floor if self.thresholds is None else np.maximum(self.thresholds, floor))


def load_head(task: LabelTask, engine: Engine) -> LabelHead:
    """The head for this model and training data: the one trained on exactly these rows, else the
    closest one trained on rows that differ by at most `retrain_share`, else one trained now.

    Keeping a head through small changes is what makes labels incremental: the head is part of
    every label's identity (jobs/text/labels.py), so a head retrained on 1% new rows would label every
    row again for a head that labels almost all of them the same."""
    if task.taxonomy is not None and not task.trains():
        return zero_shot_head(task.taxonomy, task.corpus, engine)
    if not task.trains():
        raise ModelError("a trained head needs the label column it learns from")
    column = task.column
    declared = None if task.taxonomy is None else [entry.label for entry in task.taxonomy.labels]
    labelled, fingerprints = labelled_rows(task.corpus, column, task.policy.train_texts, declared, task.corrected())
    lineage = {
        "model": engine.model.hash,
        "column": column,
        "taxonomy": "" if task.taxonomy is None else task.taxonomy.key(),
        "max_train_texts": str(task.policy.train_texts),
        "fine_tune_seconds": str(task.policy.fine_tune_seconds),
        "recipe": f"{RECIPE}|{FEW_SHOT_RECIPE}",
    }
    key = {**lineage, "training": hashlib.sha256(fingerprints.tobytes()).hexdigest()[:16]}
    cache = EngineCache(engine.machine.cache_dir)
    if (kept := cache.find("label-head", key)) or (
        kept := closest_head(cache, lineage, fingerprints, task.policy.retrain_share)
    ):
        return LabelHead(kept, engine)
    entry = cache.get_or_build(
        "label-head", key, lambda directory: _train(labelled, fingerprints, engine, task, directory)
    )
    return LabelHead(entry.path, engine)


def zero_shot_head(taxonomy: Taxonomy, corpus: TextSample, engine: Engine) -> LabelHead:
    """The zero-shot head of this model, taxonomy and corpus, made once: kept while they stay the
    same, as a trained head is through small changes (its centre, a mean over 1,000 texts, moves
    little with a night's rows), so its labels are recomputed only for rows that changed."""
    key = {"model": engine.model.hash, "taxonomy": taxonomy.key(), "corpus": corpus.path}

    def build(directory: Path) -> None:
        weight, bias, training = build_zero_shot(taxonomy, corpus, engine)
        export_head(weight, bias, directory / HEAD_FILE, taxonomy.multi, unit=True)
        meta = {
            "labels": [entry.label for entry in taxonomy.labels],
            "multi": taxonomy.multi,
            # Several labels per row: a label is given where its row is nearer its text than the
            # label's typical row (sigmoid 0.5), and at or above min_score.
            "thresholds": [0.5] * len(taxonomy.labels) if taxonomy.multi else None,
            "held_out_accuracy": None,
            "encoder": None,
            "training": training,
        }
        (directory / LABELS_FILE).write_text(json.dumps(meta))

    entry = EngineCache(engine.machine.cache_dir).get_or_build("label-head", key, build)
    return LabelHead(entry.path, engine)


def labelled_rows(
    sample: TextSample,
    column: str | None,
    limit: int | None,
    declared: list[str] | None = None,
    corrected: dict[str, str] | None = None,
) -> tuple[Labelled, np.ndarray]:
    """The corpus's labelled rows (the gate's held-out ones excluded), read a batch at a time, in
    file order; and their fingerprints. A list column gives several labels per row. `declared`:
    the output's labels (its taxonomy), in their order: every row's label must be one of them.
    `corrected`: labels by id (str) that replace the column's, and train whatever the row's slot.

    With a `limit`, the rows kept are those of the smallest fingerprints, held in a heap while
    reading: memory is O(limit) however large the corpus, the sample is as random as the hash and
    blind to the file's order (which may group rows by class), and a night that changes 1% of the
    rows changes about 1% of the sample, so the cached head is kept (`retrain_share`). Every night
    reads the whole corpus here, so each batch's columns go to Python once, not a dict a row."""
    kept: list[tuple[int, int, str, object, int]] = []  # (-fingerprint, row number, text, label, slot)
    number = 0
    corrected = corrected or {}
    read = [sample.id, sample.text] + ([column] if column else [])
    for batch in sample_batches(sample, read):
        ids, texts = batch[sample.id].to_pylist(), batch[sample.text].to_pylist()
        column_labels = batch[column].to_pylist() if column else [None] * len(ids)
        for id_, text, label in zip(ids, texts, column_labels, strict=True):
            if (labelled := labelled_row(id_, text, label, corrected.get(str(id_)))) is None:
                continue
            text, label, slot = labelled
            digest = hashlib.blake2b(f"{id_}\x00{text}\x00{label}".encode(), digest_size=8).digest()
            entry = (-int.from_bytes(digest, "little"), number, text, label, slot)
            number += 1
            if limit is None:
                kept.append(entry)
            elif len(kept) < limit:
                heapq.heappush(kept, entry)
            else:
                heapq.heappushpop(kept, entry)
    if not kept:
        raise ModelError(f"labels corpus {sample.path}: no row has both a text and a {column!r} label")
    kept.sort(key=lambda entry: entry[1])
    texts = [entry[2] for entry in kept]
    labels = [entry[3] for entry in kept]
    slots = [entry[4] for entry in kept]
    multi = any(isinstance(label, tuple) for label in labels)
    if multi:  # a correction of a list column's row: that one label
        labels = [label if isinstance(label, tuple) else (label,) for label in labels]
    names = sorted({name for label in labels for name in (label if multi else [label])})
    if declared is not None:
        if unknown := sorted(set(names) - set(declared)):
            raise ModelError(
                f"labels corpus {sample.path}: {column!r} holds labels the output does not declare in "
                f"labels: {', '.join(map(repr, unknown[:5]))}{' …' if len(unknown) > 5 else ''}"
            )
        names = declared
    if len(names) < 2 and not multi:
        raise ModelError(
            f"labels corpus {sample.path}: every labelled row of {column!r} has the label {names[0]!r}; "
            "a head learns from two or more"
        )
    index = {name: i for i, name in enumerate(names)}
    if multi:
        targets = np.zeros((len(labels), len(names)), dtype=bool)
        for row, label in enumerate(labels):
            targets[row, [index[name] for name in label]] = True
    else:
        targets = np.array([index[label] for label in labels], dtype=np.int64)
    fingerprints = np.sort(np.array([-entry[0] for entry in kept], dtype="<u8"))
    return Labelled(texts, targets, names, np.array(slots)), fingerprints


def labelled_row(id_: object, text: object, label: object, correction: str | None = None) -> tuple[str, object, int] | None:
    """(text, label, slot) of a row with a text and a label, not one of the gate's unless
    corrected (a `correction` replaces its label); else None. A list of labels becomes a sorted
    tuple of its names (None for an empty list)."""
    slot = split_slot(id_)
    if correction is not None:
        return None if (parsed := text_and_label(text, correction)) is None else (*parsed, slot)
    if slot == SPLIT_SLOT["gate"] or (parsed := text_and_label(text, label)) is None:
        return None
    return (*parsed, slot)


def text_and_label(text: object, label: object) -> tuple[str, object] | None:
    """(text, label) of a row with a text and a label, else None: a list of labels as a sorted
    tuple of its names (None for an empty list), one label as its name."""
    if not isinstance(text, str) or not text.strip() or label is None:
        return None
    if isinstance(label, list):
        names = tuple(sorted({str(name) for name in label if name is not None}))
        return (text, names) if names else None
    return (text, str(label)) if str(label) else None


def held_out_rows(task: LabelTask, names: list[str], limit: int) -> tuple[list[str], np.ndarray]:
    """Up to `limit` labelled rows of the gate's slot, which no head trains on (labelled_row):
    (texts, targets as `names` index them, a row of booleans each with several labels per row).
    Labels the head does not know are left out (a row left with none, too), and corrected rows
    (they train). Reading stops once `limit` are found. A task without a label column has none."""
    if task.column is None:
        return [], np.zeros(0, dtype=np.int64)
    column, index, corrected = task.column, {name: i for i, name in enumerate(names)}, task.corrected()
    texts: list[str] = []
    targets: list[object] = []
    for batch in sample_batches(task.corpus, [task.corpus.id, task.corpus.text, column]):
        columns = (batch[name].to_pylist() for name in (task.corpus.id, task.corpus.text, column))
        for id_, text, label in zip(*columns, strict=True):
            if split_slot(id_) != SPLIT_SLOT["gate"] or str(id_) in corrected:
                continue
            if (parsed := text_and_label(text, label)) is None:
                continue
            text, label = parsed
            known = [index[name] for name in (label if isinstance(label, tuple) else (label,)) if name in index]
            if known:
                texts.append(text)
                targets.append(known if isinstance(label, tuple) else known[0])
        if len(texts) >= limit:
            break
    texts, targets = texts[:limit], targets[:limit]
    if targets and isinstance(targets[0], list):
        rows = np.zeros((len(targets), len(names)), dtype=bool)
        for row, known in enumerate(targets):
            rows[row, known] = True
        return texts, rows
    return texts, np.array(targets, dtype=np.int64)


def closest_head(
    cache: EngineCache, lineage: dict[str, str], fingerprints: np.ndarray, retrain_share: float
) -> Path | None:
    """The cached head of this lineage whose training rows differ least from these, if by at most
    `retrain_share` of them (rows changed, added or removed); ties go to the newest."""
    best: tuple[float, float, Path] | None = None
    for path, key in cache.entries("label-head"):
        if {name: key.get(name) for name in lineage} != lineage or not (path / TRAINING_FILE).exists():
            continue
        trained = np.load(path / TRAINING_FILE)
        same = len(np.intersect1d(trained, fingerprints, assume_unique=True))
        changed = 1 - same / max(len(trained), len(fingerprints))
        candidate = (changed, -path.stat().st_mtime, path)
        if changed <= retrain_share and (best is None or candidate < best):
            best = candidate
    return best[2] if best else None


def _train(labelled: Labelled, fingerprints: np.ndarray, engine: Engine, task: LabelTask, directory: Path) -> None:
    """Embed the labelled rows at FP32 (with the frozen encoder, and the one fine-tuned on the
    training rows), train and choose the head, export it with its report; with a few rows per
    label, the few-shot head (few_shot.py). The declared labels' zero-shot head, where there are
    some, is one more candidate on the same test rows."""
    np.save(directory / TRAINING_FILE, fingerprints)
    if len(labelled.texts) <= FEW_SHOT_ROWS * len(labelled.names) and len(labelled.names) >= 2:
        _train_few_shot(labelled, engine, task, directory)
        return
    policy = task.policy
    rows = held_out_split(labelled)
    embeddings = {"embeddings": fp32_embeddings(engine, labelled.texts)}
    fine_tune, tuned = None, None
    if policy.fine_tune_seconds > 0:
        cache = EngineCache(engine.machine.cache_dir)
        device = resolve_device(engine.machine)
        tuned, fine_tune = fine_tuned(engine.model, labelled, rows["train"], policy.fine_tune_seconds, device, cache)
        embeddings["fine-tuned"] = fp32_embeddings(engine.replace(model=tuned), labelled.texts)
    head, report = train_head(labelled, embeddings, rows)
    if task.taxonomy is not None:
        weight, bias, _ = build_zero_shot(task.taxonomy, task.corpus, engine)
        test = rows["test"]
        logits = unit(embeddings["embeddings"][test]) @ weight.T + bias
        accuracy = round(score(labelled.multi, logits, labelled.targets[test], None)[0], 4)
        zero = CandidateReport("zero-shot", accuracy, None, 0.0, {})
        trained, report = report, replace(report, candidates=[*report.candidates, zero])
        if accuracy > trained.accuracy:  # rows too few or too noisy to learn from
            export_head(weight, bias, directory / HEAD_FILE, labelled.multi, unit=True)
            won = replace(report, chosen="zero-shot", encoder="embeddings")
            write_meta(directory, labelled, won, None, {**asdict(won), "fine_tune": fine_tune})
            return
    export_head(head.weight, head.bias, directory / HEAD_FILE, labelled.multi)
    if head.features is not None and head.text_weight is not None:
        head.features.save(directory)
        np.save(directory / TEXT_WEIGHT_FILE, head.text_weight)
    encoder = tuned.folder.name if tuned is not None and report.encoder == "fine-tuned" else None
    thresholds = None if head.thresholds is None else head.thresholds.tolist()
    write_meta(directory, labelled, report, encoder, {**asdict(report), "fine_tune": fine_tune}, thresholds)


def _train_few_shot(labelled: Labelled, engine: Engine, task: LabelTask, directory: Path) -> None:
    """The few-shot head, its label texts the output's taxonomy or else the label names."""
    taxonomy = task.taxonomy or Taxonomy(labels=tuple(LabelText(label=name) for name in labelled.names))
    few = build_few_shot(labelled, taxonomy, task.corpus, engine, task.policy.fine_tune_seconds)
    export_head(few.weight, few.bias, directory / HEAD_FILE, labelled.multi, unit=True)
    encoder = None if few.encoder is None else few.encoder.folder.name
    write_meta(directory, labelled, few.report, encoder, {**asdict(few.report), "fine_tune": few.fine_tune})


def write_meta(
    directory: Path,
    labelled: Labelled,
    report: TrainingReport,
    encoder: str | None,
    training: dict,
    thresholds: list[float] | None = None,
) -> None:
    """The head's labels and report beside its graph. A head on unit embeddings (zero-shot,
    few-shot) with several labels per row gives each label from its sigmoid's 0.5, as the
    zero-shot head does: a few rows set no threshold of their own."""
    if thresholds is None and labelled.multi:
        thresholds = [0.5] * len(labelled.names)
    meta = {
        "labels": labelled.names,
        "multi": labelled.multi,
        "thresholds": thresholds,
        "held_out_accuracy": report.accuracy,
        "encoder": encoder,
        "training": training,
    }
    (directory / LABELS_FILE).write_text(json.dumps(meta))


def fp32_embeddings(engine: Engine, texts: list[str]) -> np.ndarray:
    with load_encoder(engine.replace(precision="fp32")) as encoder:
        return encoder.encode(texts)


def labeling_engine(head: LabelHead, engine: Engine) -> Engine:
    """The engine whose embeddings `head` takes: `engine`, or its encoder fine-tuned (cached
    beside the head), which then goes through the precision ladder and gates as any encoder."""
    if head.encoder is None:
        return engine
    base = engine.model
    tuned = read_encoder(engine.machine.cache_dir / head.encoder, base.pooling, base.normalize, base.max_seq_length)
    return engine.replace(model=tuned)
