"""Deleting key-value versions: whole, paced, and never the published one (KeyValueStore's GC).

Deletion first moves a version out of the registry into `dropping`, in one script that refuses
the published version; publish switches only to a registered version, in one script too
(key_value.py FLIP). So a version being deleted is never published, and the published one is
never deleted. A version's buckets are then UNLINKed a hundred a round trip, found from its
registered bucket count rather than by KEYS or SCAN, then its meta; its `dropping` entry goes last, so a
deletion interrupted by a crash is finished by the next collection.
"""

from __future__ import annotations

import json
import time

from precompute.stores.errors import StoreError, VersionNotFoundError
from precompute.stores.redis_settings import Client, OutputKeys, RedisSettings, unavailable_as_store_error
from precompute.stores.versions import check_version

CLAIM = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return 0 end
local entry = redis.call('HGET', KEYS[2], ARGV[1])
if not entry then return -1 end
redis.call('HSET', KEYS[3], ARGV[1], entry)
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
return 1
"""
"""KEYS pointer, registry, dropping, published; ARGV version. Move an unpublished version to `dropping`:
its entry stays there until its last key is gone, so an interrupted deletion is finished later."""

UNLINK_CHUNK = 100
"""Keys per UNLINK round trip: freeing a hundred small hashes holds Redis only briefly."""
GC_PAUSE = 1.0
"""After each UNLINK round trip the collector sleeps this many times as long as it took: flat
out, it takes the CPU that Redis and its readers need on shared cores, and a concurrent
reader's p99 grows several times (`bench publish` measures it; README, "Known limits")."""


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
    """Delete every claimed version's keys, those an interrupted run left too; return them, oldest first."""
    with unavailable_as_store_error(settings):
        dropping = sorted(name.decode() for name in client.hkeys(keys.dropping))
    for version in dropping:
        purge(client, settings, keys, version)
    return dropping


def drop(client: Client, settings: RedisSettings, keys: OutputKeys, version: str) -> None:
    """Delete one unpublished version whole (e.g. a failed run's)."""
    claimed = claim(client, settings, keys, check_version(version))
    if claimed == 0:
        raise StoreError(
            f"version {version!r} of output {keys.output!r} is published; publish or roll back first"
        )
    if claimed < 0:
        raise VersionNotFoundError(f"version {version!r} of output {keys.output!r} does not exist")
    purge(client, settings, keys, version)


def claim(client: Client, settings: RedisSettings, keys: OutputKeys, version: str) -> int:
    """1: moved to `dropping`; 0: published, kept; -1: not registered."""
    with unavailable_as_store_error(settings):
        return client.eval(CLAIM, 4, keys.pointer, keys.registry, keys.dropping, keys.published, version)


def purge(client: Client, settings: RedisSettings, keys: OutputKeys, version: str) -> None:
    """UNLINK every bucket of a claimed version and its meta, then forget it."""
    with unavailable_as_store_error(settings):
        raw = client.hget(keys.dropping, version)
        if raw is None:  # another process finished it
            return
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
