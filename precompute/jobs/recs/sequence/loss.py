"""The sequence model's training losses (jobs/recs/sequence/train.py): a state [dim] per position,
the item it was followed by, and the item vectors the scores are dot products with.

softmax: cross-entropy over the whole catalogue (SASRec trained this way beats its original
sampled binary loss by a wide margin: Klenitskiy and Vasilev, "Turning Dross Into Gold Loss: is
BERT4Rec really better than SASRec?", RecSys 2023), computed a block of positions at a time
(CatalogueCrossEntropy): the [positions, items] logits never exist at once.

gbce: gSASRec's generalised binary cross-entropy over sampled negatives (Petrov and Macdonald,
RecSys 2023), whose step does not grow with the catalogue.
"""

from __future__ import annotations

import torch
from torch.nn import functional

from precompute.jobs.recs.spec import SequenceSpec

LOGITS_PER_BLOCK = 1 << 19
"""Logits (float32) one block of positions computes at once: 2 MB, a share of a core's cache, so
the softmax reads what the matrix product just wrote from cache, not from memory."""


class CatalogueCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of states @ vectors.T against targets, with the gradients of both
    computed in the forward pass block by block (the idea of Wijmans et al., "Cut Your Losses in
    Large-Vocabulary Language Models", 2024; their kernels are GPU-only). torch's
    cross_entropy over the whole [positions, items] matrix goes through memory five times; this
    reads each block's logits from cache (LOGITS_PER_BLOCK), so the loss runs faster and its
    memory does not grow with the batch."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        states: torch.Tensor,
        vectors: torch.Tensor,
        targets: torch.Tensor,
    ) -> torch.Tensor:
        rows = max(1, LOGITS_PER_BLOCK // len(vectors))
        grad_states, grad_vectors = torch.empty_like(states), torch.zeros_like(vectors)
        total = states.new_zeros(())
        for start in range(0, len(states), rows):
            block, target = states[start : start + rows], targets[start : start + rows, None]
            logits = block @ vectors.T
            normaliser = torch.logsumexp(logits, 1, keepdim=True)
            total += (normaliser - logits.gather(1, target)).sum()
            probabilities = logits.sub_(normaliser).exp_()  # d loss / d logits = softmax - one-hot
            probabilities.scatter_add_(1, target, probabilities.new_full(target.shape, -1.0))
            torch.mm(probabilities, vectors, out=grad_states[start : start + rows])
            grad_vectors.addmm_(probabilities.T, block)
        count = max(1, len(states))
        ctx.save_for_backward(grad_states / count, grad_vectors / count)
        return total / count

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, None]:
        grad_states, grad_vectors = ctx.saved_tensors
        return grad * grad_states, grad * grad_vectors, None


def step_loss(
    vectors: torch.Tensor, states: torch.Tensor, positives: torch.Tensor, settings: SequenceSpec
) -> torch.Tensor:
    """The loss of `states` [n, dim] whose next items are `positives` [n] (rows of `vectors`)."""
    if settings.loss == "softmax":
        return CatalogueCrossEntropy.apply(states, vectors, positives)
    # gBCE: positives' log-sigmoid raised to beta, which undoes what sampling `negatives` of the
    # catalogue does to the scores' calibration (alpha: the share sampled; t: how much to undo).
    items = len(vectors)
    count = max(1, min(settings.negatives, items - 1))  # alpha <= 1: a share of the others
    negatives = torch.randint(0, items, (count,), device=states.device)
    alpha = count / max(1, items - 1)
    beta = alpha * (settings.gbce_t * (1 - 1 / alpha) + 1 / alpha)
    positive = (states * vectors[positives]).sum(1)
    negative = states @ vectors[negatives].T
    collided = negatives[None, :] == positives[:, None]  # a positive drawn as a negative is no negative
    negative_loss = functional.softplus(negative).masked_fill(collided, 0).sum(1)
    return (beta * functional.softplus(-positive) + negative_loss).mean() / (1 + count)
