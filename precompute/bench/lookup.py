"""`bench lookup`: `GET /v1/labels/{id}` through the service at fixed request rates, against bare Redis.

Ours: the lookup service as a child process (uvicorn), answering labels published by
KeyValueStore in its own fresh redis-server: per request one pipelined round trip (HGET
in the version's bucket + GET of the version pointer), numpy decode, the vocabulary
mapping, JSON. Baseline, at the same rates from the same client: redis-py GET of a plain
key holding the same value (no HTTP, no versioning, no decoding); what a product service
reading Redis directly would pay.

Records: the 5,000 demo corpus ids, each with its top-3 labels (its Debian section first,
two others after) over the 58 sections; a "recs" version of 10 items per user is
published too, as the service would find it, and a "related" version of 10 items per item.
Ids are drawn at random per request.

The related output's routes are measured the same way, each against what a product service
would do with redis-py instead: `GET /v1/related/{id}` against a GET, `POST /v1/related:batchGet`
of BATCH ids and `POST /v1/recs:forItems` of a SESSION items' session (its lists merged) against
an MGET of as many plain keys (no merge).

Load: bench/load.py (open loop, due-time latencies, raw keep-alive HTTP/1.1).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import redis

from precompute.bench.load import CLIENT_THREADS, Connect, get, http, open_loop, percentiles, post_json
from precompute.bench.records import Figure, write_record
from precompute.demo_data import DEMO_CORPUS
from precompute.lookup.settings import ServiceSettings
from precompute.models.hardware import device_fingerprint
from precompute.service.server import running
from precompute.stores.key_value.records import encode_ranked
from precompute.stores.key_value.server import free_port, redis_server
from precompute.stores.key_value.settings import RedisSettings
from precompute.stores.key_value.store import KeyValueStore
from precompute.stores.vectors.settings import VectorStoreSettings
from precompute.stores.versions import new_version

LABELS_PER_ITEM = 3
RECS_PER_USER = 10
USERS = 5000
PLAIN_PREFIX = "bench:plain:"
RELATED_PREFIX = "bench:related:"
WARMUP_S = 1.0
BATCH = 10
"""Ids per `:batchGet`."""
SESSION = 5
"""Items per `:forItems` session."""


def labels(ids: list[str], sections: list[str], rng: np.random.Generator) -> tuple[list[str], list[bytes]]:
    """(vocabulary, one value per id): the item's own section first, then two others."""
    vocabulary = sorted(set(sections))
    own = np.array([vocabulary.index(s) for s in sections])
    others = (own[:, None] + rng.integers(1, len(vocabulary), size=(len(ids), LABELS_PER_ITEM - 1))) % len(
        vocabulary
    )
    indices = np.concatenate([own[:, None], others], axis=1)
    scores = np.sort(rng.random((len(ids), LABELS_PER_ITEM)), axis=1)[:, ::-1]
    return vocabulary, encode_ranked(indices, scores)


def recs(items: int, rng: np.random.Generator) -> tuple[list[str], list[bytes]]:
    users = [f"user-{u:05d}" for u in range(USERS)]
    indices = rng.integers(0, items, size=(USERS, RECS_PER_USER))
    scores = np.sort(rng.random((USERS, RECS_PER_USER)), axis=1)[:, ::-1]
    return users, encode_ranked(indices, scores)


def publish(
    settings: RedisSettings, output: str, ids: list[str], values: list[bytes], vocabulary: list[str], **meta: object
) -> str:
    version = new_version()
    with KeyValueStore(settings) as store:
        store.create_version(output, version, len(ids), {"vocabulary": vocabulary, **meta})
        store.write(output, version, ids, values)
        store.publish(output, version, {ids[0]: values[0]})
    return version


def redis_gets(url: str, keys: Sequence[str] | Sequence[list[str]]) -> Connect:
    """Per thread: a redis-py client of its own (one connection), GET keys[i] (MGET, a list)."""

    def connect() -> Callable[[int], bool]:
        client = redis.Redis.from_url(url)

        def call(i: int) -> bool:
            wanted = keys[i]
            if isinstance(wanted, list):
                return all(value is not None for value in client.mget(wanted))
            return client.get(wanted) is not None

        return call

    return connect


def related(items: int, rng: np.random.Generator) -> list[bytes]:
    """Each item's 10 related items, none itself."""
    indices = (np.arange(items)[:, None] + rng.integers(1, items, size=(items, RECS_PER_USER))) % items
    scores = np.sort(rng.random((items, RECS_PER_USER)), axis=1)[:, ::-1]
    return encode_ranked(indices, scores)


def side_by_side(rate: float, seconds: float, ours: Connect, baseline: Connect, name: str) -> dict[str, object]:
    """Both sides' latencies at `rate` (each after WARMUP_S of the same load), and their ratios."""
    figures: dict[str, object] = {}
    for side, connect in (("ours", ours), ("baseline", baseline)):
        open_loop(connect, int(rate * WARMUP_S), rate)
        latencies, failed = open_loop(connect, int(rate * seconds), rate)
        figures[side] = {**percentiles(latencies), "failed": failed}
        print(f"{side:9} {rate:7g} {figures[side]['p50_ms']:8.3f} {figures[side]['p99_ms']:8.3f} {failed:7d}  {name}")
    for stat in ("p50", "p99"):
        figures[f"{stat}_ratio"] = round(figures["ours"][f"{stat}_ms"] / figures["baseline"][f"{stat}_ms"], 2)
    print(f"{'ratio':9} {rate:7g} {figures['p50_ratio']:7.2f}x {figures['p99_ratio']:7.2f}x  ours / baseline")
    return figures


def main(rates: Sequence[float] = (500.0, 1000.0), seconds: float = 10.0, seed: int = 0) -> dict[str, object]:
    """`seconds` of load per rate and side, after WARMUP_S of the same load."""
    corpus = pq.read_table(DEMO_CORPUS, columns=["id", "section"])
    ids, sections = corpus["id"].to_pylist(), corpus["section"].to_pylist()
    rng = np.random.default_rng(seed)
    vocabulary, values = labels(ids, sections, rng)
    users, user_values = recs(len(ids), rng)
    value_bytes = len(values[0])

    result: dict[str, object] = {
        "bench": "lookup",
        "machine": device_fingerprint("cpu"),
        "items": len(ids),
        "labels_per_item": LABELS_PER_ITEM,
        "value_bytes": value_bytes,
        "seconds_per_rate": seconds,
        "client": f"{CLIENT_THREADS} threads, open loop, raw keep-alive HTTP/1.1 / redis-py",
        "ours": "HTTP GET /v1/labels/{id} (uvicorn, one pipelined Redis round trip, numpy decode, JSON)",
        "baseline": "redis-py GET of a plain key holding the same value",
        "rates": {},
    }
    print(
        f"{len(ids):,} items x top-{LABELS_PER_ITEM} labels ({value_bytes} B values), random ids, "
        f"{seconds:g} s per rate, open loop, {CLIENT_THREADS} client threads"
    )
    with tempfile.TemporaryDirectory(prefix="bench-lookup-") as tmp, redis_server(Path(tmp) / "redis") as url:
        settings = RedisSettings(url=url)
        publish(settings, "labels", ids, values, vocabulary)
        publish(settings, "recs", users, user_values, ids)
        related_values = related(len(ids), rng)
        publish(settings, "related", ids, related_values, ids, session_items=False)
        with redis.Redis.from_url(url) as client:
            client.mset({f"{PLAIN_PREFIX}{i}": v for i, v in zip(ids, values, strict=True)})
            client.mset({f"{RELATED_PREFIX}{i}": v for i, v in zip(ids, related_values, strict=True)})

        service = ServiceSettings(port=free_port())
        stores = VectorStoreSettings(type="edge", path=Path(tmp) / "qdrant")
        with running(service, stores, settings):
            print(f"{'':9} {'rate/s':>7} {'p50 ms':>8} {'p99 ms':>8} {'failed':>7}")
            result["routes"] = {}
            for rate in rates:
                requests = int(rate * seconds)
                picks = rng.integers(0, len(ids), size=(requests, BATCH))
                one = [ids[row[0]] for row in picks]
                labels_get = [get(service.host, f"/v1/labels/{i}") for i in one]
                result["rates"][str(int(rate))] = side_by_side(
                    rate, seconds, http(service.host, service.port, labels_get),
                    redis_gets(url, [f"{PLAIN_PREFIX}{i}" for i in one]), "GET /v1/labels/{id}",
                )  # fmt: skip
                routes = {
                    "GET /v1/related/{id}": (
                        [get(service.host, f"/v1/related/{i}") for i in one],
                        [f"{RELATED_PREFIX}{i}" for i in one],
                    ),
                    f"POST /v1/related:batchGet ({BATCH} ids)": (
                        [post_json(service.host, "/v1/related:batchGet", {"ids": [ids[p] for p in row]}) for row in picks],
                        [[f"{RELATED_PREFIX}{ids[p]}" for p in row] for row in picks],
                    ),
                    f"POST /v1/recs:forItems ({SESSION} items)": (
                        [post_json(service.host, "/v1/recs:forItems", {"ids": [ids[p] for p in row[:SESSION]]}) for row in picks],
                        [[f"{RELATED_PREFIX}{ids[p]}" for p in row[:SESSION]] for row in picks],
                    ),
                }
                for route, (ours, keys) in routes.items():
                    figures = side_by_side(rate, seconds, http(service.host, service.port, ours), redis_gets(url, keys), route)
                    result["routes"].setdefault(route, {})[str(int(rate))] = figures
    print("acceptance at 500/s: p50 <= 1 ms, p99 <= 5 ms; target at 1000/s: p50 <= 0.6 ms, p99 <= 2 ms")
    print(f"machine {result['machine']}")
    print(json.dumps(result))
    first = result["rates"][str(int(rates[0]))]
    write_record(
        "lookup",
        result,
        dataset=f"demo corpus ids, {len(ids):,} items x top-{LABELS_PER_ITEM} labels",
        ours=Figure(f"GET /v1/labels/{{id}} p99 at {rates[0]:g}/s", first["ours"]["p99_ms"], "ms"),
        baseline=Figure(f"redis-py GET p99 at {rates[0]:g}/s", first["baseline"]["p99_ms"], "ms"),
        higher_is_better=False,
    )
    return result


if __name__ == "__main__":
    main()
