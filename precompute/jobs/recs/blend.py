"""Models added together: the hybrid (a collaborative model beside the content towers) and the
ensemble of every collaborative model a night trained (jobs/recs/models.py candidates), as one
pair of towers whose dot product is the weighted sum of the parts' scores.

Each collaborative part is divided by its scale: the median over users of how far their best
item's score stands above their SCALE_RANK-th best. Scores of different models have no common
unit (SASRec's are logits, whose level is arbitrary; transitions' are shares of moves; EASE's
regression weights), but a shift-invariant spread does: in it, the popularity prior and
content_weight mean the same on every model, and an ensemble's parts count alike.

On ML-1M (each user's last interaction held out, no prior or content), SASRec and transitions
each rank far above EASE, the two added at equal weight above either alone, and all three a
little higher still; unequal weights between the parts barely move NDCG@10, so the parts weigh
the same, untuned (`precompute bench recs` measures the published blend; docs/recommendations.md).
"""

from __future__ import annotations

import copy

import numpy as np
import torch

from precompute.jobs.recs.history.seen import Seen
from precompute.jobs.recs.topk.exact import BlockedTopK
from precompute.jobs.recs.towers import ContentTowers, Towers

SCALE_USERS = 2000
"""Training users whose scores set a part's scale (a median: stable at this size)."""
SCALE_RANK = 100
"""The scale is the gap between a user's best score and this rank's (or the catalogue's last)."""
SCALE_BLOCK = 512
"""Users scored at once (BlockedTopK's block)."""


def spread_scale(towers: Towers, train: Seen) -> float:
    """The median over (up to SCALE_USERS) training users of their best score less their
    SCALE_RANK-th best: the unit a part's scores are divided by (1 where it is zero). Scored as
    the job scores (jobs/recs/topk/exact.py BlockedTopK: blocks of users, bounded tiles of items, only the
    columns a block uses), every item counted, seen or not."""
    users = min(SCALE_USERS, len(train.offsets) - 1)
    end = train.offsets[users]
    head = train._replace(
        offsets=train.offsets[: users + 1],
        items=train.items[:end],
        weights=train.weights[:end],
        ids=None if train.ids is None else train.ids[:users],
    )
    vectors, items = towers.users(head), len(towers.items)
    if not len(vectors) or not items:
        return 1.0
    rank = min(SCALE_RANK, items) - 1
    # Seen items count here: no user's items are masked.
    empty = head.items[:0]
    unmasked = head._replace(offsets=np.zeros_like(head.offsets), items=empty, weights=head.weights[:0])
    scores = BlockedTopK(towers.items, rank + 1, SCALE_BLOCK)(torch.from_numpy(vectors), unmasked)[1]
    spread = scores[:, 0] - scores[:, rank]
    spread = spread[spread > 0]
    return float(np.median(spread)) if len(spread) else 1.0


def own_copy(towers: Towers) -> Towers:
    """A shallow copy whose `items` a blend may point at its own matrix without touching the
    original, which other blends (a night's candidates and their ensemble) also hold. Not
    copy.copy: that goes through __getstate__, which drops what only this process needs (the
    sequence model's network, saved for the next night's warm start)."""
    part = object.__new__(type(towers))
    part.__dict__.update(towers.__dict__)
    return part


class BlendTowers:
    """Collaborative parts, each in units of its scale, with the content towers beside them
    when content_weight > 0: their dot product is the sum of the scores.

    The scales and the weight go on the user side, so the item matrix is the parts' own side by
    side, and each part keeps only a view of its columns, also once unpickled in a top-k actor:
    EASE's [items, items] matrix is held once, not twice (its user tower needs only the item
    count; ALS's, own towers' and the sequence model's need none of it)."""

    def __init__(
        self, parts: list[tuple[Towers, float]], content: ContentTowers | None, content_weight: float
    ) -> None:
        self.name = "+".join(towers.name for towers, _ in parts) + ("+content" if content else "")
        self.parts = [(own_copy(towers), scale) for towers, scale in parts]
        self.content, self.content_weight = content, content_weight
        matrices = [towers.items for towers, _ in parts] + ([content.items] if content else [])
        self.widths = [matrix.shape[1] for matrix in matrices[: len(parts)]]
        self.items = np.hstack(matrices).astype(np.float32, copy=False)  # hstack has copied them
        self.share_columns()

    def share_columns(self) -> None:
        start = 0
        for (towers, _), width in zip(self.parts, self.widths, strict=True):
            towers.items = self.items[:, start : start + width]
            start += width

    def users(self, seen: Seen) -> np.ndarray:
        vectors = [towers.users(seen) / scale for towers, scale in self.parts]
        if self.content:
            vectors.append(self.content_weight * self.content.users(seen))
        return np.hstack(vectors).astype(np.float32, copy=False)

    def __getstate__(self) -> dict[str, object]:
        parts = []
        for towers, scale in self.parts:
            towers = copy.copy(towers)
            towers.items = None
            parts.append((towers, scale))
        return {**self.__dict__, "parts": parts}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self.share_columns()


def ensemble(trained: list[BlendTowers]) -> BlendTowers:
    """Every trained model's collaborative parts at equal weight, with the first's content."""
    first = trained[0]
    parts = [part for blend in trained for part in blend.parts]
    return BlendTowers(parts, first.content, first.content_weight)
