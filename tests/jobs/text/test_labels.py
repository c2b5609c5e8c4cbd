"""The labels job on real Ray, written through the real Redis sink and read back as the service reads it."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from precompute.demo_data import DEMO_CORPUS
from precompute.jobs.inputs import CorpusInput
from precompute.jobs.nights import Previous
from precompute.jobs.settings import JobSettings
from precompute.jobs.text.content_cache import Reuse, promote
from precompute.jobs.text.labels import STAGED, LabelsJobReport, copy_plan, labeler_identity, run_labels_job
from precompute.jobs.validate import RejectRatioExceededError
from precompute.jobs.work_dir import WorkPath
from precompute.models.labels.head import LabelPolicy, LabelTask
from precompute.models.labels.labeler import load_labeler
from precompute.models.text.reference import TextSample
from precompute.stores.key_value.reader import KeyValueReader
from precompute.stores.key_value.records import decode_ranked
from precompute.stores.key_value.settings import RedisSettings
from precompute.stores.key_value.sink import KeyValueSink
from precompute.stores.key_value.store import KeyValueStore
from precompute.stores.key_value.versions import CopyPlan, OutputVersions
from precompute.stores.versions import new_version

VERSION = "20261123T010000Z-label0"
LABELS = LabelTask(
    corpus=TextSample(path=str(DEMO_CORPUS)), column="section", policy=LabelPolicy(train_texts=400, fine_tune_seconds=0)
)
"""As in the flow's tests: the trained head is cached per training set, so they share it."""


@pytest.fixture
def redis(redis_url: str) -> RedisSettings:
    return RedisSettings(url=redis_url, prefix=f"t{uuid.uuid4().hex[:8]}")


@pytest.mark.slow
@pytest.mark.parametrize("driver_rows", [2048, 0], ids=["in-the-driver", "by-actors"])
def test_every_valid_item_gets_the_labelers_top_labels(
    ray_local, settings, small_corpus: Path, redis: RedisSettings, tmp_path: Path, driver_rows: int
) -> None:
    """Its 200 rows labelled in the driver (few rows: driver_rows) or by the actor pool."""
    # FP32: dynamic INT8 quantizes each batch with its own scales, and rows near the FP32
    # recheck's margin take either path, so the job's batches and this test's would differ.
    settings = settings.replace(precision="fp32")
    job = JobSettings(work_dir=tmp_path, driver_rows=driver_rows)
    with KeyValueStore(redis) as store:
        report = run_labels_job(
            CorpusInput(path=str(small_corpus), max_reject_ratio=0.05),
            job,
            LABELS,
            settings,
            KeyValueSink(store.settings, "labels", VERSION),
            WorkPath.of(tmp_path / "run"),
            before_write=lambda rows, copy: store.create_version("labels", VERSION, rows),
        )
        store.publish("labels", VERSION, report.samples)

    rejects = pq.read_table(report.rejects_path).to_pylist()
    assert sorted(r["reject_reason"] for r in rejects) == [
        "id 'dup' is duplicated",
        "id 'dup' is duplicated",
        "id is null",
        "text is empty",
    ]
    assert (report.rows, report.rejects, report.items) == (204, 4, 200)
    rows = pq.read_table(small_corpus).slice(0, 200).to_pylist()

    async def read() -> list[bytes | None]:
        async with KeyValueReader(redis) as reader:
            return (await reader.get_many("labels", [r["id"] for r in rows]))[1]

    stored = asyncio.run(read())
    with load_labeler(LABELS, settings) as labeler:
        assert report.vocabulary == labeler.labels
        assert report.labeler["engine"]["precision"] == labeler.report.engine.precision
        indices, scores, _ = labeler.label([r["text"] for r in rows])
    for value, want_indices, want_scores in zip(stored, indices, scores, strict=True):
        got_indices, got_scores = decode_ranked(value)
        np.testing.assert_array_equal(got_indices, want_indices)
        np.testing.assert_allclose(got_scores, want_scores, atol=1e-3)  # float16 on the wire
    top = [report.vocabulary[decode_ranked(v)[0][0]] for v in stored]
    agreement = np.mean([label == row["section"] for label, row in zip(top, rows, strict=True)])
    assert agreement > 0.4  # the head learned the sections: 57 of them, chance is under 0.1


def test_too_many_rejects_fail_before_any_labelling(
    ray_local, settings, small_corpus: Path, redis: RedisSettings, tmp_path: Path
) -> None:
    corpus = CorpusInput(path=str(small_corpus), max_reject_ratio=0.01)
    with (
        KeyValueStore(redis) as store,
        pytest.raises(RejectRatioExceededError, match="4 of 204 rows rejected"),
    ):
        run_labels_job(
            corpus,
            JobSettings(work_dir=tmp_path),
            LABELS,
            settings,
            KeyValueSink(store.settings, "labels", VERSION),
            WorkPath.of(tmp_path / "run"),
        )
    assert pq.read_table(tmp_path / "run" / "rejects.parquet").num_rows == 4  # quarantined, with reasons


def label_and_publish(
    store: KeyValueStore, corpus: CorpusInput, labels: LabelTask, settings, tmp_path: Path
) -> tuple[LabelsJobReport, str]:
    """What the flow's label task does: label into a new version (a copy of the published one on an
    unchanged night), publish it, promote its staged values. (report, version)"""
    cache_dir = WorkPath.of(tmp_path / "cache")
    current = store.current("labels")
    new = OutputVersions(store, "labels").writer(new_version(), dict)
    previous = None if current is None else Previous(current, WorkPath.of(tmp_path / current), new.copyable(current))
    report = run_labels_job(
        corpus,
        JobSettings(work_dir=tmp_path),
        labels,
        settings,
        new.sink(),
        WorkPath.of(tmp_path / new.version),
        before_write=new.create,
        cache_dir=cache_dir,
        previous=previous,
    )
    store.publish("labels", new.version, report.samples)
    promote(cache_dir, WorkPath.of(tmp_path / new.version) / STAGED)
    return report, new.version


@pytest.mark.slow
def test_a_rerun_reuses_unchanged_labels_and_a_new_head_recomputes_them_all(
    ray_local, settings, small_corpus: Path, redis: RedisSettings, tmp_path: Path
) -> None:
    corpus = CorpusInput(path=str(small_corpus), max_reject_ratio=0.05)
    rows = pq.read_table(small_corpus).to_pylist()
    rows[7]["text"] += " Now with a changed description."
    changed = tmp_path / "changed.parquet"
    pq.write_table(pa.Table.from_pylist(rows[:20] + rows[21:]), changed)  # and row 20 gone

    async def read() -> list[bytes | None]:
        async with KeyValueReader(redis) as reader:
            return (await reader.get_many("labels", [r["id"] for r in rows[:200]]))[1]

    new_head = LABELS.model_copy(update={"policy": LabelPolicy(train_texts=300, fine_tune_seconds=0)})
    with KeyValueStore(redis) as store:
        first, _ = label_and_publish(store, corpus, LABELS, settings, tmp_path)
        labelled = asyncio.run(read())
        second, _ = label_and_publish(store, corpus.model_copy(update={"path": str(changed)}), LABELS, settings, tmp_path)
        reused = asyncio.run(read())
        third, relabelled = label_and_publish(store, corpus, new_head, settings, tmp_path)
        before = asyncio.run(read())
        fourth, copied = label_and_publish(store, corpus, new_head, settings, tmp_path)  # nothing moved
        after = asyncio.run(read())

    assert (first.computed, first.reused, first.written) == (200, 0, 200)
    # A copy of the published version, less the row that is gone, with the one moved value written.
    assert (second.computed, second.reused, second.written) == (1, 198, 1)
    assert reused[20] is None and reused[7] is not None
    assert reused[:7] + reused[8:20] + reused[21:] == labelled[:7] + labelled[8:20] + labelled[21:]
    assert (third.computed, third.reused, third.written, third.unchanged_from) == (200, 0, 200, None)
    # The same corpus, engine and task as the published run: its version copied whole, no Ray job.
    assert fourth.unchanged_from == relabelled and set(fourth.seconds) == {"digest", "copy"}
    assert (fourth.rows, fourth.rejects, fourth.items, fourth.computed, fourth.reused) == (204, 4, 200, 0, 200)
    assert (fourth.vocabulary, fourth.labeler) == (third.vocabulary, third.labeler)
    assert None not in after and after == before and copied != relabelled
    assert pq.read_table(fourth.rejects_path).num_rows == 4


def test_the_labelers_identity_covers_its_head_and_vocabulary(settings) -> None:
    """What keys a cached label: a change to what produced it computes every row again. (Not the
    precision the gate chooses: the identity is taken before the labeler is built.)"""

    def identity(head_dir: str | None = "/engines/label-head-aaaa", vocabulary: tuple[str, ...] = ("a", "b")) -> str:
        return labeler_identity(LABELS, settings, None if head_dir is None else Path(head_dir), list(vocabulary))

    same = identity()
    assert identity(head_dir="/elsewhere/label-head-aaaa") == same  # the head's key, not where it is cached
    assert identity(head_dir="/engines/label-head-bbbb") != same  # other training data, column or recipe
    assert identity(head_dir=None) != same  # a classifier's own labels
    assert identity(vocabulary=("a", "c")) != same


def test_a_copy_is_planned_only_where_the_kept_rows_are_the_published_versions_values(tmp_path: Path) -> None:
    """Only the labelled rows are written over a copy, so the rows kept from the cache must be the
    published version's: the cache is its run's staged parts (a run that published but failed
    before promoting its cache leaves an older one)."""
    published = Previous("v1", WorkPath.of(tmp_path / "v1"), range(10**6))

    def reuse(run: str, kept: int) -> Reuse:
        return Reuse(None, [], kept, ["gone"], WorkPath.of(tmp_path / run / STAGED))

    assert copy_plan(published, reuse("v1", 90), 100) == CopyPlan("v1", ["gone"])
    assert copy_plan(published, reuse("v0", 90), 100) is None  # an older run's values
    assert copy_plan(published, reuse("v1", 49), 100) is None  # most rows labelled again
    full = Previous("v1", published.run_dir, range(0))  # a copy would not hold 100 records well
    assert copy_plan(full, reuse("v1", 90), 100) is None
    assert copy_plan(published, Reuse(None, None, 0, []), 100) is None
    assert copy_plan(None, reuse("v1", 90), 100) is None
