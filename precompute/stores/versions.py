"""What every store's versions share: their names, and one output's versions through a night and after.

A version is named by its UTC creation time and a random suffix, so names sort by age and
two runs never collide. `Versioned` is one output's versions in its store, whichever store that
is: a night publishes, drops and collects through it (flows/lifecycle.py), and `precompute
status` and `rollback` read it. The vector store (vectors/store.py) and one output of the
key-value store (key_value/versions.py OutputVersions) implement it.
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

    def versions(self) -> list[str]:
        """Every stored version's name, oldest first."""
        ...

    def listing(self) -> list[Version]:
        """Every version, oldest first, the published one marked, with its size and age."""
        ...

    def rollback(self, to: str | None = None) -> str:
        """Publish `to` (default: the newest version before the published one); return it."""
        ...

    def publish(self, version: str) -> None:
        """Make a written and checked version the one readers see, in one atomic switch."""
        ...

    def drop(self, version: str) -> None:
        """Delete an unpublished version whole (a failed night's); never the published one."""
        ...

    def collect(self, keep: int) -> list[str]:
        """Delete all but the published version and the `keep` newest others (rollback targets),
        with what a failed night left; return the deleted ones, oldest first."""
        ...
