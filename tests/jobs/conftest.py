"""The recommendations job tests' inputs: real demo items and interactions, per module."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from precompute.demo_data import DEMO_CORPUS, DEMO_INTERACTIONS
from precompute.jobs.recs.state import Items
from precompute.jobs.text.content_cache import content_keys
from precompute.models import Encoder
from tests.jobs.recs.inputs import BAD_ROWS, ITEMS


@pytest.fixture(scope="module")
def items(encoder: Encoder) -> Items:
    """The demo's most interacted-with packages, embedded from their real descriptions."""
    counts = Counter(pq.read_table(DEMO_INTERACTIONS, columns=["item_id"])["item_id"].to_pylist())
    ids = sorted(item for item, _ in counts.most_common(ITEMS))
    corpus = {
        row["id"]: row["text"] for row in pq.read_table(DEMO_CORPUS, columns=["id", "text"]).to_pylist()
    }
    texts = [corpus[i] for i in ids]
    return Items.of(pa.array(ids, pa.string()), encoder.encode(texts), np.array(content_keys("minilm", texts), "S16"))


@pytest.fixture(scope="module")
def interactions(items: Items, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Real interactions with those items, plus one row of each kind the contract rejects."""
    ids = set(items.ids.to_pylist())
    good = [row for row in pq.read_table(DEMO_INTERACTIONS).to_pylist() if row["item_id"] in ids]
    path = tmp_path_factory.mktemp("interactions") / "interactions.parquet"
    rows = good + BAD_ROWS
    users = pa.array(
        [u.encode() if isinstance(u, str) else u for u in (r["user_id"] for r in rows)], pa.binary()
    )
    table = pa.table(
        {
            "user_id": users.view(pa.string()),  # a string column holding one row of invalid UTF-8
            "item_id": pa.array([r["item_id"] for r in rows], pa.string()),
            "weight": pa.array([r["weight"] for r in rows], pa.float32()),
        }
    )
    pq.write_table(table, path)
    return path
