"""The previous run's staged rows split from this run's: what is kept, what the model sees."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray
from ray.data.dataset import MaterializedDataset

from precompute.jobs.inputs import CorpusInput
from precompute.jobs.staging import StagingSink
from precompute.jobs.text import content_cache
from precompute.jobs.text.content_cache import KEY, promote, reuse_previous, with_content_keys
from precompute.jobs.text.corpus_validation import GoodRows
from precompute.jobs.work_dir import WorkPath

pytestmark = pytest.mark.slow  # seconds to minutes each: left out of `pytest -m "not slow"`


def keyed(texts: list[str]) -> pa.Table:
    return with_content_keys(pa.table({"id": [str(i) for i in range(len(texts))], "text": texts}), "model")


@pytest.mark.parametrize("gathered", [3, 2])
def test_a_nights_few_fresh_rows_are_gathered_before_the_model_and_many_stream(
    ray_local, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gathered: int
) -> None:
    """Read again from the corpus beside the actor pool, a night's few moved rows waited on the
    pool's CPUs; gathered first, they do not. Past GATHERED_ROWS they stream, as a full run's."""
    monkeypatch.setattr(content_cache, "GATHERED_ROWS", gathered)
    texts = [f"text {i}" for i in range(100)]
    cache, run = WorkPath.of(tmp_path / "cache"), WorkPath.of(tmp_path / "runs" / "v1")
    before = keyed(texts).select(["id", KEY]).append_column("value", pa.array(range(100)))
    before = before.append_column("computed", pa.array([True] * 100))
    ray.data.from_arrow(before).write_datasink(StagingSink(run))
    promote(cache, run)

    texts[5], texts[50], texts[70] = "moved", "moved too", "moved again"
    staged = WorkPath.of(tmp_path / "runs" / "v2")
    pq.write_table(pa.table({"id": [str(i) for i in range(99)], "text": texts[:-1]}), tmp_path / "corpus.parquet")
    tonight = GoodRows(CorpusInput(path=str(tmp_path / "corpus.parquet")), set())  # 99 gone
    reuse = reuse_previous(tonight.then(partial(with_content_keys, identity="model")), cache, ["value"], [], staged)
    assert (reuse.count, reuse.gone, reuse.source) == (96, ["99"], run)
    assert sum(part["rows"] for part in ray.get(reuse.kept)) == 96  # their parts written into `staged`
    assert all((staged / part["name"]).is_file() for part in ray.get(reuse.kept))
    assert sorted(row["id"] for row in reuse.fresh.take_all()) == ["5", "50", "70"]
    assert isinstance(reuse.fresh, MaterializedDataset) == (gathered == 3)
