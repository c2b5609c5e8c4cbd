"""Checks a new vector-store version must pass before anyone can read it (the embeddings kind's).

Count: every staged row is in the version. Canaries: a stored vector's nearest
neighbour is itself (or an exact duplicate of it). Recall@10: the index's answers against
exact FP32 search over the same vectors.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from precompute.jobs.embedding_cache import EMBEDDING, embeddings_of
from precompute.jobs.staging import committed_dataset
from precompute.stores.vectors import VectorStore

K = 10
TIE = 1e-5


class IndexCheckError(Exception):
    """The new version is not fit to publish; the current version stays."""


@dataclass(frozen=True)
class Validation:
    count: int
    canaries: int
    canaries_found: int
    recall_at_10: float


def staged_vectors(run_dir: Path) -> tuple[list[str], np.ndarray]:
    """(ids, vectors) of the committed parts only: a retried write's orphan part would count twice."""
    table = committed_dataset(run_dir).to_table(columns=["id", EMBEDDING])
    return [str(i) for i in table["id"].to_pylist()], embeddings_of(table)


def check_index(
    store: VectorStore, version: str, run_dir: Path, queries: int, min_recall: float
) -> Validation:
    ids, vectors = staged_vectors(run_dir)
    count = store.count(version)
    if count != len(ids):
        raise IndexCheckError(f"version {version} holds {count} points, {len(ids)} were staged")
    sample = np.random.default_rng(0).choice(len(ids), size=min(queries, len(ids)), replace=False)
    exact = np.argsort(-(vectors[sample] @ vectors.T), axis=1)[:, :K]
    found, overlap = 0, 0
    for row, truth in zip(sample, exact, strict=True):
        hits = store.search(vectors[row], K, version=version)
        top = [h.id for h in hits if h.score >= hits[0].score - TIE]
        found += ids[row] in top
        overlap += len({h.id for h in hits} & {ids[i] for i in truth})
    recall = overlap / (K * len(sample))
    if found < len(sample):
        raise IndexCheckError(f"version {version}: {len(sample) - found} of {len(sample)} canaries not found")
    if recall < min_recall:
        raise IndexCheckError(f"version {version}: recall@10 {recall:.4f} < min_recall={min_recall}")
    return Validation(count, len(sample), found, round(recall, 4))
