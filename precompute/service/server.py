"""Run the lookup service: in the foreground (`precompute serve`) or as a child process (demo, bench).

The child is a separate process, as in production: its latency is not shared with the
caller's interpreter, and it reads the published version from the store like any reader.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import uvicorn
from pydantic_settings import BaseSettings
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from precompute.lookup.metrics import MULTIPROCESS_DIR
from precompute.lookup.settings import ServiceSettings
from precompute.pipeline import Pipeline

READY_TIMEOUT_S = 300


class HeadersTooLargeError(Exception):
    """Raised from the parser's header callback: the request is answered 431 and closed."""


@functools.cache
def header_limits() -> tuple[int, int]:
    """(max_headers, max_header_bytes) of this worker, read once from its PRECOMPUTE_SERVICE_*
    variables (serve sets them before uvicorn starts a worker)."""
    settings = ServiceSettings()
    return settings.max_headers, settings.max_header_bytes


class DeadlineHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol (llhttp, in C) with a deadline on each request's head (request line and headers):
    uvicorn's keep-alive timeout (ServiceSettings.request_timeout_s), from the connection's
    opening or its previous answer; and a bound on the head's header fields, their count and
    their bytes, past which it answers 431.

    uvicorn closes an idle keep-alive connection only between requests, and every byte received
    restarts that timer: a client that connects and sends nothing, or sends its headers a byte at
    a time, would hold a socket (and a file descriptor) for as long as it likes. llhttp bounds
    neither the number of headers nor their size, so a head of many or huge headers would be
    held in memory whole and handed to the app.
    """

    _deadline: asyncio.TimerHandle | None = None
    _headers = 0
    _header_bytes = 0
    _too_large: str | None = None

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._headers, self._header_bytes, self._too_large = 0, 0, None

    def on_header(self, name: bytes, value: bytes) -> None:
        max_headers, max_bytes = header_limits()
        self._headers += 1
        self._header_bytes += len(name) + len(value)
        if self._headers > max_headers:
            self._too_large = f"more than {max_headers} header fields"
        elif self._header_bytes > max_bytes:
            self._too_large = f"header fields over {max_bytes} bytes"
        if self._too_large is not None:
            raise HeadersTooLargeError(self._too_large)  # llhttp stops parsing; uvicorn answers, below
        super().on_header(name, value)

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request the parser gave up on: 431 where a bound on headers stopped it."""
        if self._too_large is None:
            super().send_400_response(msg)
            return
        body = f'{{"error":"request header fields too large: {self._too_large}"}}'.encode()
        head = [STATUS_LINE[431]]
        for name, value in self.server_state.default_headers:
            head.extend([name, b": ", value, b"\r\n"])
        head.extend(
            [
                b"content-type: application/json\r\n",
                b"content-length: " + str(len(body)).encode("ascii") + b"\r\n",
                b"connection: close\r\n\r\n",
                body,
            ]
        )
        self.transport.write(b"".join(head))
        self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # asyncio sets TCP_NODELAY only on sockets whose proto is IPPROTO_TCP, and the socket
        # uvicorn binds for several workers has proto 0: without this, Nagle holds each answer's
        # second segment for the client's delayed ACK, which capped two workers' rate
        # (`precompute bench capacity`).
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._deadline is not None and self.cycle is not None and not self.cycle.response_complete:
            self._deadline.cancel()  # the head is in: the app reads the body, under its own deadline
            self._deadline = None

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.cycle is None or self.cycle.response_complete:  # no pipelined request started
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        if not self.transport.is_closing():
            self._deadline = self.loop.call_later(self.timeout_keep_alive, self.transport.close)


def serve(settings: ServiceSettings, pipeline: Pipeline | None = None) -> None:
    """Serve in the foreground, in `settings.workers` processes sharing the port; the log
    (address, versions, store outages) goes to stderr. Each worker builds its app from the
    PRECOMPUTE_* variables (the pipeline's path among them): its own engine and store readers,
    following the same published versions."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.update(as_environment(settings))
    if pipeline is not None:
        os.environ["PRECOMPUTE_PIPELINE"] = str(pipeline.path)
    with tempfile.TemporaryDirectory(prefix="precompute-metrics-") as metrics:
        if settings.workers > 1:  # before the workers import prometheus_client (lookup/metrics.py)
            os.environ[MULTIPROCESS_DIR] = metrics
        uvicorn.run(
            "precompute.service.app:create_app",
            factory=True,
            workers=settings.workers,
            host=settings.host,
            port=settings.port,
            loop="uvloop",
            http=DeadlineHttpProtocol,
            timeout_keep_alive=settings.request_timeout_s,  # type: ignore[arg-type]  # a float works: call_later
            limit_concurrency=settings.max_connections,
            log_level="warning",
        )


def as_environment(*settings: BaseSettings) -> dict[str, str]:
    """Settings objects as the PRECOMPUTE_* variables that rebuild them in a child process."""
    env = {}
    for group in settings:
        prefix = group.model_config["env_prefix"]
        for name, value in group.model_dump().items():
            if value is not None:
                env[f"{prefix}{name.upper()}"] = str(value)
    return env


@contextmanager
def running(
    settings: ServiceSettings,
    *others: BaseSettings,
    pipeline: Pipeline | None = None,
    log: Path | None = None,
) -> Iterator[str]:
    """Start `precompute serve` with these settings (and pipeline file), wait until /readyz is 200,
    yield its base URL. `log`: a file for its output (default: this process's stderr)."""
    env = {**os.environ, **as_environment(settings, *others)}
    if pipeline is not None:
        env["PRECOMPUTE_PIPELINE"] = str(pipeline.path)
    output = open(log, "ab") if log is not None else None
    child = subprocess.Popen(
        [sys.executable, "-m", "precompute", "serve"], env=env, stdout=output, stderr=output
    )
    base = f"http://{settings.host}:{settings.port}"
    deadline = time.monotonic() + READY_TIMEOUT_S
    try:
        while True:
            try:
                if httpx.get(f"{base}/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or child.poll() is not None:
                raise RuntimeError(f"the lookup service at {base} did not become ready")
            time.sleep(0.2)
        yield base
    finally:
        child.terminate()
        child.wait(timeout=30)
        if output is not None:
            output.close()
