"""The recommendations job on real Ray and real Parquet: exact top-k, rejects, values (full runs)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from precompute.jobs.inputs import InteractionsInput
from precompute.jobs.recs.history.seen import Seen
from precompute.jobs.recs.recommend import run_recs_job
from precompute.jobs.recs.spec import RecsSpec
from precompute.jobs.recs.topk.candidates import check_users
from precompute.jobs.recs.topk.exact import active_columns, top_k
from precompute.jobs.settings import JobSettings
from precompute.jobs.validate import RejectRatioExceededError
from precompute.jobs.work_dir import WorkPath
from precompute.stores.key_value.records import decode_ranked
from tests.jobs.recs.inputs import BAD_ROWS, ParquetSink


def brute_force(users: np.ndarray, items: np.ndarray, seen: list[set[int]], prior: np.ndarray) -> np.ndarray:
    """Every user's score for every item, seen items at -inf: the reference top-k is its argsort."""
    scores = users.astype(np.float64) @ items.T.astype(np.float64) + prior
    for row, seen_items in enumerate(seen):
        scores[row, list(seen_items)] = -np.inf
    return scores


def csr(seen: list[list[int]]) -> Seen:
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in seen])]).astype(np.int64)
    items = np.array([i for s in seen for i in s], np.int64)
    return Seen(offsets, items, np.ones(len(items), np.float32))


@pytest.mark.parametrize("users_are", ["dense", "histories"])
@pytest.mark.parametrize("tile", [1024, 64, 2], ids=["one-tile", "items-in-tiles", "tiles-under-k"])
def test_top_k_is_exact_and_never_returns_a_seen_item(tile: int, users_are: str) -> None:
    """`histories`: user vectors as a blend of an item-item model and content makes them, a few of
    the item columns beside dense ones, which a block scores on the columns it uses alone."""
    rng = np.random.default_rng(7)
    users, items = rng.normal(size=(50, 32)), rng.normal(size=(200, 32))
    if users_are == "histories":
        taken = np.zeros((50, 200))
        taken[np.arange(50)[:, None], rng.integers(0, 200, (50, 3))] = 1.0
        users, items = np.hstack([users, taken]), np.hstack([items, rng.normal(size=(200, 200))])
        block, columns = active_columns(torch.from_numpy(users[:16].astype(np.float32)))
        assert columns is not None and block.shape == (16, len(columns)) and len(columns) <= 32 + 16 * 3
    users /= np.linalg.norm(users, axis=1, keepdims=True)
    items /= np.linalg.norm(items, axis=1, keepdims=True)
    prior = rng.uniform(0, 0.3, 200)
    seen = [sorted(rng.choice(200, size=rng.integers(0, 40), replace=False).tolist()) for _ in range(49)]
    seen.append(list(range(197)))  # only three unseen items left for k=5

    indices, scores = top_k(users, items, csr(seen), k=5, block=16, prior=prior, tile=tile)

    reference = brute_force(users, items, [set(s) for s in seen], prior)
    expected = np.argsort(-reference, axis=1, kind="stable")[:, :5]
    np.testing.assert_array_equal(indices[:49], expected[:49])
    np.testing.assert_allclose(scores[:49], np.take_along_axis(reference, expected, 1)[:49], atol=1e-5)
    assert indices[49].tolist() == [*expected[49, :3].tolist(), -1, -1]
    assert np.isneginf(scores[49, 3:]).all()
    assert all(not set(row) & set(s) for row, s in zip(indices.tolist(), seen, strict=True))


@pytest.mark.slow
@pytest.mark.parametrize(("topk", "driver_users"), [("exact", 1), ("exact", 0), ("ivf", 0)])
def test_job_writes_the_exact_top_k_of_every_user_and_quarantines_bad_rows(
    ray_local, items, interactions: Path, tmp_path: Path, topk: str, driver_users: int
) -> None:
    """With the IVF index too (60 items: every candidate is found, so the top k is the exact one),
    ranked in the driver (more users than topk_driver_users, but a local Ray is one node, whose
    CPUs a top-k pool would share) or by the top-k actors (topk_driver_users 0)."""
    ids, vectors = items.ids.to_pylist(), items.vectors
    settings = RecsSpec(k=10, popularity_weight=0.4, model="content", topk=topk)
    sized: list[tuple[int, object, bool]] = []
    report = run_recs_job(
        InteractionsInput(path=str(interactions)),
        settings,
        JobSettings(users_per_block=256, topk_driver_users=driver_users),
        items,
        ParquetSink(tmp_path / "out"),
        WorkPath.of(tmp_path / "work"),
        before_write=lambda users, copy: sized.append((users, copy, (tmp_path / "out").exists())),
    )

    rejects = pq.read_table(report.rejects_path).to_pylist()
    assert sorted((r["user_id"] or b"", r["reject_reason"]) for r in rejects) == sorted(
        [
            (b"", "user_id is null"),
            (b"u-\xff", "user_id is not valid UTF-8 (byte 2)"),
            (b"u-inf", "weight is infinite"),
            (b"u-nan", "weight is NaN"),
            (b"u-negative", "weight -1.0 is negative"),
            (b"u-null-item", "item_id is null"),
            (b"u-unknown", "item_id 'no-such-package' is not in the item table"),
        ]
    )

    table = pq.read_table(interactions)
    good = table.slice(0, table.num_rows - len(BAD_ROWS)).to_pylist()
    position = {item: i for i, item in enumerate(ids)}
    history: dict[str, dict[int, float]] = {}
    for row in good:
        history.setdefault(row["user_id"], {})[position[row["item_id"]]] = row["weight"]
    counts = np.bincount([position[row["item_id"]] for row in good], minlength=len(ids))
    prior = 0.4 * np.log1p(counts) / np.log1p(counts.max())
    users = sorted(history)
    profiles = np.stack([sum(w * vectors[i] for i, w in history[u].items()) for u in users])
    profiles /= np.linalg.norm(profiles, axis=1, keepdims=True)
    reference = brute_force(profiles, vectors, [set(history[u]) for u in users], prior)

    written = pq.read_table(tmp_path / "out").sort_by("id")
    assert written["id"].to_pylist() == users
    assert (report.rows, report.rejects, report.users, report.k) == (
        table.num_rows,
        len(BAD_ROWS),
        len(users),
        10,
    )
    assert (report.mode, report.mode_reason, report.rescored, report.copied) == (
        "full",
        "nothing published yet",
        len(users),
        0,
    )
    for row, value in enumerate(written["value"].to_pylist()):
        indices, scores = decode_ranked(value)
        best = np.sort(reference[row])[::-1][:10]
        # Items with the reference's top-k scores, in order (ties may swap); fp16 scores on the wire.
        np.testing.assert_allclose(reference[row, indices], best, atol=1e-5)
        np.testing.assert_allclose(scores, best, atol=2e-3)
    assert sized == [(len(users), None, False)]
    assert report.ranking is not None and report.ranking["method"] == topk
    assert report.ranking["ranked_in"] == ("actors" if driver_users == 0 else "driver")
    if topk == "ivf":
        assert report.ranking["recall"] == 1.0 and report.ranking["sample_users"] == min(check_users(len(users)), len(users))
    stored = dict(zip(written["id"].to_pylist(), written["value"].to_pylist(), strict=True))
    assert len(report.samples) == 5 and report.samples.items() <= stored.items()


def test_too_many_rejects_fail_before_any_top_k(ray_local, items, interactions: Path, tmp_path: Path) -> None:
    strict = InteractionsInput(path=str(interactions), max_reject_ratio=0.001)
    with pytest.raises(
        RejectRatioExceededError, match=r"7 of \d+ interactions rejected, over max_reject_ratio=0.001"
    ):
        run_recs_job(strict, RecsSpec(), JobSettings(), items, ParquetSink(tmp_path / "out"), WorkPath.of(tmp_path / "work"))
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_als_scores_its_users_in_the_actors_from_read_only_factors(
    ray_local, items, interactions: Path, tmp_path: Path
) -> None:
    """ALS (auto's model past 20,000 items) solves each user against its item factors in the
    top-k actors, which Ray's object store hands out read-only; the IVF index ranks them."""
    report = run_recs_job(
        InteractionsInput(path=str(interactions)),
        RecsSpec(k=10, model="als", topk="ivf"),
        JobSettings(users_per_block=256, topk_driver_users=0),  # the actors, not the driver
        items,
        ParquetSink(tmp_path / "out"),
        WorkPath.of(tmp_path / "work"),
    )

    assert report.quality.published == "als+content" and report.rescored == report.users
    assert report.ranking is not None and report.ranking["method"] == "ivf"
    written = pq.read_table(tmp_path / "out")
    assert written.num_rows == report.users
    assert all(len(decode_ranked(value)[0]) == 10 for value in written["value"].to_pylist())
