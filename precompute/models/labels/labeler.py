"""The content labeler: a user's sequence classifier, or a head over an encoder (head.py: trained or zero-shot).

A classifier folder (`AutoModelForSequenceClassification`) runs on the engine path like an
encoder: exported with its softmax (or sigmoid) in the graph, quantized, and gated on
top-label agreement with its own FP32 self (models/engines/load.py): it brings no labelled rows.

The encoder under a trained head runs on the engine path (quantized, cached) with its own gate,
on what label users feel: the head's accuracy on held-out labelled rows (the gate's slot, which
no head trains on) under the precision must reach `gate_min_accuracy_ratio` of its accuracy
under FP32. Agreement with FP32's top label is reported, not gated: a near tie that flips
between two labels the head confuses anyway costs no accuracy. A precision that fails gets a
second try before the ladder falls back: it labels every text, and the texts whose top two
probabilities lie closer than a calibrated margin (the near ties, where flips happen) are
labelled again at FP32. Each try is in the report. A corpus with no labelled row in the gate's
slot is gated on agreement, as a classifier, and so is a zero-shot head.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.metrics import f1_score

from precompute.models.engines.cache import EngineCache
from precompute.models.engines.climb import Rung, climb
from precompute.models.engines.gate import GateResult, few_held_out
from precompute.models.engines.load import (
    GATE_VECTORS,
    LOG,
    gate_line,
    gate_texts,
    load_encoder,
    reference_embeddings,
)
from precompute.models.engines.runtime import resolve_backend, resolve_device, text_ladder
from precompute.models.labels.head import (
    LabelHead,
    LabelPolicy,
    LabelTask,
    held_out_rows,
    labeling_engine,
    load_head,
)
from precompute.models.settings import Engine
from precompute.models.text.encoder import Encoder, EngineReport
from precompute.models.text.kept_vectors import vectors_of
from precompute.models.text.reference import reference_texts, texts_digest

GATES_FILE = "gates.json"
GATE_ROWS_PER_TEXT = 4
"""The label gate reads up to this many labelled held-out rows per gate text asked (1,024 at the
default 256): a ratio of 0.995 moves by one row in 200, so it needs more rows than a cosine."""


@dataclass(frozen=True)
class LabelerReport:
    engine: EngineReport
    head_dir: str
    """The trained head's cache entry; empty for a classifier."""
    held_out_accuracy: float | None
    """The trained head's top-1 accuracy (micro F1 with several labels per row) on held-out
    labelled texts; None for a classifier."""
    training: dict[str, Any] | None = None
    """The trained head's candidates and baseline on those texts (label_training.TrainingReport)."""
    gates: list[GateResult] = field(default_factory=list)


def top_of(probabilities: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(label indices, probabilities), [rows, k] each, best first."""
    order = np.argsort(-probabilities, axis=1, kind="stable")[:, :k]
    return order, np.take_along_axis(probabilities, order, axis=1)


def top_two_margin(probabilities: np.ndarray) -> np.ndarray:
    """Best minus second-best probability per row: how far a text is from a tie."""
    two = np.partition(probabilities, -2, axis=1)[:, -2:]
    return two[:, 1] - two[:, 0]


class KeptOutputs:
    """An encoder whose outputs are kept beside its engine by text (text_vectors), where its
    cosine gate keeps its outputs of the same gate texts: the label gate asks those and the
    calibration texts every night, and a night whose texts moved by a few encodes those few."""

    def __init__(self, encoder: Encoder) -> None:
        self.encoder = encoder
        self.path = Path(encoder.report.engine_dir) / GATE_VECTORS

    def encode(self, texts: list[str]) -> np.ndarray:
        return vectors_of(self.path, texts, self.encoder.encode)


class Labeler:
    """Texts in, top labels out: a gated classifier; or a gated encoder, then the trained head,
    near ties again at FP32 if so gated."""

    def __init__(
        self,
        encoder: Encoder | KeptOutputs,
        head: LabelHead | None,
        policy: LabelPolicy,
        recheck: Encoder | KeptOutputs | None = None,
        margin: float = 0.0,
    ) -> None:
        self.encoder = encoder
        self.head = head
        self.top = policy.top
        self.min_score = policy.min_score
        self.recheck = recheck
        self.margin = margin
        self.report: LabelerReport | None = None
        """Set by load_labeler once the gate passed."""

    @property
    def labels(self) -> list[str]:
        return self.head.labels if self.head else list(self.encoder.source.labels)

    def probabilities(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(label probabilities [rows, labels], whether each row was rechecked at FP32)."""
        outputs = self.encoder.encode(texts)
        probabilities = self.head.probabilities(outputs, texts) if self.head else outputs
        near = np.zeros(len(texts), dtype=bool)
        if self.recheck is not None and self.head is not None:
            near = top_two_margin(probabilities) < self.margin
            if near.any():
                near_texts = [t for t, n in zip(texts, near, strict=True) if n]
                probabilities[near] = self.head.probabilities(self.recheck.encode(near_texts), near_texts)
        return probabilities, near

    def label(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(label indices, probabilities, whether each is given), [len(texts), top] each, best
        first: a label is given at or above `min_score` (and a multi-label head's threshold)."""
        probabilities = self.probabilities(texts)[0]
        given = (
            self.head.given(probabilities, self.min_score) if self.head else probabilities >= self.min_score
        )
        indices, scores = top_of(probabilities, self.top)
        return indices, scores, np.take_along_axis(given, indices, axis=1)

    def close(self) -> None:
        """Closes what load_labeler or open_labeler opened: Encoders (a gate's KeptOutputs wrap
        encoders that the gate closes)."""
        for encoder in (self.encoder, self.recheck):
            if isinstance(encoder, Encoder):
                encoder.close()

    def __enter__(self) -> Labeler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def held_out_accuracy(head: LabelHead, probabilities: np.ndarray, truth: np.ndarray) -> float:
    """Top-1 accuracy; with several labels per row, micro F1 of the labels the head gives."""
    if head.multi:
        return float(f1_score(truth, head.given(probabilities, 0.0), average="micro", zero_division=0))
    return float(np.mean(np.argmax(probabilities, axis=1) == truth))


def recheck_margin(head: LabelHead, quantized: KeptOutputs, fp32: KeptOutputs, texts: list[str]) -> float:
    """Just above the widest margin at which `quantized` flipped a calibration text's top label."""
    quick = head.probabilities(quantized.encode(texts), texts)
    exact = head.probabilities(fp32.encode(texts), texts)
    flipped = np.argmax(quick, axis=1) != np.argmax(exact, axis=1)
    return float(np.nextafter(top_two_margin(quick)[flipped].max(initial=0.0), np.inf))


def load_labeler(task: LabelTask, engine: Engine, head_dir: Path | None = None) -> Labeler:
    """The fastest labeler whose labels agree with FP32's: the precision climb (climb.py) over each
    precision alone, then with its near ties rechecked at FP32, the first that passes serving.
    `head_dir`: the head the caller chose already (load_head), whose rows are then not read again
    (every labelled row of the corpus, a row at a time)."""
    if engine.model.task == "classify":
        return load_classifier(task, engine)
    head = load_head(task, engine) if head_dir is None else chosen_head(head_dir, engine)
    engine = labeling_engine(head, engine)  # a fine-tuned encoder is gated like any other
    texts, truth = held_out_rows(task, head.labels, engine.policy.gate_texts * GATE_ROWS_PER_TEXT)
    by_accuracy = len(texts) > 0
    if not by_accuracy:
        texts = gate_texts(engine).texts
    exact = head.probabilities(reference_embeddings(engine, texts), texts)
    exact_accuracy = held_out_accuracy(head, exact, truth) if by_accuracy else None
    device = resolve_device(engine.machine)
    policy = task.policy
    threshold = engine.policy.gate_min_accuracy_ratio if by_accuracy else engine.policy.gate_agreement

    def label_gate(labeler: Labeler, name: str) -> GateResult:
        probabilities, rechecked = labeler.probabilities(texts)
        agreement = float(np.mean(np.argmax(probabilities, axis=1) == np.argmax(exact, axis=1)))
        margin = labeler.margin if labeler.recheck is not None else None
        figures = {"agreement": agreement, "recheck_margin": margin, "rechecked": float(rechecked.mean()), "texts_from": task.corpus.path}
        if exact_accuracy is None:
            passed = agreement >= threshold
            reason = "" if passed else f"label agreement {agreement:.4f} < {threshold} (no labelled held-out row)"
            return GateResult(name, passed, reason, **figures)
        accuracy = held_out_accuracy(head, probabilities, truth)
        ratio = accuracy / exact_accuracy if exact_accuracy > 0 else 1.0
        passed = ratio >= threshold
        reason = "" if passed else (
            f"held-out accuracy {accuracy:.4f} vs FP32 {exact_accuracy:.4f}: ratio {ratio:.4f} < {threshold}"
        )
        return GateResult(
            name, passed, reason, accuracy=round(accuracy, 4), accuracy_fp32=round(exact_accuracy, 4),
            texts=len(texts), note=few_held_out(len(texts), "labelled rows"), **figures
        )

    def evaluate(encoder: Encoder, directory: Path) -> None:
        """A precision's gates: alone, then with the near ties rechecked at FP32."""
        precision, quick = encoder.report.precision, KeptOutputs(encoder)
        tried = [label_gate(Labeler(quick, head, policy), precision)]
        if not tried[0].passed and precision != "fp32":
            with load_encoder(engine.replace(precision="fp32")) as fp32:
                # As many as a small corpus has: the gate still judges the margin they set.
                calibration = reference_texts(engine.reference, "calibration", policy.recheck_texts, at_least=0)
                exact = KeptOutputs(fp32)
                margin = recheck_margin(head, quick, exact, calibration)
                recheck = Labeler(quick, head, policy, exact, margin)
                tried.append(label_gate(recheck, f"{precision}+fp32-recheck"))
        (directory / GATES_FILE).write_text(json.dumps([asdict(g) for g in tried]))
        for gate in tried:
            LOG.info("%s", gate_line(gate))

    # A precision's gates are cached like the engine's own, by head, engine and gate texts: a nightly
    # run on an unchanged corpus opens its labeler without gating again, and one whose texts moved
    # scores the head over the kept outputs of the texts that did not (KeptOutputs).
    cache = EngineCache(engine.machine.cache_dir)
    gated: set[str] = set()

    def precision_rungs() -> Iterator[Rung[Labeler]]:
        """Each precision of the text ladder alone, then rechecked; one the cosine gate already
        raised to the next (load_encoder climbs from it) is not gated twice."""
        backend = resolve_backend(engine.machine, device).name
        for precision in text_ladder(engine.policy.precision, device, backend):
            if precision in gated:
                continue
            # Search is not what a labeler is judged by: its held-out accuracy is, below.
            encoder = load_encoder(engine.replace(precision=precision, gate_min_recall_ratio=0.0))
            key = {
                "head": head.directory.name,
                "engine": Path(encoder.report.engine_dir).name,
                "texts": texts_digest(texts),
                "truth": hashlib.sha256(truth.tobytes()).hexdigest()[:16],
                "bar": f"{'accuracy' if by_accuracy else 'agreement'} {threshold}",
                "recheck_texts": str(policy.recheck_texts),
            }
            entry = cache.get_or_build("label-gate", key, lambda directory, e=encoder: evaluate(e, directory))
            gates = [GateResult(**g) for g in json.loads((entry.path / GATES_FILE).read_text())]
            gated.add(encoder.report.precision)
            for gate in gates:
                yield Rung(gate.precision, partial(passed_rung, gate, encoder))
            if not gates[-1].passed:
                encoder.close()

    def passed_rung(gate: GateResult, encoder: Encoder) -> tuple[GateResult, Labeler | None]:
        if not gate.passed:
            return gate, None
        report = LabelerReport(encoder.report, str(head.directory), head.held_out_accuracy, head.training)
        return gate, passed_labeler(encoder, head, task, engine, report, gate.recheck_margin)

    climbed = climb(precision_rungs())
    labeler = climbed.engine
    labeler.report = replace(labeler.report, gates=climbed.gates)
    return labeler


def load_classifier(task: LabelTask, engine: Engine) -> Labeler:
    """A classifier labels through its own engine, whose gate is top-label agreement with FP32."""
    encoder = load_encoder(engine)
    labeler = Labeler(encoder, None, task.policy)
    labeler.report = LabelerReport(encoder.report, "", None, None, list(encoder.report.gates))
    return labeler


def chosen_head(head_dir: Path, engine: Engine) -> LabelHead:
    """A head chosen elsewhere (the flow's, the gate's), by its entry's name in this machine's
    cache: a task or actor never picks another one (load_head), wherever the chooser's cache was."""
    return LabelHead(engine.machine.cache_dir / head_dir.name, engine)


def open_labeler(task: LabelTask, engine: Engine, report: LabelerReport) -> Labeler:
    """The labeler a passed gate chose (`report`, from load_labeler), opened without gating it
    again: a job gates once, and each of its actors opens what passed. Gating costs seconds
    of encoding (the gate's and the calibration texts, at two precisions); opening, a cache hit."""
    head = None
    if report.head_dir:
        head = chosen_head(Path(report.head_dir), engine)
        engine = labeling_engine(head, engine)
    encoder = load_encoder(engine.replace(precision=report.engine.precision))
    return passed_labeler(encoder, head, task, engine, report, report.gates[-1].recheck_margin)


def passed_labeler(
    encoder: Encoder,
    head: LabelHead | None,
    task: LabelTask,
    engine: Engine,
    report: LabelerReport,
    margin: float | None,
) -> Labeler:
    """The labeler a gate passed: `encoder`, with FP32 rechecking the near ties where that gate
    passed with a recheck `margin`."""
    recheck = None if margin is None else load_encoder(engine.replace(precision="fp32"))
    labeler = Labeler(encoder, head, task.policy, recheck, margin or 0.0)
    labeler.report = report
    return labeler
