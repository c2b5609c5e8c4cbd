"""Versioned key lookups in Redis, the writing half: create, write, copy, publish, roll back.

A version is written aside under its own keys while readers keep reading the published
one; publish checks it (record count, sample reads) and then switches the pointer in one
atomic step. Old versions are deleted whole (key_value_deletion.py), and publish and deletion
race safely. A job writes one version through key_value_versions.py `NewVersion`, which
creates, copies, publishes or drops it; the service reads with key_value_reader.py; the key
layout is in redis_settings.py.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import repeat
from types import TracebackType
from typing import Any, Self

from precompute.stores.errors import StoreError, VersionNotFoundError
from precompute.stores.key_value import meta as kv_meta
from precompute.stores.key_value import overlay
from precompute.stores.key_value.check import check_holds
from precompute.stores.key_value.deletion import doomed, drop, finish_deletions
from precompute.stores.key_value.overlay import WRITTEN, Layout
from precompute.stores.key_value.scripts import CREATE, FLIP
from precompute.stores.key_value.settings import (
    OutputKeys,
    RedisSettings,
    buckets_of,
    connect,
    output_keys,
    unavailable_as_store_error,
)
from precompute.stores.versions import check_version

COPY_CHUNK = 500
"""Buckets per COPY round trip: a bucket is one small listpack, cheap to copy."""
BUCKET_SLACK = 0.25
"""How far (as a fraction) the mean records per bucket of a copied version may drift from
entries_per_bucket (`copyable`)."""


@dataclass(frozen=True, slots=True)
class VersionInfo:
    name: str
    rows: int
    """As given to create_version; publish checked that Redis holds exactly this many."""
    created: datetime
    is_current: bool


def check_items(name: str, items: Sequence[object], kind: type) -> None:
    """One C-level pass on the write path; the slow search only when something is wrong."""
    if not all(map(isinstance, items, repeat(kind))):
        i, item = next((i, x) for i, x in enumerate(items) if not isinstance(x, kind))
        raise ValueError(f"{name}[{i}] must be {kind.__name__}, got {type(item).__name__}")


class KeyValueStore:
    """For jobs, flows and the CLI (sync). The service reads with KeyValueReader."""

    def __init__(self, settings: RedisSettings) -> None:
        self.settings = settings
        self._client = connect(self.settings)
        self._layouts: dict[tuple[str, str], Layout] = {}
        """Where the records of each version this instance writes go, read once from the registry."""

    # -- writing ----------------------------------------------------------------------------

    def create_version(
        self,
        output: str,
        version: str,
        rows: int,
        meta: Mapping[str, Any] | None = None,
        buckets: int | None = None,
        base: str | None = None,
        meta_digest: str | None = None,
    ) -> None:
        """Register a new, empty version of `rows` records; its bucket count is fixed from here on.

        buckets: another version's count (`layout().buckets`), so that copy_version can fill this one
        from it bucket by bucket; by default, sized for `rows` at `entries_per_bucket`, or for an
        overlay at OVERLAY_SHARE of its base's count.
        base: a whole version this one overlays (key_value_overlay.py): it starts with the base's
        records, and holds only what is written to it or deleted from it.
        meta_digest: the caller's identity of `meta`; an overlay whose base was created with the
        same one reads the base's meta and stores none (`meta` unused: key_value_meta.py).
        """
        keys = output_keys(self.settings, output)
        check_version(version)
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
            raise ValueError(f"rows must be an int >= 0, got {rows!r}")
        if buckets is not None and (isinstance(buckets, bool) or not isinstance(buckets, int) or buckets < 1):
            raise ValueError(f"buckets must be an int >= 1, got {buckets!r}")
        entry: dict[str, Any] = {"rows": rows, "created": datetime.now(UTC).isoformat(timespec="seconds")}
        if meta_digest is not None:
            entry[kv_meta.DIGEST] = meta_digest
        shared = False
        if base is None:
            entry["buckets"] = buckets or max(1, math.ceil(rows / self.settings.entries_per_bucket))
        else:
            under = self._entry(keys, check_version(base), held=True)
            if "base" in under:
                raise StoreError(f"version {base!r} of output {output!r} is an overlay: overlay its base")
            own = buckets or max(1, math.ceil(under["buckets"] * overlay.OVERLAY_SHARE))
            entry |= {"buckets": own, "base": base, "base_buckets": under["buckets"], "base_rows": under["rows"]}
            if shared := kv_meta.shares(under, meta_digest):
                entry[kv_meta.META_OF] = base
        encoded = b"" if shared else kv_meta.encoded(meta)
        with unavailable_as_store_error(self.settings):
            entries = (version, json.dumps(entry), encoded, base or "")
            created = self._client.eval(CREATE, 3, keys.registry, keys.meta(version), keys.bases, *entries)
        if created == -1:
            raise VersionNotFoundError(f"version {base!r} of output {output!r} is gone: nothing to overlay")
        if not created:
            raise StoreError(f"version {version!r} of output {output!r} already exists")

    def write(self, output: str, version: str, ids: Sequence[str], values: Sequence[bytes]) -> int:
        """HSET records into an unpublished version, bucket by bucket, pipelined; return how many.

        Every record is checked before any is sent, so a bad one writes nothing.
        """
        keys = output_keys(self.settings, output)
        if len(ids) != len(values):
            raise ValueError(f"ids and values differ in length: {len(ids)} and {len(values)}")
        check_items("ids", ids, str)
        check_items("values", values, bytes)
        layout = self._writable(keys, version)
        if layout.base:
            values = [WRITTEN + value for value in values]
        buckets = layout.buckets
        fields = [item_id.encode() for item_id in ids]
        groups: dict[int, list[bytes]] = {}  # bucket -> HSET arguments: field, value, field, ...
        for bucket, field, value in zip(buckets_of(fields, buckets), fields, values, strict=True):
            args = groups.get(bucket)
            if args is None:
                groups[bucket] = [field, value]
            else:
                args += (field, value)
        self._send(keys, version, "HSET", groups, per_record=2)
        return len(ids)

    def copy_version(self, output: str, source: str, target: str) -> None:
        """Fill the unpublished `target` with every record of `source`, server-side: one COPY per
        bucket, pipelined `COPY_CHUNK` at a time, no record through this process.

        Bucket n of every version carries the hash tag {n}, so each COPY stays in one slot (Redis
        Cluster; COPY needs Redis >= 6.2). `target` must be empty and have the bucket count of
        what is copied (a record's bucket is crc32(id) % buckets). An overlay `source` goes into
        a whole `target` as its base's buckets, then its changes through this process (a tenth
        of the records at most); into an overlay over the same base, as its own buckets.
        """
        keys = output_keys(self.settings, output)
        layout, into = self.layout(output, source), self._writable(keys, target)
        if into.base is not None and into.base != layout.base:
            raise StoreError(
                f"version {target!r} of output {output!r} overlays {into.base!r}: copy into it only an overlay of that"
            )
        copied, buckets = (source, layout.buckets) if into.base else (layout.base or source, layout.whole_buckets)
        if into.buckets != buckets:
            raise StoreError(
                f"version {target!r} of output {output!r} has {into.buckets} buckets and {source!r} "
                f"{buckets}: create it with buckets={buckets} to copy into it"
            )
        with unavailable_as_store_error(self.settings):
            for start in range(0, buckets, COPY_CHUNK):
                pipe = self._client.pipeline(transaction=False)
                for bucket in range(start, min(start + COPY_CHUNK, buckets)):
                    pipe.execute_command("COPY", keys.bucket(copied, bucket), keys.bucket(target, bucket))
                pipe.execute()
            if layout.base and not into.base:
                overlay.apply(self._client, keys, layout, target, buckets)

    def delete(self, output: str, version: str, ids: Sequence[str]) -> int:
        """Delete records from an unpublished version (records copied from a version they have
        since left: HDEL, or in an overlay a tombstone); return how many were there."""
        keys = output_keys(self.settings, output)
        check_items("ids", ids, str)
        layout = self._writable(keys, version)
        fields = [item_id.encode() for item_id in ids]
        if layout.base:
            with unavailable_as_store_error(self.settings):
                return overlay.delete(self._client, keys, layout, fields)
        groups: dict[int, list[bytes]] = {}
        for bucket, field in zip(buckets_of(fields, layout.buckets), fields, strict=True):
            groups.setdefault(bucket, []).append(field)
        return sum(self._send(keys, version, "HDEL", groups, per_record=1))

    def _send(
        self, keys: OutputKeys, version: str, command: str, groups: dict[int, list[bytes]], per_record: int
    ) -> list[int]:
        """One `command` per bucket with its arguments, pipelined about `write_batch` records a
        round trip; the replies in order."""
        replies: list[int] = []
        with unavailable_as_store_error(self.settings):
            pipe = self._client.pipeline(transaction=False)
            pending = 0
            for bucket, args in groups.items():
                pipe.execute_command(command, keys.bucket(version, bucket), *args)
                pending += len(args) // per_record
                if pending >= self.settings.write_batch:
                    replies += pipe.execute()
                    pending = 0
            replies += pipe.execute()
        return replies

    def check_writable(self, keys: OutputKeys, version: str) -> int:
        """The version's bucket count; refuses unknown and published versions."""
        return self._writable(keys, version).buckets

    def _writable(self, keys: OutputKeys, version: str) -> Layout:
        check_version(version)
        cached = self._layouts.get((keys.output, version))
        if cached is not None:
            return cached
        with unavailable_as_store_error(self.settings):
            entry, pointer = (
                self._client.pipeline(transaction=False)
                .hget(keys.registry, version)
                .get(keys.pointer)
                .execute()
            )
        if entry is None:
            raise VersionNotFoundError(
                f"version {version!r} of output {keys.output!r} does not exist; create_version first"
            )
        if pointer == version.encode():
            raise StoreError(
                f"version {version!r} of output {keys.output!r} is published; it is never written again"
            )
        layout = self._layouts[keys.output, version] = Layout.of(version, json.loads(entry))
        return layout

    # -- publishing -------------------------------------------------------------------------

    def publish(self, output: str, version: str, samples: Mapping[str, bytes] | None = None) -> None:
        """Check the version and make it the one readers see in one atomic step. Old versions stay
        until collect_garbage: an outage after the flip must not make the publish look failed.

        Checks (key_value_check.py): Redis holds exactly the `rows` given to create_version, and
        every sample reads back identical. A failed check raises PublishValidationError and
        switches nothing.
        """
        keys = output_keys(self.settings, output)
        self._validate(keys, check_version(version), samples or {})
        self._flip(keys, version)

    def rollback(self, output: str, to: str | None = None) -> str:
        """Publish `to`, by default the newest version older than the published one; return it.

        The version is checked like a publish (its record count), without samples.
        """
        keys = output_keys(self.settings, output)
        if to is None:
            current = self.current(output)
            if current is None:
                raise VersionNotFoundError(
                    f"nothing of output {output!r} is published: nothing to roll back from"
                )
            published = self._published(keys)
            older = [v for v in self._names(keys) if v < current and v in published]
            if not older:
                raise VersionNotFoundError(
                    f"no version of output {output!r} older than {current!r} to roll back to"
                )
            to = older[-1]
        self._validate(keys, check_version(to), {})
        self._flip(keys, to)
        return to

    def check(self, output: str, version: str, samples: Mapping[str, bytes]) -> None:
        """The checks of a publish (check_holds), switching nothing."""
        self._validate(output_keys(self.settings, output), check_version(version), samples)

    def _validate(self, keys: OutputKeys, version: str, samples: Mapping[str, bytes]) -> None:
        entry = self._entry(keys, version)
        with unavailable_as_store_error(self.settings):
            check_holds(self._client, keys, Layout.of(version, entry), entry["rows"], samples)

    def _flip(self, keys: OutputKeys, version: str) -> None:
        self._layouts.pop((keys.output, version), None)  # so a later write re-checks, and is refused
        with unavailable_as_store_error(self.settings):
            now = datetime.now(UTC).isoformat(timespec="seconds")
            flipped = self._client.eval(FLIP, 3, keys.pointer, keys.registry, keys.published, version, now)
        if not flipped:
            raise VersionNotFoundError(f"version {version!r} of output {keys.output!r} was deleted meanwhile")

    # -- reading the registry ---------------------------------------------------------------

    def current(self, output: str) -> str | None:
        """The published version, None before the first publish."""
        keys = output_keys(self.settings, output)
        with unavailable_as_store_error(self.settings):
            pointer = self._client.get(keys.pointer)
        return pointer.decode() if pointer is not None else None

    def versions(self, output: str) -> list[VersionInfo]:
        """Every registered version, published or not, oldest first."""
        keys = output_keys(self.settings, output)
        with unavailable_as_store_error(self.settings):
            entries, pointer = (
                self._client.pipeline(transaction=False).hgetall(keys.registry).get(keys.pointer).execute()
            )
        infos = []
        for name, raw in sorted(entries.items()):
            entry = json.loads(raw)
            created = datetime.fromisoformat(entry["created"])
            infos.append(VersionInfo(name.decode(), entry["rows"], created, name == pointer))
        return infos

    def meta(self, output: str, version: str) -> dict[str, Any]:
        """What create_version stored with the version (e.g. the vocabulary values index into)."""
        keys = output_keys(self.settings, output)
        entry = self._entry(keys, check_version(version))  # refuses an unknown version
        with unavailable_as_store_error(self.settings):
            raw = self._client.get(keys.meta(kv_meta.owner(version, entry)))
        return kv_meta.stored_meta(raw, keys, version, entry)

    def shares_meta(self, output: str, base: str, meta_digest: str | None) -> bool:
        """Whether an overlay over `base` created with `meta_digest` reads the base's meta."""
        base_entry = self._entry(output_keys(self.settings, output), check_version(base), held=True)
        return kv_meta.shares(base_entry, meta_digest)

    def _names(self, keys: OutputKeys) -> list[str]:
        """Registered versions, oldest first, by name alone (HKEYS: no entry read)."""
        with unavailable_as_store_error(self.settings):
            return sorted(name.decode() for name in self._client.hkeys(keys.registry))

    def _published(self, keys: OutputKeys) -> set[str]:
        with unavailable_as_store_error(self.settings):
            return {name.decode() for name in self._client.hkeys(keys.published)}

    def layout(self, output: str, version: str) -> Layout:
        """Where a registered version's records are: its buckets, and its base's if it is an overlay."""
        return Layout.of(version, self._entry(output_keys(self.settings, output), check_version(version)))

    def changed(self, output: str, version: str) -> int:
        """Records an overlay writes or deletes over its base (0 for a whole version)."""
        layout = self.layout(output, version)
        if not layout.base:
            return 0
        with unavailable_as_store_error(self.settings):
            return overlay.own_records(self._client, output_keys(self.settings, output), layout)

    def copyable(self, output: str, version: str) -> range:
        """Record counts that a copy of `version` (copy_version) holds well: a copy keeps its
        bucket count, and records per bucket may drift BUCKET_SLACK from entries_per_bucket
        before a version should be sized afresh instead."""
        buckets, per_bucket = self.layout(output, version).whole_buckets, self.settings.entries_per_bucket
        low = int((buckets - 1) * per_bucket * (1 - BUCKET_SLACK))
        return range(low, int(buckets * per_bucket * (1 + BUCKET_SLACK)) + 1)

    def _entry(self, keys: OutputKeys, version: str, held: bool = False) -> dict[str, Any]:
        """A registered version's entry; `held`: or one claimed by GC (an overlay's base waits there)."""
        with unavailable_as_store_error(self.settings):
            raw = self._client.hget(keys.registry, version)
            if raw is None and held:
                raw = self._client.hget(keys.dropping, version)
        if raw is None:
            raise VersionNotFoundError(f"version {version!r} of output {keys.output!r} does not exist")
        return json.loads(raw)

    # -- deleting ---------------------------------------------------------------------------

    def collect_garbage(self, output: str, keep: int) -> list[str]:
        """Delete all versions but the published one and the `keep` newest others that were
        published once (rollback targets); see key_value_deletion.py. Returns the deleted
        versions, oldest first."""
        keys = output_keys(self.settings, output)
        for version in doomed(self._client, self.settings, keys, keep):
            self._layouts.pop((keys.output, version), None)
        return finish_deletions(self._client, self.settings, keys)

    def drop_version(self, output: str, version: str) -> None:
        """Delete one unpublished version whole (e.g. a failed run's)."""
        keys = output_keys(self.settings, output)
        self._layouts.pop((keys.output, check_version(version)), None)
        drop(self._client, self.settings, keys, version)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
