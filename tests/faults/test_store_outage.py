"""The service's Redis goes away for ten seconds under load, and comes back with its data."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import httpx
import pytest

from precompute.stores.redis_server import redis_server
from tests.faults.service import V1, published_service

OUTAGE_S = 10.0
REQUESTS = [
    ("GET", "/v1/labels/pkg-1", None),
    ("POST", "/v1/recs:batchGet", {"ids": ["user-1", "user-2"]}),
    ("POST", "/v1/search", {"query": "text editor", "k": 3}),
]


def test_redis_down_ten_seconds_under_load(
    encoder, settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Key lookups answer 503 (never 500, never another version) while Redis is down, search goes
    on, and everything answers 200 from V1 again after it is back, with no restart; the service's
    log says so in two lines."""
    answers: list[tuple[float, str, int, str | None]] = []
    stop = threading.Event()

    def load(base: str) -> None:
        with httpx.Client(base_url=base, timeout=10) as http:
            while not stop.is_set():
                for method, path, body in REQUESTS:
                    answer = http.request(method, path, json=body)
                    answers.append((time.monotonic(), path, answer.status_code, answer.json().get("version")))

    log = tmp_path / "service.log"
    with contextlib.ExitStack() as redis:
        url = redis.enter_context(redis_server(tmp_path / "redis", persistent=True))
        with published_service(encoder, settings, url, tmp_path, monkeypatch, log=log) as (base, _):
            clients = [threading.Thread(target=load, args=(base,)) for _ in range(2)]
            for client in clients:
                client.start()
            time.sleep(2)
            down = time.monotonic()
            redis.close()
            time.sleep(OUTAGE_S)
            restarting = time.monotonic()
            with redis_server(tmp_path / "redis", port=urlparse(url).port, persistent=True):
                up = time.monotonic()
                time.sleep(5)
                stop.set()
                for client in clients:
                    client.join(timeout=30)

    assert {status for _, _, status, _ in answers} <= {200, 503}
    assert {version for _, _, status, version in answers if status == 200} == {V1}
    during = [(path, status) for t, path, status, _ in answers if down + 0.5 < t < restarting]
    assert {status for path, status in during if path != "/v1/search"} == {503}
    assert {status for path, status in during if path == "/v1/search"} == {200}  # Qdrant is not Redis
    after = [status for t, _, status, _ in answers if t > up + 2]
    assert after and set(after) == {200}
    lines = [line for line in log.read_text().splitlines() if " lookup: " in line]
    outage = [line for line in lines if "redis" in line]
    assert len(outage) == 2 and "redis unavailable" in outage[0] and "redis recovered after" in outage[1]
    assert "serving on http://" in lines[0]
