"""The encoder fine-tuned on labelled rows: trained within its budget, cached, an encoder like any other."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from precompute.models.engines.cache import EngineCache
from precompute.models.labels.finetune import BATCH, fine_tuned
from precompute.models.labels.training import Labelled
from precompute.models.source import read_encoder
from tests.models.tiny import tiny_encoder


def test_a_fine_tuned_encoder_is_trained_once_per_training_set_and_reused(tmp_path: Path) -> None:
    source = read_encoder(tiny_encoder(tmp_path / "tiny", "bert", pooling="mean"))
    rng = np.random.default_rng(0)
    classes = rng.integers(0, 2, 96)
    texts = [f"{'chess board game' if c else 'xml parser library'} number {i}" for i, c in enumerate(classes)]
    labelled = Labelled(texts, classes, ["games", "libs"], rng.integers(0, 10, 96))
    rows = np.arange(64)
    cache = EngineCache(tmp_path / "cache")

    tuned, report = fine_tuned(source, labelled, rows, 60.0, "cpu", cache)
    assert report["steps"] == 64 // BATCH and report["epochs"] == 1.0 and report["device"] == "cpu"
    assert (tuned.dim, tuned.pooling, tuned.normalize) == (source.dim, source.pooling, source.normalize)
    assert tuned.hash != source.hash  # new weights: a new engine, exported and gated on its own
    built = [path for path, _ in cache.entries("label-encoder")]

    again, _ = fine_tuned(source, labelled, rows, 60.0, "cpu", cache)
    assert again.folder == tuned.folder and [path for path, _ in cache.entries("label-encoder")] == built
    other, _ = fine_tuned(source, labelled, np.arange(32), 60.0, "cpu", cache)  # other rows: trained anew
    assert other.folder != tuned.folder and len(cache.entries("label-encoder")) == 2

    _, report = fine_tuned(source, labelled, np.arange(96), 0.0, "cpu", cache)  # no time: no step
    assert report["steps"] == 0


def test_several_labels_per_row_fine_tune_with_a_sigmoid_per_label(tmp_path: Path) -> None:
    """A list column's rows (a boolean row of labels each) train through binary cross-entropy:
    the weights move, as with one label per row."""
    source = read_encoder(tiny_encoder(tmp_path / "tiny", "bert", pooling="mean"))
    rng = np.random.default_rng(1)
    targets = rng.random((64, 3)) < 0.4
    targets[~targets.any(axis=1), 0] = True
    texts = [" ".join(name for name, on in zip(("chess", "xml", "audio"), row, strict=True) if on) for row in targets]
    labelled = Labelled(texts, targets, ["games", "libs", "sound"], rng.integers(0, 10, 64))
    assert labelled.multi
    tuned, report = fine_tuned(source, labelled, np.arange(64), 60.0, "cpu", EngineCache(tmp_path / "cache"))
    assert report["steps"] == 64 // BATCH and tuned.hash != source.hash
