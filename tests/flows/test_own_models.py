"""Two models per kind from one pipeline file, end to end: the bundled encoder next to a tiny random
32-d one (saved by the installed sentence-transformers itself), a label head trained on the corpus next to a classifier folder (and a head over the tiny
encoder that gives several labels per row, from a list column, and zero-shot labels from a
list of label names and descriptions, no label column), and recommendations from
a user's own two towers (ONNX files over features Parquets). The nightly flow publishes all five,
the service answers each by name with its own model, `precompute status` lists each."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from starlette.testclient import TestClient

from precompute.cli.status import status
from precompute.flows.nightly import nightly
from precompute.lookup.settings import ServiceSettings
from precompute.pipeline import load_pipeline
from precompute.settings import Machine
from precompute.stores.vectors import open_vector_store
from precompute.stores.vectors.settings import VectorStoreSettings
from tests.flows.conftest import LANGUAGES, night_environment
from tests.lookup.apps import app_of
from tests.models.tiny import HIDDEN, LABELS, saved_by_sentence_transformers, tiny_classifier, tiny_towers

pytestmark = pytest.mark.slow  # seconds to minutes each: left out of `pytest -m "not slow"`

PIPELINE = """
[outputs.minilm]
kind = "embeddings"
input = {{ path = "{corpus}", max_reject_ratio = 0.05 }}
store = "minilm"
engine = {{ gate_texts = 16, calibration_texts = 16 }}

[outputs.tiny]
kind = "embeddings"
input = {{ path = "{corpus}", max_reject_ratio = 0.05 }}
model = {{ path = "{encoder}", pooling = "mean" }}
store = "tiny"
engine = {{ gate_texts = 16, calibration_texts = 16 }}

[outputs.sections]
kind = "labels"
input = {{ path = "{corpus}", label = "section", max_reject_ratio = 0.05 }}
train_texts = 400
fine_tune_seconds = 0
engine = {{ gate_texts = 16, calibration_texts = 16 }}

[outputs.tags]
kind = "labels"
input = {{ path = "{tagged}", label = "tags", max_reject_ratio = 0.05 }}
model = {{ path = "{encoder}", pooling = "mean" }}
top = 3
# 200 rows hold out 20 to compare on: this output shows several labels per row and a fine-tuned
# encoder's candidates, not their quality.
max_baseline_loss = 1.0
fine_tune_seconds = 30
engine = {{ gate_texts = 16, calibration_texts = 16 }}

[outputs.topics]
kind = "labels"
input = {{ path = "{corpus}", max_reject_ratio = 0.05 }}
classifier = {{ path = "{classifier}" }}
top = 2
engine = {{ gate_texts = 16, calibration_texts = 16 }}

[outputs.languages]
kind = "labels"
input = {{ path = "{corpus}", max_reject_ratio = 0.05 }}
""" + LANGUAGES + """
[outputs.picks]
kind = "recs"
input = {{ path = "{interactions}" }}
items = "tiny"
model = "towers"
towers = {{ user = "towers/user.onnx", item = "towers/item.onnx", users = {{ path = "users.parquet" }}, items = {{ path = "items.parquet" }} }}
# Random towers: the popularity prior ranks, so the quality gate has something to pass.
popularity_weight = 5.0
min_lift = 0.5
"""


def tagged(corpus: Path, folder: Path) -> Path:
    """The corpus with a list of tags per row: its section, and "library" or "documentation"
    where its id says so (a third of the rows have two)."""
    table = pq.read_table(corpus)
    tags = [
        [section, *(["library"] if str(id_).startswith("lib") else []), *(["documentation"] if str(id_).endswith("-doc") else [])]
        for id_, section in zip(table["id"].to_pylist(), table["section"].to_pylist(), strict=True)
    ]
    path = folder / "tagged.parquet"
    pq.write_table(table.append_column("tags", pa.array(tags, pa.list_(pa.string()))), path)
    return path


def behaviour(corpus: Path, folder: Path) -> Path:
    """Interactions skewed to the first items (so most-popular has signal), and each user's and
    item's features for the tiny towers."""
    ids = [r["id"] for r in pq.read_table(corpus).to_pylist() if r["id"] not in (None, "dup", "empty-text")]
    rng = np.random.default_rng(5)
    users = [f"user{n}" for n in range(60)]
    rows = [
        {"user_id": user, "item_id": ids[int(i)], "timestamp": t}
        for user in users
        for t, i in enumerate(np.unique(np.minimum(rng.zipf(1.5, size=6), len(ids)) - 1))
    ]
    pq.write_table(pa.Table.from_pylist(rows), folder / "interactions.parquet")
    pq.write_table(
        pa.table(
            {
                "id": users,
                "age": rng.uniform(18, 80, len(users)),
                "taste": rng.normal(size=(len(users), 8)).tolist(),
            }
        ),
        folder / "users.parquet",
    )
    pq.write_table(
        pa.table(
            {"id": ids, "category": rng.integers(0, 10, len(ids)), "price": rng.uniform(1, 100, len(ids))}
        ),
        folder / "items.parquet",
    )
    tiny_towers(folder / "towers")
    return folder / "interactions.parquet"


@pytest.fixture
def pipeline_file(
    settings, small_corpus: Path, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Path:
    path = tmp_path / "precompute.toml"
    path.write_text(
        PIPELINE.format(
            corpus=small_corpus,
            encoder=saved_by_sentence_transformers(tmp_path / "tiny-encoder"),
            classifier=tiny_classifier(tmp_path / "tiny-classifier"),
            tagged=tagged(small_corpus, tmp_path),
            interactions=behaviour(small_corpus, tmp_path),
        )
    )
    night_environment(monkeypatch, path, tmp_path, redis_url, settings.machine.cache_dir, "own")
    return path


def test_two_models_per_kind_are_published_and_served_by_name(
    prefect_api, ray_local, settings, small_corpus: Path, pipeline_file: Path
) -> None:
    report = nightly()
    assert report["failed"] == {}
    outputs = report["outputs"]
    assert {name: outputs[name]["kind"] for name in outputs} == {
        "minilm": "embeddings",
        "tiny": "embeddings",
        "sections": "labels",
        "tags": "labels",
        "topics": "labels",
        "languages": "labels",
        "picks": "recs",
    }
    towers = outputs["picks"]["towers"]
    passing = [gate for gate in towers["gates"] if gate["passed"]]
    fastest = min(gate["seconds"] for gate in passing)  # auto's rule (the report rounds seconds)
    assert towers["precision"] in {gate["precision"] for gate in passing if gate["seconds"] == fastest}
    assert outputs["picks"]["towers"]["users_without_features"] == 0
    # The own towers, with the content part where it ranks the held-out items better (jobs/recs/quality.py).
    assert outputs["picks"]["validation"]["published"] in {"towers", "towers+content"}
    assert outputs["minilm"]["computed"] == outputs["tiny"]["computed"] == 200
    assert outputs["languages"]["head_training"]["chosen"] == "zero-shot"
    # A few rows a tag (200 rows, 60 tags): the few-shot head, the tiny encoder fine-tuned on
    # pairs of rows in each fold (tests/models/labels cover the held-out path's candidates).
    tags = outputs["tags"]["head_training"]
    assert all(fold["steps"] > 0 for fold in tags["fine_tune"]["folds"])
    assert {c["name"] for c in tags["candidates"]} == {"zero-shot", "few-shot", "rows-only", "fine-tuned"}

    pipeline = load_pipeline(pipeline_file)
    listed = {s.output: s for s in status(pipeline, Machine.from_environment())}
    assert {name: s.current for name, s in listed.items()} == {
        name: outputs[name]["version"] for name in outputs
    }
    assert all(s.versions[-1].count == 200 for name, s in listed.items() if name != "picks")
    assert listed["picks"].versions[-1].count == 60

    rows = [r for r in pq.read_table(small_corpus).to_pylist() if r["id"] not in (None, "dup")][:200]
    sections = {r["section"] for r in rows}
    target = rows[7]
    app = app_of(ServiceSettings(warmup_queries=1), settings, pipeline=pipeline)
    with TestClient(app) as client:
        ready = client.get("/readyz").json()
        assert set(ready["engines"]) == {"minilm", "tiny"}
        assert ready["versions"] == {name: outputs[name]["version"] for name in outputs}

        for name in ("minilm", "tiny"):
            answer = client.post(f"/v1/search/{name}", json={"query": target["text"], "k": 3})
            assert answer.status_code == 200, answer.text
            assert answer.json()["version"] == outputs[name]["version"]
            assert answer.json()["hits"][0]["id"] == target["id"]  # its own text, embedded by its own model

        ours = client.get(f"/v1/labels/sections/{target['id']}").json()
        assert {label["label"] for label in ours["labels"]} <= sections and len(ours["labels"]) == 3
        tags = client.post("/v1/labels/tags:batchGet", json={"ids": [r["id"] for r in rows]}).json()
        assert tags["missing"] == []
        given = [[label["label"] for label in item["labels"]] for item in tags["results"]]
        assert {tag for labels in given for tag in labels} <= sections | {"library", "documentation"}
        assert any(len(labels) > 1 for labels in given) and all(len(labels) <= 3 for labels in given)
        # Zero-shot: no label column; the rows of the five languages' sections mostly get their own
        # language (chance among the six labels: 1 in 6).
        coded = [r for r in rows if r["section"] in ("perl", "python", "ocaml", "java", "golang")]
        languages = client.post("/v1/labels/languages:batchGet", json={"ids": [r["id"] for r in coded]}).json()
        top = [item["labels"][0]["label"] for item in languages["results"]]
        assert languages["version"] == outputs["languages"]["version"] and len(top) == len(coded) > 40
        assert np.mean([label == r["section"] for label, r in zip(top, coded, strict=True)]) >= 0.6, top
        theirs = client.get(f"/v1/labels/topics/{target['id']}").json()
        assert {label["label"] for label in theirs["labels"]} <= set(LABELS) and len(theirs["labels"]) == 2
        assert client.get("/v1/labels/nope/x").status_code == 404
        picks = client.get("/v1/recs/picks/user0")
        assert picks.status_code == 200, picks.text
        assert len(picks.json()["items"]) == 10

    for name, dim in (("minilm", 384), ("tiny", HIDDEN)):
        with open_vector_store(VectorStoreSettings(), pipeline.declared[name].store) as store:
            assert store.meta(outputs[name]["version"])["dim"] == dim
