"""Versions published, rolled back and collected by another process while a real `precompute serve`
searches: every search is answered, whole, from one of the versions, and nothing is a 5xx."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import httpx
import pyarrow.parquet as pq
import pytest

from precompute.demo_data import DEMO_CORPUS
from precompute.stores.vectors import open_vector_store
from precompute.stores.vectors.settings import VectorStoreSettings
from tests.faults.service import V1, published_service
from tests.lookup.test_search import write_version
from tests.waiting import wait_for

pytestmark = pytest.mark.slow  # seconds to minutes each: left out of `pytest -m "not slow"`

V2, V3 = "20261122T010000Z-bbbbbb", "20261123T010000Z-cccccc"


def test_searches_ride_out_publish_rollback_and_collection(
    encoder, settings, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = pq.read_table(DEMO_CORPUS).slice(0, 100).to_pylist()
    stores = VectorStoreSettings(type="edge", path=tmp_path / "qdrant")
    answers: list[tuple[int, str | None]] = []
    stop = threading.Event()

    def search(base: str) -> None:
        with httpx.Client(base_url=base, timeout=30) as http:
            while not stop.is_set():
                answer = http.post("/v1/search", json={"query": rows[7]["title"], "k": 5})
                answers.append((answer.status_code, answer.json().get("version")))

    def served(version: str) -> None:
        seen = len(answers)
        wait_for(lambda: any(v == version for _, v in answers[seen:]), f"searches answered from {version}")

    with published_service(encoder, settings, redis_url, tmp_path, monkeypatch) as (base, _):
        clients = [threading.Thread(target=search, args=(base,)) for _ in range(2)]
        for client in clients:
            client.start()
        try:
            served(V1)
            with open_vector_store(stores, "corpus") as store:
                write_version(stores, V2, rows, encoder)  # published
                served(V2)
                assert store.rollback() == V1
                assert store.collect(1) == []  # V2 stays: the newest other version
                served(V1)
                assert store.rollback(V2) == V2
                assert store.collect(0) == [V1]  # deleted while readers may still name it
                served(V2)
                write_version(stores, V3, rows[:50], encoder)
                assert store.collect(0) == [V2]
                served(V3)
        finally:
            stop.set()
            for client in clients:
                client.join(timeout=60)
        metrics = httpx.get(f"{base}/metrics").text

    assert {status for status, _ in answers} == {200}
    assert {version for _, version in answers} == {V1, V2, V3}
    assert not re.search(r'route="/v1/search",status="5\d\d"', metrics)
