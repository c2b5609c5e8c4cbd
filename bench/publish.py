"""`bench publish`: our versioned write path against plain MSET, on the same records, in one fresh Redis.

Ours: `KeyValueStore.create_version`, `write` in blocks of `block` records (what the Ray sink
hands each write task), then `publish` (count check over every bucket, sample reads, the
pointer flip). Baseline, what a user would otherwise pick: MSET of the same pre-encoded
values under plain keys `{prefix}:{id}`, 1,000 per call, with no versioning at all.
Records: the demo corpus's ids (Debian package names) suffixed to reach the count, each
with a top-k ranked value from `stores.records` (6 bytes a pair). Both sides take turns
in each repeat on an emptied Redis; medians are reported.

Memory is Redis's `used_memory` after the load minus before it (FLUSHALL in between): it
counts everything the layout costs, the main dictionary's table and allocator rounding
included, which MEMORY USAGE per key leaves out (reported too, as `memory_usage_*`).
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import redis

from models.hardware import device_fingerprint
from models.settings import DEMO_CORPUS
from stores.key_value import KeyValueStore
from stores.records import encode_ranked
from stores.redis_server import redis_server
from stores.redis_settings import RedisSettings

OUTPUT = "recs"
MSET_BATCH = 1000
SAMPLES = 100
KEY_CHUNK = 1000


def records(n: int, k: int) -> tuple[list[str], list[bytes]]:
    base = pq.read_table(DEMO_CORPUS, columns=["id"])["id"].to_pylist()
    ids = [item if r == 0 else f"{item}:{r}" for r in range(-(-n // len(base))) for item in base][:n]
    rng = np.random.default_rng(0)
    indices = rng.integers(0, len(base), size=(n, k))
    scores = np.sort(rng.random((n, k)), axis=1)[:, ::-1].astype(np.float16)
    return ids, encode_ranked(indices, scores)


def used_memory(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def memory_usage(client: redis.Redis, keys: list[str]) -> int:
    """Sum of MEMORY USAGE (exact: SAMPLES 0) over `keys`."""
    total = 0
    for start in range(0, len(keys), KEY_CHUNK):
        pipe = client.pipeline(transaction=False)
        for key in keys[start : start + KEY_CHUNK]:
            pipe.memory_usage(key, samples=0)
        total += sum(pipe.execute())
    return total


def measure(client: redis.Redis, load: Callable[[], str]) -> tuple[float, int, list[bytes]]:
    """(seconds, used_memory delta, keys written) of one load into an emptied Redis.

    `load` returns the SCAN pattern of its keys; SCAN is fine here, on a bench's own Redis.
    """
    client.flushall(asynchronous=False)
    before = used_memory(client)
    start = time.perf_counter()
    pattern = load()
    seconds = time.perf_counter() - start
    grown = used_memory(client) - before
    return seconds, grown, list(client.scan_iter(match=pattern, count=KEY_CHUNK))


def main(
    records_n: int = 100_000, k: int = 10, repeats: int = 3, block: int | None = None
) -> dict[str, object]:
    """`block`: records per `write` call; by default what the Ray sink hands it (`write_batch`)."""
    ids, values = records(records_n, k)
    payload = sum(len(i.encode()) + len(v) for i, v in zip(ids, values, strict=True)) / records_n
    samples = {ids[i]: values[i] for i in range(0, records_n, max(records_n // SAMPLES, 1))}
    times: dict[str, list[float]] = {"ours": [], "baseline": []}
    grown: dict[str, list[int]] = {"ours": [], "baseline": []}
    usage: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="bench-publish-") as tmp, redis_server(Path(tmp)) as url:
        settings = RedisSettings(url=url)
        block = block or settings.write_batch
        client = redis.Redis.from_url(url)
        with KeyValueStore(settings) as store:

            def ours() -> str:
                version = f"20261122T031500Z-{time.monotonic_ns():x}"
                store.create_version(OUTPUT, version, records_n)
                for start in range(0, records_n, block):
                    store.write(OUTPUT, version, ids[start : start + block], values[start : start + block])
                store.publish(OUTPUT, version, samples)
                return f"{settings.prefix}:{OUTPUT}:{version}:*"

            def baseline() -> str:
                plain = [f"{settings.prefix}:{i}" for i in ids]
                for start in range(0, records_n, MSET_BATCH):
                    stop = start + MSET_BATCH
                    client.mset(dict(zip(plain[start:stop], values[start:stop], strict=True)))
                return f"{settings.prefix}:*"

            for _ in range(repeats):
                for name, load in (("ours", ours), ("baseline", baseline)):
                    seconds, delta, keys = measure(client, load)
                    times[name].append(seconds)
                    grown[name].append(delta)
                    usage[name] = memory_usage(client, keys)
                    if name == "ours":
                        pipe = client.pipeline(transaction=False)
                        for key in keys:
                            pipe.object("encoding", key)
                        not_listpack = sum(e != b"listpack" for e in pipe.execute())
                        buckets = len(keys)
        client.close()

    result: dict[str, object] = {
        "bench": "publish",
        "machine": device_fingerprint("cpu"),
        "records": records_n,
        "k": k,
        "repeats": repeats,
        "block": block,
        "payload_bytes_per_record": round(payload, 1),
        "buckets": buckets,
        "buckets_not_listpack": not_listpack,
        "ours": "KeyValueStore.write (hash buckets) + publish",
        "baseline": f"redis-py MSET, {MSET_BATCH} plain keys per call",
    }
    for name in times:
        result[f"{name}_records_per_s"] = round(records_n / statistics.median(times[name]))
        result[f"{name}_bytes_per_record"] = round(statistics.median(grown[name]) / records_n, 1)
        result[f"{name}_x_payload"] = round(statistics.median(grown[name]) / records_n / payload, 2)
        result[f"{name}_memory_usage_bytes_per_record"] = round(usage[name] / records_n, 1)
    result["ratio"] = round(result["ours_records_per_s"] / result["baseline_records_per_s"], 2)
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
        f"memory is the used_memory delta; MEMORY USAGE summed over keys says ours "
        f"{result['ours_memory_usage_bytes_per_record']}, baseline {result['baseline_memory_usage_bytes_per_record']} "
        f"B/record; {not_listpack} of {buckets} buckets past the listpack limits"
    )
    print(f"machine {result['machine']}")
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
