"""`precompute demo`: the nightly flow on the demo data, then real reads of all three outputs through the service.

Key lookups need Redis: without PRECOMPUTE_REDIS_URL the demo starts a throwaway
redis-server of its own (nothing persisted), as a fresh machine has none running.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pyarrow.compute as pc
import pyarrow.parquet as pq

from precompute.cli.status import render, status
from precompute.flows.terminal import print_summary, run_logged
from precompute.jobs.settings import JobSettings
from precompute.lookup.settings import ServiceSettings
from precompute.pipeline import load_pipeline
from precompute.service.server import running
from precompute.settings import Machine
from precompute.stores.key_value.server import redis_server

QUERIES = ("play chess against the computer", "compress files to save disk space", "python web framework")
USERS = 2


@contextlib.contextmanager
def redis_for_demo(work_dir: Path) -> Iterator[None]:
    if "PRECOMPUTE_REDIS_URL" in os.environ:
        yield
        return
    with redis_server(work_dir / "redis") as url:
        os.environ["PRECOMPUTE_REDIS_URL"] = url
        print(f"started a throwaway redis-server at {url} (set PRECOMPUTE_REDIS_URL to use your own)")
        try:
            yield
        finally:
            del os.environ["PRECOMPUTE_REDIS_URL"]


def demo_users(interactions: str, count: int) -> dict[str, list[str]]:
    """The first `count` users with at least three items: enough history to say what they like."""
    table = pq.read_table(interactions, columns=["user_id", "item_id"])
    sizes = table.group_by("user_id").aggregate([("item_id", "list")]).sort_by("user_id")
    picked = sizes.filter(pc.greater_equal(pc.list_value_length(sizes["item_id_list"]), 3)).slice(0, count)
    return dict(zip(picked["user_id"].to_pylist(), picked["item_id_list"].to_pylist(), strict=True))


def summary(report: dict) -> str:
    """The demo pipeline's four outputs, one line each."""
    embeddings, labels, recs, related = (report["outputs"][o] for o in ("embeddings", "labels", "recs", "related"))
    quality = recs["validation"]
    models = quality["models"]
    baselines = " and ".join(
        f"{label}'s {models[name]['ndcg']:.3f}"
        for name, label in (("itemknn", "item-kNN"), ("most_popular", "most-popular"))
        if name in models  # item-kNN is left out past 20,000 items
    )
    return (
        f"embeddings {embeddings['version']}: {embeddings['rows']} rows, {embeddings['rejects']} rejected, "
        f"{embeddings['reused']} reused, {embeddings['computed']} computed, "
        f"recall@10 {embeddings['validation']['recall_at_10']}\n"
        f"labels     {labels['version']}: {labels['items']} items, {labels['labels']} labels, "
        f"engine {labels['engine']['precision']} (label gate: "
        + ", ".join(f"{g['precision']} {g['agreement']:.3f}" for g in labels["gate"])
        + ")\n"
        f"recs       {recs['version']}: {recs['users']} users, {quality['published']}: held-out "
        f"NDCG@{quality['k']} {models['published']['ndcg']:.3f} against {baselines}\n"
        f"related    {related['version']}: {related['items']} items, {related['validation']['published']}: "
        f"held-out sessions' NDCG@{related['validation']['k']} {related['validation']['models']['published']['ndcg']:.3f} "
        f"against most-popular's {related['validation']['models']['most_popular']['ndcg']:.3f}"
    )


def main(top_k: int = 3, verbose: bool = False) -> None:
    pipeline = load_pipeline()
    pipeline.check()
    with redis_for_demo(JobSettings().work_dir.machine_dir()):
        print("running the nightly flow on the demo data (a few minutes on 2 cores the first time)")
        report, log = run_logged(pipeline, verbose)
        print()
        print_summary(report, log)
        print(f"\n{summary(report)}")
        with (
            running(ServiceSettings(), pipeline=pipeline, log=log) as base,
            httpx.Client(base_url=base) as http,
        ):
            print(f"\nlookup service at {base}: {http.get('/readyz').json()}")
            for query in QUERIES:
                answer = http.post("/v1/search", json={"query": query, "k": top_k}).json()
                print(f"\nPOST /v1/search {query!r}")
                for hit in answer["hits"]:
                    labels = http.get(f"/v1/labels/{hit['id']}").json()["labels"]
                    named = ", ".join(f"{label['label']} {label['score']:.2f}" for label in labels)
                    print(f"  {hit['score']:.3f}  {hit['id']}: {hit['payload'].get('title', '')}  [{named}]")
            interactions = pipeline.outputs[pipeline.default("recs") or "recs"].input.path
            for user, items in demo_users(interactions, USERS).items():
                answer = http.get(f"/v1/recs/{user}", params={"k": 5}).json()
                print(f"\nGET /v1/recs/{user}?k=5  (declares {', '.join(items)})")
                print("  " + ", ".join(f"{item['id']} {item['score']:.2f}" for item in answer["items"]))
                related = http.get(f"/v1/related/{items[0]}", params={"k": 5}).json()
                print(f"GET /v1/related/{items[0]}?k=5")
                print("  " + ", ".join(f"{item['id']} {item['score']:.2f}" for item in related["items"]))
                session = http.post("/v1/recs:forItems", json={"ids": items[:2], "k": 5}).json()
                print(f"POST /v1/recs:forItems {items[:2]}  (an anonymous session)")
                print("  " + ", ".join(f"{item['id']} {item['score']:.2f}" for item in session["items"]))
        # Shown here, while the throwaway Redis is up: after the demo, `precompute status` reads
        # PRECOMPUTE_REDIS_URL, where the demo's labels and recs never were.
        print(f"\nprecompute status\n{render(status(pipeline, Machine.from_environment()))}")
