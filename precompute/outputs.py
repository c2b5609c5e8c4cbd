"""`precompute status` and `precompute rollback`: the three outputs' versions, whichever store holds them.

Embeddings live in the vector store (PRECOMPUTE_QDRANT_*), labels and recommendations in
Redis (PRECOMPUTE_REDIS_*); an operator asks about an output by name and need not know which.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from stores.key_value import KeyValueStore
from stores.redis_settings import RedisSettings
from stores.vector_settings import VectorStoreSettings
from stores.vectors import open_vector_store, version_age

Output = Literal["embeddings", "labels", "recs"]
OUTPUTS: tuple[Output, ...] = ("embeddings", "labels", "recs")


@dataclass(frozen=True)
class Version:
    name: str
    count: int
    """Points (embeddings) or records (labels, recs) the version holds."""
    age_s: float
    current: bool


@dataclass(frozen=True)
class OutputStatus:
    output: str
    store: str
    current: str | None
    versions: list[Version]
    """Oldest first; the published one included (current=True)."""


def status(vectors: VectorStoreSettings, redis: RedisSettings) -> list[OutputStatus]:
    with open_vector_store(vectors) as store:
        current = store.current()
        embeddings = [Version(v, store.count(v), version_age(v), v == current) for v in store.versions()]
    statuses = [OutputStatus("embeddings", f"qdrant ({vectors.type})", current, embeddings)]
    now = datetime.now(UTC)
    with KeyValueStore(redis) as store:
        for output in ("labels", "recs"):
            versions = [
                Version(v.name, v.rows, (now - v.created).total_seconds(), v.is_current)
                for v in store.versions(output)
            ]
            current = next((v.name for v in versions if v.current), None)
            statuses.append(OutputStatus(output, "redis", current, versions))
    return statuses


def rollback(output: Output, to: str | None, vectors: VectorStoreSettings, redis: RedisSettings) -> str:
    """Publish `to`, by default the version before the published one; return the version now served."""
    if output == "embeddings":
        with open_vector_store(vectors) as store:
            return store.rollback(to)
    with KeyValueStore(redis) as store:
        return store.rollback(output, to)


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
        lines.append(
            f"{s.output} ({s.store}): " + (f"serving {s.current}" if s.current else "nothing published")
        )
        for v in reversed(s.versions):
            mark = "*" if v.current else " "
            lines.append(f"  {mark} {v.name}  {v.count:>9,}  {age(v.age_s):>8} old")
    return "\n".join(lines)


def as_json(statuses: list[OutputStatus]) -> list[dict[str, Any]]:
    return [asdict(s) for s in statuses]
