"""Key-value versions that share their unchanged records: an overlay holds what changed since its base.

A night that changed 1% of the records used to make a whole version (every bucket COPYed), and
the night after deleted the old one whole (GC, paced): both cost every record. An overlay
version holds only the records written or deleted since its base, a whole version, in buckets
of its own (OVERLAY_SHARE of the base's count). There a value carries one byte before it:
WRITTEN before a record's value, or TOMBSTONE alone for a record deleted (any value, the empty
one included, stays a job's to write). A reader asks the overlay and the base in one pipeline
and takes the overlay's answer where it has one. The next night's overlay starts
as a server-side copy of tonight's overlay buckets over the same base; once REBASE_SHARE of the
base's records have changed, a night is a whole version again (key_value_versions.py). A base
stays while a registered overlay holds it (the output's `bases` hash): GC claims it like any
version, but unlinks its buckets only once none does (key_value_deletion.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from precompute.stores.key_value.settings import Client, OutputKeys, bucket_of

WRITTEN = b"\x01"
"""Before each value an overlay holds (a top-10 ranked value of 60 bytes stays within the
64-byte values Redis keeps in a listpack)."""
TOMBSTONE = b"\x00"
"""An overlay's value for a record deleted since its base."""
OVERLAY_SHARE = 0.1
"""An overlay's buckets per bucket of its base: about 100 records each once a tenth changed."""
REBASE_SHARE = 0.1
"""Records changed since the base, as a share of its records, past which a night is whole:
an overlay's buckets then hold about entries_per_bucket records, and a lookup reads two."""
CHUNK = 500
"""Buckets per round trip when a version's buckets are counted or read whole."""
FIELDS_CHUNK = 10_000
"""Records per round trip when records are probed or written one by one."""


@dataclass(frozen=True, slots=True)
class Layout:
    """Where a version's records are: its own buckets, and its base's if it is an overlay."""

    version: str
    buckets: int
    base: str | None = None
    base_buckets: int = 0
    base_rows: int = 0

    @classmethod
    def of(cls, version: str, entry: Mapping[str, Any]) -> Layout:
        """From a registry entry: {rows, buckets, created} and, for an overlay, its base's name,
        bucket count and record count."""
        if "base" not in entry:
            return cls(version, entry["buckets"])
        return cls(version, entry["buckets"], entry["base"], entry["base_buckets"], entry["base_rows"])

    @property
    def whole_buckets(self) -> int:
        """The bucket count a whole copy of this version takes (its base's, for an overlay)."""
        return self.base_buckets if self.base else self.buckets


def ask(pipe: Any, keys: OutputKeys, layout: Layout, fields: Sequence[bytes]) -> None:
    """Queue the HGETs that answer `fields` (sync or async pipeline): the version's own buckets,
    then its base's; `answers` reads the replies."""
    for field in fields:
        pipe.hget(keys.bucket(layout.version, bucket_of(field, layout.buckets)), field)
    if layout.base:
        for field in fields:
            pipe.hget(keys.bucket(layout.base, bucket_of(field, layout.base_buckets)), field)


def answers(layout: Layout, replies: Sequence[bytes | None], n: int) -> list[bytes | None]:
    """The value of each of `n` fields from `ask`'s replies: the overlay's where it has one."""
    if not layout.base:
        return list(replies[:n])
    return [
        based if own is None else None if own == TOMBSTONE else own[1:]
        for own, based in zip(replies[:n], replies[n : 2 * n], strict=True)
    ]


def per_bucket(client: Client, keys: OutputKeys, layout: Layout, command: str) -> list[Any]:
    """`command` (HGETALL, HLEN) on each of a version's own buckets, CHUNK a round trip; the replies."""
    replies: list[Any] = []
    for start in range(0, layout.buckets, CHUNK):
        pipe = client.pipeline(transaction=False)
        for bucket in range(start, min(start + CHUNK, layout.buckets)):
            pipe.execute_command(command, keys.bucket(layout.version, bucket))
        replies += pipe.execute()
    return replies


def records(client: Client, keys: OutputKeys, layout: Layout) -> dict[bytes, bytes]:
    """Every record of an overlay's own buckets, tombstones included (a few percent of its base)."""
    return {field: value for part in per_bucket(client, keys, layout, "HGETALL") for field, value in part.items()}


def own_records(client: Client, keys: OutputKeys, layout: Layout) -> int:
    """Records in a version's own buckets: all of a whole version's, an overlay's changes."""
    return sum(per_bucket(client, keys, layout, "HLEN"))


def in_base(client: Client, keys: OutputKeys, layout: Layout, fields: Sequence[bytes]) -> list[bool]:
    found: list[bool] = []
    for start in range(0, len(fields), FIELDS_CHUNK):
        pipe = client.pipeline(transaction=False)
        for field in fields[start : start + FIELDS_CHUNK]:
            pipe.hexists(keys.bucket(layout.base, bucket_of(field, layout.base_buckets)), field)
        found += map(bool, pipe.execute())
    return found


def count(client: Client, keys: OutputKeys, layout: Layout) -> int:
    """The records an overlay version holds: its base's, plus those it adds, less those it deletes."""
    held = records(client, keys, layout)
    fields = list(held)
    based = in_base(client, keys, layout, fields)
    added = sum(1 for f, b in zip(fields, based, strict=True) if not b and held[f] != TOMBSTONE)
    deleted = sum(1 for f, b in zip(fields, based, strict=True) if b and held[f] == TOMBSTONE)
    return layout.base_rows + added - deleted


def delete(client: Client, keys: OutputKeys, layout: Layout, fields: Sequence[bytes]) -> int:
    """Delete records from an overlay: a tombstone over a base record, an HDEL of one the overlay
    added; return how many were there."""
    deleted = 0
    for start in range(0, len(fields), FIELDS_CHUNK):
        chunk = fields[start : start + FIELDS_CHUNK]
        pipe = client.pipeline(transaction=False)
        ask(pipe, keys, layout, chunk)
        replies = pipe.execute()
        present = [v is not None for v in answers(layout, replies, len(chunk))]
        based = [v is not None for v in replies[len(chunk) :]]  # ask's base replies
        pipe = client.pipeline(transaction=False)
        for field, here, base in zip(chunk, present, based, strict=True):
            key = keys.bucket(layout.version, bucket_of(field, layout.buckets))
            if here and base:
                pipe.hset(key, field, TOMBSTONE)
            elif here:
                pipe.hdel(key, field)
        pipe.execute()
        deleted += sum(present)
    return deleted


def apply(client: Client, keys: OutputKeys, layout: Layout, target: str, target_buckets: int) -> None:
    """Write an overlay's changes into `target`, a copy of its base: values set, deleted records deleted."""
    held = list(records(client, keys, layout).items())
    for start in range(0, len(held), FIELDS_CHUNK):
        pipe = client.pipeline(transaction=False)
        for field, value in held[start : start + FIELDS_CHUNK]:
            key = keys.bucket(target, bucket_of(field, target_buckets))
            if value == TOMBSTONE:
                pipe.hdel(key, field)
            else:
                pipe.hset(key, field, value[1:])
        pipe.execute()
