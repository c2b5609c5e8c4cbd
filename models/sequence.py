"""A self-attentive sequential recommender (SASRec: Kang and McAuley, "Self-Attentive Sequential
Recommendation", ICDM 2018), as a PyTorch module whose score is a dot product.

A user's latest `max_length` items (positions + 1; 0 pads on the left) go through item and
position embeddings and causal transformer blocks (pre-norm); the state at the last position is
the user's vector, and the item embeddings themselves are the item vectors (shared, as in the
paper): score(user, item) = state . embedding[item + 1]. So the exact top-k of the other models
serves it unchanged, and the network is only ever run on the users' side.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional


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
        self.feed_forward = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Dropout(dropout), nn.Linear(dim, dim))
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, dim = x.shape
        qkv = self.qkv(self.attention_norm(x)).view(batch, length, 3, self.heads, dim // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        attended = functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.dropout(self.out(attended.transpose(1, 2).reshape(batch, length, dim)))
        return x + self.dropout(self.feed_forward(self.feed_forward_norm(x)))


class SASRec(nn.Module):
    def __init__(self, items: int, dim: int, blocks: int, heads: int, max_length: int, dropout: float) -> None:
        super().__init__()
        self.items, self.max_length = items, max_length
        self.item_embedding = nn.Embedding(items + 1, dim, padding_idx=0)
        self.position_embedding = nn.Embedding(max_length, dim)
        self.dropout = nn.Dropout(dropout)
        self.blocks = nn.Sequential(*(Block(dim, heads, dropout) for _ in range(blocks)))
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
        return self.norm(self.blocks(x))

    def user_states(self, history: torch.Tensor) -> torch.Tensor:
        """[batch, length] -> [batch, dim]: the state after each user's latest item."""
        return self.forward(history)[:, -1]

    def item_vectors(self) -> torch.Tensor:
        """[items, dim]: row j is item j's vector (the padding row left out)."""
        return self.item_embedding.weight[1:]
