"""What the recommendations job tests share: the sink they write through, the rows the contract rejects."""

from __future__ import annotations

import math
import sys
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import ray
from ray import cloudpickle
from ray.data.block import Block, BlockAccessor
from ray.data.datasource import Datasink

ITEMS = 60
BAD_ROWS = [
    {"user_id": None, "item_id": "emacsen-common", "weight": 1.0},
    {"user_id": "u-null-item", "item_id": None, "weight": 1.0},
    {"user_id": "u-nan", "item_id": "emacsen-common", "weight": math.nan},
    {"user_id": "u-negative", "item_id": "emacsen-common", "weight": -1.0},
    {"user_id": "u-unknown", "item_id": "no-such-package", "weight": 1.0},
    {"user_id": "u-inf", "item_id": "emacsen-common", "weight": math.inf},
    {"user_id": b"u-\xff", "item_id": "emacsen-common", "weight": 1.0},  # not UTF-8
]


class ParquetSink(Datasink[None]):
    """A stand-in for the Redis sink a flow passes: each block a Parquet part, so a test reads back
    exactly what the job wrote (the rescored users only), which a Redis version, holding the copied
    users too, cannot show. What it cannot show, a version really copied, deleted from and written
    in Redis, test_recommend_incremental.py's carried-out plan shows."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def routed(self, values: ray.data.Dataset, rows: int) -> ray.data.Dataset:
        """Parts in any order: nothing to route (the Redis sink routes rows by bucket)."""
        return values

    def write(self, blocks: Iterable[Block], ctx: Any) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        for block in blocks:
            pq.write_table(
                BlockAccessor.for_block(block).to_arrow(), self.path / f"{uuid.uuid4().hex}.parquet"
            )


# Ray's workers cannot import a test module: ship ParquetSink's code with it instead.
cloudpickle.register_pickle_by_value(sys.modules[__name__])
