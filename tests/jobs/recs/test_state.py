"""The recs state's items (jobs/recs/state.py): a night whose item ids are the published ones
links their base and writes only the keys that moved since it, and the next night compares
with the keys as they were, base and delta together."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa

from precompute.jobs.nights import Previous
from precompute.jobs.recs.state import (
    FINGERPRINT,
    ITEMS_DELTA,
    ITEMS_FILE,
    LENGTH,
    STATE,
    Items,
    plan,
    stage,
)
from precompute.jobs.work_dir import WorkPath

ITEMS = 100
FINGERPRINT_OF_MODEL = {"vocabulary": "v1", "k": 10}
USERS = pa.table({"id": ["u1"], FINGERPRINT: pa.array([b"0" * 16]), LENGTH: pa.array([1], pa.int64())})


def keys_with(moved: list[int], mark: bytes = b"m") -> np.ndarray:
    keys = np.array([f"key-{i:012d}".encode() for i in range(ITEMS)], "S16")
    keys[moved] = [mark * 16] * len(moved)
    return keys


def night(run_dir: Path, keys: np.ndarray, previous: Previous | None) -> tuple[np.ndarray, Previous]:
    """Plan against `previous`, stage tonight's items; (the items the plan saw move, this night as the next one's previous)."""
    items = Items.of(pa.array([f"i{i:03d}" for i in range(ITEMS)]), np.zeros((ITEMS, 2), np.float32), keys)
    planned = plan(FINGERPRINT_OF_MODEL, items, previous)
    stage(WorkPath.of(run_dir), FINGERPRINT_OF_MODEL, items.ids, keys, USERS, planned.items_base)
    return np.flatnonzero(planned.changed_items), Previous(run_dir.name, WorkPath.of(run_dir), range(10))


def test_a_night_links_the_published_items_and_writes_the_keys_that_moved_since(tmp_path: Path) -> None:
    _, first = night(tmp_path / "n1", keys_with([]), None)
    assert not (tmp_path / "n1" / STATE / ITEMS_DELTA).exists()

    moved, second = night(tmp_path / "n2", keys_with([3, 40]), first)
    assert moved.tolist() == [3, 40]
    base, linked = (tmp_path / n / STATE / ITEMS_FILE for n in ("n1", "n2"))
    assert os.path.samefile(base, linked)
    assert pa.ipc.open_file(tmp_path / "n2" / STATE / ITEMS_DELTA).read_all()["position"].to_pylist() == [3, 40]

    # The night after compares with n2's keys (base and delta), not the base's: 40 moved back, 7 moved.
    moved, third = night(tmp_path / "n3", keys_with([3, 7]), second)
    assert moved.tolist() == [7, 40]
    assert os.path.samefile(base, tmp_path / "n3" / STATE / ITEMS_FILE)

    # Past KEYS_REBASE_SHARE of the items moved from the base, a night writes its own.
    moved, fourth = night(tmp_path / "n4", keys_with(list(range(10))), third)
    assert moved.tolist() == [0, 1, 2, 4, 5, 6, 8, 9]  # 3 and 7 held the mark already
    assert not os.path.samefile(base, tmp_path / "n4" / STATE / ITEMS_FILE)
    assert not (tmp_path / "n4" / STATE / ITEMS_DELTA).exists()
    moved, _ = night(tmp_path / "n5", keys_with(list(range(10))), fourth)
    assert moved.tolist() == []
