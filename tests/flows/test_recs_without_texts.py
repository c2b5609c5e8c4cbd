"""Recommendations and related items over a catalogue of ids: no embeddings output, through the
nightly flow and the service; and item texts that say nothing, which the published blend gives
no weight."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from starlette.testclient import TestClient

from precompute.bench.recs.shop import shop
from precompute.flows.nightly import nightly
from precompute.lookup.settings import ServiceSettings
from precompute.pipeline import load_pipeline
from tests.flows.conftest import night_environment
from tests.lookup.apps import app_of

pytestmark = pytest.mark.slow  # seconds to minutes each: left out of `pytest -m "not slow"`

IDS_ONLY = """
[outputs.shelf]
kind = "recs"
input = { path = "orders.parquet", time = "time", basket = "order_id" }
model = "ease"

[outputs.also]
kind = "related"
input = { path = "orders.parquet", time = "time", basket = "order_id" }
"""
JUNK_TEXT = """
[outputs.products]
kind = "embeddings"
input = { path = "products.parquet" }
store = "products"
engine = { gate_texts = 16, calibration_texts = 16 }

[outputs.shelf]
kind = "recs"
input = { path = "orders.parquet", time = "time", basket = "order_id" }
items = "products"
model = "ease"
"""


def night(folder: Path, pipeline: str, redis_url: str, settings, monkeypatch: pytest.MonkeyPatch) -> dict:
    folder.mkdir()
    items, orders = shop(users=120, seed=3)
    pq.write_table(orders, folder / "orders.parquet")
    words = ["blue", "seven", "window", "quietly", "paper", "river", "noon", "glass"]
    junk = [" ".join(words[(i * 7 + j) % len(words)] for j in range(4)) + f" {i % 13}" for i in range(items.num_rows)]
    pq.write_table(pa.table({"id": items["id"], "text": junk}), folder / "products.parquet")
    (folder / "precompute.toml").write_text(pipeline)
    night_environment(monkeypatch, folder / "precompute.toml", folder, redis_url, settings.machine.cache_dir, "ids")
    monkeypatch.chdir(folder)
    report = nightly()
    assert report["failed"] == {}, report["failed"]
    return report


def test_a_recs_output_of_ids_alone_runs_publishes_and_serves(
    prefect_api, ray_local, settings, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    report = night(tmp_path / "ids", IDS_ONLY, redis_url, settings, monkeypatch)
    shelf = report["outputs"]["shelf"]
    assert shelf["validation"]["published"] == "ease" and shelf["validation"]["target"] == "basket"
    orders = pq.read_table(tmp_path / "ids" / "orders.parquet").to_pylist()
    bought = {}
    for row in orders:
        bought.setdefault(row["user_id"], set()).add(row["item_id"])
    pipeline = load_pipeline(tmp_path / "ids" / "precompute.toml")
    with TestClient(app_of(ServiceSettings(), settings, pipeline=pipeline)) as client:
        answer = client.get("/v1/recs/shelf/u00007")
        assert answer.status_code == 200, answer.text
        listed = [item["id"] for item in answer.json()["items"]]
        assert len(listed) == 10 and set(listed) <= {row["item_id"] for row in orders}
        if shelf["validation"]["repeat"] is not None:  # a shop: the shopper's staples come back
            assert set(listed) & bought["u00007"]
        assert client.get("/v1/recs/shelf/nobody").status_code == 404
        related = client.get("/v1/related/p00007")
        assert related.status_code == 200, related.text
        assert "p00007" not in [item["id"] for item in related.json()["items"]] and related.json()["items"]
        session = client.post("/v1/recs:forItems", json={"ids": ["p00007", "p00012"]})
        assert session.status_code == 200, session.text
        answered = [item["id"] for item in session.json()["items"]]
        assert len(answered) == 10
        if not report["outputs"]["also"]["validation"]["include_seen"]:  # seen auto: the night's choice
            assert not {"p00007", "p00012"} & set(answered)
        assert client.post("/v1/recs:forItems", json={"ids": []}).status_code == 422

    ids_only = shelf["validation"]["models"]["published"]["ndcg"]
    texts = night(tmp_path / "junk", JUNK_TEXT, redis_url, settings, monkeypatch)["outputs"]["shelf"]["validation"]
    # Texts that say nothing: content weighs 0 in the published blend, or costs under 1%.
    assert texts["published"] == "ease" or texts["models"]["published"]["ndcg"] >= 0.99 * ids_only
