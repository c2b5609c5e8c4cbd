"""Deleting key-value versions: whole, paced, and never the published one (KeyValueStore's GC).

Deletion first moves a version out of the registry into `dropping`, in one script that refuses
the published version; publish switches only to a registered version, in one script too
(key_value.py FLIP). So a version being deleted is never published, and the published one is
never deleted. A version's buckets are then UNLINKed a hundred a round trip, found from its
registered bucket count rather than by KEYS or SCAN, then its meta; its `dropping` entry goes last, so a
deletion interrupted by a crash is finished by the next collection. A claimed version that a
registered overlay holds as its base (key_value_overlay.py) waits in `dropping` until none does.
"""

from __future__ import annotations

import json
import time

from precompute.stores.errors import StoreError, VersionNotFoundError
from precompute.stores.key_value.scripts import CLAIM
from precompute.stores.key_value.settings import Client, OutputKeys, RedisSettings, unavailable_as_store_error
from precompute.stores.versions import check_version

UNLINK_CHUNK = 100
"""Keys per UNLINK round trip: freeing a hundred small hashes holds Redis only briefly."""
GC_PAUSE = 1.0
"""After each UNLINK round trip the collector sleeps this many times as long as it took: flat
out, it takes the CPU that Redis and its readers need on shared cores, and a concurrent
reader's p99 grows several times (`precompute bench publish` measures it)."""


def doomed(client: Client, settings: RedisSettings, keys: OutputKeys, keep: int) -> list[str]:
    """Claim every version but the published one and the `keep` newest others that were published
    once (rollback targets); return those claimed.

    A version older than the published one that never was published is a failed or interrupted
    run's: it is claimed whatever `keep` says. Newer unpublished ones are runs in progress and stay.
    """
    if keep < 0:
        raise ValueError(f"keep must be >= 0, got {keep}")
    with unavailable_as_store_error(settings):
        pointer, names, published = (
            client.pipeline(transaction=False)
            .get(keys.pointer)
            .hkeys(keys.registry)
            .hkeys(keys.published)
            .execute()
        )
    current = pointer.decode() if pointer is not None else None
    ever = {name.decode() for name in published}
    others = sorted(name.decode() for name in names if name.decode() != current)
    abandoned = [v for v in others if v not in ever and current is not None and v < current]
    targets = [v for v in others if v in ever]
    claimed = []
    for version in abandoned + targets[: max(len(targets) - keep, 0)]:
        if claim(client, settings, keys, version) == 1:  # refused (kept) if a rollback published it
            claimed.append(version)
    return claimed


def finish_deletions(client: Client, settings: RedisSettings, keys: OutputKeys) -> list[str]:
    """Delete every claimed version's keys, those an interrupted run left too, but a base a
    registered overlay still holds; return those deleted, oldest first."""
    with unavailable_as_store_error(settings):
        dropping = sorted(name.decode() for name in client.hkeys(keys.dropping))
    return [version for version in dropping if purge(client, settings, keys, version)]


def drop(client: Client, settings: RedisSettings, keys: OutputKeys, version: str) -> None:
    """Delete one unpublished version whole (e.g. a failed run's)."""
    claimed = claim(client, settings, keys, check_version(version))
    if claimed == 0:
        raise StoreError(
            f"version {version!r} of output {keys.output!r} is published; publish or roll back first"
        )
    if claimed < 0:
        raise VersionNotFoundError(f"version {version!r} of output {keys.output!r} does not exist")
    purge(client, settings, keys, version)  # a base an overlay holds waits for a later collection


def claim(client: Client, settings: RedisSettings, keys: OutputKeys, version: str) -> int:
    """1: moved to `dropping`; 0: published, kept; -1: not registered."""
    with unavailable_as_store_error(settings):
        return client.eval(
            CLAIM, 5, keys.pointer, keys.registry, keys.dropping, keys.published, keys.bases, version
        )


def purge(client: Client, settings: RedisSettings, keys: OutputKeys, version: str) -> bool:
    """UNLINK every bucket of a claimed version and its meta, then forget it; False, and nothing
    deleted, while a registered overlay holds it as its base. No overlay can take it as its base
    from here on (key_value.py CREATE), so it stays free once found free."""
    with unavailable_as_store_error(settings):
        raw, bases = client.pipeline(transaction=False).hget(keys.dropping, version).hvals(keys.bases).execute()
        if raw is None:  # another process finished it
            return True
        if version.encode() in bases:
            return False
        buckets = json.loads(raw)["buckets"]
        for start in range(0, buckets, UNLINK_CHUNK):
            began = time.perf_counter()
            pipe = client.pipeline(transaction=False)
            for bucket in range(start, min(start + UNLINK_CHUNK, buckets)):
                pipe.unlink(keys.bucket(version, bucket))
            pipe.execute()
            time.sleep((time.perf_counter() - began) * GC_PAUSE)
        client.unlink(keys.meta(version))
        client.hdel(keys.dropping, version)
    return True
