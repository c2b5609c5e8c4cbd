"""Two models per kind from one pipeline file, end to end: the bundled encoder next to a tiny random
32-d one, a label head trained on the corpus next to a classifier folder. The nightly flow publishes
all four, the service answers each by name with its own model, `precompute status` lists each."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from starlette.testclient import TestClient

from flows.nightly import nightly
from lookup.app import create_app
from lookup.settings import ServiceSettings
from precompute.outputs import status
from precompute.pipeline import load_pipeline
from stores.redis_settings import RedisSettings
from stores.vector_settings import VectorStoreSettings
from stores.vectors import open_vector_store
from tests.models.tiny import HIDDEN, LABELS, tiny_classifier, tiny_encoder

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
engine = {{ gate_texts = 16, calibration_texts = 16 }}

[outputs.topics]
kind = "labels"
input = {{ path = "{corpus}", max_reject_ratio = 0.05 }}
classifier = {{ path = "{classifier}" }}
top = 2
engine = {{ gate_texts = 16, calibration_texts = 16 }}
"""


@pytest.fixture
def pipeline_file(
    settings, small_corpus: Path, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Path:
    path = tmp_path / "precompute.toml"
    path.write_text(
        PIPELINE.format(
            corpus=small_corpus,
            encoder=tiny_encoder(tmp_path / "tiny-encoder", "bert"),
            classifier=tiny_classifier(tmp_path / "tiny-classifier"),
        )
    )
    env = {
        "PRECOMPUTE_PIPELINE": str(path),
        "PRECOMPUTE_REDIS_URL": redis_url,
        "PRECOMPUTE_REDIS_PREFIX": f"own{tmp_path.name}",
        "PRECOMPUTE_JOB_WORK_DIR": str(tmp_path / "work"),
        "PRECOMPUTE_QDRANT_PATH": str(tmp_path / "qdrant"),
        "PRECOMPUTE_ENGINE_CACHE_DIR": str(settings.cache_dir),
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
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
        "topics": "labels",
    }
    assert outputs["minilm"]["computed"] == outputs["tiny"]["computed"] == 200

    pipeline = load_pipeline(pipeline_file)
    listed = {s.output: s for s in status(pipeline, VectorStoreSettings(), RedisSettings())}
    assert {name: s.current for name, s in listed.items()} == {
        name: outputs[name]["version"] for name in outputs
    }
    assert all(s.versions[-1].count == 200 for s in listed.values())

    rows = [r for r in pq.read_table(small_corpus).to_pylist() if r["id"] not in (None, "dup")][:200]
    sections = {r["section"] for r in rows}
    target = rows[7]
    app = create_app(ServiceSettings(warmup_queries=1), settings, pipeline=pipeline)
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
        theirs = client.get(f"/v1/labels/topics/{target['id']}").json()
        assert {label["label"] for label in theirs["labels"]} <= set(LABELS) and len(theirs["labels"]) == 2
        assert client.get("/v1/labels/nope/x").status_code == 404

    for name, dim in (("minilm", 384), ("tiny", HIDDEN)):
        with open_vector_store(pipeline.vector_settings(name, VectorStoreSettings())) as store:
            assert store.meta(outputs[name]["version"])["dim"] == dim
