"""A label head trained on the corpus's own label column, over an encoder: softmax regression
on FP32 embeddings.

The head is trained on the labelled corpus (the gate's held-out texts excluded), exported to
ONNX (Gemm + Softmax) and cached like an engine, keyed by model, training rows and recipe, and
kept while its training rows change little (`retrain_share`): `load_head` trains it on first
use, so a fresh machine needs no step of its own. It runs through the backends every engine
uses (models/runtime.py open_graph). Weights never go into git.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from pydantic import BaseModel, ConfigDict, Field

from precompute.models.backends.base import BuildSpec
from precompute.models.engine import load_encoder
from precompute.models.engine_cache import EngineCache
from precompute.models.errors import ModelError
from precompute.models.reference_texts import SPLIT_SLOT, TextSample, sample_rows, split_slot
from precompute.models.runtime import open_graph, resolve_device
from precompute.models.settings import Engine

RECIPE = "softmax-regression/lbfgs/l2-1e-4/v1"
HEAD_FILE = "head.onnx"
LABELS_FILE = "labels.json"
TRAINING_FILE = "training.npy"
"""The sorted fingerprints of the rows a head was trained on (row_fingerprints)."""
PROBABILITIES = "probabilities"
HEAD_INPUT = "embedding"
HEAD_ROWS = 4096
"""Embeddings per head call: the batch its engine is built for."""


class LabelPolicy(BaseModel):
    """How an output's labels are made: the pipeline file's fields of a labels output."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    top: int = Field(3, ge=1, le=10)
    """Labels stored per item, best first."""

    train_texts: int = Field(20_000, ge=10)
    """Trained head: the first this many labelled rows train it, the gate's held-out ones
    excluded. A softmax head over a few hundred dimensions learns what it can from tens of
    thousands; more rows only add FP32 inference to every retrain."""

    retrain_share: float = Field(0.05, ge=0, le=1)
    """A cached head is kept while at most this share of its training rows changed; past it, a
    new head is trained (and every label computed again). 0 retrains on any change."""

    recheck_texts: int = Field(400, ge=10)
    """Calibration texts (disjoint from the gate's) that set the near-tie margin of a
    precision that falls short of the gate: the widest margin at which it flipped a label."""


class LabelTask(BaseModel):
    """What a labeler is made for: the corpus and the label column a head learns from (None: a
    classifier folder labels by itself), and the output's policy."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    corpus: TextSample
    column: str | None = None
    policy: LabelPolicy = LabelPolicy()


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
    """The exported head through the engines' backends: probabilities of embeddings."""

    def __init__(self, directory: Path, engine: Engine) -> None:
        self.directory = directory
        device = resolve_device(engine.machine)
        self.runner = open_graph((directory / HEAD_FILE).read_bytes(), engine.machine, device, BuildSpec(HEAD_ROWS))
        meta = json.loads((directory / LABELS_FILE).read_text())
        self.labels: list[str] = meta["labels"]
        self.held_out_accuracy: float = meta["held_out_accuracy"]

    def probabilities(self, embeddings: np.ndarray) -> np.ndarray:
        parts = [
            self.runner.infer({HEAD_INPUT: embeddings[start : start + HEAD_ROWS]})
            for start in range(0, len(embeddings), HEAD_ROWS)
        ]
        return np.concatenate(parts) if parts else np.zeros((0, len(self.labels)), np.float32)


def load_head(task: LabelTask, engine: Engine) -> LabelHead:
    """The head for this model and training data: the one trained on exactly these rows, else the
    closest one trained on rows that differ by at most `retrain_share`, else one trained now.

    Keeping a head through small changes is what makes labels incremental: the head is part of
    every label's identity (jobs/labels.py), so a head retrained on 1% new rows would label every
    row again for a head that labels almost all of them the same."""
    column = label_column(task)
    rows = training_rows(task.corpus, column, task.policy.train_texts)
    fingerprints = row_fingerprints(rows, column)
    lineage = {
        "model": engine.model.hash,
        "column": column,
        "max_train_texts": str(task.policy.train_texts),
        "recipe": RECIPE,
    }
    key = {**lineage, "training": hashlib.sha256(fingerprints.tobytes()).hexdigest()[:16]}
    cache = EngineCache(engine.machine.cache_dir)
    if (kept := cache.find("label-head", key)) or (
        kept := closest_head(cache, lineage, fingerprints, task.policy.retrain_share)
    ):
        return LabelHead(kept, engine)
    entry = cache.get_or_build(
        "label-head", key, lambda directory: _train(rows, fingerprints, column, engine, directory)
    )
    return LabelHead(entry.path, engine)


def label_column(task: LabelTask) -> str:
    if task.column is None:
        raise ModelError("a trained head needs the label column it learns from")
    return task.column


def training_rows(sample: TextSample, column: str, count: int) -> list[dict[str, object]]:
    """The first `count` labelled rows of the corpus (the gate's held-out ones excluded), read a
    batch at a time: training costs the same at a million rows as at fifty thousand."""
    rows = (
        {"id": r[sample.id], "text": r[sample.text], column: r[column]}
        for r in sample_rows(sample, [sample.id, sample.text, column])
        if r[sample.text]
        and r[sample.text].strip()
        and r[column]
        and split_slot(r[sample.id]) != SPLIT_SLOT["gate"]
    )
    found = list(itertools.islice(rows, count))
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


def _train(
    rows: list[dict[str, object]],
    fingerprints: np.ndarray,
    column: str,
    engine: Engine,
    directory: Path,
) -> None:
    names = sorted({str(r[column]) for r in rows})
    targets = np.array([names.index(str(r[column])) for r in rows], dtype=np.int64)
    # Hold out a tenth (by hash, never the gate's) to report accuracy, then fit on everything.
    held_out = np.array([split_slot(r["id"]) == SPLIT_SLOT["calibration"] for r in rows])
    with load_encoder(engine.replace(precision="fp32")) as encoder:
        embeddings = encoder.encode([str(r["text"]) for r in rows])
    weight, bias = train_head(embeddings[~held_out], targets[~held_out], len(names))
    predicted = np.argmax(embeddings[held_out] @ weight.T + bias, axis=1)
    accuracy = float(np.mean(predicted == targets[held_out])) if held_out.any() else float("nan")
    weight, bias = train_head(embeddings, targets, len(names))
    export_head(weight, bias, directory / HEAD_FILE)
    np.save(directory / TRAINING_FILE, fingerprints)
    (directory / LABELS_FILE).write_text(json.dumps({"labels": names, "held_out_accuracy": accuracy}))
