"""Vectors of texts kept in a file by each text's digest, so that a gate whose held-out texts
moved by a few since the last night encodes those few, not all of them again: a small change
of the corpus moves few of its gate texts, and gating the whole ladder of graphs and the FP32
reference again on every text was a large share of an incremental night (`precompute bench
scale`, its engines stage).

A text's vector is the one it had when first encoded, in whatever batch it came: dynamic INT8
sets its ranges per batch, so it may differ from a fresh encoding in the last digits, as it
does between a night's batches anyway.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

KEPT = 4096
"""Vectors a file keeps: the latest call's texts, then the most recent others (a night's
outputs may gate one engine on the texts of different inputs)."""

log = logging.getLogger(__name__)


def text_digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def vectors_of(path: Path, texts: list[str], encode: Callable[[list[str]], np.ndarray]) -> np.ndarray:
    """float32 [len(texts), dim] in order: the vectors `path` holds by digest, the others
    `encode`d (called only when some are missing) and added to it."""
    digests = [text_digest(t) for t in texts]
    held = read(path)
    missing = {d: t for d, t in zip(digests, texts, strict=True) if d not in held}
    if missing:
        held.update(zip(missing, encode(list(missing.values())), strict=True))
        write(path, [*digests, *held], held)
    return np.stack([held[d] for d in digests]).astype(np.float32, copy=False)


def read(path: Path) -> dict[str, np.ndarray]:
    """The file's vectors by digest, most recent first; none if it is missing or unreadable."""
    try:
        with np.load(path) as saved:
            return dict(zip(saved["digests"].tolist(), saved["vectors"], strict=True))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:
        log.warning("text vectors %s unreadable (%s): encoding its texts again", path, e)
        return {}


def write(path: Path, order: list[str], held: dict[str, np.ndarray]) -> None:
    """The first KEPT of `order` (digests, repeats ignored), replacing the file at once: a reader,
    another job's actor, sees the old file or the new one."""
    kept = list(dict.fromkeys(order))[:KEPT]
    tmp = tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", delete=False)
    try:
        with tmp:
            np.savez(tmp, digests=np.array(kept), vectors=np.stack([held[d] for d in kept]))
        os.replace(tmp.name, path)
    finally:
        Path(tmp.name).unlink(missing_ok=True)  # a write that failed leaves no file behind
