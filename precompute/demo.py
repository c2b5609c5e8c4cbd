"""`precompute demo`: the nightly flow on the demo corpus, then real queries through the service."""

from __future__ import annotations

import httpx

from flows.nightly import nightly
from lookup.server import running
from lookup.settings import ServiceSettings

QUERIES = ("play chess against the computer", "compress files to save disk space", "python web framework")


def main(top_k: int = 3) -> None:
    report = nightly()
    print(
        f"\npublished version {report['version']}: {report['rows']} rows, {report['rejects']} rejected, "
        f"{report['reused']} reused, {report['computed']} computed, recall@10 {report['validation']['recall_at_10']}"
    )
    with running(ServiceSettings()) as base:
        print(f"lookup service at {base}: {httpx.get(f'{base}/readyz').json()}")
        for query in QUERIES:
            answer = httpx.post(f"{base}/v1/search", json={"query": query, "k": top_k}).json()
            print(f"\nPOST /v1/search {query!r}")
            for hit in answer["hits"]:
                print(f"  {hit['score']:.3f}  {hit['id']}: {hit['payload'].get('title', '')}")
