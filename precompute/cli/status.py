"""`precompute status` and `precompute rollback`: each output's versions, whichever store holds them.

An operator asks about an output by its name in the pipeline file and need not know which store
holds it: each output's kind opens its versions (stores/versions.py Versioned).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from precompute.pipeline import Pipeline
from precompute.settings import Machine
from precompute.stores.errors import StoreUnavailableError
from precompute.stores.versions import Version


@dataclass(frozen=True)
class OutputStatus:
    output: str
    kind: str
    store: str
    current: str | None
    versions: list[Version]
    """Oldest first; the published one included (current=True)."""
    unavailable: str | None = None
    """Why the store could not be read, when it could not."""


def status(pipeline: Pipeline, machine: Machine) -> list[OutputStatus]:
    """Every output of the pipeline file, in its order; an output whose store does not answer
    says so (`unavailable`) instead of failing the others."""
    statuses = []
    for name, output in pipeline.declared.items():
        current, versions, unavailable, where = None, [], None, ""
        try:
            with output.kind.versions(output, machine) as store:
                where = store.where
                versions = store.listing()
                current = next((v.name for v in versions if v.current), None)
        except StoreUnavailableError as e:
            unavailable = str(e)
        statuses.append(OutputStatus(name, output.kind.name, where, current, versions, unavailable))
    return statuses


def rollback(pipeline: Pipeline, output: str, to: str | None, machine: Machine) -> str:
    """Publish `to`, by default the version before the published one; return the version now served."""
    declared = pipeline.declared[output]
    with declared.kind.versions(declared, machine) as store:
        return store.rollback(to)


def age(seconds: float) -> str:
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def render(statuses: list[OutputStatus]) -> str:
    """One block per output: the published version first, then the ones a rollback can reach."""
    lines = []
    for s in statuses:
        served = f"serving {s.current}" if s.current else "nothing published"
        lines.append(
            f"{s.output} ({s.kind}, {s.store}): {f'unavailable: {s.unavailable}' if s.unavailable else served}"
        )
        for v in reversed(s.versions):
            mark = "*" if v.current else " "
            lines.append(f"  {mark} {v.name}  {v.count:>9,}  {age(v.age_s):>8} old")
    return "\n".join(lines)


def as_json(statuses: list[OutputStatus]) -> list[dict[str, Any]]:
    return [asdict(s) for s in statuses]
