"""The sequence model's full-softmax loss, computed a block of positions at a time, is torch's
cross-entropy: the same value and the same gradients, whatever the block size."""

from __future__ import annotations

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
