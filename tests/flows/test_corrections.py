"""Labels from a taxonomy through the nightly flow: corrections that override the model on every
night they are in the file (and stop when removed), and a few-shot head from eight rows a label."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from starlette.testclient import TestClient

from precompute.flows.nightly import nightly
from precompute.lookup.settings import ServiceSettings
from precompute.pipeline import load_pipeline
from tests.lookup.apps import app_of

pytestmark = pytest.mark.slow  # a night of one output each, a minute or so

LANGUAGES = """
labels = [
    {{ label = "perl", description = "the Perl programming language and its modules" }},
    {{ label = "python", description = "the Python programming language and its modules" }},
    {{ label = "ocaml", description = "the OCaml programming language and its libraries" }},
    {{ label = "java", description = "the Java programming language and its libraries" }},
    {{ label = "golang", description = "the Go programming language and its packages" }},
    "documentation",
]
top = 1
engine = {{ gate_texts = 16, calibration_texts = 16 }}
"""
ZERO_SHOT = """
[outputs.languages]
kind = "labels"
input = {{ path = "{corpus}", max_reject_ratio = 0.05 }}
""" + LANGUAGES
CORRECTED = ZERO_SHOT + 'corrections = {{ path = "{corrections}" }}\n'
FEW_SHOT = """
[outputs.languages]
kind = "labels"
input = {{ path = "{corpus}", label = "language", max_reject_ratio = 0.05 }}
fine_tune_seconds = 0
""" + LANGUAGES
CODED = ("perl", "python", "ocaml", "java", "golang")


@pytest.fixture
def environment(settings, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The pipeline file's path, and the variables a night and the service read."""
    path = tmp_path / "precompute.toml"
    env = {
        "PRECOMPUTE_PIPELINE": str(path),
        "PRECOMPUTE_REDIS_URL": redis_url,
        "PRECOMPUTE_REDIS_PREFIX": f"fix{tmp_path.name}",
        "PRECOMPUTE_JOB_WORK_DIR": str(tmp_path / "work"),
        "PRECOMPUTE_QDRANT_PATH": str(tmp_path / "qdrant"),
        "PRECOMPUTE_ENGINE_CACHE_DIR": str(settings.machine.cache_dir),
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return path


def served(settings, path: Path, ids: list[str]) -> dict[str, tuple[str, float]]:
    """Each id's top served label and its score."""
    app = app_of(ServiceSettings(warmup_queries=1), settings, pipeline=load_pipeline(path))
    with TestClient(app) as client:
        answer = client.post("/v1/labels/languages:batchGet", json={"ids": ids})
        assert answer.status_code == 200, answer.text
        return {item["id"]: (item["labels"][0]["label"], item["labels"][0]["score"]) for item in answer.json()["results"]}


def test_a_correction_serves_on_every_night_it_is_in_the_file_and_the_models_label_returns_without_it(
    prefect_api, ray_local, settings, small_corpus: Path, environment: Path, tmp_path: Path
) -> None:
    rows = [r for r in pq.read_table(small_corpus).to_pylist() if r["id"] not in (None, "dup", "empty-text")]
    first, second = rows[10]["id"], rows[11]["id"]
    environment.write_text(ZERO_SHOT.format(corpus=small_corpus))
    assert nightly()["failed"] == {}
    model = served(settings, environment, [first, second])
    wrong = next(name for name in CODED if name != model[first][0])  # a label the model does not give

    corrections = tmp_path / "corrections.parquet"
    environment.write_text(CORRECTED.format(corpus=small_corpus, corrections=corrections))
    pq.write_table(pa.table({"id": [first, second], "label": [wrong, model[second][0]]}), corrections)
    report = nightly()
    assert report["failed"] == {}
    assert report["outputs"]["languages"]["corrections"] == {"rows": 2, "model_agrees": 1}
    assert served(settings, environment, [first, second]) == {first: (wrong, 1.0), second: (model[second][0], 1.0)}

    pq.write_table(pa.table({"id": [second], "label": [model[second][0]]}), corrections)
    report = nightly()
    assert report["failed"] == {}
    assert report["outputs"]["languages"]["corrections"] == {"rows": 1, "model_agrees": 1}
    now = served(settings, environment, [first, second])
    assert now[first] == model[first] and now[second] == (model[second][0], 1.0)  # the model's own label is back


def test_eight_rows_a_label_publish_the_few_shot_head_that_wins_on_its_folds(
    prefect_api, ray_local, settings, small_corpus: Path, environment: Path, tmp_path: Path
) -> None:
    table = pq.read_table(small_corpus)
    seen: dict[str, int] = {}
    language = []
    for section in table["section"].to_pylist():
        seen[section] = seen.get(section, 0) + 1
        language.append(section if section in CODED and seen[section] <= 8 else None)
    corpus = tmp_path / "few.parquet"
    pq.write_table(table.append_column("language", pa.array(language, pa.string())), corpus)
    environment.write_text(FEW_SHOT.format(corpus=corpus))
    report = nightly()
    assert report["failed"] == {}
    training = report["outputs"]["languages"]["head_training"]
    found = {c["name"]: c["accuracy"] for c in training["candidates"]}
    assert set(found) == {"zero-shot", "few-shot", "rows-only"} and "cross-validated" in training["note"]
    assert found[training["chosen"]] == max(found.values())
    unlabelled = [
        r for r, label in zip(table.to_pylist(), language, strict=True)
        if label is None and r["section"] in CODED and r["id"] not in (None, "dup", "empty-text")
    ]
    top = served(settings, environment, [r["id"] for r in unlabelled])
    assert np.mean([top[r["id"]][0] == r["section"] for r in unlabelled]) >= 0.6
