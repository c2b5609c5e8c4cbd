"""The versioned key-value store against a real redis-server: writes, publish, rollback, GC, readers.

Every value encodes the version it belongs to (index 0 of its ranked pairs) and its row
(index 1), so an answer that mixes versions, or returns another id's value, is detectable.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import pyarrow as pa
import pytest
import redis

from precompute.stores.errors import (
    PublishValidationError,
    StoreError,
    StoreUnavailableError,
    VersionNotFoundError,
)
from precompute.stores.key_value.reader import KeyValueReader
from precompute.stores.key_value.records import decode_ranked, encode_ranked
from precompute.stores.key_value.server import redis_server
from precompute.stores.key_value.settings import RedisSettings, output_keys
from precompute.stores.key_value.sink import BUCKET, KeyValueSink
from precompute.stores.key_value.store import KeyValueStore
from precompute.stores.key_value.versions import CopyPlan, OutputVersions
from precompute.stores.versions import new_version
from tests.waiting import wait_for

N = 250
K = 10
OUTPUT = "recs"
IDS = [f"pkg-{i}" for i in range(N)]
V1, V2, V3, V4 = (f"2026110{d}T031500Z-aa0{d}" for d in range(1, 5))
ORDINAL = {V1: 1, V2: 2, V3: 3, V4: 4}


def values_of(ordinal: int) -> list[bytes]:
    indices = np.zeros((N, K), dtype=np.int64)
    indices[:, 0] = ordinal
    indices[:, 1] = np.arange(N)
    return encode_ranked(indices, np.ones((N, K), dtype=np.float32))


def origin(value: bytes) -> tuple[int, int]:
    """(version ordinal, row) a value was written for."""
    indices, _ = decode_ranked(value)
    return int(indices[0]), int(indices[1])

KEEP = 1
"""Versions kept besides the published one, unless a test says otherwise."""

def load(store: KeyValueStore, version: str, rows: int = N) -> list[bytes]:
    values = values_of(ORDINAL[version])
    store.create_version(OUTPUT, version, N, {"vocabulary": ["a", "b"], "ordinal": ORDINAL[version]})
    store.write(OUTPUT, version, IDS[:rows], values[:rows])
    return values


def publish(store: KeyValueStore, version: str, keep: int = KEEP) -> None:
    values = load(store, version)
    store.publish(OUTPUT, version, {IDS[0]: values[0], IDS[-1]: values[-1]})
    store.collect_garbage(OUTPUT, keep)


def keys_of(settings: RedisSettings) -> set[bytes]:
    with redis.Redis.from_url(settings.url) as client:
        return {
            *client.scan_iter(match=f"{settings.prefix}:*", count=1000),
            *client.scan_iter(match=f"{{{settings.prefix}:*", count=1000),
        }


@pytest.fixture
def settings(redis_url: str) -> RedisSettings:
    """A prefix per test: tests share one server and never see each other's keys."""
    return RedisSettings(url=redis_url, prefix=f"t{uuid.uuid4().hex[:8]}")


@pytest.fixture
def store(settings: RedisSettings) -> Iterator[KeyValueStore]:
    with KeyValueStore(settings) as store:
        yield store


async def read(settings: RedisSettings, ids: list[str]) -> tuple[str, list[bytes | None], dict]:
    async with KeyValueReader(settings) as reader:
        version, values = await reader.get_many(OUTPUT, ids)
        return version, values, await reader.meta(OUTPUT, version)


def test_write_publish_get(store: KeyValueStore, settings: RedisSettings) -> None:
    values = load(store, V1)
    store.publish(OUTPUT, V1, {IDS[7]: values[7]})

    async def reads() -> tuple:
        async with KeyValueReader(settings) as reader:
            return await reader.get(OUTPUT, IDS[3]), await reader.get_many(
                OUTPUT, [IDS[5], "unknown", IDS[5]]
            )

    (version, value), (batch_version, batch) = asyncio.run(reads())
    assert (version, value) == (V1, values[3])
    assert (batch_version, batch) == (V1, [values[5], None, values[5]])
    assert store.current(OUTPUT) == V1
    [info] = store.versions(OUTPUT)
    assert (info.name, info.rows, info.is_current) == (V1, N, True)
    assert store.meta(OUTPUT, V1) == {"vocabulary": ["a", "b"], "ordinal": 1}
    assert asyncio.run(read(settings, []))[2] == store.meta(OUTPUT, V1)


def test_nothing_published(store: KeyValueStore, settings: RedisSettings) -> None:
    load(store, V1)
    assert store.current(OUTPUT) is None
    with pytest.raises(VersionNotFoundError, match="nothing of output 'recs' is published"):
        asyncio.run(read(settings, [IDS[0]]))
    with pytest.raises(VersionNotFoundError, match="nothing to roll back from"):
        store.rollback(OUTPUT)


def test_failed_validation_switches_nothing(store: KeyValueStore, settings: RedisSettings) -> None:
    load(store, V1, rows=N - 1)
    with pytest.raises(PublishValidationError, match=f"holds {N - 1} records, but was created for {N}"):
        store.publish(OUTPUT, V1)
    assert store.current(OUTPUT) is None

    publish(store, V2)
    values = load(store, V3)
    wrong = {IDS[1]: values[2], "unknown": values[0], IDS[4]: values[4]}
    with pytest.raises(PublishValidationError, match=r"2 of 3 samples .* \['pkg-1', 'unknown'\]"):
        store.publish(OUTPUT, V3, wrong)
    with pytest.raises(VersionNotFoundError, match="does not exist"):
        store.publish(OUTPUT, V4)
    assert store.current(OUTPUT) == V2
    assert asyncio.run(read(settings, [IDS[1]]))[:2] == (V2, [values_of(2)[1]])


def test_rollback(settings: RedisSettings) -> None:
    with KeyValueStore(settings) as store:
        rollbacks(store, settings)


def rollbacks(store: KeyValueStore, settings: RedisSettings) -> None:
    for version in (V1, V2, V3):
        publish(store, version, keep=2)
    assert store.rollback(OUTPUT) == V2
    assert asyncio.run(read(settings, [IDS[9]]))[:2] == (V2, [values_of(2)[9]])
    assert store.rollback(OUTPUT) == V1
    with pytest.raises(VersionNotFoundError, match=f"older than '{V1}'"):
        store.rollback(OUTPUT)
    assert store.rollback(OUTPUT, to=V3) == V3
    assert [(v.name, v.is_current) for v in store.versions(OUTPUT)] == [(V1, False), (V2, False), (V3, True)]
    with pytest.raises(VersionNotFoundError, match="'20261231T000000Z-none'"):
        store.rollback(OUTPUT, to="20261231T000000Z-none")
    assert store.current(OUTPUT) == V3


def test_garbage_collection_keeps_current_and_newest(store: KeyValueStore, settings: RedisSettings) -> None:
    for version in (V1, V2, V3):  # KEEP=1: each publish deletes all but it and one more
        publish(store, version)
    assert [v.name for v in store.versions(OUTPUT)] == [V2, V3]
    assert store.rollback(OUTPUT) == V2
    publish(store, V4)  # the others are V2 and V3: the newer one stays
    assert [v.name for v in store.versions(OUTPUT)] == [V3, V4]
    assert store.collect_garbage(OUTPUT, KEEP) == []
    with pytest.raises(StoreError, match="is published"):
        store.drop_version(OUTPUT, V4)
    buckets = {f"{settings.prefix}:{OUTPUT}:{v}:{{{b}}}".encode() for v in (V3, V4) for b in range(3)}
    bookkeeping = {
        f"{{{settings.prefix}:{OUTPUT}}}:{k}".encode()
        for k in ("current", "versions", "published", f"{V3}:meta", f"{V4}:meta")
    }
    assert keys_of(settings) == buckets | bookkeeping  # no orphan key of a deleted version

    store.drop_version(OUTPUT, V3)
    assert [v.name for v in store.versions(OUTPUT)] == [V4]
    assert not any(V3.encode() in key for key in keys_of(settings))  # its meta went with it
    with pytest.raises(VersionNotFoundError):
        store.drop_version(OUTPUT, V3)


def test_keeping_more_versions_than_there_are_deletes_none(store: KeyValueStore) -> None:
    for version in (V1, V2, V3):
        publish(store, version, keep=5)
    assert store.collect_garbage(OUTPUT, keep=3) == []
    assert [v.name for v in store.versions(OUTPUT)] == [V1, V2, V3]


def test_a_failed_runs_version_is_collected_and_never_a_rollback_target(settings: RedisSettings) -> None:
    with KeyValueStore(settings) as store:
        publish(store, V1, keep=5)
        load(store, V2, rows=N - 1)  # a run that died before its publish
        load(store, V4)  # a run still in progress, newer than what is published next
        publish(store, V3, keep=5)
        assert [v.name for v in store.versions(OUTPUT)] == [V1, V3, V4]
        assert store.rollback(OUTPUT) == V1


@pytest.mark.slow
def test_datasink_writes_through_ray(ray_local: None, store: KeyValueStore, settings: RedisSettings) -> None:
    import ray

    values = values_of(1)
    store.create_version(OUTPUT, V1, N)
    table = pa.table({"id": IDS, "value": pa.array(values, pa.binary())})
    sink = KeyValueSink(store.settings, OUTPUT, V1)
    ray.data.from_arrow(table).repartition(3).write_datasink(sink)
    assert sink.rows == N
    store.publish(OUTPUT, V1, {IDS[100]: values[100]})
    assert asyncio.run(read(settings, IDS))[:2] == (V1, values)

    store.create_version(OUTPUT, V2, N)
    bad = pa.table({"id": IDS, "value": [str(i) for i in range(N)]})  # strings, not binary
    with pytest.raises(Exception, match=r"values\[0\] must be bytes, got str"):
        ray.data.from_arrow(bad).write_datasink(KeyValueSink(store.settings, OUTPUT, V2))
    assert [v.name for v in store.versions(OUTPUT)] == [V1]  # the failed version is deleted whole


@pytest.mark.slow
def test_rows_routed_by_bucket_reach_each_write_task_as_whole_buckets(ray_local: None, redis_url: str) -> None:
    """Past one write task's rows, the sink hash-partitions rows by bucket: each block holds whole
    buckets (no bucket is written by two tasks), so every HSET carries a bucket's records, and the
    version reads back the same as unrouted."""
    import ray

    settings = RedisSettings(url=redis_url, prefix=f"t{uuid.uuid4().hex[:8]}", write_batch=60, entries_per_bucket=5)
    values = values_of(1)
    with KeyValueStore(settings) as store:
        store.create_version(OUTPUT, V1, N)
        sink = KeyValueSink(store.settings, OUTPUT, V1)
        routed = sink.routed(ray.data.from_arrow(pa.table({"id": IDS, "value": pa.array(values, pa.binary())})), N)
        blocks = [ray.get(ref) for ref in routed.materialize().to_arrow_refs()]
        assert len(blocks) == 5 and sum(b.num_rows for b in blocks) == N  # ceil(250 / 60)
        buckets = [set(b[BUCKET].to_pylist()) for b in blocks]
        assert sum(map(len, buckets)) == len(set().union(*buckets)) > 0.9 * store.layout(OUTPUT, V1).buckets
        routed.write_datasink(sink)
        store.publish(OUTPUT, V1, {IDS[100]: values[100]})
    assert asyncio.run(read(settings, IDS))[:2] == (V1, values)


def copy_rescore_delete(store: KeyValueStore, settings: RedisSettings) -> None:
    """V2 made from the published V1 as an incremental run does: every bucket copied server-side,
    10 records rescored and 5 new ones written over the copy, 20 gone ones deleted."""
    publish(store, V1)
    kept, gone = IDS[10:-20], IDS[-20:]
    rescored = IDS[:10] + [f"new-{i}" for i in range(5)]
    fresh = values_of(2)[: len(rescored)]
    rows = len(kept) + len(rescored)
    store.create_version(OUTPUT, V2, rows, {"ordinal": 2}, buckets=store.layout(OUTPUT, V1).buckets)
    store.copy_version(OUTPUT, V1, V2)
    assert store.delete(OUTPUT, V2, [*gone, "never-there"]) == len(gone)
    store.write(OUTPUT, V2, rescored, fresh)
    store.publish(OUTPUT, V2, {rescored[0]: fresh[0], rescored[-1]: fresh[-1]})

    expected = {i: values_of(1)[IDS.index(i)] for i in kept} | dict(zip(rescored, fresh, strict=True))
    asked = IDS + rescored[10:]
    assert asyncio.run(read(settings, asked))[:2] == (V2, [expected.get(i) for i in asked])
    assert [(v.name, v.rows) for v in store.versions(OUTPUT)] == [(V1, N), (V2, rows)]
    assert store.rollback(OUTPUT) == V1  # the source is untouched
    assert asyncio.run(read(settings, IDS))[:2] == (V1, values_of(1))

    store.create_version(OUTPUT, V3, N)  # sized for N: 3 buckets
    store.create_version(OUTPUT, V4, N, buckets=7)
    with pytest.raises(
        StoreError, match=f"'{V4}' of output 'recs' has 7 buckets and '{V1}' 3: create it with buckets=3"
    ):
        store.copy_version(OUTPUT, V1, V4)
    with pytest.raises(StoreError, match="is published; it is never written again"):
        store.copy_version(OUTPUT, V3, V1)
    with pytest.raises(ValueError, match="buckets must be an int >= 1, got 0"):
        store.create_version(OUTPUT, "20261109T031500Z-aa09", N, buckets=0)


def test_a_version_copied_server_side_then_rescored(store: KeyValueStore, settings: RedisSettings) -> None:
    copy_rescore_delete(store, settings)


def test_a_version_copied_server_side_on_a_cluster(tmp_path: Path) -> None:
    """COPY names two keys: the buckets' {n} hash tag must keep both in one slot."""
    with (
        redis_server(tmp_path, cluster=True) as url,
        KeyValueStore(RedisSettings(url=url, cluster=True, prefix="copy")) as store,
    ):
        copy_rescore_delete(store, store.settings)


def test_readers_never_see_errors_or_mixed_versions(store: KeyValueStore, settings: RedisSettings) -> None:
    """Readers hammer the store while versions are published, rolled back and garbage-collected."""
    publish(store, V1)
    answers: dict[str, int] = dict.fromkeys(ORDINAL, 0)
    errors: list[BaseException] = []
    mixed: list[tuple[str, list]] = []
    stop = threading.Event()

    def check(version: str, ids: list[str], values: list[bytes | None]) -> None:
        want = [(ORDINAL[version], IDS.index(i)) for i in ids]
        if [origin(v) if v is not None else None for v in values] != want:
            mixed.append((version, values))
        answers[version] += 1

    async def reader(reader: KeyValueReader, seed: int) -> None:
        rng = np.random.default_rng(seed)
        while not stop.is_set():
            ids = [IDS[i] for i in rng.integers(0, N, size=1 if seed % 2 else 20)]
            try:
                if len(ids) == 1:
                    version, value = await reader.get(OUTPUT, ids[0])
                    check(version, ids, [value])
                else:
                    version, values = await reader.get_many(OUTPUT, ids)
                    check(version, ids, values)
            except Exception as e:
                errors.append(e)

    def read_again(version: str) -> None:
        """Until the readers answered from `version` a few more times: each step is seen."""
        seen = answers[version]
        wait_for(lambda: answers[version] >= seen + 20, f"readers to answer from {version}")

    def operate() -> None:
        try:
            for step, then in (
                (lambda: publish(store, V2), V2),
                (lambda: publish(store, V3), V3),  # deletes V1 (KEEP=1)
                (lambda: store.rollback(OUTPUT), V2),
                (lambda: store.rollback(OUTPUT, to=V3), V3),
                (lambda: publish(store, V4), V4),  # deletes V2
            ):
                read_again(store.current(OUTPUT))
                step()
                assert store.current(OUTPUT) == then
            read_again(V4)
        finally:
            stop.set()

    async def run() -> None:
        async with KeyValueReader(settings) as shared, KeyValueReader(settings) as other:
            tasks = [asyncio.create_task(reader(shared if s < 4 else other, s)) for s in range(6)]
            await asyncio.to_thread(operate)
            await asyncio.gather(*tasks)

    asyncio.run(run())
    assert errors == []
    assert mixed == []
    assert all(answers[v] > 0 for v in ORDINAL), answers


def test_redis_down_then_back(tmp_path: Path) -> None:
    """503 material while Redis is down; the same reader answers again once it is back."""

    async def scenario() -> None:
        with contextlib.ExitStack() as server:
            url = server.enter_context(redis_server(tmp_path))
            settings = RedisSettings(url=url)
            with KeyValueStore(settings) as store:
                publish(store, V1)
            async with KeyValueReader(settings) as reader:
                assert (await reader.get(OUTPUT, IDS[2]))[0] == V1
                server.close()
                with pytest.raises(StoreUnavailableError, match="unavailable"):
                    await reader.get(OUTPUT, IDS[2])
                with pytest.raises(StoreUnavailableError), KeyValueStore(settings) as store:
                    store.current(OUTPUT)
                with redis_server(tmp_path, port=urlparse(url).port), KeyValueStore(settings) as store:
                    publish(store, V2)  # nothing was persisted: the nightly publishes again
                    assert await reader.get(OUTPUT, IDS[2]) == (V2, values_of(2)[2])

    asyncio.run(scenario())


def test_bad_parameters_are_named(store: KeyValueStore, settings: RedisSettings) -> None:
    with pytest.raises(ValueError, match=r"version '\.\./x' is not a valid version name"):
        store.create_version(OUTPUT, "../x", N)
    with pytest.raises(ValueError, match="output 'a:b' is not a valid output name"):
        store.create_version("a:b", V1, N)
    for rows in (-1, 2.5, True):
        with pytest.raises(ValueError, match=f"rows must be an int >= 0, got {rows}"):
            store.create_version(OUTPUT, V1, rows)
    for buckets in (0, True):
        with pytest.raises(ValueError, match=f"buckets must be an int >= 1, got {buckets}"):
            store.create_version(OUTPUT, V1, N, buckets=buckets)
    with pytest.raises(ValueError, match="keep must be >= 0, got -1"):
        store.collect_garbage(OUTPUT, keep=-1)
    with pytest.raises(ValueError, match="meta must be JSON-serializable"):
        store.create_version(OUTPUT, V1, N, {"when": object()})
    with pytest.raises(VersionNotFoundError, match="create_version first"):
        store.write(OUTPUT, V1, IDS[:1], values_of(1)[:1])
    store.create_version(OUTPUT, V1, 2)
    with pytest.raises(StoreError, match="already exists"):
        store.create_version(OUTPUT, V1, 2)
    with pytest.raises(ValueError, match=r"values\[1\] must be bytes, got str"):
        store.write(OUTPUT, V1, IDS[:2], [b"x", "y"])
    with pytest.raises(ValueError, match=r"ids\[0\] must be str, got int"):
        store.write(OUTPUT, V1, [7, "b"], [b"x", b"y"])
    with pytest.raises(ValueError, match="ids and values differ in length: 2 and 1"):
        store.write(OUTPUT, V1, IDS[:2], [b"x"])
    with pytest.raises(ValueError, match="version 'v 2'"):
        KeyValueSink(store.settings, OUTPUT, "v 2")
    store.write(OUTPUT, V1, IDS[:2], [b"x", b"y"])
    store.publish(OUTPUT, V1)
    with pytest.raises(StoreError, match="is published; it is never written again"):
        store.write(OUTPUT, V1, IDS[:1], [b"z"])
    with pytest.raises(ValueError, match=r"ids\[1\] must be str, got bytes"):
        asyncio.run(read(settings, [IDS[0], b"pkg-1"]))


def test_one_node_cluster(tmp_path: Path) -> None:
    """Cluster mode refuses commands across slots even on one node: the layout must never need them."""
    with (
        redis_server(tmp_path, cluster=True) as url,
        KeyValueStore(RedisSettings(url=url, cluster=True)) as store,
    ):
        settings = store.settings
        store.create_version(OUTPUT, V1, N)
        store.write(OUTPUT, V1, IDS, values_of(1))
        store.publish(OUTPUT, V1, {IDS[0]: values_of(1)[0]})
        for version in (V2, V3, V4):
            publish(store, version, keep=2)
        assert store.rollback(OUTPUT) == V3
        assert [v.name for v in store.versions(OUTPUT)] == [V2, V3, V4]
        assert asyncio.run(read(settings, IDS[:50]))[:2] == (V3, values_of(3)[:50])


def test_a_copy_holds_counts_within_the_slack_of_its_buckets(store: KeyValueStore) -> None:
    """copyable: a copy keeps the source's buckets, so it holds well as many records as fill them
    to entries_per_bucket, BUCKET_SLACK either side (here 100 a bucket, 25%: 3 buckets of a
    250-record version hold 150 to 375 records, the fewest leaving one bucket to spare)."""
    load(store, V1)
    assert store.layout(OUTPUT, V1).buckets == 3
    held = store.copyable(OUTPUT, V1)
    assert (held.start, held.stop - 1) == (150, 375)
    assert 149 not in held and 376 not in held
    store.create_version(OUTPUT, V2, 0)
    assert store.layout(OUTPUT, V2).buckets == 1  # an empty version still has a bucket to write to
    assert store.copyable(OUTPUT, V2) == range(0, 126)
    store.create_version(OUTPUT, V3, 0, buckets=4)
    assert store.copyable(OUTPUT, V3) == range(225, 501)  # an even count: 3 buckets filled at least
    store.create_version(OUTPUT, V4, 0, buckets=1)  # the fewest there can be
    assert store.copyable(OUTPUT, V4) == range(0, 126)


def test_a_version_the_collector_deleted_is_never_written_again(
    store: KeyValueStore, settings: RedisSettings
) -> None:
    """A run that dies before its publish leaves a version that a later publish collects; a
    write to it afterwards (the dead run's straggler) is refused, not left as orphan keys."""
    load(store, V1, rows=N - 1)  # written by this process, never published
    publish(store, V2, keep=0)
    assert [v.name for v in store.versions(OUTPUT)] == [V2]
    with pytest.raises(VersionNotFoundError, match="create_version first"):
        store.write(OUTPUT, V1, IDS[:1], values_of(1)[:1])
    assert not any(f":{V1}:".encode() in key for key in keys_of(settings))


def test_versions_newer_than_the_published_one_are_collected_once_rolled_back_from(
    store: KeyValueStore,
) -> None:
    """After a rollback the versions newer than the published one were published once: they are
    rollback targets like older ones, and keep=0 deletes them all; the listing marks only the
    published version current."""
    for version in (V1, V2, V3):
        publish(store, version, keep=2)
    store.rollback(OUTPUT, to=V1)
    load(store, V4)  # in progress: newer, never published
    assert [(v.name, v.is_current) for v in store.versions(OUTPUT)] == [
        (V1, True),
        (V2, False),
        (V3, False),
        (V4, False),
    ]
    assert store.collect_garbage(OUTPUT, keep=0) == [V2, V3]
    assert [v.name for v in store.versions(OUTPUT)] == [V1, V4]


def test_a_failed_nights_version_is_dropped_whole_and_the_published_one_never(
    store: KeyValueStore, settings: RedisSettings
) -> None:
    """What the night's lifecycle asks of OutputVersions when a version fails before its publish."""
    versions = OutputVersions(store, OUTPUT)

    def fails() -> None:
        new = versions.writer(new_version(), dict)
        new.create(N)
        store.write(OUTPUT, new.version, IDS, values_of(2))
        versions.drop(new.version)

    fails()  # the first night of an output: nothing published yet
    assert keys_of(settings) == set()
    versions.drop("20261108T031500Z-never")  # one that never got as far as existing
    publish(store, V1)
    before = keys_of(settings)
    fails()
    versions.drop(V1)  # the published one is never dropped
    assert keys_of(settings) == before
    [published] = versions.listing()
    assert (published.name, published.count, published.current) == (V1, N, True)
    assert versions.versions() == [V1]
    assert 0 <= published.age_s < 24 * 3600


def test_a_new_version_from_a_copy_plan_holds_the_copy_less_the_users_gone(
    store: KeyValueStore, settings: RedisSettings
) -> None:
    """An incremental run's version: an overlay over V1, the users gone since deleted, published
    with its own meta; the kept users read V1's values."""
    published = load(store, V1)
    store.publish(OUTPUT, V1)
    new = OutputVersions(store, OUTPUT).writer(new_version(), lambda: {"ordinal": 2})
    new.create(N - 2, CopyPlan(V1, IDS[:2]))
    assert store.layout(OUTPUT, new.version).base == V1
    store.publish(OUTPUT, new.version, {IDS[5]: published[5]})
    version, values, meta = asyncio.run(read(settings, [IDS[0], IDS[1], IDS[5], IDS[-1]]))
    assert (version, values, meta) == (new.version, [None, None, published[5], published[-1]], {"ordinal": 2})


def test_a_publish_refuses_a_version_that_does_not_hold_what_it_was_created_for(store: KeyValueStore) -> None:
    """More records than created for (a retried write's, another run's) or fewer; samples that
    are not str ids to bytes; and many wrong samples name the first WRONG_SAMPLES_SHOWN (5)."""
    store.create_version(OUTPUT, V1, N - 1)
    store.write(OUTPUT, V1, IDS, values_of(1))
    with pytest.raises(PublishValidationError, match=f"holds {N} records, but was created for {N - 1}"):
        store.publish(OUTPUT, V1)
    values = load(store, V2)
    with pytest.raises(ValueError, match="samples must map str ids to bytes values, got 7: bytes"):
        store.publish(OUTPUT, V2, {7: values[0]})
    with pytest.raises(ValueError, match="samples must map str ids to bytes values, got 'pkg-0': str"):
        store.publish(OUTPUT, V2, {IDS[0]: "x"})
    wrong = {item: values[0] for item in IDS[1:8]}
    with pytest.raises(PublishValidationError) as refused:
        store.publish(OUTPUT, V2, wrong)
    assert str(refused.value).endswith(f"7 of 7 samples read back missing or different, e.g. {IDS[1:6]}")
    with pytest.raises(ValueError, match="ids and values differ in length: 1 and 2"):
        store.write(OUTPUT, V2, IDS[:1], values[:2])
    assert store.current(OUTPUT) is None


@pytest.mark.parametrize("buckets", [4, 2])  # more or fewer: a record would land in a bucket no reader asks
def test_a_copy_into_a_version_of_another_bucket_count_is_refused(store: KeyValueStore, buckets: int) -> None:
    load(store, V1)
    store.create_version(OUTPUT, V2, N, buckets=buckets)
    with pytest.raises(
        StoreError, match=f"'{V2}' of output 'recs' has {buckets} buckets and '{V1}' 3: create it with buckets=3"
    ):
        store.copy_version(OUTPUT, V1, V2)


def test_versions_of_thousands_of_buckets_are_counted_and_copied_whole(
    store: KeyValueStore, settings: RedisSettings
) -> None:
    """Counting and copying go a chunk of buckets a round trip (500): every chunk is done, the
    last partial one too."""
    buckets, ids = 2_345, [f"user-{i}" for i in range(6_000)]
    values = [i.to_bytes(4, "little") for i in range(len(ids))]
    store.create_version(OUTPUT, V1, len(ids), buckets=buckets)
    store.write(OUTPUT, V1, ids, values)
    store.publish(OUTPUT, V1, {ids[0]: values[0]})  # the record count checked over every bucket
    store.create_version(OUTPUT, V2, len(ids), buckets=buckets)
    store.copy_version(OUTPUT, V1, V2)
    store.publish(OUTPUT, V2, {ids[-1]: values[-1]})
    assert asyncio.run(read(settings, ids))[:2] == (V2, values)
    assert store.collect_garbage(OUTPUT, keep=0) == [V1]  # its buckets unlinked a chunk a round trip
    assert not [key for key in keys_of(settings) if V1.encode() in key]


def test_a_version_registered_with_its_meta_inline_reads_it_from_there(
    store: KeyValueStore, settings: RedisSettings
) -> None:
    """A version made before meta had a key of its own keeps being read after an upgrade."""
    keys = output_keys(settings, OUTPUT)
    entry = {"rows": 0, "buckets": 1, "created": "2026-11-01T00:00:00+00:00", "meta": {"vocabulary": ["a"]}}
    with redis.Redis.from_url(settings.url) as client:
        client.hset(keys.registry, V1, json.dumps(entry))
    assert store.meta(OUTPUT, V1) == {"vocabulary": ["a"]}
    store.publish(OUTPUT, V1)
    assert asyncio.run(read(settings, []))[2] == {"vocabulary": ["a"]}
