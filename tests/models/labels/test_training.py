"""Label heads chosen on held-out rows: candidates, calibration, several labels per row, the baseline's floor."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from scipy.special import softmax

from precompute.models.errors import ModelError
from precompute.models.labels.head import labelled_rows
from precompute.models.labels.training import (
    GRIDS,
    Labelled,
    held_out_split,
    loses_to_baseline,
    sigmoid,
    train_head,
)
from precompute.models.text.reference import TextSample

ROWS, DIM = 1500, 16
WORDS = [f"word{i}" for i in range(60)]


def corpus(
    seed: int, classes: int, text_signal: float, rows: int = ROWS
) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
    """(texts, embeddings, class of each row, slots): embeddings near their class's centre; each
    text a few random words, each word of the class's own with probability `text_signal`. The
    first ROWS rows are the same whatever `rows`: more are new rows of the same classes."""
    rng = np.random.default_rng(seed)
    classes_of = rng.integers(0, classes, ROWS)
    centres = rng.normal(size=(classes, DIM))
    embeddings = (centres[classes_of] + 1.5 * rng.normal(size=(ROWS, DIM))).astype(np.float32)
    embeddings /= np.linalg.norm(embeddings, axis=1, keepdims=True)  # as the encoder's are
    texts = [
        " ".join(
            f"class{c}word{rng.integers(3)}" if rng.random() < text_signal else rng.choice(WORDS) for _ in range(6)
        )
        for c in classes_of
    ]
    slots = rng.integers(0, 10, ROWS)
    if rows > ROWS:
        more = np.random.default_rng(seed + 1000)
        new = more.integers(0, classes, rows - ROWS)
        new_embeddings = (centres[new] + 1.5 * more.normal(size=(len(new), DIM))).astype(np.float32)
        new_embeddings /= np.linalg.norm(new_embeddings, axis=1, keepdims=True)
        new_texts = [
            " ".join(
                f"class{c}word{more.integers(3)}" if more.random() < text_signal else more.choice(WORDS) for _ in range(6)
            )
            for c in new
        ]
        texts += new_texts
        embeddings, classes_of = np.concatenate([embeddings, new_embeddings]), np.concatenate([classes_of, new])
        slots = np.concatenate([slots, more.integers(0, 10, len(new))])
    return texts, embeddings, classes_of, slots


def test_the_text_features_win_where_the_words_say_what_the_embeddings_do_not() -> None:
    texts, embeddings, classes_of, slots = corpus(0, 5, text_signal=0.3, rows=ROWS + 1000)
    labelled = Labelled(texts[:ROWS], classes_of[:ROWS], [f"c{i}" for i in range(5)], slots[:ROWS])
    head, report = train_head(labelled, {"embeddings": embeddings[:ROWS]}, held_out_split(labelled))
    accuracy = {c.name: c.accuracy for c in report.candidates}
    assert report.chosen == "embeddings+tfidf" and accuracy["embeddings+tfidf"] > accuracy["embeddings"] + 0.05
    assert accuracy["embeddings+tfidf"] > report.baseline.accuracy and report.rows == ROWS
    grid = {name: GRIDS[name.endswith("+tfidf")] for name in accuracy}  # each chose a point of its own grid
    assert all(all(c.params[key] in grid[c.name][key] for key in grid[c.name]) for c in report.candidates)
    assert loses_to_baseline(asdict(report), 0.02) is None

    # Calibrated: on 1,000 rows no head saw (the published one is fit on every labelled row), the
    # mean top probability is close to the accuracy.
    probabilities = softmax(head.logits(embeddings[ROWS:], texts[ROWS:]), axis=1)
    top_accuracy = np.mean(np.argmax(probabilities, axis=1) == classes_of[ROWS:])
    assert top_accuracy > 0.7 and abs(probabilities.max(axis=1).mean() - top_accuracy) < 0.1


def test_several_labels_per_row_get_a_sigmoid_head_with_a_threshold_per_label() -> None:
    texts, embeddings, classes_of, slots = corpus(1, 4, text_signal=0.5)
    second = (classes_of + 1) % 4
    targets = np.zeros((ROWS, 4), bool)
    targets[np.arange(ROWS), classes_of] = True
    targets[np.arange(ROWS)[::3], second[::3]] = True  # a third of the rows have two labels
    labelled = Labelled(texts, targets, list("abcd"), slots)
    head, report = train_head(labelled, {"embeddings": embeddings}, held_out_split(labelled))
    assert head.thresholds is not None and head.thresholds.shape == (4,)
    chosen = next(c for c in report.candidates if c.name == report.chosen)
    assert chosen.accuracy > 0.7 and chosen.macro_f1 is not None and chosen.macro_f1 > 0.6  # micro, macro F1
    given = sigmoid(head.logits(embeddings, texts)) >= head.thresholds
    # Rows get more than one label, and not every label: a third of them have two, the rest one.
    assert 1.1 < given.sum(axis=1).mean() < 1.7 and given.sum(axis=1).max() < 4


def test_a_head_below_its_baseline_by_more_than_the_margin_is_refused() -> None:
    training = {
        "chosen": "embeddings",
        "test_rows": 500,
        "baseline": {"accuracy": 0.70},
        "candidates": [{"name": "embeddings", "accuracy": 0.67}],
    }
    assert loses_to_baseline(training, 0.05) is None
    refusal = loses_to_baseline(training, 0.02)
    assert refusal is not None and "0.6700 (embeddings)" in refusal and "0.7000" in refusal


def test_too_few_labelled_rows_to_hold_any_out_are_named() -> None:
    texts, _, classes_of, _ = corpus(2, 3, text_signal=0.5)
    only_train = np.full(ROWS, 5)
    with pytest.raises(ModelError, match="leave no validation or test rows"):
        held_out_split(Labelled(texts, classes_of, list("abc"), only_train))


def test_one_label_on_every_row_calibrates_without_a_slope() -> None:
    """A list column whose rows all carry the one label (a tiny catalogue): nothing to fit a
    Platt slope on, so the scores are taken as they are, and the head still trains."""
    texts, embeddings, _, slots = corpus(3, 2, text_signal=0.5)
    labelled = Labelled(texts[:60], np.ones((60, 1), dtype=bool), ["only"], slots[:60])
    head, report = train_head(labelled, {"embeddings": embeddings[:60]}, held_out_split(labelled))
    assert report.test_rows < 60 and "rests on" in report.note
    probabilities = sigmoid(head.logits(embeddings[:60], texts[:60]))
    assert head.thresholds is not None and (probabilities >= head.thresholds).all()  # the one label, on every row


def test_a_label_column_of_one_label_is_refused_by_name(tmp_path: Path) -> None:
    pq.write_table(pa.table({"id": [1, 2, 3], "text": ["a", "b", "c"], "kind": ["x", "x", "x"]}), tmp_path / "one.parquet")
    with pytest.raises(ModelError, match=r"one.parquet: every labelled row of 'kind' has the label 'x'"):
        labelled_rows(TextSample(path=str(tmp_path / "one.parquet")), "kind", None)


def labelled_corpus(path: Path, rows: range, text: str = "a text of row {}") -> TextSample:
    pq.write_table(
        pa.table({"id": list(rows), "text": [text.format(i) for i in rows], "kind": [f"k{i % 3}" for i in rows]}),
        path,
        row_group_size=4096,
    )
    return TextSample(path=str(path))


def test_a_sample_of_the_labelled_rows_moves_with_what_changed(tmp_path: Path) -> None:
    """A night that adds 1% of rows changes about 1% of the training sample, so the head is
    kept (retrain_share); a sample drawn by position would redraw it whole."""
    before, fingerprints = labelled_rows(labelled_corpus(tmp_path / "a.parquet", range(4000)), "kind", 1000)
    after, grown = labelled_rows(labelled_corpus(tmp_path / "b.parquet", range(4040)), "kind", 1000)
    assert len(before.texts) == len(after.texts) == len(fingerprints) == 1000
    assert len(set(before.texts) - set(after.texts)) <= 40
    assert 1 - len(np.intersect1d(fingerprints, grown)) / 1000 <= 0.04
    numbers = [int(text.rsplit(" ", 1)[1]) for text in after.texts]
    assert numbers == sorted(numbers) and numbers[-1] > 3000  # file order, drawn from all of it


SAMPLED = """
import json, sys, tracemalloc
import pyarrow as pa
from precompute.models.labels.head import labelled_rows
from precompute.models.text.reference import TextSample
tracemalloc.start()
labelled, _ = labelled_rows(TextSample(path=sys.argv[1]), "kind", 100)
peak = tracemalloc.get_traced_memory()[1]
print(json.dumps({"rows": len(labelled.texts), "arrow": pa.default_memory_pool().max_memory(), "python": peak}))
"""


def test_a_sample_of_a_large_corpus_holds_only_its_own_rows(tmp_path: Path) -> None:
    """Sampling 100 rows of 60,000 (about 13 MB of text) holds about one read batch at a time:
    the sample is kept while reading, not drawn after every row is held. Both sides are
    measured, in a process of its own: Arrow's buffers by its memory pool's high-water mark
    (native, which tracemalloc does not see), Python's objects by tracemalloc."""
    sample = labelled_corpus(tmp_path / "large.parquet", range(60_000), "{} " + "word " * 40)
    run = subprocess.run([sys.executable, "-c", SAMPLED, sample.path], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    peaks = json.loads(run.stdout.strip().splitlines()[-1])
    assert peaks["rows"] == 100
    assert peaks["arrow"] < 8e6, f"Arrow's peak {peaks['arrow'] / 1e6:.1f} MB"
    assert peaks["python"] < 6e6, f"Python's peak {peaks['python'] / 1e6:.1f} MB"
