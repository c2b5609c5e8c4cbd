"""The nightly flow on Prefect's test harness, real Ray, the in-process Qdrant engine, a real redis-server."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from prometheus_client.parser import text_string_to_metric_families

from precompute.flows.nightly import RunFailedError, nightly
from precompute.stores.key_value.records import decode_ranked
from precompute.stores.key_value.settings import RedisSettings
from precompute.stores.key_value.store import KeyValueStore
from precompute.stores.vectors import open_vector_store
from precompute.stores.vectors.settings import VectorStoreSettings
from tests.flows.conftest import CONTENT_RECS, night_environment
from tests.held_records import held_records

pytestmark = pytest.mark.slow  # seconds to minutes each: left out of `pytest -m "not slow"`


@pytest.fixture
def environment(
    settings,
    small_corpus: Path,
    interactions: Path,
    redis_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Path:
    """The flow reads its pipeline file and machine settings from the environment, as in production."""
    pipeline = tmp_path / "precompute.toml"
    pipeline.write_text(CONTENT_RECS.format(corpus=small_corpus, interactions=interactions))
    night_environment(monkeypatch, pipeline, tmp_path, redis_url, settings.machine.cache_dir, "flow")
    monkeypatch.setenv("PRECOMPUTE_ENGINE_GATE_TEXTS", str(settings.policy.gate_texts))
    monkeypatch.setenv("PRECOMPUTE_ENGINE_CALIBRATION_TEXTS", str(settings.policy.calibration_texts))
    return tmp_path


def records(output: str, version: str) -> dict[bytes, bytes]:
    """Every record of a version, read from its buckets."""
    return held_records(RedisSettings(), output, version)


def run_metrics(environment: Path) -> dict[tuple[str, str], float]:
    """The last run's metrics textfile (flows/run_metrics.py), by (name, output)."""
    text = (environment / "work" / "metrics" / "nightly.prom").read_text()
    families = text_string_to_metric_families(text)
    return {(s.name, s.labels.get("output", "")): s.value for family in families for s in family.samples}


def screenshot(page: Path, png: Path) -> Path:
    """The page as headless Chromium draws it (`make test` installs Debian's chromium)."""
    chromium = shutil.which("chromium")
    assert chromium is not None, "chromium is not on PATH: `make test` installs it"
    subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1200,2400",
         f"--screenshot={png}", page.as_uri()],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    return png


def test_nightly_publishes_reuses_collects_garbage_and_isolates_a_failed_output(
    prefect_api,
    ray_local,
    environment: Path,
    small_corpus: Path,
    interactions: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first = nightly(keep_versions=1)
    embeddings, labels, recs = (first["outputs"][o] for o in ("embeddings", "labels", "recs"))
    assert first["failed"] == {}
    assert (embeddings["rows"], embeddings["rejects"], embeddings["computed"], embeddings["reused"]) == (
        204,
        4,
        200,
        0,
    )
    assert embeddings["validation"]["count"] == 200 and embeddings["validation"]["recall_at_10"] >= 0.99
    assert embeddings["validation"]["user_queries"] > 100 and embeddings["validation"]["curve"]
    assert embeddings["validation"]["opening_queries"] > 10  # the held-out texts' opening words
    *refused, served = embeddings["gate"]
    assert served["passed"] and not any(gate["passed"] for gate in refused)
    assert served["precision"].startswith(embeddings["engine"]["precision"])
    assert (labels["items"], labels["rejects"]) == (200, 4) and labels["gate"][-1]["passed"]
    assert recs["users"] > 10 and recs["k"] == 100
    models = recs["validation"]["models"]
    assert models["published"]["ndcg"] > models["most_popular"]["ndcg"]
    saved = json.loads((environment / "work" / "reports" / f"{first['run']}.json").read_text())
    assert saved == first
    with KeyValueStore(RedisSettings()) as store:
        assert store.current("labels") == labels["version"]
        assert store.current("recs") == recs["version"]
    metrics = run_metrics(environment)
    assert metrics[("precompute_run_success", "")] == 1
    assert (
        metrics[("precompute_output_rows", "embeddings")],
        metrics[("precompute_output_rejects", "labels")],
    ) == (
        204,
        4,
    )
    longest = max(len(decode_ranked(value)[0]) for value in records("recs", recs["version"]).values())
    assert 10 < longest <= 100

    second = nightly(keep_versions=1)
    assert (second["outputs"]["embeddings"]["computed"], second["outputs"]["embeddings"]["reused"]) == (
        0,
        200,
    )
    copied = second["outputs"]["embeddings"]["load"]
    assert (copied["mode"], copied["written"], copied["deleted"]) == ("copy", 0, 0)
    assert second["outputs"]["embeddings"]["unchanged_from"] == embeddings["version"]
    carried = second["outputs"]["embeddings"]["validation"]  # the copy's searches are its source's: not measured
    assert carried == {**embeddings["validation"], "carried_from": embeddings["version"]}
    again = second["outputs"]["recs"]
    assert (again["mode"], again["rescored"], again["copied"]) == ("unchanged", 0, recs["users"])
    assert records("recs", again["version"]) == records("recs", recs["version"])

    # Third run: recs see one user gone and one with an item fewer, while labels fail on a corpus
    # whose every row is bad. The failed output keeps its previous version served; the others publish.
    rows = pq.read_table(interactions).to_pylist()
    users = sorted({r["user_id"] for r in rows if sum(o["user_id"] == r["user_id"] for o in rows) >= 2})
    gone, changed = users[:2]
    rows = [r for r in rows if r["user_id"] != gone]
    rows.remove(next(r for r in rows if r["user_id"] == changed))
    pq.write_table(pa.Table.from_pylist(rows), environment / "moved.parquet")
    monkeypatch.setenv("PRECOMPUTE_OUTPUTS__RECS__INPUT__PATH", str(environment / "moved.parquet"))
    corpus = pq.read_table(small_corpus).to_pylist()  # 4 bad rows of 204, and 20 blank texts more
    blank = [{**corpus[0], "id": f"blank-{i}", "text": " "} for i in range(20)]
    broken = environment / "broken.parquet"
    pq.write_table(pa.Table.from_pylist(corpus + blank), broken)
    monkeypatch.setenv("PRECOMPUTE_OUTPUTS__LABELS__INPUT__PATH", str(broken))  # one field, overridden
    with pytest.raises(RunFailedError, match=r"^labels failed at compute: RejectRatioExceededError: 24 of 224"):
        nightly(keep_versions=1)
    third = json.loads(max((environment / "work" / "reports").iterdir()).read_text())
    assert list(third["failed"]) == ["labels"]
    assert third["failed"]["labels"].startswith("compute: RejectRatioExceededError: 24 of 224 rows")
    metrics = run_metrics(environment)
    assert metrics[("precompute_run_success", "")] == 0
    assert (
        metrics[("precompute_output_published", "labels")],
        metrics[("precompute_output_published", "recs")],
    ) == (
        0,
        1,
    )
    page = environment / "work" / "reports" / f"{third['run']}.html"
    html = page.read_text()
    assert (
        "1 output(s) failed" in html
        and "RejectRatioExceededError" in html
        and "Rejected rows by reason" in html
    )
    shot = screenshot(page, environment / "report.png")
    assert shot.stat().st_size > 30_000  # drawn: a blank page is a few kB
    moved = third["outputs"]["recs"]
    assert (moved["mode"], moved["rescored"], moved["copied"]) == ("incremental", 1, recs["users"] - 2)
    before, after = records("recs", again["version"]), records("recs", moved["version"])
    assert gone.encode() not in after and changed.encode() in after
    assert {u: v for u, v in after.items() if u != changed.encode()} == {
        u: v for u, v in before.items() if u not in (gone.encode(), changed.encode())
    }
    versions = [run["outputs"]["embeddings"]["version"] for run in (first, second, third)]
    assert third["outputs"]["embeddings"]["deleted_versions"] == [versions[0]]
    runs = environment / "work" / "runs"
    assert sorted(p.name for p in (runs / "embeddings").iterdir()) == sorted(versions[1:])
    with open_vector_store(VectorStoreSettings(), "corpus") as store:
        assert store.current() == versions[2]
        assert store.versions() == versions[1:]
    with KeyValueStore(RedisSettings()) as store:
        assert store.current("labels") == second["outputs"]["labels"]["version"]
        assert [v.name for v in store.versions("labels")] == [
            run["outputs"]["labels"]["version"] for run in (first, second)
        ]
        assert store.current("recs") == moved["version"]
        assert [v.name for v in store.versions("recs")] == [again["version"], moved["version"]]

    # Fourth run: every user took one package everyone took, and one of their own. Content alone
    # (no popularity prior) ranks by text and loses to most-popular, which the check refuses: the
    # published version stays, and the refused one is deleted whole.
    packages = [r["id"] for r in pq.read_table(small_corpus).to_pylist() if r["id"] not in (None, "dup")]
    everyone = [{"user_id": f"fan{u}", "item_id": item} for u in range(60) for item in (packages[0], packages[u + 1])]
    pq.write_table(pa.Table.from_pylist(everyone), environment / "everyone.parquet")
    monkeypatch.setenv("PRECOMPUTE_OUTPUTS__RECS__INPUT__PATH", str(environment / "everyone.parquet"))
    monkeypatch.setenv("PRECOMPUTE_OUTPUTS__RECS__POPULARITY_WEIGHT", "0")
    monkeypatch.delenv("PRECOMPUTE_OUTPUTS__LABELS__INPUT__PATH")
    with pytest.raises(RunFailedError, match=r"^recs failed at check: QualityError: content's held-out"):
        nightly(keep_versions=1)
    fourth = json.loads(max((environment / "work" / "reports").iterdir()).read_text())
    assert list(fourth["failed"]) == ["recs"] and fourth["outputs"]["labels"]["published"]
    with KeyValueStore(RedisSettings()) as store:
        assert store.current("recs") == moved["version"]
        assert [v.name for v in store.versions("recs")] == [again["version"], moved["version"]]
