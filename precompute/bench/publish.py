"""`bench publish`: our versioned write path against plain MSET, on the same records, in one fresh Redis.

Ours: `KeyValueStore.create_version`, rows ordered by bucket (what the Ray sink's routing hands
its write tasks: whole buckets each), `write` in blocks of `block` records, then `publish` (count check over every bucket, sample reads, the
pointer flip). Baseline, what a user would otherwise pick: MSET of the same pre-encoded
values under plain keys `{prefix}:{id}`, 1,000 per call, with no versioning at all.
Records: the demo corpus's ids (Debian package names) suffixed to reach the count, each
with a top-k ranked value from `stores.records` (6 bytes a pair). Both sides take turns
in each repeat on an emptied Redis; medians are reported.

Memory is Redis's `used_memory` after the load minus before it (FLUSHALL in between): it
counts everything the layout costs, the main dictionary's table and allocator rounding
included, which MEMORY USAGE per key leaves out (reported too, as `memory_usage_*`, from a
sample of KEY_SAMPLE keys scaled to the key count).

Reads during garbage collection: with two versions stored, the newer one published, a
reader in another process reads random ids of the published version through the
service's KeyValueReader at `reader_rate` per second, open loop (bench/load.py: due-time
latencies, CLIENT_THREADS threads), first for IDLE_S with nothing else running (the
baseline), then while `collect_garbage` deletes the old version whole. Goal: p99 <= 2 ms.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import multiprocessing
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import redis

from precompute.bench.load import CLIENT_THREADS, open_loop, percentiles
from precompute.bench.records import Figure, write_record
from precompute.demo_data import DEMO_CORPUS
from precompute.models.hardware import device_fingerprint
from precompute.stores.key_value.reader import KeyValueReader
from precompute.stores.key_value.records import encode_ranked
from precompute.stores.key_value.server import redis_server
from precompute.stores.key_value.settings import RedisSettings, buckets_of
from precompute.stores.key_value.store import KeyValueStore

OUTPUT = "recs"
MSET_BATCH = 1000
SAMPLES = 100
KEY_CHUNK = 1000
KEY_SAMPLE = 20_000
"""Keys whose MEMORY USAGE and encoding are read (SCAN order); the sum is scaled to the key count."""
READ_IDS = 100_000
"""Ids of the published version the reader draws from (a random sample of them)."""
IDLE_S = 3.0
KEEP = 2
"""Versions kept besides the published one, as an output keeps by default."""
ADMIN_TIMEOUT_S = 600.0
"""The bench's own client: FLUSHALL of 10M keys takes seconds, past redis-py's default timeout."""
CHUNK_S = 1.0
"""The reader runs open-loop chunks of this length until told to stop."""


def records(n: int, k: int) -> tuple[list[str], list[bytes]]:
    base = pq.read_table(DEMO_CORPUS, columns=["id"])["id"].to_pylist()
    ids = [item if r == 0 else f"{item}:{r}" for r in range(-(-n // len(base))) for item in base][:n]
    rng = np.random.default_rng(0)
    indices = rng.integers(0, len(base), size=(n, k))
    scores = np.sort(rng.random((n, k)), axis=1)[:, ::-1].astype(np.float16)
    return ids, encode_ranked(indices, scores)


def used_memory(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def sampled_keys(client: redis.Redis, pattern: str) -> list[bytes]:
    """Up to KEY_SAMPLE keys matching `pattern` (SCAN is fine on a bench's own Redis)."""
    return list(itertools.islice(client.scan_iter(match=pattern, count=KEY_CHUNK), KEY_SAMPLE))


def memory_usage(client: redis.Redis, keys: list[bytes]) -> int:
    """Sum of MEMORY USAGE (exact: SAMPLES 0) over `keys`."""
    total = 0
    for start in range(0, len(keys), KEY_CHUNK):
        pipe = client.pipeline(transaction=False)
        for key in keys[start : start + KEY_CHUNK]:
            pipe.memory_usage(key, samples=0)
        total += sum(pipe.execute())
    return total


def measure(client: redis.Redis, load: Callable[[], str]) -> tuple[float, int, float]:
    """(seconds, used_memory delta, MEMORY USAGE estimated over all keys) of one load into an emptied Redis."""
    client.flushall(asynchronous=False)
    before = used_memory(client)
    start = time.perf_counter()
    pattern = load()
    seconds = time.perf_counter() - start
    grown = used_memory(client) - before
    keys = sampled_keys(client, pattern)
    return seconds, grown, memory_usage(client, keys) / len(keys) * client.dbsize()


class Readers:
    """Per client thread of open_loop a KeyValueReader on an event loop of its own, kept across
    the reader's chunks, so that no chunk pays for new connections."""

    def __init__(self, url: str, ids: Sequence[str]) -> None:
        self.ids = ids
        self.pairs = [
            (asyncio.new_event_loop(), KeyValueReader(RedisSettings(url=url))) for _ in range(CLIENT_THREADS)
        ]
        self.free = list(self.pairs)

    def connect(self) -> Callable[[int], bool]:
        loop, reader = self.free.pop()

        def call(i: int) -> bool:
            try:
                _, value = loop.run_until_complete(reader.get(OUTPUT, self.ids[i % len(self.ids)]))
            except Exception:  # counted as failed, like an error answer
                return False
            return value is not None

        return call

    def chunk(self, rate: float) -> tuple[np.ndarray, int]:
        """(latencies in ms from due time, failed reads) of CHUNK_S of reads."""
        latencies, failed = open_loop(self.connect, int(rate * CHUNK_S), rate)
        self.free = list(self.pairs)
        return latencies, failed

    def close(self) -> None:
        for loop, reader in self.pairs:
            loop.run_until_complete(reader.aclose())
            loop.close()


def read_until_stopped(
    url: str, ids: list[str], rate: float, ready: Path, stop: Path
) -> tuple[list[float], list[float], int]:
    """In its own process: (due times, latencies in ms, failed reads) of open-loop reads until
    `stop` exists."""
    readers = Readers(url, ids)
    try:
        readers.chunk(rate)  # warm-up: connections, the version's registry entry
        ready.touch()
        due: list[float] = []
        latencies: list[float] = []
        failed = 0
        while not stop.exists():
            start = time.perf_counter() + 0.05  # open_loop's first due time
            chunk, bad = readers.chunk(rate)
            failed += bad
            due += (start + np.arange(len(chunk)) / rate).tolist()
            latencies += chunk.tolist()
    finally:
        readers.close()
    return due, latencies, failed


def reads_during_gc(
    url: str, settings: RedisSettings, ids: list[str], values: list[bytes], block: int, rate: float, tmp: Path
) -> dict[str, object]:
    """Publish two versions, then collect the older one while a reader process reads the newer."""
    client = redis.Redis.from_url(url, socket_timeout=ADMIN_TIMEOUT_S)
    client.flushall(asynchronous=False)
    versions = [f"20261122T031500Z-gc{n}" for n in range(2)]
    with KeyValueStore(settings) as store:
        for version in versions:
            store.create_version(OUTPUT, version, len(ids))
            for start in range(0, len(ids), block):
                store.write(OUTPUT, version, ids[start : start + block], values[start : start + block])
            store.publish(OUTPUT, version, {ids[0]: values[0]})
    memory_two_versions = used_memory(client)
    picks = np.random.default_rng(1).integers(0, len(ids), size=min(READ_IDS, len(ids)))
    ready, stop = tmp / "reader-ready", tmp / "reader-stop"
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        reads = pool.submit(read_until_stopped, url, [ids[i] for i in picks], rate, ready, stop)
        while not ready.exists():
            if reads.done():
                reads.result()  # raises the reader's error
            time.sleep(0.05)
        time.sleep(IDLE_S)
        gc_start = time.perf_counter()
        with KeyValueStore(settings) as store:
            deleted = store.collect_garbage(OUTPUT, 0)
        gc_end = time.perf_counter()
        time.sleep(CHUNK_S)
        stop.touch()
        due, latencies, failed = reads.result()
    if deleted != versions[:1]:
        raise RuntimeError(f"garbage collection deleted {deleted}, expected {versions[:1]}")
    memory_after = used_memory(client)
    client.close()
    due_at, lat = np.array(due), np.array(latencies)
    idle = lat[due_at < gc_start]
    during = lat[(due_at >= gc_start) & (due_at <= gc_end)]
    return {
        "reader": f"KeyValueReader.get, {rate:g}/s open loop, {CLIENT_THREADS} threads, own process",
        "gc_s": round(gc_end - gc_start, 2),
        "gc_freed_bytes_per_record": round((memory_two_versions - memory_after) / len(ids), 1),
        "idle": {**percentiles(idle), "max_ms": round(float(idle.max()), 3), "reads": len(idle)},
        "during_gc": {**percentiles(during), "max_ms": round(float(during.max()), 3), "reads": len(during)}
        if len(during)
        else {"reads": 0},
        "failed_reads": failed,
    }


def main(
    records_n: int = 100_000,
    k: int = 10,
    repeats: int = 3,
    block: int | None = None,
    reader_rate: float = 1000.0,
) -> dict[str, object]:
    """`block`: records per `write` call; by default what the Ray sink hands it (`write_batch`)."""
    ids, values = records(records_n, k)
    payload = sum(len(i.encode()) + len(v) for i, v in zip(ids, values, strict=True)) / records_n
    samples = {ids[i]: values[i] for i in range(0, records_n, max(records_n // SAMPLES, 1))}
    times: dict[str, list[float]] = {"ours": [], "baseline": []}
    grown: dict[str, list[int]] = {"ours": [], "baseline": []}
    usage: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-publish-") as tmp, redis_server(Path(tmp)) as url:
        settings = RedisSettings(url=url)
        block = block or settings.write_batch
        client = redis.Redis.from_url(url, socket_timeout=ADMIN_TIMEOUT_S)
        with KeyValueStore(settings) as store:

            def ours() -> str:
                version = f"20261122T031500Z-{time.monotonic_ns():x}"
                store.create_version(OUTPUT, version, records_n)
                # The job's sink routes rows to write tasks by bucket (KeyValueSink.routed, a hash
                # partition in Ray Data); one process orders them so here, in the timed part.
                buckets = buckets_of([i.encode() for i in ids], store.layout(OUTPUT, version).buckets)
                order = np.argsort(np.array(buckets, np.int64), kind="stable")
                for start in range(0, records_n, block):
                    part = order[start : start + block].tolist()
                    store.write(OUTPUT, version, [ids[i] for i in part], [values[i] for i in part])
                store.publish(OUTPUT, version, samples)
                store.collect_garbage(OUTPUT, KEEP)
                return f"{settings.prefix}:{OUTPUT}:{version}:*"

            def baseline() -> str:
                plain = [f"{settings.prefix}:{i}" for i in ids]
                for start in range(0, records_n, MSET_BATCH):
                    stop = start + MSET_BATCH
                    client.mset(dict(zip(plain[start:stop], values[start:stop], strict=True)))
                return f"{settings.prefix}:*"

            for _ in range(repeats):
                for name, load in (("ours", ours), ("baseline", baseline)):
                    seconds, delta, usage[name] = measure(client, load)
                    times[name].append(seconds)
                    grown[name].append(delta)
                    if name == "ours":
                        buckets = math.ceil(records_n / settings.entries_per_bucket)
                        pipe = client.pipeline(transaction=False)
                        for key in sampled_keys(client, f"{settings.prefix}:{OUTPUT}:*"):
                            pipe.object("encoding", key)
                        encodings = pipe.execute()
                        not_listpack = sum(e != b"listpack" for e in encodings)
        client.close()
        gc = reads_during_gc(url, settings, ids, values, block, reader_rate, Path(tmp))

    result: dict[str, object] = {
        "bench": "publish",
        "machine": device_fingerprint("cpu"),
        "records": records_n,
        "k": k,
        "repeats": repeats,
        "block": block,
        "payload_bytes_per_record": round(payload, 1),
        "buckets": buckets,
        "buckets_sampled": len(encodings),
        "buckets_sampled_not_listpack": not_listpack,
        "ours": "KeyValueStore.write of bucket-routed blocks (hash buckets) + publish + collect_garbage",
        "baseline": f"redis-py MSET, {MSET_BATCH} plain keys per call",
    }
    for name in times:
        result[f"{name}_records_per_s"] = round(records_n / statistics.median(times[name]))
        result[f"{name}_bytes_per_record"] = round(statistics.median(grown[name]) / records_n, 1)
        result[f"{name}_x_payload"] = round(statistics.median(grown[name]) / records_n / payload, 2)
        result[f"{name}_memory_usage_bytes_per_record"] = round(usage[name] / records_n, 1)
    result["ratio"] = round(result["ours_records_per_s"] / result["baseline_records_per_s"], 2)
    result["reads_during_gc"] = gc
    print(
        f"{records_n:,} records (demo corpus ids, top-{k} ranked values), payload {payload:.1f} B/record "
        f"(id + value), median of {repeats} repeats"
    )
    print(f"{'':9} {'records/s':>10} {'B/record':>9} {'x payload':>9}")
    for name in times:
        print(
            f"{name:9} {result[f'{name}_records_per_s']:10,} {result[f'{name}_bytes_per_record']:9.1f}"
            f" {result[f'{name}_x_payload']:9.2f}  {result[name]}"
        )
    print(f"ratio     {result['ratio']:10.2f}x  ours / baseline records/s (acceptance >= 0.7)")
    print(
        f"memory is the used_memory delta; MEMORY USAGE (sampled) says ours "
        f"{result['ours_memory_usage_bytes_per_record']}, baseline {result['baseline_memory_usage_bytes_per_record']} "
        f"B/record; {not_listpack} of {len(encodings)} sampled buckets past the listpack limits"
    )
    idle, during = gc["idle"], gc["during_gc"]
    print(f"reads of the published version while the old one is collected ({gc['reader']}):")
    print(f"{'':9} {'reads':>7} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for name, figures in (("idle", idle), ("during GC", during)):
        print(
            f"{name:9} {figures['reads']:7d} {figures.get('p50_ms', float('nan')):8.3f}"
            f" {figures.get('p99_ms', float('nan')):8.3f} {figures.get('max_ms', float('nan')):8.3f}"
        )
    print(
        f"GC of {records_n:,} records took {gc['gc_s']} s; {gc['failed_reads']} reads failed; goal p99 <= 2 ms"
    )
    result["load_average_1m"] = round(os.getloadavg()[0], 1)
    print(f"machine {result['machine']}, load average (1 min) at the end {result['load_average_1m']}")
    print(json.dumps(result))
    write_record(
        "publish",
        result,
        dataset=f"{records_n:,} records: demo corpus ids, top-{k} ranked pairs each",
        ours=Figure("KeyValueStore versioned publish", result["ours_records_per_s"], "records/s"),
        baseline=Figure(f"redis-py MSET, {MSET_BATCH} keys a call", result["baseline_records_per_s"], "records/s"),
        ratio=result["ratio"],
    )
    return result


if __name__ == "__main__":
    main()
