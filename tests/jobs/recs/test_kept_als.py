"""How a night tells whether its interactions moved past `retrain_share` (jobs/recs/kept_als.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from precompute.jobs.recs.history.interactions import INDEX, USER, WEIGHT
from precompute.jobs.recs.kept_als import (
    SKETCH,
    changed_share,
    interactions_sketch,
    kept_als,
    retrain,
    save_als,
)
from precompute.jobs.recs.spec import RecsSpec
from precompute.jobs.recs.state import part_digest, vocabulary_digest
from precompute.jobs.recs.towers import ALSTowers, als_model
from precompute.jobs.work_dir import WorkPath


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



def test_a_kept_als_is_compared_with_the_night_it_was_trained_on_and_keeps_its_figures_while_settings_hold(
    tmp_path: Path,
) -> None:
    """Two nights of 1.5% changes each: the second is 3% from the last night but 6% from the
    trained one, past retrain_share (5%), so it trains; compared night to night it never would."""
    rng = np.random.default_rng(2)
    settings, ids = RecsSpec(model="als", retrain_share=0.05), [f"i{i}" for i in range(10_000)]
    vocabulary = vocabulary_digest(ids)
    users, items = rng.integers(0, 50_000, 200_000), rng.integers(0, 5_000, 200_000)
    model = als_model(settings)
    model.item_factors = rng.random((len(ids), settings.factors), dtype=np.float32)
    trained, figures = interactions_sketch(interactions(users, items)), {"published": "als+content"}
    path = WorkPath.of(tmp_path / "als.npz")
    save_als(path, ALSTowers(model), 2.0, settings, vocabulary, retrain("first night", trained), figures)

    first = items.copy()
    first[:3_000] += 5_000  # share 2 * 3,000 / 203,000 = 0.030
    kept = kept_als(path, settings, vocabulary, interactions_sketch(interactions(users, first)))
    assert kept.towers is not None and (kept.scale, kept.quality) == (2.0, figures)
    assert kept.reason == "kept: 3.0% of the interactions changed since it was trained"
    assert np.array_equal(kept.trained_on, trained)
    assert kept.towers.digest == part_digest(ALSTowers(model))  # saved with the factors, not hashed again
    other_blend = settings.model_copy(update={"content_weight": 0.5})  # its figures were not this blend's
    assert kept_als(path, other_blend, vocabulary, interactions_sketch(interactions(users, first))).quality is None

    night = WorkPath.of(tmp_path / "night-2" / "als.npz")
    night.parent.mkdir()
    save_als(night, kept.towers, kept.scale, settings, vocabulary, kept, figures)  # as a kept night saves it: a copy
    assert night.read_bytes() == path.read_bytes()
    reblended = kept_als(path, other_blend, vocabulary, interactions_sketch(interactions(users, first)))
    measured = WorkPath.of(tmp_path / "night-2b" / "als.npz")
    measured.parent.mkdir()
    save_als(measured, kept.towers, kept.scale, other_blend, vocabulary, reblended, {"published": "als"})  # measured tonight
    assert kept_als(measured, other_blend, vocabulary, interactions_sketch(interactions(users, first))).quality == {"published": "als"}
    second = first.copy()
    second[3_000:6_000] += 5_000  # 0.030 from the first night, 0.058 from the trained one
    assert changed_share(interactions_sketch(interactions(users, first)), interactions_sketch(interactions(users, second))) < 0.05
    again = kept_als(night, settings, vocabulary, interactions_sketch(interactions(users, second)))
    assert again.towers is None and again.quality is None
    assert again.reason == "trained: 5.8% of the interactions changed since it was trained (retrain_share 5%)"


def test_an_als_saved_without_its_digest_is_hashed_when_kept_to_the_same_digest(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    settings, ids = RecsSpec(model="als"), [f"i{i}" for i in range(500)]
    model = als_model(settings)
    model.item_factors = rng.random((len(ids), settings.factors), dtype=np.float32)
    sketch = interactions_sketch(interactions(rng.integers(0, 100, 1_000), rng.integers(0, 500, 1_000)))
    path = WorkPath.of(tmp_path / "als.npz")
    save_als(path, ALSTowers(model), 1.0, settings, vocabulary_digest(ids), retrain("first night", sketch), {})
    with np.load(tmp_path / "als.npz") as saved:
        older = {name: saved[name] for name in saved.files if name != "digest"}
    np.savez(tmp_path / "als.npz", **older)
    kept = kept_als(path, settings, vocabulary_digest(ids), sketch)
    assert kept.towers is not None and kept.towers.digest is None
    assert part_digest(kept.towers) == part_digest(ALSTowers(model)) == kept.towers.digest
