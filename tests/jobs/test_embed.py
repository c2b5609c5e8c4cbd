"""The corpus-embedding job on real Ray: rejects, versions, and incremental recompute."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs.embed import run_embed_job
from jobs.settings import JobSettings
from jobs.validate import RejectRatioExceededError
from precompute.pipeline import CorpusInput
from stores.vector_settings import VectorStoreSettings
from stores.vectors import VectorStore, open_vector_store


@pytest.fixture
def store(tmp_path: Path) -> Iterator[VectorStore]:
    with open_vector_store(VectorStoreSettings(type="edge", path=tmp_path / "qdrant")) as store:
        yield store


@pytest.fixture
def job(tmp_path: Path) -> JobSettings:
    return JobSettings(work_dir=tmp_path / "work")


@pytest.fixture
def corpus(small_corpus: Path) -> CorpusInput:
    """The small corpus has 4 bad rows in 204: within a 5% reject ratio."""
    return CorpusInput(path=str(small_corpus), max_reject_ratio=0.05)


def test_rejects_are_quarantined_with_reasons(ray_local, settings, store, job, corpus) -> None:
    report = run_embed_job("v1", store, corpus, job, settings)

    rejects = pq.read_table(report.rejects_path).to_pylist()
    reasons = sorted((str(r["id"]), r["reject_reason"]) for r in rejects)
    assert reasons == [
        ("None", "id is null"),
        ("dup", "id 'dup' is duplicated"),
        ("dup", "id 'dup' is duplicated"),
        ("empty-text", "text is empty"),
    ]
    assert (report.rows, report.rejects, report.loaded) == (204, 4, 200)
    assert (report.computed, report.reused) == (200, 0)
    assert report.engine["precision"] == "int8" and report.engine["gates"][0]["passed"]


def test_unchanged_rows_are_reused_and_changed_ones_recomputed(
    ray_local, settings, store, job, corpus, small_corpus: Path, tmp_path: Path
) -> None:
    first = run_embed_job("v1", store, corpus, job, settings)
    second = run_embed_job("v2", store, corpus, job, settings)
    assert (second.computed, second.reused, second.loaded) == (0, first.loaded, first.loaded)

    table = pq.read_table(small_corpus).to_pylist()
    table[10]["text"] += " Now with a changed description."
    table[11]["text"] += " Now with a changed description."
    changed = tmp_path / "changed.parquet"
    pq.write_table(pa.Table.from_pylist(table), changed)
    third = run_embed_job("v3", store, corpus.model_copy(update={"path": str(changed)}), job, settings)
    assert (third.computed, third.reused) == (2, first.loaded - 2)


def test_too_many_rejects_fail_before_inference(
    ray_local, settings, store, job, corpus, tmp_path: Path
) -> None:
    strict = corpus.model_copy(update={"max_reject_ratio": 0.01})
    with pytest.raises(RejectRatioExceededError, match=r"4 of 204 rows rejected, over max_reject_ratio=0.01"):
        run_embed_job("v1", store, strict, job, settings)
    assert not (tmp_path / "work" / "runs" / "embeddings" / "v1" / "embeddings").exists()
    assert store.versions() == []
