"""The sequence model's losses: the full softmax, computed a block of positions at a time, is
torch's cross-entropy (the same value and gradients, whatever the block size); gBCE is gSASRec's,
written out by hand."""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn import functional

from precompute.jobs.recs.sequence import loss as sequence_loss
from precompute.jobs.recs.sequence.loss import step_loss
from precompute.jobs.recs.spec import SequenceSpec


@pytest.mark.parametrize("logits_per_block", [1, 37 * 5, 37 * 64, 1 << 19])
def test_the_blocked_cross_entropy_is_torchs(monkeypatch: pytest.MonkeyPatch, logits_per_block: int) -> None:
    """37 items, 300 positions: blocks of one position, of 5 (the last one short), or all at once."""
    monkeypatch.setattr(sequence_loss, "LOGITS_PER_BLOCK", logits_per_block)
    generator = torch.Generator().manual_seed(0)
    states = torch.randn(300, 8, generator=generator, dtype=torch.float64, requires_grad=True)
    vectors = torch.randn(37, 8, generator=generator, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 37, (300,), generator=generator)
    expected = functional.cross_entropy(states @ vectors.T, targets)
    want = torch.autograd.grad(3 * expected, (states, vectors))
    loss = step_loss(vectors, states, targets, SequenceSpec(loss="softmax"))
    got = torch.autograd.grad(3 * loss, (states, vectors))
    assert loss.item() == pytest.approx(expected.item(), rel=1e-12)
    for have, reference in zip(got, want, strict=True):
        torch.testing.assert_close(have, reference, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("gbce_t", [0.0, 0.75, 1.0])
def test_gbce_is_gsasrecs_loss_with_a_drawn_positive_no_negative(monkeypatch: pytest.MonkeyPatch, gbce_t: float) -> None:
    """The negatives drawn are fixed (the second equal to the first row's positive), and the loss
    is written out from gSASRec's definition: beta = alpha (t (1 - 1/alpha) + 1/alpha),
    alpha = negatives / (items - 1); a negative equal to its row's positive counts nothing."""
    drawn = torch.tensor([4, 2, 9])
    monkeypatch.setattr(torch, "randint", lambda low, high, size, device=None: drawn)
    generator = torch.Generator().manual_seed(1)
    states = torch.randn(3, 5, generator=generator, dtype=torch.float64)
    vectors = torch.randn(11, 5, generator=generator, dtype=torch.float64)
    positives = torch.tensor([2, 7, 4])
    loss = step_loss(vectors, states, positives, SequenceSpec(loss="gbce", negatives=3, gbce_t=gbce_t))

    alpha = 3 / 10
    beta = alpha * (gbce_t * (1 - 1 / alpha) + 1 / alpha)
    total = 0.0
    for row in range(3):
        positive = float(states[row] @ vectors[positives[row]])
        value = beta * -math.log(1 / (1 + math.exp(-positive)))  # -log sigmoid
        for negative in drawn.tolist():
            if negative != positives[row]:
                score = float(states[row] @ vectors[negative])
                value += -math.log(1 - 1 / (1 + math.exp(-score)))
        total += value / (1 + 3)
    assert loss.item() == pytest.approx(total / 3, rel=1e-9)
    assert beta == pytest.approx({0.0: 1.0, 0.75: 0.475, 1.0: 0.3}[gbce_t])  # t=1: fully alpha; t=0: plain BCE
