"""The sequence model's nights: a warm start from last night's weights (new items given fresh
rows) reaches a cold start's quality in a fraction of its steps, falls back to cold, saying why,
when it cannot apply, and training stops on its time budget."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from precompute.jobs.recs.sequence.cluster import train_on_cluster
from precompute.jobs.recs.sequence.train import save_weights, train_sequence, warm_start
from precompute.jobs.recs.spec import SequenceSpec

ITEMS = 40
IDS = pa.array([f"item{i:02d}" for i in range(ITEMS)], pa.string())
SPEC = SequenceSpec(dim=32, blocks=1, history=16, dropout=0.1, learning_rate=1e-2, batch=32, patience=3)


def walks(users: int, seed: int) -> list[list[int]]:
    """Users walking 3 to 13 steps of one cycle of the items: each item's successor is fixed."""
    rng = np.random.default_rng(seed)
    cycle = np.random.default_rng(0).permutation(ITEMS)
    successor = np.empty(ITEMS, np.int64)
    successor[cycle] = np.roll(cycle, -1)
    out = []
    for _ in range(users):
        walk = [int(rng.integers(ITEMS))]
        for _ in range(int(rng.integers(2, 13))):
            walk.append(int(successor[walk[-1]]))
        out.append(walk)
    return out


def csr(histories: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.concatenate([[0], np.cumsum([len(h) for h in histories])])
    return np.concatenate([np.asarray(h, np.int64) for h in histories]), offsets


@pytest.mark.slow
def test_a_warm_night_matches_a_cold_one_in_a_fraction_of_its_steps(tmp_path: Path) -> None:
    first = walks(300, seed=1)
    model, _ = train_sequence(*csr(first), ITEMS, SPEC)
    save_weights(model, SPEC, IDS, tmp_path / "sequence.pt")

    # The next night: 1% of the users took one more step (and the walk continues the cycle).
    second = [walk + walks(1, seed=i)[0][:1] if i < 3 else walk for i, walk in enumerate(first)]
    warm = warm_start(tmp_path / "sequence.pt", IDS, SPEC)
    assert warm.state is not None and warm.reason == "warm: 40 of 40 items' weights carried over"
    _, warmed = train_sequence(*csr(second), ITEMS, SPEC, warm=warm)
    _, cold = train_sequence(*csr(second), ITEMS, SPEC)
    assert (warmed.start, cold.start) == (warm.reason, "cold")
    assert cold.best_ndcg10 > 0.9 and warmed.best_ndcg10 >= cold.best_ndcg10 - 0.02
    assert warmed.steps * 2 <= cold.steps, (warmed.steps, cold.steps)  # patience alone, once warm


def test_a_warm_start_that_cannot_apply_is_cold_and_says_why(tmp_path: Path) -> None:
    path = tmp_path / "sequence.pt"
    assert warm_start(path, IDS, SPEC) == (None, "cold: no weights from the published version")
    model, _ = train_sequence(*csr(walks(50, seed=1)), ITEMS, SPEC.model_copy(update={"max_epochs": 1}))
    save_weights(model, SPEC, IDS, path)

    wider = SPEC.model_copy(update={"dim": 64})
    assert warm_start(path, IDS, wider).state is None
    assert warm_start(path, IDS, wider).reason.startswith("cold: the network changed from {'dim': 32,")

    renamed = pa.array(IDS[:35].to_pylist() + [f"new{i}" for i in range(5)], pa.string())  # 5 of 40 new: under WARM_MIN_SHARED
    assert warm_start(path, renamed, SPEC) == (None, "cold: 5 of 40 items are new")
    shuffled = pa.array(IDS.to_pylist()[::-1], pa.string())  # the same items in another order: each keeps its own embedding
    moved = warm_start(path, shuffled, SPEC)
    np.testing.assert_array_equal(
        moved.state["item_embedding.weight"][1:].numpy(),
        model.item_embedding.weight.detach()[1:].numpy()[::-1],
    )


def test_a_warm_start_with_a_few_new_items_keeps_the_others_and_gives_the_new_ones_fresh_rows(tmp_path: Path) -> None:
    """38 of 40 items kept (95%, above WARM_MIN_SHARED) and two new ones, in another order:
    each kept item's row moves with its id; the new ones get a fresh model's rows, not an old one's."""
    path = tmp_path / "sequence.pt"
    model, _ = train_sequence(*csr(walks(50, seed=1)), ITEMS, SPEC.model_copy(update={"max_epochs": 1}))
    save_weights(model, SPEC, IDS, path)
    today = pa.array(["new-a", *IDS.to_pylist()[2:], "new-b"], pa.string())  # item00, item01 gone
    warm = warm_start(path, today, SPEC)
    assert warm.state is not None and warm.reason == "warm: 38 of 40 items' weights carried over"
    rows, old = warm.state["item_embedding.weight"], model.item_embedding.weight.detach()
    np.testing.assert_array_equal(rows[2:40].numpy(), old[3:41].numpy())  # item02..item39, row 0 pads
    for new_row in (1, 40):
        assert not any(np.allclose(rows[new_row].numpy(), old[r].numpy()) for r in range(1, 41))


def test_training_stops_on_its_budget_and_keeps_the_best_checks_weights() -> None:
    """A budget of a few steps' time: training ends there (not on patience or epochs), says so, and
    the model returned is the best check's."""
    spec = SPEC.model_copy(update={"train_budget_s": 0.05, "max_epochs": 200, "patience": 200})
    model, report = train_sequence(*csr(walks(300, seed=1)), ITEMS, spec)
    assert report.stopped == "train_budget_s 0.05" and report.epochs < 200
    assert len(report.curve) >= 1
    assert report.best_ndcg10 == max(report.curve) and not model.training  # returned in eval mode


def test_more_training_workers_than_the_cluster_has_cpus_are_refused_by_name(ray_local) -> None:
    """Ray Train would wait for a placement the cluster cannot give: the job says so instead."""
    spec = SPEC.model_copy(update={"train_workers": 3})  # the local Ray has 2 CPUs
    with pytest.raises(ValueError, match=r"sequence.train_workers = 3 needs a CPU a worker; the Ray cluster has 2$"):
        train_on_cluster(*csr(walks(20, seed=0)), ITEMS, spec, None)
