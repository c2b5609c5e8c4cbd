"""`precompute bench scale` at two tiny sizes: every stage timed at each, with its growth exponent."""

from __future__ import annotations

from pathlib import Path

import pyarrow.compute as pc
import pytest

from bench.scale import STAGES, main
from bench.scale_data import corpus, interactions

SIZES = [400, 800]


def test_inputs_are_deterministic_with_unique_ids_and_interactions_that_reference_them() -> None:
    table = corpus(2000, seed=3)
    assert table.equals(corpus(2000, seed=3))
    assert len(pc.unique(table["id"])) == 2000
    seen = interactions(table, seed=3)
    assert pc.all(pc.is_in(seen["item_id"], table["id"])).as_py()
    assert len(pc.unique(seen["user_id"])) == 200  # a tenth of the rows
    counts = pc.value_counts(seen["item_id"]).field("counts").to_numpy()
    assert counts.max() >= 10 * counts.mean()  # a long tail: a few items are in many users' lists


@pytest.mark.slow  # two real nightly runs and a rerun: minutes on 2 CPUs
def test_every_stage_at_two_sizes_with_its_exponent_and_the_rerun(
    prefect_api: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PRECOMPUTE_ENGINE_CACHE_DIR", str(tmp_path / "engines"))
    monkeypatch.setenv("PREFECT_API_URL", prefect_api)  # each size's process: no Prefect of its own to start
    result = main(SIZES, work_dir=str(tmp_path / "bench"))

    assert result["sizes"] == SIZES
    assert not result["failed"]
    for stage in STAGES:
        assert all(result["seconds"][stage][n] is not None for n in SIZES), stage
        assert isinstance(result[f"{stage}_exponent"], float), stage
    for n in SIZES:
        memory = result["memory"][n]
        assert memory["driver_peak_rss_mb"] > 50
        assert any(name.startswith("ray::") for name in memory["ray_peak_rss_mb"])
        assert memory["redis_bytes_per_record"] > 0
        assert memory["qdrant_disk_mb"] > 0
    rerun = result["rerun"]
    assert rerun["rows"] == SIZES[-1]
    assert rerun["embeddings"]["computed"] == rerun["texts_changed"] > 0
    assert rerun["embeddings"]["reused"] == SIZES[-1] - rerun["texts_changed"]
