"""A recommendation model as two towers: an item matrix and a user tower, whose dot product is the
score. Every model (jobs/recs/models.py trains them) is one of these shapes, so that one top-k
(jobs/recs/topk/) serves them all."""

from __future__ import annotations

from typing import Protocol

import numpy as np
import scipy.sparse as sp
from threadpoolctl import threadpool_limits

from precompute.jobs.recs.history.seen import Seen, interaction_matrix
from precompute.jobs.recs.spec import RecsSpec


class Towers(Protocol):
    """What the top-k needs of a model: the item matrix and the user tower (picklable: every
    top-k actor gets a copy)."""

    name: str
    items: np.ndarray
    """[items, dim] float32: row j is item j's vector."""

    def users(self, seen: Seen) -> np.ndarray:
        """[users, dim] float32 from the users' interactions."""
        ...

class ContentTowers:
    name = "content"

    def __init__(self, vectors: np.ndarray) -> None:
        self.items = np.ascontiguousarray(vectors, np.float32)

    def users(self, seen: Seen) -> np.ndarray:
        """The normalised weighted mean of the user's items' vectors; zero for a user with none."""
        sums = interaction_matrix(seen, len(self.items)) @ self.items
        norms = np.linalg.norm(sums, axis=1, keepdims=True)
        return (sums / np.maximum(norms, 1e-12)).astype(np.float32)

class RowTowers:
    """An item-item model: score(u, j) = sum_i x_ui * matrix[i, j]."""

    def __init__(self, name: str, matrix: np.ndarray) -> None:
        self.name = name
        self.items = np.ascontiguousarray(np.asarray(matrix, np.float32).T)

    def users(self, seen: Seen) -> np.ndarray:
        return interaction_matrix(seen, len(self.items)).toarray().astype(np.float32)

class TransitionTowers:
    name = "transitions"

    def __init__(self, matrix: np.ndarray, history: int, decay: float) -> None:
        self.items = np.ascontiguousarray(np.asarray(matrix, np.float32).T)
        self.history, self.decay = history, decay

    def users(self, seen: Seen) -> np.ndarray:
        """Each user's `history` latest items (the last of their items in `seen`), weighted decay**t."""
        lengths = np.diff(seen.offsets)
        rows, columns, weights = [], [], []
        for t in range(self.history):
            users = np.flatnonzero(lengths > t)
            rows.append(users)
            columns.append(seen.items[seen.offsets[users + 1] - 1 - t])
            weights.append(np.full(len(users), self.decay**t, np.float32))
        shape = (len(lengths), len(self.items))
        latest = sp.csr_matrix(
            (np.concatenate(weights), (np.concatenate(rows), np.concatenate(columns))), shape
        )
        return latest.toarray()

class ALSTowers:
    name = "als"

    def __init__(self, model: object, digest: bytes | None = None) -> None:
        self.model = model
        self.items = np.ascontiguousarray(model.item_factors, np.float32)
        self.digest = digest
        """Its item factors hashed (jobs/recs/state.py part_digest), once known: a kept ALS's as
        saved with them (jobs/recs/kept_als.py)."""

    def users(self, seen: Seen) -> np.ndarray:
        if not self.model.item_factors.flags.writeable:
            # implicit's solve takes writable buffers only, and a top-k actor's come read-only
            # from Ray's object store: its own copy, once.
            self.model.item_factors = self.model.item_factors.copy()
        matrix = interaction_matrix(seen, len(self.items))
        rows = np.arange(matrix.shape[0])
        return np.asarray(self.model.recalculate_user(rows, matrix), np.float32).reshape(len(rows), -1)

def rows_of(sorted_ids: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(whether each of `ids` is in `sorted_ids`, and its position there where it is)."""
    if not len(sorted_ids):
        return np.zeros(len(ids), bool), np.zeros(len(ids), np.int64)
    at = np.searchsorted(sorted_ids, ids).clip(max=len(sorted_ids) - 1)
    return sorted_ids[at] == ids, at

class OwnTowers:
    """The pipeline's own two-tower model: item vectors aligned to the item table (zeros for an
    item without features), user vectors sorted by user id; a user without features gets zeros,
    so the popularity prior and the content part rank their items."""

    name = "towers"

    def __init__(
        self, items: np.ndarray, user_ids: np.ndarray, user_vectors: np.ndarray, report: dict | None = None
    ) -> None:
        self.items = np.ascontiguousarray(items, np.float32)
        self.user_ids, self.user_vectors = user_ids, user_vectors
        self.report = report or {}
        """How the vectors were made (jobs/recs/own_towers.py): engines, gates, rows and rejects."""

    def users(self, seen: Seen) -> np.ndarray:
        if seen.ids is None:
            raise ValueError("the towers model looks users up by id, and these users have none")
        found, at = rows_of(self.user_ids, seen.ids)
        vectors = np.zeros((len(seen.ids), self.items.shape[1]), np.float32)
        vectors[found] = self.user_vectors[at[found]]
        return vectors

def als_model(settings: RecsSpec, gpu: bool = False) -> object:
    """implicit's untrained ALS of these settings (the CPU one unless `gpu`)."""
    from implicit.als import AlternatingLeastSquares

    with threadpool_limits(1, "blas"):  # else implicit warns, at construction, of BLAS threads under its own
        return AlternatingLeastSquares(
            factors=settings.factors,
            regularization=settings.regularization_als,
            alpha=settings.alpha,
            iterations=settings.iterations,
            random_state=0,
            num_threads=0,
            use_gpu=gpu,
        )
