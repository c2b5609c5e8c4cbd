"""Hostile HTTP against a real `precompute serve`: every answer is a 4xx (or 200), never a 500,
and clients that send slowly or not at all hold no socket past the request deadline."""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Iterator
from urllib.parse import urlparse

import httpx
import pytest

from tests.faults.service import V1, published_service

DEADLINE_S = 1.0


@pytest.fixture(scope="module")
def base(encoder, settings, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with (
        pytest.MonkeyPatch.context() as monkeypatch,
        published_service(
            encoder,
            settings,
            redis_url,
            tmp_path_factory.mktemp("hostile"),
            monkeypatch,
            request_timeout_s=DEADLINE_S,
            max_body_bytes=65_536,
        ) as (url, _),
    ):
        yield url


def connect(base: str) -> socket.socket:
    where = urlparse(base)
    return socket.create_connection((where.hostname, where.port), timeout=10)


def closed_by_server(sock: socket.socket, within_s: float) -> bool:
    """True once the server closes the connection (EOF or reset), False if it is still open after `within_s`."""
    sock.settimeout(within_s)
    try:
        while sock.recv(4096):
            pass  # an answer (408 or 400) before the close is fine
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/v1/search", b'{"query": ' + b"[" * 5000 + b"]" * 5000 + b"}", 400),
        ("/v1/labels:batchGet", b"[" * 100_000, 413),
        ("/v1/recs:batchGet", b'{"ids": ' + b"[" * 2000 + b"]" * 2000 + b"}", 400),
        ("/v1/search", b'{"query": "x", "filter": {"section\\u0000": "python"}}', 422),
        ("/v1/search", b'{"query": "x", "filter": {"section": 99999999999999999999999}}', 422),
        ("/v1/search", b"\xff\xfe\x00", 400),
    ],
)
def test_hostile_bodies_are_4xx(base: str, path: str, body: bytes, status: int) -> None:
    answer = httpx.post(base + path, content=body, headers={"content-type": "application/json"})
    assert answer.status_code == status, answer.text


def sized(length: int) -> bytes:
    """A batch body of exactly `length` bytes (its one id is too long to look up: 422 once read)."""
    head, tail = b'{"ids": ["', b'"]}'
    return head + b"x" * (length - len(head) - len(tail)) + tail


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
def test_a_body_of_exactly_max_body_bytes_is_read_and_one_byte_more_is_413(base: str, declared: bool) -> None:
    """max_body_bytes (65,536 here) is the largest body read, whether its length is declared or
    only found by reading the chunks."""
    for length, status in ((65_536, 422), (65_537, 413)):
        body = sized(length)
        content = body if declared else iter([body[:1000], body[1000:]])
        answer = httpx.post(base + "/v1/recs:batchGet", content=content, headers={"content-type": "application/json"})
        assert answer.status_code == status, (length, answer.text)


def test_an_oversize_body_is_refused_unread(base: str) -> None:
    with connect(base) as sock:
        sock.sendall(b"POST /v1/search HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n\r\n{")
        assert sock.recv(4096).startswith(b"HTTP/1.1 413")


@pytest.mark.parametrize(
    "item", ["*", "%2A%7B%7D", "a%0D%0ASET%20x%201", "%00", "pkg-1%0D%0A", "..%2F..%2Fetc%2Fpasswd"]
)
def test_hostile_ids_are_answered_not_interpreted(base: str, item: str) -> None:
    answer = httpx.get(f"{base}/v1/labels/{item}")
    assert answer.status_code == 404, answer.text
    batch = httpx.post(f"{base}/v1/recs:batchGet", json={"ids": ["*", "{x}", "a\r\nSET x 1", "user-1"]})
    assert batch.status_code == 200 and batch.json()["missing"] == ["*", "{x}", "a\r\nSET x 1"]


def test_idle_half_open_and_byte_by_byte_clients_are_cut_off(base: str) -> None:
    idle = [connect(base) for _ in range(300)]  # connect, send nothing
    half = [connect(base) for _ in range(20)]
    for sock in half:
        sock.sendall(b"GET /v1/labels/pkg-1 HTTP/1.1\r\nHost: x\r\n")  # the head never ends
    slow = connect(base)
    request = b"GET /v1/labels/pkg-1 HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"x" * 300 + b"\r\n\r\n"
    sent = 0
    try:
        for byte in request:  # one byte every 0.1 s: the head would take half a minute
            slow.sendall(bytes([byte]))
            sent += 1
            time.sleep(0.1)
    except (BrokenPipeError, ConnectionResetError):
        pass
    assert sent < len(request)  # cut off mid-head, not answered
    assert closed_by_server(slow, DEADLINE_S)
    for sock in [*idle, *half]:
        assert closed_by_server(sock, 5 * DEADLINE_S)
        sock.close()
    slow.close()
    answer = httpx.get(f"{base}/v1/labels/pkg-1")  # and the service serves on
    assert answer.status_code == 200 and answer.json()["version"] == V1


def test_a_body_that_never_ends_is_408(base: str) -> None:
    with connect(base) as sock:
        sock.sendall(b"POST /v1/search HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        sock.settimeout(5 * DEADLINE_S)
        assert sock.recv(4096).startswith(b"HTTP/1.1 408")


@pytest.mark.parametrize(
    ("headers", "why"),
    [
        ([(f"x-h{n}", "1") for n in range(65)], b"more than 64 header fields"),
        ([("x-big", "a" * 20_000)], b"header fields over 16384 bytes"),
        ([(f"x-h{n}", "b" * 400) for n in range(50)], b"header fields over 16384 bytes"),
    ],
    ids=["count", "one-large", "many-medium"],
)
def test_too_many_or_too_large_headers_are_431_and_the_connection_closed(
    base: str, headers: list[tuple[str, str]], why: bytes
) -> None:
    """The defaults: at most 64 fields and 16 KiB of them (ServiceSettings), refused before the app."""
    with connect(base) as sock:
        head = "".join(f"{name}: {value}\r\n" for name, value in headers)
        sock.sendall(f"GET /v1/labels/pkg-1 HTTP/1.1\r\nHost: x\r\n{head}\r\n".encode())
        answer = b""
        sock.settimeout(10)
        while chunk := sock.recv(65_536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 431 ") and why in answer  # and then closed: recv gave b""
    assert httpx.get(f"{base}/v1/labels/pkg-1", headers={f"x-h{n}": "1" for n in range(50)}).status_code == 200


def test_the_service_never_answered_500(base: str) -> None:
    """Every answer is counted where the app ends (lookup/metrics.py), a crash's 500 included."""
    metrics = httpx.get(f"{base}/metrics").text
    assert {'status="400"', 'status="404"', 'status="413"', 'status="422"'} <= set(
        re.findall(r'status="\d+"', metrics)
    )  # the hostile requests above were counted
    assert 'status="500"' not in metrics
