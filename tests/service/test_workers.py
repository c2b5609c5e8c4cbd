"""`precompute serve` with several worker processes: each has its engine and store readers, and
all of them follow the same published versions."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil
import pyarrow.parquet as pq
import pytest

from precompute.demo_data import DEMO_CORPUS
from precompute.stores.vectors.settings import VectorStoreSettings
from tests.faults.service import V1, published_service
from tests.lookup.test_search import write_version
from tests.waiting import wait_for

pytestmark = pytest.mark.slow  # seconds to minutes each: left out of `pytest -m "not slow"`

V2 = "20261122T010000Z-bbbbbb"


def serves(pid: int, version: str) -> bool:
    """The process has the version's shard mapped (an edge reader maps the version it serves, and
    unmaps the one it served before once it switched)."""
    return f"/{version}/" in Path(f"/proc/{pid}/maps").read_text()


def workers_of(server: psutil.Process) -> list[psutil.Process]:
    return [c for c in server.children() if any("spawn_main" in part for part in c.cmdline())]


def both_serve_only(server: psutil.Process, version: str, old: str) -> bool:
    """Listed afresh each time: uvicorn replaces a worker that misses its health check (5 s, which a
    loaded machine can take), and the replacement must follow the pointer too."""
    try:
        workers = workers_of(server)
        return len(workers) == 2 and all(serves(w.pid, version) and not serves(w.pid, old) for w in workers)
    except (FileNotFoundError, ProcessLookupError, psutil.NoSuchProcess):  # a worker went meanwhile
        return False


def test_two_workers_serve_one_port_and_both_follow_a_new_version(
    encoder, settings, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = pq.read_table(DEMO_CORPUS).slice(0, 150).to_pylist()
    query = {"query": rows[120]["title"], "k": 3}
    with published_service(encoder, settings, redis_url, tmp_path, monkeypatch, workers=2) as (base, _):
        server = next(p for p in psutil.Process().children() if "serve" in p.cmdline())
        assert len(workers_of(server)) == 2

        write_version(VectorStoreSettings(type="edge", path=tmp_path / "qdrant"), V2, rows[100:], encoder)
        stop, searched = threading.Event(), []

        def search() -> None:  # a new connection each: the workers take them as the kernel hands them out
            while not stop.is_set():
                answer = httpx.post(f"{base}/v1/search", json=query)
                searched.append((answer.status_code, answer.json()["version"]))

        with ThreadPoolExecutor(4) as pool:
            for _ in range(4):
                pool.submit(search)
            try:
                wait_for(lambda: both_serve_only(server, V2, V1), "both workers to serve V2 and let V1 go")
            finally:
                stop.set()
        assert {status for status, _ in searched} == {200}
        for _ in range(20):  # every answer from now on is V2's, whichever worker gives it
            answer = httpx.post(f"{base}/v1/search", json=query)
            assert answer.json()["version"] == V2

        metrics = httpx.get(f"{base}/metrics").text  # from one worker: the sum over both
        searches = next(
            line
            for line in metrics.splitlines()
            if line.startswith('precompute_request_seconds_count{route="/v1/search",status="200"}')
        )
        assert float(searches.split()[-1]) == len(searched) + 20
