"""Labels from a taxonomy through the nightly flow: corrections that override the model on every
night they are in the file (and stop when removed), and a few-shot head from eight rows a label."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from starlette.testclient import TestClient

from precompute.demo_data import DEMO_CORPUS
from precompute.flows.nightly import nightly
from precompute.lookup.settings import ServiceSettings
from precompute.models.labels.few_shot import simplest_within_error
from precompute.models.labels.training import CandidateReport
from precompute.pipeline import load_pipeline
from tests.flows.conftest import LANGUAGES, night_environment
from tests.lookup.apps import app_of

pytestmark = pytest.mark.slow  # a night of one output each, a minute or so

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
    night_environment(monkeypatch, path, tmp_path, redis_url, settings.machine.cache_dir, "fix")
    return path


def served(settings, path: Path, ids: list[str]) -> dict[str, tuple[str, float]]:
    """Each id's top served label and its score."""
    app = app_of(ServiceSettings(warmup_queries=1), settings, pipeline=load_pipeline(path))
    top = {}
    with TestClient(app) as client:
        for start in range(0, len(ids), 500):  # the most a call may ask
            answer = client.post("/v1/labels/languages:batchGet", json={"ids": ids[start : start + 500]})
            assert answer.status_code == 200, answer.text
            top |= {item["id"]: (item["labels"][0]["label"], item["labels"][0]["score"]) for item in answer.json()["results"]}
    return top


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


def test_eight_rows_a_label_publish_the_few_shot_head_chosen_on_its_folds(
    prefect_api, ray_local, settings, environment: Path, tmp_path: Path
) -> None:
    """The demo corpus's packages of the five languages, eight of each labelled with their
    language: the head the folds chose publishes, and labels the other rows."""
    table = pq.read_table(DEMO_CORPUS, columns=["id", "text", "section"])
    table = table.filter(pc.is_in(table["section"], pa.array(CODED)))
    sections = np.array(table["section"].to_pylist(), dtype=object)
    rng = np.random.default_rng(0)  # not the file's first rows: the demo corpus is ordered by split slot
    labelled = {int(i) for name in CODED for i in rng.choice(np.flatnonzero(sections == name), 8, replace=False)}
    language = [section if i in labelled else None for i, section in enumerate(sections)]
    corpus = tmp_path / "few.parquet"
    pq.write_table(table.append_column("language", pa.array(language, pa.string())), corpus)
    environment.write_text(FEW_SHOT.format(corpus=corpus))
    report = nightly()
    assert report["failed"] == {}
    training = report["outputs"]["languages"]["head_training"]
    assert {c["name"] for c in training["candidates"]} == {"zero-shot", "few-shot", "rows-only"}
    assert "cross-validated" in training["note"] and training["rows"] >= 30  # 40, less the gate's slot
    reports = [CandidateReport(**c) for c in training["candidates"]]
    assert training["chosen"] == simplest_within_error(reports, training["rows"]).name
    unlabelled = [r for r, label in zip(table.to_pylist(), language, strict=True) if label is None]
    top = served(settings, environment, [r["id"] for r in unlabelled])
    assert len(unlabelled) > 500 and np.mean([top[r["id"]][0] == r["section"] for r in unlabelled]) >= 0.7
