"""Labelled text sets for `bench labels`, as (id, text, label) tables.

demo: the demo corpus's 5,000 Debian package descriptions and their archive sections
(data/README.md).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from precompute.demo_data import DEMO_CORPUS


def demo(cache: Path) -> pa.Table:
    table = pq.read_table(DEMO_CORPUS, columns=["id", "text", "section"])
    return table.rename_columns(["id", "text", "label"])


DATASETS: dict[str, Callable[[Path], pa.Table]] = {"demo": demo}


def load(name: str, cache: Path) -> pa.Table:
    return DATASETS[name](cache)
