"""A self-attentive sequential recommender (SASRec: Kang and McAuley, "Self-Attentive Sequential
Recommendation", ICDM 2018), as a PyTorch module whose score is a dot product.

A user's latest `max_length` items (positions + 1; 0 pads on the left) go through item and
position embeddings and causal transformer blocks (pre-norm); the state at the last position is
the user's vector, and the item embeddings themselves are the item vectors (shared, as in the
paper): score(user, item) = state . embedding[item + 1]. So the exact top-k of the other models
serves it unchanged, and the network is only ever run on the users' side.

Padding is invisible: positions are right-aligned and no item attends to a pad, so a history
reads the same padded to a training batch's longest or to `max_length` (the exported graph's
fixed width).

Inference goes through the engines every model here uses: `export_towers` writes the user side
(history -> state) and the item side (item -> embedding) as ONNX tower graphs
(models/towers.py), which the precision ladder quantizes and gates like a pipeline's own towers.
"""

from __future__ import annotations

import copy
import io
import warnings

import torch
from torch import nn
from torch.nn import functional

from precompute.models.engines.export import OPSET

HISTORY, ITEM = "history", "item"
"""The inputs of the user and item graphs."""


class Block(nn.Module):
    """Pre-norm causal self-attention, then a point-wise feed-forward layer, each residual. Dropout
    on the residual branches, none on the attention weights: on a CPU that would materialise
    every [length, length] matrix that scaled_dot_product_attention otherwise never forms."""

    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim {dim} is not a multiple of heads {heads}")
        self.heads = heads
        self.attention_norm, self.feed_forward_norm = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.feed_forward = nn.Sequential(
            nn.Linear(dim, dim), nn.ReLU(), nn.Dropout(dropout), nn.Linear(dim, dim)
        )
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
        batch, length, dim = x.shape
        qkv = self.qkv(self.attention_norm(x)).view(batch, length, 3, self.heads, dim // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        attended = functional.scaled_dot_product_attention(q, k, v, attn_mask=visible)
        x = x + self.dropout(self.out(attended.transpose(1, 2).reshape(batch, length, dim)))
        return x + self.dropout(self.feed_forward(self.feed_forward_norm(x)))


def visible_keys(history: torch.Tensor) -> torch.Tensor:
    """[batch, 1, length, length] bool: position t attends to items at t or before, never to a
    pad (a pad attends to itself alone, so that its row is defined)."""
    # Comparisons, not tril and eye: ONNX Runtime runs these on bools.
    position = torch.arange(history.shape[1], device=history.device)
    key, query = position[None, :], position[:, None]
    return ((key <= query) & (history > 0)[:, None, None, :]) | (key == query)


class SASRec(nn.Module):
    def __init__(
        self, items: int, dim: int, blocks: int, heads: int, max_length: int, dropout: float
    ) -> None:
        super().__init__()
        self.items, self.max_length = items, max_length
        self.item_embedding = nn.Embedding(items + 1, dim, padding_idx=0)
        self.position_embedding = nn.Embedding(max_length, dim)
        self.dropout = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(dim, heads, dropout) for _ in range(blocks))
        self.norm = nn.LayerNorm(dim)
        nn.init.normal_(self.item_embedding.weight, std=dim**-0.5)
        nn.init.normal_(self.position_embedding.weight, std=dim**-0.5)
        with torch.no_grad():
            self.item_embedding.weight[0].zero_()

    def forward(self, history: torch.Tensor) -> torch.Tensor:
        """[batch, length] item positions + 1, left-padded with 0 -> [batch, length, dim] states:
        the one at t has seen items up to t."""
        length = history.shape[1]
        positions = torch.arange(self.max_length - length, self.max_length, device=history.device)
        x = self.dropout(self.item_embedding(history) + self.position_embedding(positions))
        visible = visible_keys(history)
        for block in self.blocks:
            x = block(x, visible)
        return self.norm(x)

    def user_states(self, history: torch.Tensor) -> torch.Tensor:
        """[batch, length] -> [batch, dim]: the state after each user's latest item."""
        return self.forward(history)[:, -1]

    def item_vectors(self) -> torch.Tensor:
        """[items, dim]: row j is item j's vector (the padding row left out)."""
        return self.item_embedding.weight[1:]


class UserTower(nn.Module):
    """[batch, max_length] history -> [batch, dim] state: the user side as a tower graph."""

    def __init__(self, model: SASRec) -> None:
        super().__init__()
        self.model = model

    def forward(self, history: torch.Tensor) -> torch.Tensor:
        return self.model.user_states(history)


class ItemTower(nn.Module):
    """[batch] item position + 1 -> [batch, dim] embedding: the item side as a tower graph."""

    def __init__(self, model: SASRec) -> None:
        super().__init__()
        self.model = model

    def forward(self, item: torch.Tensor) -> torch.Tensor:
        return self.model.item_embedding(item)


def export_towers(model: SASRec) -> dict[str, bytes]:
    """The FP32 ONNX graphs of both sides, batch dynamic: {"user": ..., "item": ...}."""
    model = copy.deepcopy(model).eval().cpu()
    graphs = {}
    sides = {
        "user": (UserTower(model), HISTORY, torch.ones((2, model.max_length), dtype=torch.int64)),
        "item": (ItemTower(model), ITEM, torch.ones(2, dtype=torch.int64)),
    }
    for side, (tower, name, example) in sides.items():
        out = io.BytesIO()
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # the legacy exporter announces its deprecation
            torch.onnx.export(
                tower,
                (example,),
                out,
                input_names=[name],
                output_names=["vector"],
                dynamic_axes={name: {0: "batch"}, "vector": {0: "batch"}},
                opset_version=OPSET,
                dynamo=False,
            )
        graphs[side] = out.getvalue()
    return graphs
