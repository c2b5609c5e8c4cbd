"""How a night tells whether its interactions moved past `retrain_share` (jobs/recs_kept.py)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from precompute.jobs.interactions import INDEX, USER, WEIGHT
from precompute.jobs.recs_kept import SKETCH, changed_share, interactions_sketch


def interactions(users: np.ndarray, items: np.ndarray) -> pa.Table:
    return pa.table(
        {USER: [f"u{u}" for u in users], INDEX: items.astype(np.int64), WEIGHT: np.ones(len(users), np.float32)}
    )


def test_the_share_of_rows_two_nights_do_not_share_is_estimated_from_their_sketches() -> None:
    rng = np.random.default_rng(0)
    users, items = rng.integers(0, 50_000, 200_000), rng.integers(0, 5_000, 200_000)
    night = interactions(users, items)
    assert changed_share(interactions_sketch(night), interactions_sketch(night)) == 0
    moved = items.copy()
    moved[:2_000] += 5_000  # 1% of the rows now name other items
    share = changed_share(interactions_sketch(night), interactions_sketch(interactions(users, moved)))
    assert 0.015 < share < 0.025  # 1 - 198,000 / 202,000 = 0.0198
    other = interactions(users + 50_000, items)
    assert changed_share(interactions_sketch(night), interactions_sketch(other)) == 1


def test_a_sketch_is_bounded_however_many_interactions_there_are() -> None:
    rng = np.random.default_rng(1)
    n = SKETCH + 1000
    sketch = interactions_sketch(interactions(rng.integers(0, 10**6, n), rng.integers(0, 10**6, n)))
    assert len(sketch) == SKETCH and (np.diff(sketch.astype(np.float64)) >= 0).all()

