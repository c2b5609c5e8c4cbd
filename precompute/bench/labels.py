"""`precompute bench labels`: the published labels against the baselines a data scientist tries first.

Per data set (bench/labels_data.py), one seeded split for every model: 70% of the rows keep their
label, 30% lose it. The nightly flow runs on all of them from a pipeline file as a user would
write it (the bundled encoder, the labels output's defaults), the lookup service serves every
unlabelled row's labels (POST /v1/labels:batchGet, as product services call it), and the top
label is scored against the truth (an abstention counts as wrong). Beside it, trained in this
process on the same 70% and scored on the same 30%:
- tfidf_svc: TF-IDF of words and word pairs (sublinear, in two rows or more) + LinearSVC at
  scikit-learn's defaults, seeded: the job's own baseline (models/labels/training.py baseline);
- lr_fp32: logistic regression (scikit-learn's defaults) on the same encoder's FP32 embeddings.
On a set with a taxonomy (labels_data.py TAXONOMIES: a sentence per label), two more columns,
top-1 on the same 30%:
- zero-shot, no labelled row: the zero-shot head a labels output declaring those labels makes
  (models/labels/zero_shot.py: prompt, centring, scale) over FP32 embeddings (zero_shot_top1);
  beside it, each row's nearest bare label name by cosine, no prompt and no centring
  (zero_shot_names_baseline_top1);
- 8-shot: the job's few-shot head (models/labels/few_shot.py, its defaults, fine-tuning budget
  included) from a corpus where SHOTS rows a label alone keep their label, drawn seeded from the
  70% outside the engine gate's slot (few_shot8_top1); beside it, logistic regression
  (scikit-learn's defaults) on the frozen encoder's FP32 embeddings of the same rows
  (few_shot8_lr_baseline_top1). `--taxonomy-only` measures these columns alone.
The job's own candidates, their held-out accuracy and training time (the grid and calibration;
the encoder's fine-tuning apart, with its steps and device) come from its report.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from sklearn.linear_model import LogisticRegression

from precompute.bench.labels_data import DATASETS, TAXONOMIES, TITLES, load
from precompute.bench.records import Figure, write_record
from precompute.bench.served import served_run
from precompute.jobs.settings import JobSettings
from precompute.models.engines.load import load_encoder
from precompute.models.hardware import device_fingerprint
from precompute.models.labels.head import LabelHead, LabelTask, labeling_engine, load_head
from precompute.models.labels.training import Labelled, baseline
from precompute.models.labels.zero_shot import LabelText, Taxonomy
from precompute.models.settings import Engine
from precompute.models.source import bundled_encoder
from precompute.models.text.reference import SPLIT_SLOT, TextSample, split_slot

PIPELINE = """\
[outputs.labels]
kind = "labels"
input = { path = "corpus.parquet", id = "id", text = "text", label = "label" }
"""
TEST_SHARE = 0.3
IDS_PER_CALL = 500
SHOTS = 8
"""Labelled rows a label of the few-shot column."""


def split(table: pa.Table, seed: int = 0) -> np.ndarray:
    """Whether each row is a test row (its label withheld): a seeded TEST_SHARE of them."""
    test = np.zeros(table.num_rows, bool)
    test[np.random.default_rng(seed).permutation(table.num_rows)[: int(TEST_SHARE * table.num_rows)]] = True
    return test


def served_labels(base: str, ids: list[str]) -> dict[str, str | None]:
    """Each id's top served label (None: it abstained)."""
    top: dict[str, str | None] = {}
    with httpx.Client(base_url=base, timeout=60) as http:
        for start in range(0, len(ids), IDS_PER_CALL):
            answer = http.post("/v1/labels:batchGet", json={"ids": ids[start : start + IDS_PER_CALL]})
            answer.raise_for_status()
            for result in answer.json()["results"]:
                top[result["id"]] = result["labels"][0]["label"] if result["labels"] else None
    return top


def baselines(name: str, table: pa.Table, test: np.ndarray, folder: Path) -> dict[str, dict[str, float]]:
    """tfidf_svc (the job's own baseline, label_training.baseline) and lr_fp32 trained on the
    labelled rows, top-1 on the test rows, with their training time."""
    texts = table["text"].to_pylist()
    labels = np.array(table["label"].to_pylist(), dtype=object)
    names = sorted(set(labels))
    labelled = Labelled(texts, np.searchsorted(names, labels), names, np.zeros(len(texts), int))
    svc = baseline(labelled, {"train": np.flatnonzero(~test), "test": np.flatnonzero(test)})
    out = {"tfidf_svc": {"top1": svc.accuracy, "train_s": svc.train_seconds}}
    engine = Engine(model=bundled_encoder(), reference=TextSample(path=str(folder / "corpus.parquet")))
    with load_encoder(engine.replace(precision="fp32")) as encoder:
        embeddings = encoder.encode(texts)
    start = time.perf_counter()
    lr = LogisticRegression(max_iter=2000).fit(embeddings[~test], labels[~test])
    predicted = lr.predict(embeddings[test])
    out["lr_fp32"] = {"top1": float(np.mean(predicted == labels[test])), "train_s": time.perf_counter() - start}
    return out


def taxonomy_columns(name: str, table: pa.Table, test: np.ndarray, folder: Path) -> dict[str, Any]:
    """The zero-shot and 8-shot columns of a set with a taxonomy, top-1 on the test rows: the
    zero-shot head against each row's nearest bare label name; the job's few-shot head, from a
    corpus whose SHOTS rows a label alone keep their label, against logistic regression on the
    frozen encoder's FP32 embeddings of the same rows."""
    described = TAXONOMIES[name]
    names = sorted(described)
    taxonomy = Taxonomy(labels=tuple(LabelText(label=n, description=described[n]) for n in names))
    texts, labels = table["text"].to_pylist(), np.array(table["label"].to_pylist(), dtype=object)
    shots = shot_rows(table, test)
    kept = np.full(len(labels), None, dtype=object)
    kept[shots] = labels[shots]
    folder.mkdir(parents=True, exist_ok=True)
    corpus = folder / "few-shot.parquet"
    pq.write_table(table.set_column(table.schema.get_field_index("label"), "label", pa.array(kept.tolist(), pa.string())), corpus)
    engine = Engine(model=bundled_encoder(), reference=TextSample(path=str(corpus)))
    test_texts, truth = [texts[i] for i in np.flatnonzero(test)], labels[test]
    with load_encoder(engine.replace(precision="fp32")) as encoder:
        frozen, shot_vectors, bare = (encoder.encode(part) for part in (test_texts, [texts[i] for i in shots], names))
    frozen_unit = frozen / np.linalg.norm(frozen, axis=1, keepdims=True)

    def top1(head: LabelHead, vectors: np.ndarray) -> float:
        return float(np.mean(np.array(head.labels)[np.argmax(head.probabilities(vectors, test_texts), axis=1)] == truth))

    start = time.perf_counter()
    zero = load_head(LabelTask(corpus=engine.reference, taxonomy=taxonomy), engine)
    zero_seconds = time.perf_counter() - start
    bare /= np.linalg.norm(bare, axis=1, keepdims=True)
    nearest = np.array(names)[np.argmax(frozen_unit @ bare.T, axis=1)]
    start = time.perf_counter()
    few = load_head(LabelTask(corpus=engine.reference, column="label", taxonomy=taxonomy), engine)
    few_seconds = time.perf_counter() - start
    tuned = labeling_engine(few, engine)
    if tuned is not engine:
        with load_encoder(tuned.replace(precision="fp32")) as encoder:
            few_vectors = encoder.encode(test_texts)
    else:
        few_vectors = frozen
    lr = LogisticRegression(max_iter=2000).fit(shot_vectors, labels[shots])
    training = few.training
    return {
        "zero_shot_top1": round(top1(zero, frozen), 4),
        "zero_shot_names_baseline_top1": round(float(np.mean(nearest == truth)), 4),
        "few_shot8_top1": round(top1(few, few_vectors), 4),
        "few_shot8_lr_baseline_top1": round(float(np.mean(lr.predict(frozen) == truth)), 4),
        "few_shot8_head": training["chosen"],
        "few_shot8_candidates": {c["name"]: c["accuracy"] for c in training["candidates"]},
        "few_shot8_folds_baseline": training["baseline"]["accuracy"],
        "few_shot8_fine_tune": training["fine_tune"],
        "taxonomy_train_s": {"zero_shot": round(zero_seconds, 1), "few_shot8": round(few_seconds, 1)},
    }


def shot_rows(table: pa.Table, test: np.ndarray, seed: int = 0) -> np.ndarray:
    """SHOTS rows a label, drawn (seeded) from the non-test rows a head may train on (not the
    engine gate's slot, which no head trains on): the same rows for the job and its baseline."""
    labels = np.array(table["label"].to_pylist(), dtype=object)
    trainable = ~test & np.array([split_slot(i) != SPLIT_SLOT["gate"] for i in table["id"].to_pylist()])
    rng = np.random.default_rng(seed)
    return np.sort(np.concatenate(
        [rng.choice(np.flatnonzero(trainable & (labels == name)), SHOTS, replace=False) for name in sorted(set(labels))]
    ))


def measure_taxonomy(name: str, folder: Path, cache: Path) -> dict[str, Any]:
    """The zero-shot and 8-shot columns alone, on the bench's split of one set."""
    table = load(name, cache)
    test = split(table)
    return {"dataset": name, "rows": table.num_rows, "classes": len(set(table["label"].to_pylist())),
            "test_rows": int(test.sum()), **taxonomy_columns(name, table, test, folder)}


def measure(name: str, folder: Path, cache: Path) -> dict[str, Any]:
    """The served protocol on one data set in `folder`, and the baselines on its split."""
    table = load(name, cache)
    test = split(table)
    for previous in ("work", "redis"):  # a first night: no head or versions from an earlier run
        shutil.rmtree(folder / previous, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    withheld = pa.array([None if t else label for t, label in zip(test, table["label"].to_pylist(), strict=True)])
    pq.write_table(table.set_column(table.schema.get_field_index("label"), "label", withheld), folder / "corpus.parquet")
    (folder / "precompute.toml").write_text(PIPELINE)
    environment = {"PRECOMPUTE_JOB_WORK_DIR": str(folder / "work")}
    ids = [str(i) for i in np.array(table["id"].to_pylist(), dtype=object)[test]]
    with served_run(folder, environment) as (report, base):
        served = served_labels(base, ids)
    truth = dict(zip(table["id"].to_pylist(), table["label"].to_pylist(), strict=True))
    labels = report["outputs"]["labels"]
    training = labels["head_training"]
    found = baselines(name, table, test, folder)
    columns = taxonomy_columns(name, table, test, folder / "taxonomy") if name in TAXONOMIES else {}
    return {
        "dataset": name,
        "rows": table.num_rows,
        "classes": len(set(truth.values())),
        "test_rows": len(ids),
        "published_top1": round(float(np.mean([served.get(i) == truth[i] for i in ids])), 4),
        "tfidf_svc_top1": round(found["tfidf_svc"]["top1"], 4),
        "lr_fp32_top1": round(found["lr_fp32"]["top1"], 4),
        **columns,
        "published_head": training["chosen"],
        "engine": labels["engine"],
        "engine_gates": [
            {key: gate.get(key) for key in ("precision", "passed", "accuracy", "accuracy_fp32", "agreement", "texts")}
            for gate in labels["gate"]
        ],
        "job_estimate_top1": labels["head_held_out_accuracy"],
        "candidates": {c["name"]: {"top1": c["accuracy"], "train_s": c["train_seconds"]} for c in training["candidates"]},
        "fine_tune": training["fine_tune"],
        "baseline_train_s": {name: round(figures["train_s"], 1) for name, figures in found.items()},
        "label_s": labels["seconds"],
    }


def main(datasets: str = "demo,rotten-tomatoes,newsgroups", taxonomy_only: bool = False) -> dict[str, Any]:
    names = datasets.split(",")
    if unknown := set(names) - set(DATASETS):
        raise ValueError(f"unknown data sets {sorted(unknown)}: choose from {', '.join(DATASETS)}")
    if taxonomy_only and (untaxed := [n for n in names if n not in TAXONOMIES]):
        raise ValueError(f"no taxonomy for {untaxed}: the zero-shot and 8-shot columns need one ({', '.join(TAXONOMIES)})")
    job = JobSettings()
    result: dict[str, Any] = {"bench": "labels", "machine": device_fingerprint("cpu"), "datasets": {}}
    for name in names:
        folder, cache = job.work_dir.machine_dir() / "bench-labels" / name, job.work_dir.machine_dir() / "datasets"
        figures = measure_taxonomy(name, folder / "taxonomy", cache) if taxonomy_only else measure(name, folder, cache)
        result["datasets"][name] = figures
        print_figures(name, figures)
    default = result["datasets"][names[0]]
    print(json.dumps(result))
    if taxonomy_only:
        result |= {key: default[key] for key in ("few_shot8_top1", "few_shot8_lr_baseline_top1", "zero_shot_top1")}
        write_record(
            "labels",
            result,
            dataset=f"{TITLES[names[0]]}: {SHOTS} labelled rows a label, {default['test_rows']:,} held out",
            ours=Figure(f"few-shot top-1 ({default['few_shot8_head']})", default["few_shot8_top1"], "accuracy"),
            baseline=Figure("logistic regression on FP32 embeddings of the same rows", default["few_shot8_lr_baseline_top1"], "accuracy"),
        )
        return result
    result |= {key: default[key] for key in ("published_top1", "tfidf_svc_top1", "lr_fp32_top1")}
    write_record(
        "labels",
        result,
        dataset=f"{TITLES[names[0]]}: {default['rows']:,} texts, {default['classes']} classes, "
        f"{default['test_rows']:,} held out",
        ours=Figure(f"served labels' top-1 ({default['published_head']})", default["published_top1"], "accuracy"),
        baseline=Figure("TF-IDF + LinearSVC top-1", default["tfidf_svc_top1"], "accuracy"),
    )
    return result


def print_figures(name: str, figures: dict[str, Any]) -> None:
    if "published_top1" in figures:
        candidates = ", ".join(f"{c} {f['top1']:.4f} ({f['train_s']} s)" for c, f in figures["candidates"].items())
        print(
            f"{name}: {figures['rows']} rows, {figures['classes']} classes, {figures['test_rows']} served: "
            f"published {figures['published_top1']:.4f} ({figures['published_head']}), "
            f"tfidf_svc {figures['tfidf_svc_top1']:.4f}, lr_fp32 {figures['lr_fp32_top1']:.4f}; "
            f"job's held-out candidates: {candidates}; fine-tuning: {figures['fine_tune']}"
        )
        for gate in figures["engine_gates"]:
            print(
                f"{name} label gate {gate['precision']}: {'passed' if gate['passed'] else 'failed'}, held-out accuracy "
                f"{gate['accuracy']} under it vs {gate['accuracy_fp32']} under FP32 on {gate['texts']} rows "
                f"(agreement {gate['agreement']:.4f})"
            )
    if "zero_shot_top1" in figures:
        print(
            f"{name} zero-shot (no labelled row): {figures['zero_shot_top1']:.4f}; nearest bare label "
            f"name {figures['zero_shot_names_baseline_top1']:.4f}"
        )
        print(
            f"{name} {SHOTS}-shot: {figures['few_shot8_top1']:.4f} ({figures['few_shot8_head']}; cross-validated "
            f"candidates {figures['few_shot8_candidates']}); logistic regression on the same rows "
            f"{figures['few_shot8_lr_baseline_top1']:.4f}"
        )
