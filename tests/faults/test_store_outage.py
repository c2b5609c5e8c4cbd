"""The service's Redis goes away under load, and comes back with its data."""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from urllib.parse import urlparse

import httpx
import pytest

from precompute.stores.key_value.server import redis_server
from tests.faults.service import V1, published_service
from tests.waiting import wait_for

pytestmark = pytest.mark.slow  # seconds to minutes each: left out of `pytest -m "not slow"`

OUTAGE_ANSWERS = 60
"""Key lookups answered 503 while Redis is down, before it comes back: seconds of load."""
REQUESTS = [
    ("GET", "/v1/labels/pkg-1", None),
    ("POST", "/v1/recs:batchGet", {"ids": ["user-1", "user-2"]}),
    ("POST", "/v1/search", {"query": "text editor", "k": 3}),
]


def test_redis_down_under_load_then_back(
    encoder, settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Key lookups answer 503 (never 500, never another version) while Redis is down, search goes
    on, and everything answers 200 from V1 again after it is back, with no restart; the service's
    log says so in two lines."""
    answers: list[tuple[str, int, str | None]] = []
    stop = threading.Event()

    def load(base: str) -> None:
        with httpx.Client(base_url=base, timeout=10) as http:
            while not stop.is_set():
                for method, path, body in REQUESTS:
                    answer = http.request(method, path, json=body)
                    answers.append((path, answer.status_code, answer.json().get("version")))

    def stop_clients() -> None:
        stop.set()
        for client in clients:
            client.join(timeout=30)

    def lookups(since: int, status: int) -> int:
        return sum(1 for path, got, _ in answers[since:] if path != "/v1/search" and got == status)

    log = tmp_path / "service.log"
    with contextlib.ExitStack() as redis:
        url = redis.enter_context(redis_server(tmp_path / "redis", persistent=True))
        with published_service(encoder, settings, url, tmp_path, monkeypatch, log=log) as (base, _):
            clients = [threading.Thread(target=load, args=(base,)) for _ in range(2)]
            for client in clients:
                client.start()
            try:
                wait_for(lambda: lookups(0, 200) >= 20, "lookups answered before the outage")
                redis.close()
                first_503 = wait_for(
                    lambda: next((i for i, a in enumerate(answers) if a[1] == 503), None), "the first 503"
                )
                wait_for(lambda: lookups(first_503, 503) >= OUTAGE_ANSWERS, "lookups answered during the outage")
                restarting = len(answers)
                with redis_server(tmp_path / "redis", port=urlparse(url).port, persistent=True):
                    recovered = wait_for(
                        lambda: next(
                            (i for i, a in enumerate(answers[restarting:]) if a[1] == 200 and a[0] != "/v1/search"),
                            None,
                        ),
                        f"a lookup answered again (service log: {log})",
                    )
                    back = restarting + recovered + len(clients) * len(REQUESTS)  # the requests in flight then
                    wait_for(lambda: len(answers) >= back + 60, "answers after the recovery")
                    stop_clients()  # while Redis is up: what they answer after is not the test's
            except AssertionError as e:
                tail = "\n".join(log.read_text().splitlines()[-20:]) if log.exists() else "(no log)"
                raise AssertionError(f"{e}; last answers {answers[-6:]}; the service's log ends:\n{tail}") from None
            finally:
                stop_clients()

    assert {status for _, status, _ in answers} <= {200, 503}
    assert {version for _, status, version in answers if status == 200} == {V1}
    during = answers[first_503:restarting]
    assert {status for path, status, _ in during if path != "/v1/search"} == {503}
    assert {status for path, status, _ in during if path == "/v1/search"} == {200}  # Qdrant is not Redis
    assert {status for _, status, _ in answers[back:]} == {200}
    lines = [line for line in log.read_text().splitlines() if " lookup: " in line]
    outage = [line for line in lines if "redis" in line]
    assert len(outage) == 2 and "redis unavailable" in outage[0] and "redis recovered after" in outage[1]
    assert "serving on http://" in lines[0]
