"""The content-label model: a user's sequence classifier, or a softmax head trained over an encoder.

A classifier folder (`AutoModelForSequenceClassification`) runs on the engine path like an
encoder: exported with its softmax (or sigmoid) in the graph, quantized, and gated on
top-label agreement with its own FP32 self (models/engine.py). The rest of this module is
the other option, a head trained on the corpus's own label column:

    python -m precompute.models.labels    # train (or find cached) and print held-out accuracy

The head is softmax regression on FP32 embeddings of the labelled corpus (the gate's
held-out texts excluded), exported to ONNX (Gemm + Softmax) and cached like an engine,
keyed by model, training rows and recipe, and kept while its training rows change little
(`retrain_share`); `load_labeler` trains it on first use, so a fresh machine needs no step
of its own. Weights never go into git.

The encoder under the head runs on the engine path (quantized, cached) with its own gate:
a precision labels only if its top label agrees with FP32's on `gate_agreement` of the
held-out texts. Labels are less forgiving than search: a near tie between two sections
flips on a small perturbation, so a precision that passes the cosine gate for embeddings
can still fail this one. Such a precision gets a second try before the ladder falls back:
it labels every text, and the texts whose top two probabilities lie closer than a
calibrated margin (the near ties, where flips happen) are labelled again at FP32. On the
demo corpus INT8 alone agreed on 0.961 of the gate's texts; with the near ties (about a
fifth of them) rechecked it agreed on 0.996. Each try is in the report.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from precompute.models.encoder import Encoder, EngineReport
from precompute.models.engine import (
    gate_texts,
    load_encoder,
    precision_ladder,
    reference_embeddings,
    resolve_backend,
    resolve_device,
)
from precompute.models.engine_cache import EngineCache
from precompute.models.errors import GateFailedError, ModelError
from precompute.models.reference_texts import (
    SPLIT_SLOT,
    TextSample,
    reference_texts,
    sample_rows,
    split_slot,
    texts_digest,
)
from precompute.models.settings import DEMO_CORPUS, EngineSettings
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

RECIPE = "softmax-regression/lbfgs/l2-1e-4/v1"
HEAD_FILE = "head.onnx"
LABELS_FILE = "labels.json"
TRAINING_FILE = "training.npy"
"""The sorted fingerprints of the rows a head was trained on (row_fingerprints)."""
GATES_FILE = "gates.json"
PROBABILITIES = "probabilities"
HEAD_INPUT = "embedding"


class LabelSettings(BaseSettings):
    """What the label head learns from; env PRECOMPUTE_LABELS_<NAME>."""

    model_config = SettingsConfigDict(env_prefix="PRECOMPUTE_LABELS_", frozen=True)

    corpus: TextSample = TextSample(path=str(DEMO_CORPUS))
    """Parquet with the id, text and label columns: the training data of a trained head."""

    column: str = "section"
    """The label column (the Debian archive Section in the demo corpus); unused by a classifier."""

    max_train_texts: int = Field(20_000, ge=10)
    """Training texts: the first this many labelled rows, the gate's held-out ones excluded. A
    softmax head over 384 dimensions learns what it can from tens of thousands; more rows only
    add FP32 inference to every retrain."""

    retrain_share: float = Field(0.05, ge=0, le=1)
    """A cached head is kept while at most this share of its training rows changed; past it, a
    new head is trained (and every label computed again). 0 retrains on any change."""

    top: int = Field(3, ge=1, le=10)
    """Labels stored per item, best first."""

    gate_agreement: float = Field(0.99, gt=0, le=1)
    """A precision labels only if its top label matches FP32's on this share of held-out texts."""

    recheck_texts: int = Field(400, ge=10)
    """Calibration texts (disjoint from the gate's) that set the near-tie margin of a
    precision that falls short of the gate: the widest margin at which it flipped a label."""


@dataclass(frozen=True)
class LabelGate:
    precision: str
    agreement: float
    passed: bool
    reason: str
    recheck_margin: float | None = None
    """Texts whose top-2 probability margin is under this were labelled again at FP32 (None: none)."""
    rechecked: float = 0.0
    """Share of the gate's texts that were."""


@dataclass(frozen=True)
class LabelerReport:
    engine: EngineReport
    head_dir: str
    """The trained head's cache entry; empty for a classifier."""
    held_out_accuracy: float | None
    """The trained head's top-1 accuracy on held-out labelled texts; None for a classifier."""
    gates: list[LabelGate] = field(default_factory=list)


def train_head(embeddings: np.ndarray, targets: np.ndarray, classes: int) -> tuple[np.ndarray, np.ndarray]:
    """Weights [classes, dim] and bias [classes] of an L2-regularised softmax regression."""
    import torch  # training only: labelling runs the exported head on ONNX Runtime

    torch.manual_seed(0)
    linear = torch.nn.Linear(embeddings.shape[1], classes)
    x, y = torch.from_numpy(embeddings), torch.from_numpy(targets)
    optimizer = torch.optim.LBFGS(linear.parameters(), max_iter=300, line_search_fn="strong_wolfe")

    def loss() -> torch.Tensor:
        optimizer.zero_grad()
        value = torch.nn.functional.cross_entropy(linear(x), y) + 1e-4 * linear.weight.pow(2).sum()
        value.backward()
        return value

    optimizer.step(loss)
    return linear.weight.detach().numpy(), linear.bias.detach().numpy()


def export_head(weight: np.ndarray, bias: np.ndarray, path: Path) -> None:
    """embedding [B, dim] -> probabilities [B, classes]: Gemm then Softmax."""
    graph = helper.make_graph(
        [
            helper.make_node("Gemm", [HEAD_INPUT, "weight", "bias"], ["logits"], transB=1),
            helper.make_node("Softmax", ["logits"], [PROBABILITIES], axis=-1),
        ],
        "label_head",
        [helper.make_tensor_value_info(HEAD_INPUT, TensorProto.FLOAT, ["batch", weight.shape[1]])],
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
    """The exported head on ONNX Runtime: probabilities and top labels of embeddings."""

    def __init__(self, directory: Path) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        self.directory = directory
        self.session = ort.InferenceSession(str(directory / HEAD_FILE), options, ["CPUExecutionProvider"])
        meta = json.loads((directory / LABELS_FILE).read_text())
        self.labels: list[str] = meta["labels"]
        self.held_out_accuracy: float = meta["held_out_accuracy"]

    def probabilities(self, embeddings: np.ndarray) -> np.ndarray:
        return self.session.run(None, {HEAD_INPUT: embeddings})[0]


def top_of(probabilities: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(label indices, probabilities), [rows, k] each, best first."""
    order = np.argsort(-probabilities, axis=1, kind="stable")[:, :k]
    return order, np.take_along_axis(probabilities, order, axis=1)


def load_head(labels: LabelSettings, engine: EngineSettings) -> LabelHead:
    """The head for this model and training data: the one trained on exactly these rows, else the
    closest one trained on rows that differ by at most `retrain_share`, else one trained now.

    Keeping a head through small changes is what makes labels incremental: the head is part of
    every label's identity (jobs/labels.py), so a head retrained on 1% new rows would label every
    row again for a head that labels almost all of them the same."""
    rows = training_rows(labels)
    fingerprints = row_fingerprints(rows, labels.column)
    lineage = {
        "model": engine.model.hash,
        "column": labels.column,
        "max_train_texts": str(labels.max_train_texts),
        "recipe": RECIPE,
    }
    key = {**lineage, "training": hashlib.sha256(fingerprints.tobytes()).hexdigest()[:16]}
    cache = EngineCache(engine.cache_dir)
    if (kept := cache.find("label-head", key)) or (
        kept := closest_head(cache, lineage, fingerprints, labels)
    ):
        return LabelHead(kept)
    entry = cache.get_or_build(
        "label-head", key, lambda directory: _train(rows, fingerprints, labels, engine, directory)
    )
    return LabelHead(entry.path)


def training_rows(labels: LabelSettings) -> list[dict[str, object]]:
    """The first `max_train_texts` labelled rows of the corpus (the gate's held-out ones excluded),
    read a batch at a time: training costs the same at a million rows as at fifty thousand."""
    sample, column = labels.corpus, labels.column
    rows = (
        {"id": r[sample.id], "text": r[sample.text], column: r[column]}
        for r in sample_rows(sample, [sample.id, sample.text, column])
        if r[sample.text]
        and r[sample.text].strip()
        and r[column]
        and split_slot(r[sample.id]) != SPLIT_SLOT["gate"]
    )
    found = list(itertools.islice(rows, labels.max_train_texts))
    if not found:
        raise ModelError(f"labels corpus {sample.path}: no row has both a text and a {column!r} label")
    return found


def row_fingerprints(rows: list[dict[str, object]], column: str) -> np.ndarray:
    """A sorted 64-bit hash of each training row's (id, text, label): how two training sets compare."""
    digests = (
        hashlib.blake2b(f"{r['id']}\x00{r['text']}\x00{r[column]}".encode(), digest_size=8).digest()
        for r in rows
    )
    return np.sort(np.frombuffer(b"".join(digests), dtype=np.uint64))


def closest_head(
    cache: EngineCache, lineage: dict[str, str], fingerprints: np.ndarray, labels: LabelSettings
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
        if changed <= labels.retrain_share and (best is None or candidate < best):
            best = candidate
    return best[2] if best else None


def _train(
    rows: list[dict[str, object]],
    fingerprints: np.ndarray,
    labels: LabelSettings,
    engine: EngineSettings,
    directory: Path,
) -> None:
    column = labels.column
    names = sorted({str(r[column]) for r in rows})
    targets = np.array([names.index(str(r[column])) for r in rows], dtype=np.int64)
    # Hold out a tenth (by hash, never the gate's) to report accuracy, then fit on everything.
    held_out = np.array([split_slot(r["id"]) == SPLIT_SLOT["calibration"] for r in rows])
    with load_encoder(engine.model_copy(update={"precision": "fp32"})) as encoder:
        embeddings = encoder.encode([str(r["text"]) for r in rows])
    weight, bias = train_head(embeddings[~held_out], targets[~held_out], len(names))
    predicted = np.argmax(embeddings[held_out] @ weight.T + bias, axis=1)
    accuracy = float(np.mean(predicted == targets[held_out])) if held_out.any() else float("nan")
    weight, bias = train_head(embeddings, targets, len(names))
    export_head(weight, bias, directory / HEAD_FILE)
    np.save(directory / TRAINING_FILE, fingerprints)
    (directory / LABELS_FILE).write_text(json.dumps({"labels": names, "held_out_accuracy": accuracy}))


def top_two_margin(probabilities: np.ndarray) -> np.ndarray:
    """Best minus second-best probability per row: how far a text is from a tie."""
    two = np.partition(probabilities, -2, axis=1)[:, -2:]
    return two[:, 1] - two[:, 0]


class Labeler:
    """Texts in, top labels out: a gated classifier; or a gated encoder, then the trained head,
    near ties again at FP32 if so gated."""

    def __init__(
        self,
        encoder: Encoder,
        head: LabelHead | None,
        top: int,
        recheck: Encoder | None = None,
        margin: float = 0.0,
    ) -> None:
        self.encoder = encoder
        self.head = head
        self.top = top
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
        probabilities = self.head.probabilities(outputs) if self.head else outputs
        near = np.zeros(len(texts), dtype=bool)
        if self.recheck is not None and self.head is not None:
            near = top_two_margin(probabilities) < self.margin
            if near.any():
                again = self.recheck.encode([t for t, n in zip(texts, near, strict=True) if n])
                probabilities[near] = self.head.probabilities(again)
        return probabilities, near

    def label(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(label indices, probabilities), [len(texts), top] each, best first."""
        return top_of(self.probabilities(texts)[0], self.top)

    def close(self) -> None:
        self.encoder.close()
        if self.recheck is not None:
            self.recheck.close()

    def __enter__(self) -> Labeler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def recheck_margin(head: LabelHead, quantized: Encoder, fp32: Encoder, texts: list[str]) -> float:
    """Just above the widest margin at which `quantized` flipped a calibration text's top label."""
    quick = head.probabilities(quantized.encode(texts))
    exact = head.probabilities(fp32.encode(texts))
    flipped = np.argmax(quick, axis=1) != np.argmax(exact, axis=1)
    return float(np.nextafter(top_two_margin(quick)[flipped].max(initial=0.0), np.inf))


def load_labeler(labels: LabelSettings | None = None, engine: EngineSettings | None = None) -> Labeler:
    """The fastest labeler whose labels agree with FP32's: each precision alone, then with its
    near ties rechecked at FP32, before the ladder falls back to the next precision."""
    labels, engine = labels or LabelSettings(), engine or EngineSettings()
    if engine.model.task == "classify":
        return load_classifier(labels, engine)
    head = load_head(labels, engine)
    texts = gate_texts(engine)
    reference = np.argmax(head.probabilities(reference_embeddings(engine, texts)), axis=1)
    device = resolve_device(engine)
    fp32_settings = engine.model_copy(update={"precision": "fp32"})

    def agreement_gate(labeler: Labeler, name: str) -> LabelGate:
        probabilities, rechecked = labeler.probabilities(texts)
        agreement = float(np.mean(np.argmax(probabilities, axis=1) == reference))
        passed = agreement >= labels.gate_agreement
        reason = "" if passed else f"label agreement {agreement:.4f} < {labels.gate_agreement}"
        margin = labeler.margin if labeler.recheck is not None else None
        return LabelGate(name, agreement, passed, reason, margin, float(rechecked.mean()))

    def evaluate(encoder: Encoder, directory: Path) -> None:
        """A rung's gates: its precision alone, then with the near ties rechecked at FP32."""
        precision = encoder.report.precision
        tried = [agreement_gate(Labeler(encoder, head, labels.top), precision)]
        if not tried[0].passed and precision != "fp32":
            with load_encoder(fp32_settings) as fp32:
                calibration = reference_texts(engine.reference, "calibration", labels.recheck_texts)
                margin = recheck_margin(head, encoder, fp32, calibration)
                recheck = Labeler(encoder, head, labels.top, fp32, margin)
                tried.append(agreement_gate(recheck, f"{precision}+fp32-recheck"))
        (directory / GATES_FILE).write_text(json.dumps([asdict(g) for g in tried]))

    # A rung's gates are cached like the engine's own, by head, engine and gate texts: a nightly
    # run on an unchanged corpus opens its labeler without encoding the gate's texts again.
    cache = EngineCache(engine.cache_dir)
    gates: list[LabelGate] = []
    for rung in precision_ladder(engine, device, resolve_backend(engine, device).name):
        if any(g.precision == rung for g in gates):
            continue
        # Its precision is lower than `rung` if the cosine gate failed it.
        encoder = load_encoder(engine.model_copy(update={"precision": rung}))
        key = {
            "head": head.directory.name,
            "engine": Path(encoder.report.engine_dir).name,
            "texts": texts_digest(texts),
            "gate_agreement": str(labels.gate_agreement),
            "recheck_texts": str(labels.recheck_texts),
        }
        entry = cache.get_or_build("label-gate", key, lambda directory, e=encoder: evaluate(e, directory))
        gates += [LabelGate(**g) for g in json.loads((entry.path / GATES_FILE).read_text())]
        if gates[-1].passed:
            report = LabelerReport(encoder.report, str(head.directory), head.held_out_accuracy, gates)
            return passed_labeler(encoder, head, labels, engine, report)
        encoder.close()
    failures = "; ".join(f"{g.precision}: {g.reason}" for g in gates)
    raise GateFailedError(f"no precision passed the label agreement gate ({failures})")


def label_names(labels: LabelSettings, engine: EngineSettings) -> list[str]:
    """The labels a labeler can give, by index: the classifier's, or the trained head's (trained now on a miss)."""
    if engine.model.task == "classify":
        return list(engine.model.labels)
    return load_head(labels, engine).labels


def load_classifier(labels: LabelSettings, engine: EngineSettings) -> Labeler:
    """A classifier labels through its own engine, whose gate is top-label agreement with FP32."""
    encoder = load_encoder(engine.model_copy(update={"gate_agreement": labels.gate_agreement}))
    labeler = Labeler(encoder, None, labels.top)
    gates = [LabelGate(g.precision, g.agreement or 0.0, g.passed, g.reason) for g in encoder.report.gates]
    labeler.report = LabelerReport(encoder.report, "", None, gates)
    return labeler


def open_labeler(labels: LabelSettings, engine: EngineSettings, report: LabelerReport) -> Labeler:
    """The labeler a passed gate chose (`report`, from load_labeler), opened without gating it
    again: a job gates once, and each of its actors opens what passed. Gating costs seconds
    of encoding (the gate's and the calibration texts, at two precisions); opening, a cache hit."""
    encoder = load_encoder(engine.model_copy(update={"precision": report.engine.precision}))
    # The head the gate chose, by its entry's name: an actor never picks another one (load_head).
    head = LabelHead(engine.cache_dir / Path(report.head_dir).name) if report.head_dir else None
    return passed_labeler(encoder, head, labels, engine, report)


def passed_labeler(
    encoder: Encoder,
    head: LabelHead | None,
    labels: LabelSettings,
    engine: EngineSettings,
    report: LabelerReport,
) -> Labeler:
    """The labeler the last gate of `report` passed: `encoder`, with FP32 rechecking the near ties
    when that gate passed with a recheck margin."""
    margin = report.gates[-1].recheck_margin
    recheck = None if margin is None else load_encoder(engine.model_copy(update={"precision": "fp32"}))
    labeler = Labeler(encoder, head, labels.top, recheck, margin or 0.0)
    labeler.report = report
    return labeler


def main() -> None:
    labels, engine = LabelSettings(), EngineSettings()
    head = load_head(labels, engine)
    print(f"{len(head.labels)} labels from {labels.corpus.path} column {labels.column!r}")
    print(f"held-out top-1 accuracy {head.held_out_accuracy:.4f}")


if __name__ == "__main__":
    sys.exit(main())
