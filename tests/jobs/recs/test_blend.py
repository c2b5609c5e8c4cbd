"""Models added together: each part in the unit of its own scores' spread, whatever their level,
and the sum served as one pair of towers, also after the trip to a top-k actor."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from precompute.jobs.recs.blend import BlendTowers, ensemble, spread_scale
from precompute.jobs.recs.history.seen import Seen
from precompute.jobs.recs.towers import ContentTowers

ITEMS = 150


class Fixed:
    """Towers with given item vectors and user vectors (by user position)."""

    def __init__(self, name: str, items: np.ndarray, users: np.ndarray) -> None:
        self.name, self.items, self.vectors = name, items.astype(np.float32), users.astype(np.float32)

    def users(self, seen: Seen) -> np.ndarray:
        return self.vectors[: len(seen.offsets) - 1]


def seen(users: int) -> Seen:
    offsets = np.arange(users + 1, dtype=np.int64)
    return Seen(offsets, np.arange(users, dtype=np.int64) % ITEMS, np.ones(users, np.float32))


def test_the_scale_is_the_spread_of_scores_whatever_their_level() -> None:
    """Logits shifted by a different constant for every user, or multiplied by 10: the gap from
    a user's best score to their 100th moves only with the multiplier."""
    rng = np.random.default_rng(0)
    items, users = rng.normal(size=(ITEMS, 4)), rng.normal(size=(30, 4))
    plain = spread_scale(Fixed("a", items, users), seen(30))
    with_ones = np.hstack([items, np.ones((ITEMS, 1))])
    shifted = Fixed("a", with_ones, np.hstack([users, rng.normal(scale=50, size=(30, 1))]))
    assert spread_scale(shifted, seen(30)) == pytest.approx(plain, rel=1e-4)
    assert spread_scale(Fixed("a", items, 10 * users), seen(30)) == pytest.approx(10 * plain, rel=1e-5)
    scores = users @ items.T
    ordered = np.sort(scores, axis=1)
    assert plain == pytest.approx(float(np.median(ordered[:, -1] - ordered[:, -100])), rel=1e-5)
    assert spread_scale(Fixed("a", np.zeros((ITEMS, 2)), np.ones((30, 2))), seen(30)) == 1.0  # flat


def test_the_scale_is_the_same_when_its_users_are_scored_a_few_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A large catalogue's scale scores its users in blocks of bounded memory: same figure."""
    rng = np.random.default_rng(1)
    towers = Fixed("a", rng.normal(size=(ITEMS, 4)), rng.normal(size=(30, 4)))
    whole = spread_scale(towers, seen(30))
    monkeypatch.setattr("precompute.jobs.recs.blend.SCALE_BLOCK", 7)
    assert spread_scale(towers, seen(30)) == whole


def test_an_ensemble_scores_the_sum_of_its_parts_each_in_its_unit() -> None:
    rng = np.random.default_rng(1)
    first = Fixed("first", rng.normal(size=(ITEMS, 3)), rng.normal(size=(8, 3)))
    second = Fixed("second", rng.normal(size=(ITEMS, ITEMS)), rng.normal(size=(8, ITEMS)))
    content = ContentTowers(rng.normal(size=(ITEMS, 5)))
    expected_parts = [
        first.users(seen(8)) @ first.items.T / 2.0,
        second.users(seen(8)) @ second.items.T / 7.0,
    ]
    candidates = [BlendTowers([(first, 2.0)], content, 0.3), BlendTowers([(second, 7.0)], content, 0.3)]
    blend = ensemble(candidates)
    assert blend.name == "first+second+content"
    expected = sum(expected_parts) + 0.3 * content.users(seen(8)) @ content.items.T
    np.testing.assert_allclose(blend.users(seen(8)) @ blend.items.T, expected, rtol=1e-4, atol=1e-4)
    # Each blend's parts view its own matrix: the ensemble took none of its candidates' columns.
    for owner in [*candidates, blend]:
        assert all(np.shares_memory(towers.items, owner.items) for towers, _ in owner.parts)
    assert first.items.shape == (ITEMS, 3) and not np.shares_memory(first.items, blend.items)
    # In a top-k actor: the same scores, and each part's items a view of the one matrix.
    arrived = pickle.loads(pickle.dumps(blend))
    np.testing.assert_allclose(arrived.users(seen(8)) @ arrived.items.T, expected, rtol=1e-4, atol=1e-4)
    for towers, _ in arrived.parts:
        assert np.shares_memory(towers.items, arrived.items)
