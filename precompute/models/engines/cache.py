"""A directory of built artifacts (exports, quantized graphs, engines), each keyed by what made it.

An entry is built in a private temporary directory and renamed into place, so a reader
never sees half an engine and two processes building the same key do not corrupt it:
the second rename fails and its copy is dropped.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

KEY_FILE = "key.json"


@dataclass(frozen=True)
class CacheEntry:
    path: Path
    hit: bool
    """True when the entry was already there and nothing was built."""


def key_digest(key: Mapping[str, str]) -> str:
    return hashlib.sha256(json.dumps(dict(key), sort_keys=True).encode()).hexdigest()[:16]


class EngineCache:
    def __init__(self, root: Path) -> None:
        self.root = root

    def keys(self) -> list[dict[str, str]]:
        """The key of every entry: what `precompute check` reports as built."""
        return [key for _, key in self.entries("*")]

    def entries(self, kind: str) -> list[tuple[Path, dict[str, str]]]:
        """(directory, key) of every entry of `kind`: what a lookup by likeness rather than by key searches."""
        return [
            (path.parent, json.loads(path.read_text()))
            for path in sorted(self.root.glob(f"{kind}-*/{KEY_FILE}"))
        ]

    def find(self, kind: str, key: Mapping[str, str]) -> Path | None:
        """The entry for `key` if it was built, without building it."""
        path = self._path(kind, key)
        return path if (path / KEY_FILE).exists() else None

    def get_or_build(self, kind: str, key: Mapping[str, str], build: Callable[[Path], None]) -> CacheEntry:
        """Return the entry for `key`, calling `build(directory)` only if it does not exist yet."""
        final = self._path(kind, key)
        if (final / KEY_FILE).exists():
            return CacheEntry(final, hit=True)
        self.root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{kind}-", dir=self.root))
        try:
            build(staging)
            (staging / KEY_FILE).write_text(json.dumps(dict(key), indent=2, sort_keys=True))
            os.rename(staging, final)
        except OSError:
            if not (final / KEY_FILE).exists():
                raise
            # Another process finished the same key first: its entry is as good as ours.
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return CacheEntry(final, hit=False)

    def _path(self, kind: str, key: Mapping[str, str]) -> Path:
        return self.root / f"{kind}-{key_digest(key)}"
