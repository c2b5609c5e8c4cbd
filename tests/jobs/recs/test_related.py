"""Related items: each item's list from an item-to-item model, never the item itself, measured as
the service merges them for a session (jobs/recs/related.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from precompute.bench.recs.shop import shop
from precompute.jobs.inputs import InteractionsInput
from precompute.jobs.recs.held_out import hold_out
from precompute.jobs.recs.item_table import interaction_items
from precompute.jobs.recs.models import train_towers
from precompute.jobs.recs.quality import valid_interactions
from precompute.jobs.recs.related import evaluate_related, item_lists, run_related_job
from precompute.jobs.recs.spec import RelatedSpec
from precompute.jobs.settings import JobSettings
from precompute.jobs.work_dir import WorkPath
from precompute.stores.key_value.records import decode_ranked
from tests.jobs.recs.inputs import ParquetSink


def orders(users: int = 120) -> tuple[list[str], pa.Table]:
    items, table = shop(users=users, seed=4)
    return items["id"].to_pylist(), table.rename_columns(["user_id", "item_id", "time", "basket"])


@pytest.mark.parametrize("model", ["transitions", "itemknn", "ease", "als"])
def test_an_items_related_list_never_holds_the_item_itself(model: str) -> None:
    ids, table = orders()
    train = hold_out(valid_interactions(table, ids), seed=0).train
    towers = train_towers(model, train, np.zeros((len(ids), 1), np.float32), RelatedSpec().recs())
    values = item_lists(towers, None, 10)
    assert len(values) == len(ids)
    for item, value in enumerate(values):
        listed = decode_ranked(value)[0]
        assert item not in listed.tolist() and len(listed) == 10 and len(set(listed.tolist())) == 10


def test_the_published_lists_rank_held_out_sessions_above_most_popular() -> None:
    ids, table = orders()
    quality, towers = evaluate_related(valid_interactions(table, ids), len(ids), RelatedSpec())
    assert quality.target == "basket" and quality.published in {"transitions", "itemknn", "ease"}
    assert quality.models["published"].ndcg > 2 * quality.models["most_popular"].ndcg
    assert len(quality.candidates) == 6  # three models, each with the session's items excluded and allowed
    assert towers.name == quality.published


def test_the_job_writes_one_list_per_item_and_says_whether_sessions_get_their_own_items(
    ray_local, tmp_path: Path
) -> None:
    ids, table = orders(60)
    pq.write_table(table.rename_columns(["user_id", "item_id", "time", "order_id"]), tmp_path / "orders.parquet")
    source = InteractionsInput(path=str(tmp_path / "orders.parquet"), basket="order_id")
    items = interaction_items(source)
    created: list[tuple[int, bool]] = []
    report = run_related_job(
        source,
        RelatedSpec(k=5, seen="exclude"),
        JobSettings(),
        items,
        ParquetSink(tmp_path / "out"),
        WorkPath.of(tmp_path / "work"),
        lambda records, allowed: created.append((records, allowed)),
    )
    written = pq.read_table(tmp_path / "out").sort_by("id")
    assert created == [(len(items.ids), False)] and written["id"].to_pylist() == items.ids.to_pylist()
    position = {item: at for at, item in enumerate(items.ids.to_pylist())}
    for item, value in zip(written["id"].to_pylist(), written["value"].to_pylist(), strict=True):
        listed = decode_ranked(value)[0].tolist()
        assert len(listed) == 5 and position[item] not in listed
    assert report.quality.include_seen is False and report.items == len(items.ids) < len(ids)  # only items bought
