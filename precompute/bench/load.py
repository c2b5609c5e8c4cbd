"""Open-loop load at a fixed rate, with the lightest client Python allows: shared by the latency benches.

Request i is due at start + i/rate, and its latency counts from then, so a late answer
delays no later measurement (no coordinated omission); a thread waits for a due time by
sleeping, then spinning its last SPIN_S. A few threads take the next due
request as they come free. Over HTTP each thread holds one keep-alive connection, sends
prebuilt request bytes on a raw socket and reads the answer by its Content-Length:
http.client parses headers with the email package (tens of microseconds a response), which
on two shared cores would be counted against the service. Debian's `wrk` and `hey` were
passed over: wrk holds no fixed rate, and hey times each request from when it was sent,
not from when it was due.
"""

from __future__ import annotations

import ctypes
import itertools
import json
import socket
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np

CLIENT_THREADS = 4
PR_SET_TIMERSLACK = 29
SPIN_S = 0.0002
"""A client thread sleeps until this long before a request is due, then spins: a sleeping
thread wakes 50-100 us late on these VMs, which would be counted against the service. At
1,000 requests/s the four threads spin a fifth of a core."""

Connect = Callable[[], Callable[[int], bool]]
"""Called once per client thread; returns that thread's `call(i)`, which sends request i
and returns whether it succeeded."""


def precise_sleeps() -> None:
    """Linux lets a sleeping thread wake up to 50 us late (timer slack); 1 ns keeps due times honest."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: sleeps are as precise as the platform makes them


def open_loop(connect: Connect, requests: int, rate: float) -> tuple[np.ndarray, int]:
    """(latency in ms of each request from its due time, failed requests)."""
    latencies = np.zeros(requests)
    failed = [0]
    due_ids = itertools.count()  # next() on a count is atomic under the GIL: a free thread takes the next due
    start = time.perf_counter() + 0.05

    def client() -> None:
        precise_sleeps()
        call = connect()
        while (i := next(due_ids)) < requests:
            due = start + i / rate
            delay = due - time.perf_counter() - SPIN_S
            if delay > 0:
                time.sleep(delay)
            while time.perf_counter() < due:
                pass
            if not call(i):
                failed[0] += 1
            latencies[i] = time.perf_counter() - due

    threads = [threading.Thread(target=client) for _ in range(CLIENT_THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return latencies * 1000, failed[0]


def get(host: str, path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()


def post_json(host: str, path: str, body: object) -> bytes:
    payload = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    )
    return head.encode() + payload


def http(host: str, port: int, requests: Sequence[bytes], bodies: list[bytes] | None = None) -> Connect:
    """Send requests[i] on the thread's connection; keep the answer's body in bodies[i] if given."""

    def connect() -> Callable[[int], bool]:
        sock = socket.create_connection((host, port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def call(i: int) -> bool:
            sock.sendall(requests[i])
            answer = sock.recv(65536)
            while (end := answer.find(b"\r\n\r\n")) < 0:
                answer += sock.recv(65536)
            at = answer.find(b"content-length:", 0, end)
            length = int(answer[at + 15 : answer.find(b"\r\n", at)])
            while len(answer) < end + 4 + length:
                answer += sock.recv(65536)
            if bodies is not None:
                bodies[i] = answer[end + 4 :]
            return answer.startswith(b"HTTP/1.1 200")

        return call

    return connect


def percentiles(latencies: np.ndarray, digits: int = 3) -> dict[str, float]:
    return {
        "p50_ms": round(float(np.median(latencies)), digits),
        "p99_ms": round(float(np.percentile(latencies, 99)), digits),
    }
