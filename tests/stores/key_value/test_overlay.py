"""Overlay versions: a night's version holds what changed over a whole base (key_value_overlay.py)
and reads its base's meta where it is the same (key_value_meta.py), through NewVersion as the
jobs make them, read by the service's reader, collected by GC."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from precompute.lookup.keys import RECS, KeyLookups
from precompute.lookup.metrics import Metrics
from precompute.lookup.settings import ServiceSettings
from precompute.stores.errors import PublishValidationError, StoreError, VersionNotFoundError
from precompute.stores.key_value.overlay import REBASE_SHARE
from precompute.stores.key_value.reader import KeyValueReader
from precompute.stores.key_value.server import redis_server
from precompute.stores.key_value.settings import RedisSettings
from precompute.stores.key_value.store import KeyValueStore
from precompute.stores.key_value.versions import CopyPlan, NewVersion, OutputVersions
from precompute.stores.versions import new_version
from tests.stores.key_value.test_store import (
    IDS,
    OUTPUT,
    V1,
    V2,
    V3,
    keys_of,
    read,
    settings,
    store,
    values_of,
)

__all__ = ["settings", "store"]  # fixtures


def night(store: KeyValueStore, source: str, gone: list[str], written: dict[str, bytes], rows: int) -> str:
    """One incremental night as a job runs it: a copy of `source` less `gone`, `written` over it."""
    new = writer(store, lambda: {"night": True})
    new.create(rows, CopyPlan(source, gone))
    store.write(OUTPUT, new.version, list(written), list(written.values()))
    store.publish(OUTPUT, new.version, dict(list(written.items())[:3]))
    return new.version


def writer(store: KeyValueStore, meta: Callable[[], dict], digest: str | None = None) -> NewVersion:
    return OutputVersions(store, OUTPUT).writer(new_version(), meta, digest)


def value(tag: int, i: int) -> bytes:
    return f"{tag}:{i}".encode()


def nights_in_a_row(store: KeyValueStore, settings: RedisSettings) -> None:
    base = values_of(1)
    store.create_version(OUTPUT, V1, len(IDS))
    store.write(OUTPUT, V1, IDS, base)
    store.publish(OUTPUT, V1, {IDS[0]: base[0]})
    whole = store.layout(OUTPUT, V1).buckets
    expected: dict[str, bytes | None] = dict(zip(IDS, base, strict=True))
    asked = [*IDS, "new-0", "new-1", "new-2", "new-3", "never"]

    def apply(gone: list[str], written: dict[str, bytes]) -> int:
        expected.update(dict.fromkeys(gone))
        expected.update(written)
        return sum(v is not None for v in expected.values())

    # An overlay over V1: 5 records deleted, 10 rescored, 3 new. V1 leaves the registry but stays held.
    gone, written = IDS[:5], {i: value(2, n) for n, i in enumerate([*IDS[5:15], "new-0", "new-1"])}
    written["new-2"] = b""  # an empty value is a value (a label-less row's), never a deletion
    a = night(store, V1, gone, written, apply(gone, written))
    assert store.layout(OUTPUT, a).base == V1 and store.layout(OUTPUT, a).buckets < whole
    assert store.collect_garbage(OUTPUT, keep=0) == []  # V1 claimed, its buckets kept for `a`
    assert [v.name for v in store.versions(OUTPUT)] == [a]
    assert asyncio.run(read(settings, asked))[:2] == (a, [expected.get(i) for i in asked])

    # The next overlay copies a's own buckets, over V1 still: deleted ones written back, a new one deleted.
    gone, written = [*IDS[15:18], "new-0"], {i: value(3, n) for n, i in enumerate([*IDS[:2], *IDS[20:25]])}
    b = night(store, a, gone, written, apply(gone, written))
    assert store.layout(OUTPUT, b).base == V1
    assert asyncio.run(read(settings, asked))[:2] == (b, [expected.get(i) for i in asked])
    assert store.rollback(OUTPUT, to=a) == a  # a is kept (keep_versions) and still reads whole
    assert asyncio.run(read(settings, IDS[:5]))[1] == [None] * 5
    assert store.rollback(OUTPUT, to=b) == b
    assert store.collect_garbage(OUTPUT, keep=0) == [a]
    assert not [key for key in keys_of(settings) if a.encode() in key]

    # Once more than REBASE_SHARE of V1's records have changed, the next night is whole again.
    gone, written = [], {i: value(4, n) for n, i in enumerate(IDS[-30:])}
    c = night(store, b, gone, written, apply(gone, written))
    assert store.layout(OUTPUT, c).base == V1 and store.changed(OUTPUT, c) > REBASE_SHARE * len(IDS)
    assert store.collect_garbage(OUTPUT, keep=0) == [b]
    gone, written = [IDS[100]], {"new-3": value(5, 0)}
    d = night(store, c, gone, written, apply(gone, written))
    assert store.layout(OUTPUT, d).base is None and store.layout(OUTPUT, d).buckets == whole
    assert store.collect_garbage(OUTPUT, keep=0) == sorted([V1, c])  # V1 held no more
    assert not [key for key in keys_of(settings) if any(v.encode() in key for v in (V1, b, c))]
    assert asyncio.run(read(settings, asked))[:2] == (d, [expected.get(i) for i in asked])


def test_overlay_nights_share_their_bases_records_until_a_night_is_whole_again(
    store: KeyValueStore, settings: RedisSettings
) -> None:
    nights_in_a_row(store, settings)


def test_overlay_nights_on_a_cluster(tmp_path: Path) -> None:
    """An overlay and its base sit in different slots: a read and a count ask both."""
    with (
        redis_server(tmp_path, cluster=True) as url,
        KeyValueStore(RedisSettings(url=url, cluster=True, prefix="overlay")) as store,
    ):
        nights_in_a_row(store, store.settings)


def test_an_overlay_is_checked_like_any_version_and_only_over_a_whole_one(
    store: KeyValueStore, settings: RedisSettings
) -> None:
    """Its record count (the base's, plus what it adds, less what it deletes) must be what it was
    created for; it overlays only a whole version that exists; a failed night leaves no key."""
    base = values_of(1)
    store.create_version(OUTPUT, V1, len(IDS))
    store.write(OUTPUT, V1, IDS, base)
    store.publish(OUTPUT, V1)
    store.create_version(OUTPUT, V2, len(IDS), base=V1)
    assert store.delete(OUTPUT, V2, [IDS[0], IDS[1], "never"]) == 2
    store.write(OUTPUT, V2, ["new-0"], [b"x"])
    with pytest.raises(PublishValidationError, match=f"holds {len(IDS) - 1} records, but was created for {len(IDS)}"):
        store.publish(OUTPUT, V2)
    with pytest.raises(StoreError, match=f"version {V2!r} of output 'recs' is an overlay: overlay its base"):
        store.create_version(OUTPUT, V3, len(IDS), base=V2)
    with pytest.raises(VersionNotFoundError, match="'20261109T031500Z-aa09' of output 'recs' does not exist"):
        store.create_version(OUTPUT, V3, len(IDS), base="20261109T031500Z-aa09")

    before = keys_of(settings)
    new = writer(store, dict)
    new.create(len(IDS), CopyPlan(V1, [IDS[3]]))
    store.write(OUTPUT, new.version, [IDS[4]], [b"y"])
    OutputVersions(store, OUTPUT).drop(new.version)  # the night failed
    assert keys_of(settings) == before



def meta_key(settings: RedisSettings, version: str) -> bytes:
    return f"{{{settings.prefix}:{OUTPUT}}}:{version}:meta".encode()


async def served(settings: RedisSettings, versions: list[str]) -> tuple[list[object], list[str], list[dict]]:
    """The service's Vocabulary of each version, and the reader's meta owner and meta of each."""
    lookups = KeyLookups(ServiceSettings(), settings, Metrics())
    lookups.serve(OUTPUT, OUTPUT, RECS)
    async with KeyValueReader(settings) as reader:
        output = lookups.outputs[OUTPUT]
        made = [await lookups.vocabulary(reader, output, version) for version in versions]
        owners = [await reader.meta_owner(OUTPUT, version) for version in versions]
        return made, owners, [await reader.meta(OUTPUT, version) for version in versions]


def test_an_overlay_with_its_bases_meta_digest_reads_the_bases_meta_and_stores_none(
    store: KeyValueStore, settings: RedisSettings
) -> None:
    """No meta made, encoded or stored again for a night whose vocabulary is its base's: the
    store, the reader and the service read the base's (the service makes one Vocabulary for
    both); another digest stores its own; the base's meta goes with the base, once no overlay
    holds it."""
    vocabulary = {"vocabulary": ["x", "y"], "integer_ids": False}
    store.create_version(OUTPUT, V1, len(IDS), vocabulary, meta_digest="d1")
    store.write(OUTPUT, V1, IDS, values_of(1))
    store.publish(OUTPUT, V1)

    def unused() -> dict:
        raise AssertionError("the meta was made though the base's is the same")

    same = writer(store, unused, "d1")
    same.create(len(IDS), CopyPlan(V1, []))
    store.publish(OUTPUT, same.version, {})
    assert meta_key(settings, same.version) not in keys_of(settings)
    (base_made, same_made), owners, metas = asyncio.run(served(settings, [V1, same.version]))
    assert same_made is base_made and owners == [V1, V1] and metas == [vocabulary, vocabulary]
    assert store.collect_garbage(OUTPUT, keep=0) == []  # V1 claimed and held: its meta stays
    assert store.meta(OUTPUT, same.version) == vocabulary
    assert asyncio.run(served(settings, [same.version]))[2] == [vocabulary]

    other = {"vocabulary": ["x", "y", "z"]}
    changed = writer(store, lambda: other, "d2")
    changed.create(len(IDS), CopyPlan(same.version, []))  # over V1 still, with a meta of its own
    store.publish(OUTPUT, changed.version, {})
    assert store.layout(OUTPUT, changed.version).base == V1
    assert asyncio.run(served(settings, [changed.version]))[1:] == ([changed.version], [other])
    assert store.collect_garbage(OUTPUT, keep=0) == [same.version]

    full = writer(store, lambda: other, "d2")
    full.create(len(IDS))
    store.write(OUTPUT, full.version, IDS, values_of(2))
    store.publish(OUTPUT, full.version, {})
    assert store.collect_garbage(OUTPUT, keep=0) == sorted([V1, changed.version])
    assert not {meta_key(settings, v) for v in (V1, same.version, changed.version)} & set(keys_of(settings))
    assert store.meta(OUTPUT, full.version) == other
