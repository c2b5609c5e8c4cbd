"""A run's log file.

Prefect, Ray and the jobs log to the terminal by default, and a failure arrives there as pages
of framed tracebacks with the cause inside a Ray or Prefect wrapper. `precompute run` sends all
of that, tracebacks included, to one file per run and prints its own lines instead: one per
output, one per failure (flows/failures.py).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO


@contextmanager
def output_to_file(directory: Path) -> Iterator[tuple[Path, TextIO, TextIO]]:
    """Send everything this process and its children write to stdout and stderr (Python logging,
    Ray's C++ core, ONNX Runtime, progress bars) to a new log file under `directory`, at the file
    descriptor level; yield (its path, the terminal's stdout and stderr for the command's own lines)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"run-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{os.getpid()}.log"
    sys.stdout.flush()
    sys.stderr.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    out, err = (os.fdopen(os.dup(fd), "w", buffering=1) for fd in (1, 2))
    with open(path, "ab", buffering=0) as log:
        for fd in saved:
            os.dup2(log.fileno(), fd)
        try:
            yield path, out, err
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            # What logs at exit (Prefect stopping its temporary server, its events worker still
            # flushing: a WARNING) is no line for the user; an error still is.
            for name in ("", "prefect"):
                logging.getLogger(name).setLevel(logging.ERROR)
            for fd, original in saved.items():
                os.dup2(original, fd)
                os.close(original)
            out.close()
            err.close()
