"""The sequence network's contract with its engines: padding is invisible, and the exported
graphs compute what the network does."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import torch

from precompute.models.sequence import HISTORY, ITEM, SASRec, export_towers


def network() -> SASRec:
    torch.manual_seed(0)
    return SASRec(items=50, dim=16, blocks=2, heads=2, max_length=12, dropout=0.1).eval()


HISTORIES = torch.tensor([[0] * 9 + [3, 4, 5], list(range(1, 13)), [0] * 11 + [50]])


def test_a_history_reads_the_same_whatever_its_padding() -> None:
    """A training batch pads to its longest history and the graph to max_length: the same state."""
    model = network()
    with torch.no_grad():
        padded = model.user_states(HISTORIES)
        assert torch.allclose(padded[0], model.user_states(HISTORIES[:1, 9:])[0], atol=1e-5)
        assert torch.allclose(padded[2], model.user_states(HISTORIES[2:, 10:])[0], atol=1e-5)
        assert not torch.allclose(padded[0], padded[2], atol=1e-3)  # and the history does count


def test_the_exported_towers_compute_the_networks_vectors() -> None:
    model = network()
    graphs = export_towers(model)
    user = ort.InferenceSession(graphs["user"], providers=["CPUExecutionProvider"])
    item = ort.InferenceSession(graphs["item"], providers=["CPUExecutionProvider"])
    assert [i.shape for i in user.get_inputs()] == [["batch", 12]]
    with torch.no_grad():
        states = model.user_states(HISTORIES).numpy()
        vectors = model.item_vectors().numpy()
    np.testing.assert_allclose(user.run(None, {HISTORY: HISTORIES.numpy()})[0], states, atol=1e-5)
    np.testing.assert_allclose(item.run(None, {ITEM: np.arange(1, 51)})[0], vectors, atol=1e-6)
