"""Peak memory of a run, for `precompute bench scale`: the driver, each Ray process kind, Redis, Qdrant's disk.

RSS and USS are polled (psutil, every 0.5 s) over this process and all its descendants (Ray's
raylet and workers are children of the driver that started Ray locally), keeping the maximum per
process title: Ray names a worker after what it runs (`ray::EmbedActor`, `ray::IDLE`), so the
peak of each actor pool is one line. A peak shorter than the poll interval can be missed.

RSS counts the pages of Ray's shared object store that a worker maps when it reads a block
zero-copy, so it grows with the blocks a process has touched, not only with what it holds; USS
(the pages only this process maps) is its own memory: what "per-actor memory" means here.
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path
from types import TracebackType

import psutil
import redis

POLL_S = 0.5
"""USS reads /proc/<pid>/smaps: a few ms a process."""


def title(process: psutil.Process) -> str:
    """A Ray worker by what it runs (`ray::EmbedActor` for `ray::MapWorker(MapBatches(EmbedActor))`,
    `ray::ReadFilesParquetV2` for a fused read, `ray::IDLE`); another process by its executable."""
    try:
        cmdline = process.cmdline()
        first = cmdline[0] if cmdline else process.name()
    except psutil.Error:
        return "?"
    if not first.startswith("ray::"):
        return Path(first.split()[0]).name if first else process.name()
    name = first.removeprefix("ray::").removeprefix("MapWorker(").removeprefix("MapBatches(")
    return "ray::" + re.split(r"[ .(]|->", name, maxsplit=1)[0].rstrip(")")


class PeakRss:
    """Context manager: `driver`, `by_title` (RSS) and `uss_by_title` hold the peaks in bytes seen
    while it was open."""

    def __init__(self) -> None:
        self.driver = 0
        self.by_title: dict[str, int] = {}
        self.uss_by_title: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="peak-rss", daemon=True)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()

    def _poll(self) -> None:
        me = psutil.Process(os.getpid())
        while True:
            self.driver = max(self.driver, me.memory_info().rss)
            for child in me.children(recursive=True):
                try:
                    memory = child.memory_full_info()
                except psutil.Error:
                    continue
                name = title(child)
                if not memory.rss:
                    continue  # caught while starting or exiting, its title half-written
                self.by_title[name] = max(self.by_title.get(name, 0), memory.rss)
                self.uss_by_title[name] = max(self.uss_by_title.get(name, 0), memory.uss)
            if self._stop.wait(POLL_S):
                return


def redis_used_memory(url: str) -> int:
    with redis.Redis.from_url(url) as client:
        return int(client.info("memory")["used_memory"])


def disk_bytes(path: Path) -> int:
    """Bytes allocated on disk under `path` (what `du` counts)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                continue
    return total
