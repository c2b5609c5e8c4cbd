"""Exact top-k of user . item scores over every item, in blocks of users and tiles of items.

One matrix multiply per (block, tile) into a score buffer allocated once, the prior added and
seen items masked in place, then torch.topk; each tile's top k is merged with the best so far.
Scoring is exact, not approximate: no recall is lost to an index.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import torch

from precompute.jobs.recs.history.seen import Seen

SCORE_BUFFER_BYTES = 512 * 2**20
"""The score buffer's bound: a block of users is scored against tiles of at most this many bytes
of scores (262,144 items at 512 users a block), so the buffer stops growing with the items
(a [512, items] buffer would be 2 GB at 1M items). Smaller tiles cost time, so the bound is
generous (`precompute bench recs` times the exact top-k)."""


ACTIVE_SHARE = 0.5
"""Past this share of a block's columns in use, the whole block is scored: gathering the item
matrix's columns costs more than the zero terms it saves."""
GATHERED_BYTES = 128 * 2**20
"""The bound on a tile's gathered item columns (active_columns): 6,700 items of 5,000 columns."""


class BlockedTopK:
    """Exact top-k of user . item + prior over every item, the user's seen items excluded.

    Holds the item matrix and the prior (on the CPU, the caller's arrays themselves) and a
    [block, tile] score buffer of at most SCORE_BUFFER_BYTES, allocated once: a block of users
    against a tile of items is one matrix multiply into the buffer, the prior added and seen
    items set to -inf in place, then topk; each tile's top k are merged with the best so far.
    CUDA where torch sees it, else CPU BLAS.
    """

    def __init__(
        self,
        item_vectors: np.ndarray,
        k: int,
        block: int,
        prior: np.ndarray | None = None,
        tile: int | None = None,
    ) -> None:
        if k < 1 or not len(item_vectors):
            raise ValueError(f"k must be at least 1 and there must be items: k={k}, {len(item_vectors)} items")
        k = min(k, len(item_vectors))  # a catalogue smaller than k: every item, ranked
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.items = shared_tensor(item_vectors, self.device)
        self.prior = None if prior is None else shared_tensor(prior, self.device)
        tile = tile or max(1, SCORE_BUFFER_BYTES // (4 * block))
        self.k, self.block, self.tile = k, block, min(tile, len(item_vectors))
        self.buffer = torch.empty(block * self.tile, dtype=torch.float32, device=self.device)

    def __call__(self, user_vectors: torch.Tensor, seen: Seen) -> tuple[np.ndarray, np.ndarray]:
        """(indices, scores), [users, k] each, best first; index -1 and score -inf where a user
        has fewer than k unseen items."""
        users = len(user_vectors)
        indices = np.empty((users, self.k), np.int64)
        scores = np.empty((users, self.k), np.float32)
        for start in range(0, users, self.block):
            stop = min(start + self.block, users)
            offsets = seen.offsets[start : stop + 1]
            rows = np.repeat(np.arange(stop - start), np.diff(offsets))
            cols = seen.items[offsets[0] : offsets[-1]]
            block, columns = active_columns(user_vectors[start:stop].to(self.device))
            top_scores, top_indices = self._block(block, columns, rows, cols)
            scores[start:stop] = top_scores.cpu().numpy()
            indices[start:stop] = top_indices.cpu().numpy()
        indices[np.isneginf(scores)] = -1
        return indices, scores

    def _block(
        self, users: torch.Tensor, columns: torch.Tensor | None, rows: np.ndarray, cols: np.ndarray
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Top k of one block of users (seen items at rows, cols), a tile of items at a time; only
        the item matrix's `columns` where given (active_columns)."""
        best: tuple[torch.Tensor, torch.Tensor] | None = None
        tile = self.tile
        if columns is not None:
            tile = max(1, min(tile, GATHERED_BYTES // (4 * max(1, len(columns)))))
        for first in range(0, len(self.items), tile):
            last = min(first + tile, len(self.items))
            scores = self.buffer[: len(users) * (last - first)].view(len(users), last - first)
            items = self.items[first:last] if columns is None else self.items[first:last, columns]
            torch.mm(users, items.T, out=scores)
            if self.prior is not None:
                scores += self.prior[first:last]
            inside = (cols >= first) & (cols < last)
            scores[
                torch.tensor(rows[inside], device=self.device),
                torch.tensor(cols[inside] - first, device=self.device),
            ] = -math.inf
            tile_scores, tile_indices = torch.topk(scores, min(self.k, last - first), dim=1)
            tile_indices += first
            if best is not None:
                merged_scores = torch.cat([best[0], tile_scores], dim=1)
                tile_scores, at = torch.topk(merged_scores, min(self.k, merged_scores.shape[1]), dim=1)
                tile_indices = torch.gather(torch.cat([best[1], tile_indices], dim=1), 1, at)
            best = tile_scores, tile_indices
        assert best is not None  # at least one item: checked at construction
        return best


def active_columns(users: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(the block's columns that are not zero for every user, their positions), where they are
    at most ACTIVE_SHARE of the columns, else (the block, None). An item-item model's user vector
    is the user's history, one column per item (jobs/recs/models.py RowTowers), so a block of
    users touches few of them: scoring only those is the same sum without its zero terms."""
    active = torch.nonzero(users.any(dim=0)).squeeze(1)
    if len(active) > ACTIVE_SHARE * users.shape[1]:
        return users, None
    return users[:, active], active


def shared_tensor(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """`array` as a contiguous float32 tensor on `device`, on the CPU sharing its memory where it
    is one already: in a top-k actor the item matrix and the prior lie read-only in Ray's object
    store, shared by the node's actors, where a copy would be private to each (the scoring only
    reads them, so torch's warning about a read-only array does not apply). A blend part's column
    view is copied: the matrix multiply wants rows contiguous."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.as_tensor(np.ascontiguousarray(array, np.float32), device=device)


def top_k(
    user_vectors: np.ndarray,
    item_vectors: np.ndarray,
    seen: Seen,
    k: int,
    block: int,
    prior: np.ndarray | None = None,
    tile: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-k items per user by blocked matrix multiply; see BlockedTopK."""
    ranker = BlockedTopK(item_vectors, k, block, prior, tile)
    return ranker(torch.tensor(user_vectors, dtype=torch.float32), seen)


def popularity_prior(counts: np.ndarray, weight: float) -> np.ndarray:
    """weight * log1p(count), scaled so the most popular item gets `weight`: on a cosine's scale."""
    logs = np.log1p(counts.astype(np.float32))
    return (weight * logs / max(float(logs.max()), 1e-12)).astype(np.float32)

