"""`precompute status` and `precompute rollback`: each output's versions, whichever store holds them.

Embeddings live in the vector store (PRECOMPUTE_QDRANT_*), labels and recommendations in
Redis (PRECOMPUTE_REDIS_*); an operator asks about an output by its name in the pipeline file
and need not know which.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from precompute.stores.errors import StoreUnavailableError
from precompute.stores.key_value import KeyValueStore
from precompute.stores.redis_settings import RedisSettings
from precompute.stores.vector_settings import VectorStoreSettings
from precompute.stores.vectors import open_vector_store, version_age

from precompute.pipeline import Pipeline


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
    kind: str
    store: str
    current: str | None
    versions: list[Version]
    """Oldest first; the published one included (current=True)."""
    unavailable: str | None = None
    """Why the store could not be read, when it could not."""


def status(pipeline: Pipeline, vectors: VectorStoreSettings, redis: RedisSettings) -> list[OutputStatus]:
    """Every output of the pipeline file, in its order; an output whose store does not answer
    says so (`unavailable`) instead of failing the others."""
    statuses = []
    now = datetime.now(UTC)
    with KeyValueStore(redis) as key_values:
        for name, output in pipeline.outputs.items():
            current, versions, unavailable = None, [], None
            try:
                if output.kind == "embeddings":
                    settings = pipeline.vector_settings(name, vectors)
                    where = f"qdrant {settings.type}: {settings.name}"
                    with open_vector_store(settings) as store:
                        current = store.current()
                        versions = [
                            Version(v, store.count(v), version_age(v), v == current) for v in store.versions()
                        ]
                else:
                    key = pipeline.store(name)
                    where = f"redis: {redis.prefix}:{key}"
                    versions = [
                        Version(v.name, v.rows, (now - v.created).total_seconds(), v.is_current)
                        for v in key_values.versions(key)
                    ]
                    current = next((v.name for v in versions if v.current), None)
            except StoreUnavailableError as e:
                unavailable = str(e)
            statuses.append(OutputStatus(name, output.kind, where, current, versions, unavailable))
    return statuses


def rollback(
    pipeline: Pipeline, output: str, to: str | None, vectors: VectorStoreSettings, redis: RedisSettings
) -> str:
    """Publish `to`, by default the version before the published one; return the version now served."""
    if pipeline.outputs[output].kind == "embeddings":
        with open_vector_store(pipeline.vector_settings(output, vectors)) as store:
            return store.rollback(to)
    with KeyValueStore(redis) as store:
        return store.rollback(pipeline.store(output), to)


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
