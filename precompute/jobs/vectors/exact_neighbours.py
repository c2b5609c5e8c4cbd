"""A check query's exact neighbours among a version's staged rows: what the index check
(jobs/vectors/index_check.py) measures each search's hits against. Scored from the staged parts a step at
a time, or, for a copy of a checked version, its source's lists updated with the rows the copy
changed (jobs/vectors/check_sample.py)."""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads

from precompute.jobs.text.embedding_cache import EMBEDDING, embeddings_of

K = 10
TIE = 1e-5
DEPTH = 2 * K
"""Rows a query's exact list keeps: a copy's check drops the rows that moved from its source's
lists, and a list still knows its K best while no more than DEPTH - K of its rows moved."""
EXACT_CHUNK = 32
"""Queries scored against a step's rows at once: bounds the [queries, rows] score matrix."""
READ_ROWS = 65_536
"""Staged rows read and scored per step: 96 MB of 384-d vectors, whatever the corpus's size."""


@dataclass(frozen=True)
class Neighbours:
    """A query's exact neighbours among the staged rows, its own row left out: every row scoring
    at least `bound`, which lies at or below the K-th best less TIE."""

    scores: dict[str, float]
    """Exact cosine by id."""
    bound: float
    """Every row not in `scores` scores below it: the DEPTH-th best less TIE after a full scan;
    -inf where fewer than DEPTH rows are there (all of them are in `scores`)."""

    def right(self) -> set[str]:
        """The rows a hit may be to count as right: within TIE of the K-th best."""
        return {row for row, score in self.scores.items() if score >= self.floor - TIE}

    @cached_property
    def floor(self) -> float:
        """The K-th best cosine; -inf where fewer than K rows are there to rank. Cached: measure
        compares every hit of every rung with it."""
        return sorted(self.scores.values(), reverse=True)[K - 1] if len(self.scores) >= K else -np.inf


def exact_neighbours(parts: pads.Dataset, queries: np.ndarray, own: list[str | None]) -> list[Neighbours]:
    """Each query's Neighbours, READ_ROWS staged rows at a time: no process holds every vector.
    Rows below a query's DEPTH-th best so far, less TIE, cannot be within TIE of its final
    DEPTH-th best (more rows only raise it), so they are dropped as each step is scored."""
    best = [np.empty(0, np.float32) for _ in queries]
    named = [np.empty(0, object) for _ in queries]
    floor = np.full(len(queries), -np.inf, np.float32)
    asked = {mine: q for q, mine in enumerate(own) if mine is not None}
    for batch in parts.to_batches(columns=["id", EMBEDDING], batch_size=READ_ROWS):
        if not batch.num_rows:
            continue
        table = pa.Table.from_batches([batch])
        ids = np.array([str(i) for i in table["id"].to_pylist()], dtype=object)
        unit = unit_rows(embeddings_of(table))
        mine = [(asked[i], row) for row, i in enumerate(ids) if i in asked]  # stored rows' own queries
        for start in range(0, len(queries), EXACT_CHUNK):
            scores = queries[start : start + EXACT_CHUNK] @ unit.T
            for q, row in mine:
                if start <= q < start + len(scores):
                    scores[q - start, row] = -np.inf  # a stored row's query leaves itself out
            if len(ids) >= DEPTH:
                step = -np.partition(-scores, DEPTH - 1, axis=1)[:, DEPTH - 1]
            else:
                step = np.full(len(scores), -np.inf)
            for j, row_scores in enumerate(scores):
                q = start + j
                kept = np.flatnonzero(row_scores >= max(floor[q], step[j]) - TIE)
                merged, names = np.concatenate([best[q], row_scores[kept]]), np.concatenate([named[q], ids[kept]])
                if len(merged) >= DEPTH:
                    floor[q] = -np.partition(-merged, DEPTH - 1)[DEPTH - 1]
                near = merged >= floor[q] - TIE
                best[q], named[q] = merged[near], names[near]
    return [
        Neighbours(dict(zip(names.tolist(), scores.tolist(), strict=True)), float(bottom - TIE))
        for scores, names, bottom in zip(best, named, floor, strict=True)
    ]


def moved_neighbours(
    before: list[Neighbours], queries: np.ndarray, removed: Set[str], ids: list[str], vectors: np.ndarray
) -> list[Neighbours] | None:
    """Each query's Neighbours once the rows `removed` left and the rows `ids` (unit `vectors`)
    came, from its Neighbours before: rows outside a list scored below its bound and still do.
    None where some list no longer knows its K best within TIE (too many of its rows left)."""
    scores = queries @ vectors.T
    after = []
    for near, row in zip(before, scores, strict=True):
        kept = {i: s for i, s in near.scores.items() if i not in removed}
        kept.update((ids[j], float(row[j])) for j in np.flatnonzero(row >= near.bound))
        ranked = sorted(kept.values(), reverse=True)
        known = ranked[K - 1] - TIE >= near.bound if len(ranked) >= K else near.bound == -np.inf
        if not known:
            return None
        bound = max(near.bound, ranked[DEPTH - 1] - TIE) if len(ranked) >= DEPTH else near.bound
        after.append(Neighbours({i: s for i, s in kept.items() if s >= bound}, bound))
    return after


def unit_rows(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
