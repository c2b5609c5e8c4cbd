"""`precompute bench capacity`: the lookup service under a mixed load, rate after rate, until it
misses its latency goals: lookups' p99 <= 2 ms and searches' p99 <= 10 ms.

The service: a child process (uvicorn, as in production) over a fresh redis-server holding
labels for the 5,000 demo items and 10 recommendations for 5,000 users, and the demo corpus
embedded into an in-process Qdrant version. The mix: 90% key lookups (labels and recs, ids at
random) and 10% searches whose texts are the demo's package titles drawn with a Zipf law
(a few queries make most of the traffic, as in real search logs).

Two load generators:
- open loop (bench/load.py): requests due at a fixed rate, latency from the due time, per
  route: what p99 a product service sees at that rate. The highest rate where both goals
  hold is `max_rps`. Run with the query cache off, then on (the service restarted).
- wrk (Debian's C load generator, installed here if missing), closed loop over 16
  connections with the same mix (a Lua script): the most requests/s the service answers at
  all, whatever the latency.

The baseline in the same run: lookups alone at the lookup share of `max_rps`, so that the
cost of searches running alongside is the ratio of the two p99s. Then a cached search:
repeated queries against a warm cache, whose p50 is `cached_search_p50_ms`, beside the floor
of any answer on this machine and client (`GET /healthz`, same rate) and the share of those
searches the service itself answered within 0.5 ms (its latency histogram, lookup/metrics.py).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

import httpx
import numpy as np
import pyarrow.parquet as pq

from precompute.bench.load import CLIENT_THREADS, get, http, open_loop, percentiles, post_json
from precompute.bench.lookup import labels, publish, recs
from precompute.bench.records import Figure, write_record
from precompute.demo_data import DEMO_CORPUS, demo_engine
from precompute.lookup.settings import ServiceSettings
from precompute.models import load_encoder
from precompute.models.hardware import device_fingerprint
from precompute.service.server import running
from precompute.stores.key_value.server import free_port, redis_server
from precompute.stores.key_value.settings import RedisSettings
from precompute.stores.vectors import open_vector_store
from precompute.stores.vectors.settings import VectorStoreSettings
from precompute.stores.versions import new_version

SEARCH_SHARE = 0.10
ZIPF_S = 1.1
K = 10
LOOKUP_P99_MS, SEARCH_P99_MS = 2.0, 10.0
WARMUP_S = 1.0
WRK_CONNECTIONS = 16
WRK_SCRIPT = """
-- The bench's mix: requests[i] is drawn per call, weighted as in the open-loop runs.
local requests = {}
function init(args)
  local f = io.open(args[1])
  for line in f:lines() do
    local method, path, body = line:match("^(%u+) (%S+) ?(.*)$")
    table.insert(requests, wrk.format(method, path, {["Content-Type"] = "application/json"},
                                      body ~= "" and body or nil))
  end
  f:close()
end
function request()
  return requests[math.random(#requests)]
end
"""


def ensure_wrk() -> str:
    """wrk's path, installing Debian's package first if it is missing (as `make` does redis-server)."""
    if path := shutil.which("wrk"):
        return path
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    subprocess.run([*sudo, "apt-get", "install", "-y", "-qq", "wrk"], check=True, capture_output=True)
    return shutil.which("wrk") or "wrk"


def zipf_queries(queries: list[str], size: int, rng: np.random.Generator) -> list[str]:
    """`size` draws from `queries` with P(rank r) proportional to 1 / r^ZIPF_S."""
    weights = 1 / np.arange(1, len(queries) + 1) ** ZIPF_S
    return [queries[i] for i in rng.choice(len(queries), size=size, p=weights / weights.sum())]


class Mix:
    """The mixed requests of one run: raw HTTP bytes, and which of them are searches."""

    def __init__(self, host: str, ids: list[str], users: list[str], queries: list[str]) -> None:
        self.host, self.ids, self.users, self.queries = host, ids, users, queries

    def lookup(self, rng: np.random.Generator) -> tuple[str, str]:
        if rng.random() < 0.5:
            return "GET", f"/v1/labels/{self.ids[rng.integers(len(self.ids))]}"
        return "GET", f"/v1/recs/{self.users[rng.integers(len(self.users))]}"

    def draw(
        self, size: int, share: float, rng: np.random.Generator
    ) -> tuple[list[tuple[str, str, str]], np.ndarray]:
        """(method, path, JSON body) of `size` requests, `share` of them searches; and the search mask."""
        searches = rng.random(size) < share
        texts = iter(zipf_queries(self.queries, int(searches.sum()), rng))
        drawn = [
            ("POST", "/v1/search", json.dumps({"query": next(texts), "k": K}))
            if search
            else (*self.lookup(rng), "")
            for search in searches
        ]
        return drawn, searches

    def raw(self, drawn: list[tuple[str, str, str]]) -> list[bytes]:
        return [
            post_json(self.host, path, json.loads(body)) if method == "POST" else get(self.host, path)
            for method, path, body in drawn
        ]


def open_loop_run(
    mix: Mix, port: int, rate: float, seconds: float, share: float, rng: np.random.Generator
) -> dict[str, float]:
    """p50/p99 per route at `rate` (after WARMUP_S of the same load) and the failed requests."""
    warm, _ = mix.draw(int(rate * WARMUP_S), share, rng)
    open_loop(http(mix.host, port, mix.raw(warm)), len(warm), rate)
    drawn, searches = mix.draw(int(rate * seconds), share, rng)
    latencies, failed = open_loop(http(mix.host, port, mix.raw(drawn)), len(drawn), rate)
    figures: dict[str, float] = {"rate": rate, "failed": failed}
    for route, mask in (("lookup", ~searches), ("search", searches)):
        if mask.any():
            figures.update({f"{route}_{k}": v for k, v in percentiles(latencies[mask]).items()})
    return figures


def meets_goals(figures: dict[str, float]) -> bool:
    return (
        figures["failed"] == 0
        and figures.get("lookup_p99_ms", 0) <= LOOKUP_P99_MS
        and figures.get("search_p99_ms", 0) <= SEARCH_P99_MS
    )


def wrk_run(
    wrk: str,
    mix: Mix,
    port: int,
    seconds: float,
    rng: np.random.Generator,
    work: Path,
    connections: int = WRK_CONNECTIONS,
    share: float = SEARCH_SHARE,
) -> dict[str, float]:
    """Closed loop over `connections` connections, the mix: requests/s and wrk's latency p50/p99."""
    drawn, _ = mix.draw(20_000, share, rng)
    (work / "requests.txt").write_text("".join(f"{m} {p} {b}\n" for m, p, b in drawn))
    (work / "mix.lua").write_text(WRK_SCRIPT)
    out = subprocess.run(
        [
            wrk,
            f"-c{connections}",
            "-t1",
            f"-d{seconds:g}s",
            "--latency",
            "-s",
            str(work / "mix.lua"),
            f"http://{mix.host}:{port}",
            "--",
            str(work / "requests.txt"),
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    latency = {p: re.search(rf"\s{p}%\s+([\d.]+)(us|ms|s)", out) for p in ("50", "99")}
    scale = {"us": 0.001, "ms": 1.0, "s": 1000.0}
    figures = {"requests_per_s": rps}
    for p, m in latency.items():
        if m:
            figures[f"p{p}_ms"] = round(float(m.group(1)) * scale[m.group(2)], 3)
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    figures["non_2xx"] = int(non2xx.group(1)) if non2xx else 0
    return figures


def publish_corpus(stores: VectorStoreSettings, corpus: list[dict]) -> None:
    with load_encoder(demo_engine()) as encoder, open_vector_store(stores, "corpus") as store:
        version = new_version()
        store.create_version(version, encoder.dim)
        store.upsert(
            version,
            [r["id"] for r in corpus],
            encoder.encode([r["text"] for r in corpus]),
            [{"title": r["title"]} for r in corpus],
        )
        store.finalize(version)
        store.publish(version)


CACHED_RATE = 100
CACHED_SECONDS = 3


def search_histogram(base: str) -> dict[str, float]:
    """The service's cumulative search latency buckets (answered 200), by upper bound."""
    text = httpx.get(f"{base}/metrics").text
    pattern = r'precompute_request_seconds_bucket\{le="([^"]+)",route="/v1/search",status="200"\} (\S+)'
    return {le: float(count) for le, count in re.findall(pattern, text)}


def cached_search(mix: Mix, base: str, port: int, rng: np.random.Generator) -> dict[str, float]:
    """One query, repeated (its answer cached): p50/p99 from the client, the floor of any answer
    (/healthz) from the same client at the same rate, and the share the service answered in 0.5 ms."""
    hot = Mix(mix.host, mix.ids, mix.users, mix.queries[:1])
    before = search_histogram(base)
    figures = open_loop_run(hot, port, CACHED_RATE, CACHED_SECONDS, 1.0, rng)
    after = search_histogram(base)
    within = (after["0.0005"] - before.get("0.0005", 0)) / (after["+Inf"] - before.get("+Inf", 0))
    n = CACHED_RATE * CACHED_SECONDS
    floor, _ = open_loop(http(mix.host, port, [get(mix.host, "/healthz")] * n), n, CACHED_RATE)
    return {
        **figures,
        "healthz_p50_ms": percentiles(floor)["p50_ms"],
        "in_service_share_within_0_5_ms": round(within, 3),
    }


def cached_search_back_to_back(
    wrk: str, mix: Mix, port: int, rng: np.random.Generator, work: Path
) -> dict[str, float]:
    """The cached query again and again on one connection from wrk (C): no idle gaps to wake
    from and no Python client in the way."""
    hot = Mix(mix.host, mix.ids, mix.users, mix.queries[:1])
    return wrk_run(wrk, hot, port, CACHED_SECONDS, rng, work, connections=1, share=1.0)


OVERLOAD = 5
"""A ramp stops past the first rate whose p50s are this many times the p99 goals: a backlog,
which in an open loop only grows from there (a p99 alone can be one stall of a shared machine)."""
CACHE_WARM_SEARCHES = 500


def overloaded(figures: dict[str, float]) -> bool:
    return (
        figures["failed"] > 0
        or figures.get("lookup_p50_ms", 0) > OVERLOAD * LOOKUP_P99_MS
        or figures.get("search_p50_ms", 0) > OVERLOAD * SEARCH_P99_MS
    )


def ramp(
    mix: Mix, port: int, rates: Sequence[float], seconds: float, rng: np.random.Generator
) -> dict[str, object]:
    """Each rate in turn until overloaded; the highest that meets the goals, and at it the
    p99 of lookups alone (the same lookups' share of the rate, no searches)."""
    run: dict[str, object] = {"rates": []}
    best = None
    for rate in rates:
        figures = open_loop_run(mix, port, rate, seconds, SEARCH_SHARE, rng)
        run["rates"].append(figures)  # type: ignore[union-attr]
        print(
            f"{rate:7g} {figures['lookup_p50_ms']:11.3f} {figures['lookup_p99_ms']:7.3f} "
            f"{figures['search_p50_ms']:11.3f} {figures['search_p99_ms']:7.3f} {figures['failed']:7d}"
        )
        if meets_goals(figures):
            best = figures
        if overloaded(figures):
            break
    run["max_rps"] = best["rate"] if best else 0
    run["at_max"] = best
    reference = best or run["rates"][0]  # type: ignore[index]
    alone = open_loop_run(mix, port, reference["rate"] * (1 - SEARCH_SHARE), seconds, 0, rng)
    run["lookups_alone"] = alone
    run["lookup_p99_mixed_over_alone"] = round(reference["lookup_p99_ms"] / alone["lookup_p99_ms"], 2)
    print(
        f"lookups alone at {alone['rate']:g}/s: p50 {alone['lookup_p50_ms']:.3f} ms, p99 {alone['lookup_p99_ms']:.3f} ms "
        f"(mixed at {reference['rate']:g}/s over alone: {run['lookup_p99_mixed_over_alone']}x)"
    )
    return run


def main(
    rates: Sequence[float] = (25, 50, 100, 200, 400),
    seconds: float = 5.0,
    seed: int = 0,
    workers: Sequence[int] = (1, 2),
) -> dict[str, object]:
    rng = np.random.default_rng(seed)
    corpus = pq.read_table(DEMO_CORPUS, columns=["id", "title", "text", "section"]).to_pylist()
    ids = [r["id"] for r in corpus]
    queries = list(dict.fromkeys(r["title"] for r in corpus))
    rng.shuffle(queries)
    vocabulary, label_values = labels(ids, [r["section"] for r in corpus], rng)
    users, user_values = recs(len(ids), rng)
    wrk = ensure_wrk()
    result: dict[str, object] = {
        "bench": "capacity",
        "machine": device_fingerprint("cpu"),
        "cores": len(os.sched_getaffinity(0)),
        "mix": f"{1 - SEARCH_SHARE:.0%} key lookups (labels, recs), {SEARCH_SHARE:.0%} searches "
        f"(Zipf s={ZIPF_S} over {len(queries)} titles)",
        "goals": {"lookup_p99_ms": LOOKUP_P99_MS, "search_p99_ms": SEARCH_P99_MS},
        "client": f"open loop, {CLIENT_THREADS} threads, {seconds:g} s a rate; wrk {WRK_CONNECTIONS} connections",
        "runs": {},
    }
    print(f"{result['mix']}; open loop {seconds:g} s a rate; machine {result['machine']}")
    with (
        tempfile.TemporaryDirectory(prefix="bench-capacity-") as tmp,
        redis_server(Path(tmp) / "redis") as url,
    ):
        work = Path(tmp)
        redis = RedisSettings(url=url)
        publish(redis, "labels", ids, label_values, vocabulary)
        publish(redis, "recs", users, user_values, ids)
        stores = VectorStoreSettings(type="edge", path=work / "qdrant")
        publish_corpus(stores, corpus)
        for count in workers:
            for cache in ("off", "on"):
                service = ServiceSettings(
                    port=free_port(),
                    workers=count,
                    query_cache_mb=32 if cache == "on" else 0,
                    warmup_queries=50,
                )
                mix = Mix(service.host, ids, users, queries)
                with running(service, stores, redis) as base:
                    print(f"\n{count} worker(s), query cache {cache}")
                    if cache == "on":  # steady state: the head of the query distribution is cached
                        open_loop_run(mix, service.port, 100, CACHE_WARM_SEARCHES / 100, 1.0, rng)
                    print(
                        f"{'rate/s':>7} {'lookup p50':>11} {'p99':>7} {'search p50':>11} {'p99':>7} {'failed':>7}"
                    )
                    run = ramp(mix, service.port, rates, seconds, rng)
                    run["wrk"] = wrk_run(wrk, mix, service.port, seconds, rng, work)
                    print(
                        f"wrk, closed loop: {run['wrk']['requests_per_s']:.0f} requests/s, "
                        f"p50 {run['wrk'].get('p50_ms')} ms, p99 {run['wrk'].get('p99_ms')} ms"
                    )
                    if cache == "on":
                        hot = run["cached_search"] = cached_search(mix, base, service.port, rng)
                        hot["wrk_back_to_back"] = cached_search_back_to_back(
                            wrk, mix, service.port, rng, work
                        )
                        print(
                            f"cached search at {CACHED_RATE}/s: p50 {hot['search_p50_ms']:.3f} ms, "
                            f"p99 {hot['search_p99_ms']:.3f} ms; /healthz p50 {hot['healthz_p50_ms']:.3f} ms; "
                            f"{hot['in_service_share_within_0_5_ms']:.0%} within 0.5 ms inside the service; "
                            f"back to back from wrk: p50 {hot['wrk_back_to_back'].get('p50_ms')} ms"
                        )
                result["runs"][f"workers_{count}_cache_{cache}"] = run  # type: ignore[index]
    best = max(
        (run for name, run in result["runs"].items() if name.endswith("cache_on")),  # type: ignore[union-attr]
        key=lambda run: run["max_rps"],
    )
    at = best["at_max"] or {}
    result.update(
        {
            "max_rps": best["max_rps"],
            "lookup_p99_ms": at.get("lookup_p99_ms"),
            "search_p99_ms": at.get("search_p99_ms"),
            "cached_search_p50_ms": best["cached_search"]["search_p50_ms"],
            "healthz_p50_ms": best["cached_search"]["healthz_p50_ms"],
            "cached_search_back_to_back_p50_ms": best["cached_search"]["wrk_back_to_back"].get("p50_ms"),
        }
    )
    print(json.dumps(result))
    mixed = best["at_max"] or best["rates"][0]
    write_record(
        "capacity",
        result,
        dataset=f"demo corpus: {len(ids):,} items' labels, {len(users):,} users' recs, searches over its titles",
        ours=Figure(
            f"lookup p99 under the {1 - SEARCH_SHARE:.0%}/{SEARCH_SHARE:.0%} mix at {mixed['rate']:g}/s "
            f"(highest rate meeting both goals: {best['max_rps']:g}/s)",
            mixed["lookup_p99_ms"],
            "ms",
        ),
        baseline=Figure(
            f"lookup p99 of lookups alone at {best['lookups_alone']['rate']:g}/s",
            best["lookups_alone"]["lookup_p99_ms"],
            "ms",
        ),
        higher_is_better=False,
    )
    return result
