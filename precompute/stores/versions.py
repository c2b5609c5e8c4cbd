"""What every store's versions share: their names, and how an operator lists and rolls them back.

A version is named by its UTC creation time and a random suffix, so names sort by age and
two runs never collide. `Versioned` is what `precompute status` and `rollback` read, whichever
store holds an output: the vector store (vectors.py) and one output of the key-value store
(key_value.py `KeyValueStore.output`) both implement it.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

VERSION_TIME = "%Y%m%dT%H%M%SZ"
"""Versions start with their UTC creation time, so names sort by age."""
_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def new_version() -> str:
    return f"{datetime.now(UTC):{VERSION_TIME}}-{uuid.uuid4().hex[:6]}"


def version_age(version: str) -> float:
    """Seconds since a version made by `new_version` was created."""
    created = datetime.strptime(version.split("-")[0], VERSION_TIME).replace(tzinfo=UTC)
    return (datetime.now(UTC) - created).total_seconds()


def check_version(version: str) -> str:
    """Versions become key parts, directory and collection names: refuse anything else (no `..`, no `/`)."""
    if not isinstance(version, str) or not _VERSION.match(version) or ".." in version:
        raise ValueError(f"version {version!r} is not a valid version name (letters, digits, '_', '-', '.')")
    return version


@dataclass(frozen=True)
class Version:
    name: str
    count: int
    """Points (vectors) or records (key-value) the version holds."""
    age_s: float
    current: bool


class Versioned(Protocol):
    """One output's versions in its store, as an operator sees them."""

    where: str
    """The store and the name the output has there, for people (no address, no secret)."""

    def current(self) -> str | None:
        """The published version, None before the first publish."""
        ...

    def listing(self) -> list[Version]:
        """Every version, oldest first, the published one marked."""
        ...

    def rollback(self, to: str | None = None) -> str:
        """Publish `to` (default: the newest version before the published one); return it."""
        ...
