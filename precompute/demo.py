"""`precompute demo`: the end-to-end path on embedded defaults, shown with real queries."""

from __future__ import annotations

import time

import numpy as np
import pyarrow.parquet as pq

from models import EngineSettings, load_encoder

QUERIES = ("play chess against the computer", "compress files to save disk space", "python web framework")


def main(top_k: int = 3) -> None:
    settings = EngineSettings()
    corpus = pq.read_table(settings.reference_corpus, columns=["id", "title", "text"]).to_pylist()
    with load_encoder(settings) as encoder:
        report = encoder.report
        print(f"engine: {report.backend}/{report.device}/{report.precision} (cache hit: {report.cache_hit})")
        for gate in report.gates:
            verdict = "passed" if gate.passed else f"failed: {gate.reason}"
            print(f"  gate {gate.precision}: cosine mean {gate.mean_cosine:.4f}, min {gate.min_cosine:.4f}, {verdict}")
        start = time.perf_counter()
        vectors = encoder.encode([row["text"] for row in corpus])
        seconds = time.perf_counter() - start
        print(f"embedded {len(corpus)} documents in {seconds:.1f} s ({len(corpus) / seconds:.0f} docs/s)")
        for query in QUERIES:
            scores = vectors @ encoder.encode([query])[0]
            print(f"\n{query!r}")
            for i in np.argsort(-scores)[:top_k]:
                print(f"  {scores[i]:.3f}  {corpus[i]['id']}: {corpus[i]['title']}")
