"""Every record a key-value version holds, read from Redis directly (for checks beyond a lookup)."""

from __future__ import annotations

import redis

from precompute.stores.key_value.overlay import TOMBSTONE
from precompute.stores.key_value.settings import RedisSettings, output_keys
from precompute.stores.key_value.store import KeyValueStore


def held_records(settings: RedisSettings, output: str, version: str) -> dict[bytes, bytes]:
    """The version's buckets read whole; for an overlay, its base's with the overlay's changes over them."""
    keys = output_keys(settings, output)
    with KeyValueStore(settings) as store, redis.Redis.from_url(settings.url) as client:
        layout = store.layout(output, version)

        def buckets(name: str, count: int) -> dict[bytes, bytes]:
            return {f: v for b in range(count) for f, v in client.hgetall(keys.bucket(name, b)).items()}

        if not layout.base:
            return buckets(version, layout.buckets)
        held = buckets(layout.base, layout.base_buckets)
        for field, value in buckets(version, layout.buckets).items():
            if value == TOMBSTONE:
                held.pop(field, None)
            else:
                held[field] = value[1:]
        return held
