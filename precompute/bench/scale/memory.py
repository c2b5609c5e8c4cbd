"""Peak memory of a run, for `precompute bench scale`: the driver, each Ray process kind, Redis, Qdrant's disk.

RSS and USS are polled (psutil, every 0.5 s, by a process of its own) over this process and all
its descendants (Ray's raylet and workers are children of the driver that started Ray locally),
keeping the maximum per process title: Ray names a worker after what it runs (`ray::EmbedActor`,
`ray::IDLE`), so the peak of each actor pool is one line. A peak shorter than the poll interval
can be missed.

RSS counts the pages of Ray's shared object store that a worker maps when it reads a block
zero-copy, so it grows with the blocks a process has touched, not only with what it holds. USS
(the pages only this process maps) does not exclude the store either: Linux counts a page as
private by how many processes map it, not by how it was mapped, so the blocks a worker wrote
into the store and nobody has read yet are in its USS, and a materialized dataset's blocks stay
there (measured: a task's 50 MB result, 47 MB of its USS, until the object is freed). So each
kind's peak USS is split: `own` outside the object store's mapping (`/dev/shm/plasma*`), what
"per-actor memory" means here, and `store`, the store's pages only that process maps, which the
store's capacity bounds on the node, not the process (Ray spills past it).
"""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys
from pathlib import Path
from types import TracebackType

import psutil
import redis

POLL_S = 0.5
"""USS reads /proc/<pid>/smaps: a few ms a process."""

MAPPING = re.compile(r"^[0-9a-f]+-[0-9a-f]+ ")
OBJECT_STORE = "/dev/shm/plasma"


def private_kb(pid: int) -> tuple[int, int]:
    """(USS, the part of it in Ray's object store) in KB, from one read of /proc/<pid>/smaps."""
    total = store = 0
    in_store = False
    with open(f"/proc/{pid}/smaps") as smaps:
        for line in smaps:
            if MAPPING.match(line):
                in_store = OBJECT_STORE in line
            elif line.startswith(("Private_Clean:", "Private_Dirty:")):
                kb = int(line.split()[1])
                total += kb
                store += kb if in_store else 0
    return total, store


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


IDLE = "ray::IDLE"
Peaks = dict[str, int]


class PeakRss:
    """Context manager: `driver`, `by_title` (RSS), `uss_by_title`, `own_by_title` (USS outside
    the object store) and `store_by_title` (USS in it) hold the peaks in bytes seen while it was
    open. An idle worker holds what its last task left, so it is named after the last title it
    was seen under (`ray::IDLE after Write`).

    Polled by a process of its own, not a thread of the flow's driver: reading a Ray worker's
    smaps (about 15,000 lines with torch loaded) takes about 9 ms of Python (9 processes: 79 ms
    a poll), all of it holding the driver's GIL, every POLL_S. With the thread, the bench timed a
    1M rerun's interactions validation at 0.10-0.14 s, where the same call on that run's own state
    took 32 ms alone."""

    def __init__(self) -> None:
        self.driver = 0
        self.by_title: Peaks = {}
        self.uss_by_title: Peaks = {}
        self.own_by_title: Peaks = {}
        self.store_by_title: Peaks = {}
        self._poller: subprocess.Popen[str] | None = None

    def __enter__(self) -> PeakRss:
        command = [sys.executable, "-m", "precompute.bench.scale.memory", str(os.getpid())]
        self._poller = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        assert self._poller is not None
        peaks, _ = self._poller.communicate()  # closes its stdin: the poller's signal to report and exit
        self.driver, self.by_title, self.uss_by_title, self.own_by_title, self.store_by_title = json.loads(peaks)


def poll_peaks(root: int) -> tuple[int, Peaks, Peaks, Peaks, Peaks]:
    """Every POLL_S until stdin closes: the peak RSS of `root`, and the peaks per title of its
    descendants (this process left out)."""
    driver, ran, rss_peak = psutil.Process(root), {}, 0
    by_title: Peaks = {}
    uss: Peaks = {}
    own: Peaks = {}
    store: Peaks = {}
    while True:
        rss_peak = max(rss_peak, driver.memory_info().rss)
        for child in driver.children(recursive=True):
            if child.pid == os.getpid():
                continue
            try:
                rss = child.memory_info().rss
                uss_kb, store_kb = private_kb(child.pid)
            except (psutil.Error, OSError):
                continue
            name = title(child)
            if not rss:
                continue  # caught while starting or exiting, its title half-written
            if name != IDLE:
                ran[child.pid] = name
            elif child.pid in ran:
                name = f"{IDLE} after {ran[child.pid].removeprefix('ray::')}"
            for kept, value in ((by_title, rss), (uss, uss_kb * 1024), (own, (uss_kb - store_kb) * 1024), (store, store_kb * 1024)):
                kept[name] = max(kept.get(name, 0), value)
        if select.select([sys.stdin], [], [], POLL_S)[0]:  # closed: the run is over
            return rss_peak, by_title, uss, own, store


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


if __name__ == "__main__":  # PeakRss's poller: python -m precompute.bench.scale.memory <driver pid>
    print(json.dumps(poll_peaks(int(sys.argv[1]))))
