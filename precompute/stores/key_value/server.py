"""A throwaway redis-server on a free port: for the tests, the benchmark and the demo on a fresh machine.

Nothing is persisted (`--save ''`, no AOF): the server lives as long as the `with` block.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis

from precompute.stores.errors import StoreError

START_TIMEOUT_S = 10.0
CLUSTER_SLOTS = 16384


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def redis_server(
    directory: Path, port: int | None = None, cluster: bool = False, persistent: bool = False
) -> Iterator[str]:
    """Start redis-server, yield its URL once it answers PING, terminate it on exit.

    `port` reuses a known port (a test restarting "the same" server, `persistent` with its
    data); `cluster` starts a one-node Redis Cluster owning every slot, which enforces the same
    cross-slot rules as a real cluster.
    """
    executable = shutil.which("redis-server")
    if executable is None:
        raise StoreError("redis-server is not on PATH; install it with: apt-get install -y redis-server")
    port = port or free_port()
    directory.mkdir(parents=True, exist_ok=True)
    log = directory / f"redis-{port}.log"
    args = [executable, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory)]
    # persistent: every write reaches the append-only file before its reply, as a Redis that
    # must survive a restart is configured; a restart on the same directory reads it back.
    durability = ["--appendonly", "yes", "--appendfsync", "always"] if persistent else ["--appendonly", "no"]
    args += ["--save", "", *durability, "--daemonize", "no", "--logfile", str(log)]
    if cluster:
        # The bus port defaults to port + 10000, which may be taken or past 65535.
        args += ["--cluster-enabled", "yes", "--cluster-port", str(free_port())]
        args += ["--cluster-config-file", f"nodes-{port}.conf"]
    process = subprocess.Popen(args, stdin=subprocess.DEVNULL)
    try:
        with wait_for_ping(process, port, log) as client:
            if cluster:
                own_all_slots(client)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.terminate()
        try:
            process.wait(timeout=START_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wait_for_ping(process: subprocess.Popen[bytes], port: int, log: Path) -> redis.Redis:
    client = redis.Redis(port=port, socket_timeout=1.0)
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if process.poll() is not None:
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise StoreError(f"redis-server on port {port} exited with code {process.returncode}:\n{tail}")
        try:
            client.ping()
            return client
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                raise StoreError(
                    f"redis-server on port {port} did not answer PING in {START_TIMEOUT_S:g} s"
                ) from None
            time.sleep(0.02)


def own_all_slots(client: redis.Redis) -> None:
    if not int(client.execute_command("CLUSTER INFO").get("cluster_slots_assigned", 0)):
        client.execute_command("CLUSTER ADDSLOTSRANGE", 0, CLUSTER_SLOTS - 1)
    deadline = time.monotonic() + START_TIMEOUT_S
    while client.execute_command("CLUSTER INFO").get("cluster_state") != "ok":
        if time.monotonic() > deadline:
            raise StoreError(f"the one-node cluster did not turn ok in {START_TIMEOUT_S:g} s")
        time.sleep(0.02)
