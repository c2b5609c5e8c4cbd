"""Repeats and baskets: a user's own items allowed back where the held-out data says so, and each
user's last basket held out (jobs/recs/topk/repeat.py, held_out.py, quality.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import torch

from precompute.bench.recs.shop import shop
from precompute.jobs.inputs import InteractionsInput
from precompute.jobs.recs.held_out import hold_out
from precompute.jobs.recs.history.interactions import tag_rejects
from precompute.jobs.recs.history.seen import Seen, visit_numbers
from precompute.jobs.recs.quality import evaluate, valid_interactions
from precompute.jobs.recs.recommend import run_recs_job
from precompute.jobs.recs.spec import RecsSpec
from precompute.jobs.recs.state import Items
from precompute.jobs.recs.topk.exact import BlockedTopK
from precompute.jobs.recs.topk.repeat import PERSONAL_FIRST, Repeat, seen_scores, with_repeats
from precompute.jobs.settings import JobSettings
from precompute.jobs.validate import REASON
from precompute.jobs.work_dir import WorkPath
from precompute.stores.key_value.records import decode_ranked
from tests.jobs.recs.inputs import ParquetSink


def csr(histories: list[list[int]]) -> Seen:
    offsets = np.concatenate([[0], np.cumsum([len(h) for h in histories])]).astype(np.int64)
    items = np.array([i for h in histories for i in h], np.int64)
    return Seen(offsets, items, np.ones(len(items), np.float32))


def reference_bonus(history: list[int], visits: list[int], repeat: Repeat, catalogue: int) -> np.ndarray:
    """bonus(u, j) as jobs/recs/topk/repeat.py's docstring writes it, item by item."""
    counts, due = np.zeros(catalogue), np.zeros(catalogue)
    latest = max(visits)
    for item, visit in zip(history, visits, strict=True):
        counts[item] += repeat.decay ** (latest - visit)
    for item in set(history):
        ages = sorted({latest - v for i, v in zip(history, visits, strict=True) if i == item})
        if len(ages) >= 2:
            gap = (ages[-1] - ages[0]) / (len(ages) - 1)
            due[item] = np.exp(-2 * (ages[0] + 1 - gap) ** 2 / gap**2)
    return repeat.weight * counts / counts.max() * (1 + repeat.due * due)


@pytest.mark.parametrize("repeat", [Repeat(0.0, 1.0), Repeat(0.7, 0.8), Repeat(5.0, 1.0, 2.0), Repeat(2.0, 0.9, 4.0)])
@pytest.mark.parametrize("in_visits", [False, True], ids=["one-visit-each", "baskets"])
def test_the_merge_is_the_exact_top_k_of_every_item_with_the_repeat_bonus(repeat: Repeat, in_visits: bool) -> None:
    rng = np.random.default_rng(3)
    users, items, k = rng.normal(size=(30, 8)), rng.normal(size=(120, 8)), 7
    prior = rng.uniform(0, 0.5, 120)
    histories = [rng.integers(0, 120, rng.integers(0, 25)).tolist() for _ in range(29)] + [list(range(118)) * 2]
    visits = [sorted(rng.integers(0, 6, len(h)).tolist()) if in_visits else list(range(len(h))) for h in histories]
    seen = csr(histories)._replace(visits=np.array([v for vs in visits for v in vs], np.int64)) if in_visits else csr(histories)
    ranker = BlockedTopK(items.astype(np.float32), k, 8, prior.astype(np.float32))
    unseen = ranker(torch.tensor(users, dtype=torch.float32), seen)
    own = seen_scores(users.astype(np.float32), items.astype(np.float32), prior.astype(np.float32), seen)
    indices, scores = with_repeats(*unseen, own, repeat)

    reference = users @ items.T + prior
    for row, history in enumerate(histories):
        if history:
            reference[row] += reference_bonus(history, visits[row], repeat, 120)
    expected = np.sort(reference, axis=1)[:, ::-1][:, :k]
    np.testing.assert_allclose(np.take_along_axis(reference, indices, 1), expected, atol=1e-4)
    np.testing.assert_allclose(scores, expected, atol=1e-3)
    assert (indices >= 0).all()  # the last user has two unseen items, and 118 of their own to fill k


def test_personal_top_frequency_ranks_the_users_items_by_count_then_the_popular_ones() -> None:
    seen = csr([[1, 2, 1, 3, 3, 3], []])
    counts = np.array([50, 0, 0, 0, 9, 70], np.float32)
    ranker = BlockedTopK(np.zeros((6, 1), np.float32), 6, 4, counts)
    zeros = np.zeros((2, 1), np.float32)
    unseen = ranker(torch.from_numpy(zeros), seen)
    own = seen_scores(zeros, np.zeros((6, 1), np.float32), counts, seen)
    indices, _ = with_repeats(*unseen, own, Repeat(PERSONAL_FIRST, 1.0))
    assert indices[0].tolist() == [3, 1, 2, 5, 0, 4]  # three, two, one purchases; then by popularity
    assert indices[1, :3].tolist() == [5, 0, 4] and set(indices[1, 3:].tolist()) == {1, 2, 3}  # most-popular


def shop_rows(users: int) -> tuple[list[str], pa.Table]:
    items, orders = shop(users=users, seed=1)
    return items["id"].to_pylist(), orders.rename_columns(["user_id", "item_id", "time", "basket"])


def test_in_a_shop_where_staples_recur_the_repeat_models_win() -> None:
    ids, orders = shop_rows(150)
    good = valid_interactions(orders, ids)
    vectors = np.zeros((len(ids), 4), np.float32)
    quality, _ = evaluate(good, vectors, RecsSpec(model="itemknn", content_weight=0))
    assert quality.target == "basket" and quality.repeats is not None and quality.repeats > 0.5
    assert quality.repeat is not None and quality.seen.startswith("allowed: ")
    published, personal = quality.models["published"], quality.models["personal_top_frequency"]
    excluded = quality.candidates["itemknn"]
    assert published.recall is not None and excluded.recall is not None and personal.recall is not None
    assert published.recall > 5 * excluded.recall and published.recall >= personal.recall
    assert published.new_item_ndcg == excluded.new_item_ndcg  # the new-item figures rank unseen items alone
    assert published.new_item_ndcg is not None and published.new_item_ndcg > quality.models["most_popular"].new_item_ndcg

    exclude, _ = evaluate(good, vectors, RecsSpec(model="itemknn", content_weight=0, seen="exclude"))
    assert exclude.repeat is None and exclude.models["published"] == excluded


def test_where_no_one_has_an_item_twice_seen_items_stay_excluded() -> None:
    """Film ratings: each item once per user. auto keeps them out; include lets them in anyway."""
    rng = np.random.default_rng(0)
    ids = [f"film{i:03}" for i in range(60)]
    rows = []
    for user in range(80):
        start = int(rng.integers(0, 50))
        rows += [(f"u{user}", ids[start + step], step) for step in range(int(rng.integers(3, 10)))]
    table = pa.table({"user_id": [r[0] for r in rows], "item_id": [r[1] for r in rows], "time": [r[2] for r in rows]})
    good = valid_interactions(table, ids)
    vectors = np.zeros((len(ids), 4), np.float32)
    quality, _ = evaluate(good, vectors, RecsSpec(model="transitions", content_weight=0))
    assert (quality.target, quality.repeats, quality.repeat) == ("interaction", 0.0, None)
    assert quality.seen == "excluded: no held-out item was one its user had before"
    forced, _ = evaluate(good, vectors, RecsSpec(model="transitions", content_weight=0, seen="include"))
    assert forced.repeat is not None and forced.models["published"].ndcg <= quality.models["published"].ndcg


BASKET_TYPES = {
    "string": pa.string(),
    "large_string": pa.large_string(),
    "binary": pa.binary(),
    "large_binary": pa.large_binary(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "uint16": pa.uint16(),
}


@pytest.mark.parametrize("kind", list(BASKET_TYPES))
def test_every_basket_type_holds_out_the_same_last_basket(kind: str) -> None:
    ids, orders = shop_rows(30)
    reference = hold_out(valid_interactions(orders, ids), seed=0)
    baskets = orders["basket"]
    if pa.types.is_integer(BASKET_TYPES[kind]):
        recast = pc.cast(pc.subtract(baskets, pc.min(baskets)), BASKET_TYPES[kind])  # uint16 fits the span
    else:
        recast = pc.cast(pc.cast(baskets, pa.string()), BASKET_TYPES[kind])
    split = hold_out(valid_interactions(orders.set_column(3, "basket", recast), ids), seed=0)
    assert split.target == "basket" and np.diff(split.held.offsets).max() > 1  # whole orders held out
    np.testing.assert_array_equal(split.held.offsets, reference.held.offsets)
    np.testing.assert_array_equal(split.held.items, reference.held.items)
    np.testing.assert_array_equal(split.train.items, reference.train.items)


def test_a_user_with_one_basket_is_not_held_out_and_a_null_basket_is_its_rows_reason() -> None:
    ids = ["a", "b", "c"]
    table = pa.table(
        {
            "user_id": ["u1", "u1", "u1", "u2", "u2", "u3"],
            "item_id": ["a", "b", "c", "a", "b", "a"],
            "time": [1, 1, 2, 5, 5, 7],
            "basket": [10, 10, 11, 12, 12, None],
        }
    )
    tagged = tag_rejects(table, pa.array(ids))
    assert tagged[REASON].to_pylist() == [None] * 5 + ["basket is null"]
    split = hold_out(valid_interactions(table, ids), seed=0)
    assert split.held.offsets.tolist() == [0, 1, 1] and split.held.items.tolist() == [2]  # u1's last order; u2 has one
    assert split.train.offsets.tolist() == [0, 2, 4]


def test_the_job_publishes_a_shoppers_own_items_where_repeats_win(ray_local, tmp_path: Path) -> None:
    ids, orders = shop_rows(120)
    path = tmp_path / "orders.parquet"
    pq.write_table(orders.rename_columns(["user_id", "item_id", "time", "order_id"]), path)
    keys = np.array([i.encode().ljust(16, b"-")[:16] for i in ids], "S16")
    items = Items.of(pa.array(ids, pa.string()), np.zeros((len(ids), 4), np.float32), keys)
    histories: dict[str, set[int]] = {}
    for user, item in zip(orders["user_id"].to_pylist(), orders["item_id"].to_pylist(), strict=True):
        histories.setdefault(user, set()).add(ids.index(item))
    for seen in ("auto", "exclude"):
        out = tmp_path / seen
        report = run_recs_job(
            InteractionsInput(path=str(path), basket="order_id"),
            RecsSpec(model="itemknn", content_weight=0, seen=seen),
            JobSettings(users_per_block=64),
            items,
            ParquetSink(out),
            WorkPath.of(tmp_path / f"work-{seen}"),
        )
        written = pq.read_table(out)
        own = [
            len(set(decode_ranked(value)[0].tolist()) & histories[user])
            for user, value in zip(written["id"].to_pylist(), written["value"].to_pylist(), strict=True)
        ]
        assert report.quality.target == "basket" and written.num_rows == len(histories)
        if seen == "auto":
            assert report.quality.repeat is not None and np.mean(own) > 5  # mostly the shopper's staples
        else:
            assert report.quality.repeat is None and sum(own) == 0


def test_interactions_at_one_time_are_one_visit_and_a_row_without_a_time_its_own() -> None:
    offsets = np.array([0, 4, 7, 7, 9])
    seconds = np.array([5.0, 5.0, 9.0, 12.0, 1.0, np.nan, np.nan, 3.0, 3.0])
    assert visit_numbers(offsets, seconds).tolist() == [0, 0, 1, 2, 0, 1, 2, 0, 0]
    table = pa.table({"user_id": ["u"] * 3, "item_id": ["a", "b", "a"], "time": [1, 1, 2], "basket": [7, 7, 8]})
    split = hold_out(valid_interactions(table, ["a", "b"]), seed=0)
    assert split.train.visits is not None and split.train.visits.tolist() == [0, 0]
