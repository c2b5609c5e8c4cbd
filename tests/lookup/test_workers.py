"""`precompute serve` with several worker processes: each has its engine and store readers, and
all of them follow the same published versions."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import psutil
import pyarrow.parquet as pq
import pytest

from precompute.demo_data import DEMO_CORPUS
from precompute.stores.vector_settings import VectorStoreSettings
from tests.faults.service import published_service
from tests.lookup.test_search import write_version

V2 = "20261122T010000Z-bbbbbb"
POINTER_CHECK_S = 0.5
"""How stale an edge store reader's view of the pointer may be (stores/qdrant_edge_store.py)."""


def test_two_workers_serve_one_port_and_both_follow_a_new_version(
    encoder, settings, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = pq.read_table(DEMO_CORPUS).slice(0, 150).to_pylist()
    with published_service(encoder, settings, redis_url, tmp_path, monkeypatch, workers=2) as (base, _):
        server = next(p for p in psutil.Process().children() if "serve" in p.cmdline())
        workers = [c for c in server.children() if any("spawn_main" in part for part in c.cmdline())]
        assert len(workers) == 2

        write_version(VectorStoreSettings(type="edge", path=tmp_path / "qdrant"), V2, rows[100:], encoder)
        time.sleep(2 * POINTER_CHECK_S)
        versions = set()
        for _ in range(20):  # a new connection each: the workers take them as the kernel hands them out
            answer = httpx.post(f"{base}/v1/search", json={"query": rows[120]["title"], "k": 3})
            assert answer.status_code == 200, answer.text
            versions.add(answer.json()["version"])
        assert versions == {V2}

        metrics = httpx.get(f"{base}/metrics").text  # from one worker: the sum over both
        searches = next(
            line
            for line in metrics.splitlines()
            if line.startswith('precompute_request_seconds_count{route="/v1/search",status="200"}')
        )
        assert float(searches.split()[-1]) == 20
