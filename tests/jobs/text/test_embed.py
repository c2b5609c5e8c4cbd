"""The corpus-embedding job on real Ray: rejects, versions, and incremental recompute."""

from __future__ import annotations

import inspect
import json
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from precompute.jobs.inputs import CorpusInput
from precompute.jobs.settings import JobSettings
from precompute.jobs.staging import MANIFEST, committed_dataset, committed_parts
from precompute.jobs.text.embed import EmbedActor, prepare_engine, run_embed_job
from precompute.jobs.text.embedding_cache import EMBEDDING, embeddings_of
from precompute.jobs.text.labels import prepare_labeler
from precompute.jobs.validate import RejectRatioExceededError
from precompute.jobs.work_dir import WorkPath
from precompute.models import load_encoder
from precompute.models.datasets import Digests, InputFiles
from precompute.models.engines.gate import GateResult
from precompute.models.engines.load import gate_line
from precompute.stores.vectors import open_vector_store
from precompute.stores.vectors.settings import VectorStoreSettings
from precompute.stores.vectors.store import VectorStore


@pytest.fixture
def store(tmp_path: Path) -> Iterator[VectorStore]:
    with open_vector_store(VectorStoreSettings(type="edge", path=tmp_path / "qdrant"), "corpus") as store:
        yield store


@pytest.fixture
def job(tmp_path: Path) -> JobSettings:
    return JobSettings(work_dir=tmp_path / "work")


@pytest.fixture
def corpus(small_corpus: Path) -> CorpusInput:
    """The small corpus has 4 bad rows in 204: within a 5% reject ratio."""
    return CorpusInput(path=str(small_corpus), max_reject_ratio=0.05)


@pytest.mark.slow
@pytest.mark.parametrize("driver_rows", [2048, 0], ids=["in-the-driver", "by-actors"])
def test_rejects_are_quarantined_with_reasons(
    ray_local, settings, store, job, corpus, driver_rows: int
) -> None:
    """Its 200 rows embedded in the driver (few rows: driver_rows) or by the actor pool."""
    job = job.model_copy(update={"driver_rows": driver_rows})
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
    *refused, served = report.engine["gates"]  # the fastest graph that passed serves
    assert served["passed"] and not any(gate["passed"] for gate in refused)
    assert served["precision"].startswith(report.engine["precision"])  # int8-mixed-50 is an int8-mixed
    texts = dict(zip(*(pq.read_table(corpus.path)[c].to_pylist() for c in ("id", "text")), strict=True))
    ids, vectors = staged_vectors(staged(job, "v1"))
    with load_encoder(settings) as encoder:
        expected = encoder.encode([texts[i] for i in ids])
    # Each row its own text's vector (INT8's scales depend on the batch: not exactly).
    assert np.sum(vectors * expected, axis=1).min() > 0.98


@pytest.mark.slow
def test_the_engine_ladder_reports_a_line_per_step_while_the_job_waits_for_it(
    ray_local, settings, store, job, corpus, caplog: pytest.LogCaptureFixture
) -> None:
    """The ladder runs in its own task while the driver validates rows: each rung's gate reaches
    the driver's log as a progress line of the output, as it is gated."""
    with caplog.at_level(logging.INFO, logger="precompute.progress"):
        report = run_embed_job("v1", store, corpus, job, settings, output="docs")
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("docs engine: ")]
    gates = [f"docs engine: {gate_line(GateResult(**gate))}" for gate in report.engine["gates"]]
    assert gates and lines[-len(gates) :] == gates
    assert gates[-1].endswith(" — passed") and "known-item pairs" in gates[-1]
    assert all(line.endswith(" — passed") or " — failed: " in line for line in gates)


def staged(job: JobSettings, version: str) -> WorkPath:
    return job.work_dir / "runs" / "embeddings" / version / "embeddings"


def staged_vectors(run_dir: WorkPath) -> tuple[list[str], np.ndarray]:
    """(ids, vectors) of the committed parts only: a retried write's orphan part would count twice."""
    table = committed_dataset(run_dir).to_table(columns=["id", EMBEDDING])
    return [str(i) for i in table["id"].to_pylist()], embeddings_of(table)


def computed_ids(job: JobSettings, version: str) -> set[str]:
    """The ids in the parts that hold computed rows (their manifest entries count them): kept
    rows are staged in parts of their own."""
    run = staged(job, version)
    parts = json.loads((run / MANIFEST).read_text())["parts"]
    read = [pq.read_table((run / part["name"]).path, columns=["id"]) for part in parts if part["computed"]]
    return {str(i) for table in read for i in table["id"].to_pylist()}


def vectors_by_id(job: JobSettings, version: str) -> dict[str, np.ndarray]:
    ids, vectors = staged_vectors(staged(job, version))
    return dict(zip(ids, vectors, strict=True))


@pytest.mark.slow
def test_unchanged_rows_are_reused_and_changed_ones_recomputed(
    ray_local, settings, store, job, corpus, small_corpus: Path, tmp_path: Path, monkeypatch
) -> None:
    first = run_embed_job("v1", store, corpus, job, settings)
    # A part no completed write returned (a killed write task's): neither the cache nor a reader sees it.
    shutil.copy(committed_parts(staged(job, "v1"))[0], str(staged(job, "v1") / "part-orphan.parquet"))
    assert len(staged_vectors(staged(job, "v1"))[0]) == first.loaded

    table = pq.read_table(small_corpus).to_pylist()
    table[10]["text"] += " Now with a changed description."
    table[11]["text"] += " Now with a changed description."
    table[12]["text"] = table[13]["text"]  # two ids, one text: one content key
    changed = tmp_path / "changed.parquet"
    pq.write_table(pa.Table.from_pylist(table), changed)
    changed_corpus = corpus.model_copy(update={"path": str(changed)})
    digested: list[Digests] = []  # the corpus's bytes are read once for the night's and the validation's digests
    digests = InputFiles.digests
    monkeypatch.setattr(InputFiles, "digests", lambda files: digested.append(digests(files)) or digested[-1])
    second = run_embed_job("v2", store, changed_corpus, job, settings)
    assert len(digested) == 1
    assert (second.computed, second.reused, second.loaded) == (3, first.loaded - 3, first.loaded)
    assert computed_ids(job, "v2") == {table[i]["id"] for i in (10, 11, 12)}

    third = run_embed_job("v3", store, changed_corpus, job, settings)  # nothing changed since
    assert (third.computed, third.reused, third.loaded) == (0, first.loaded, first.loaded)
    assert computed_ids(job, "v3") == set()
    before, after = vectors_by_id(job, "v2"), vectors_by_id(job, "v3")
    assert before.keys() == after.keys() and all(np.array_equal(before[i], after[i]) for i in before)
    twins = after[table[12]["id"]] @ after[table[13]["id"]]
    assert twins > 0.98  # the same text; INT8's batch-dependent scale keeps it from exactly 1


@pytest.mark.slow
def test_a_night_that_moved_a_few_rows_copies_the_published_version_and_writes_only_those(
    ray_local, settings, store, job, corpus, small_corpus: Path, tmp_path: Path
) -> None:
    first = run_embed_job("v1", store, corpus, job, settings)
    assert first.load == {"mode": "whole", "reason": "nothing is published", "written": 200, "deleted": 0}
    store.publish("v1")

    rows = pq.read_table(small_corpus).to_pylist()[:200]  # the good ones
    rows[10]["text"] += " Now with a changed description."
    rows[11]["section"] = "moved"  # the payload alone
    gone = rows.pop(12)
    rows.append({**rows[0], "id": "new", "text": "A new row about the rings of Saturn."})
    moved = tmp_path / "moved.parquet"
    pq.write_table(pa.Table.from_pylist(rows), moved)
    moved_corpus = corpus.model_copy(update={"path": str(moved)})

    second = run_embed_job("v2", store, moved_corpus, job, settings)
    assert second.load == {"mode": "copy", "reason": "a copy of v1", "written": 3, "deleted": 1}
    # The moved payload keeps its vector: only the changed text and the new row are encoded.
    assert (second.computed, second.reused) == (2, 198)
    assert computed_ids(job, "v2") == {rows[10]["id"], rows[11]["id"], "new"}  # 11 passed through the actor
    assert second.loaded == store.count("v2") == 200
    vectors, old = vectors_by_id(job, "v2"), vectors_by_id(job, "v1")
    assert np.array_equal(vectors[rows[11]["id"]], old[rows[11]["id"]])  # its cached vector, as it was
    for changed in (rows[10]["id"], "new"):
        assert store.search(vectors[changed], k=1, version="v2")[0].id == changed
    assert store.search(vectors[rows[11]["id"]], k=1, version="v2", filter={"section": "moved"})[0].id == rows[11]["id"]
    assert gone["id"] not in {h.id for h in store.search(old[gone["id"]], k=10, version="v2")}
    assert store.search(old[rows[10]["id"]], k=1, version="v1")[0].id == rows[10]["id"]  # v1 as it was

    store.publish("v2")
    third = run_embed_job("v3", store, moved_corpus, job, settings, quantization="int8")
    assert third.load["mode"] == "whole"
    assert third.load["reason"] == "the published version v2 differs in quantization"


@pytest.mark.slow
def test_a_new_payload_column_keeps_every_vector(ray_local, settings, store, job, corpus, small_corpus: Path, tmp_path: Path) -> None:
    """Every row's payload moved, no text did: each row is joined to its cached vector, none encoded."""
    first = run_embed_job("v1", store, corpus, job, settings)
    table = pq.read_table(small_corpus)
    widened = tmp_path / "widened.parquet"
    pq.write_table(table.append_column("lang", pa.array(["en"] * table.num_rows)), widened)
    second = run_embed_job("v2", store, corpus.model_copy(update={"path": str(widened)}), job, settings)
    assert (second.computed, second.reused) == (0, first.loaded)
    before, after = vectors_by_id(job, "v1"), vectors_by_id(job, "v2")
    assert before.keys() == after.keys() and all(np.array_equal(before[i], after[i]) for i in before)


@pytest.mark.slow
def test_a_night_over_the_same_corpus_and_settings_keeps_the_published_run_without_reading_a_row(
    ray_local, settings, store, job, corpus
) -> None:
    first = run_embed_job("v1", store, corpus, job, settings)
    store.publish("v1")

    second = run_embed_job("v2", store, corpus, job, settings)
    assert second.unchanged_from == "v1"
    assert set(second.seconds) == {"digest", "copy", "load"}  # no validation, engine or inference
    assert (second.rows, second.rejects, second.computed, second.reused, second.loaded) == (204, 4, 0, 200, 200)
    assert second.engine == first.engine
    assert pq.read_table(second.rejects_path).num_rows == 4
    # Nothing moved, so no row of either run was read to compare them.
    assert second.load == {"mode": "copy", "reason": "a copy of v1, no row moved", "written": 0, "deleted": 0}
    before, after = vectors_by_id(job, "v1"), vectors_by_id(job, "v2")
    assert before.keys() == after.keys() and all(np.array_equal(before[i], after[i]) for i in before)

    store.publish("v2")  # the copy carries the night on
    assert run_embed_job("v3", store, corpus, job, settings).unchanged_from == "v2"
    store.publish("v3")
    stricter = corpus.model_copy(update={"max_reject_ratio": 0.04})  # how the input is read moved
    fourth = run_embed_job("v4", store, stricter, job, settings)
    assert fourth.unchanged_from is None and "validate" in fourth.seconds
    assert (fourth.computed, fourth.reused) == (0, 200)


def test_actors_only_encode_and_never_load_a_cache() -> None:
    """The job hands an actor the rows with their cached vectors where they have one: an actor
    is handed no cache to load (its engine, and the counter of rows done for the progress line)."""
    assert list(inspect.signature(EmbedActor).parameters) == ["engine", "counter"]


def test_the_engines_builders_exit_after_one_task() -> None:
    """The workers that build and gate an engine (its ONNX session; on a cold cache PyTorch's FP32
    reference; for labels the head too) exit after it: reused, they carried those pages into the
    read and write tasks that ran in them next (by hand at 100,000 rows: tag_rejects' own USS 664
    MB, 255 MB with them exiting). Ray's task state API, which would show the worker's pid, needs
    the dashboard, which the tests' Ray does not start."""
    assert prepare_engine._default_options.get("max_calls") == 1
    assert prepare_labeler._default_options.get("max_calls") == 1


def test_too_many_rejects_fail_before_inference(
    ray_local, settings, store, job, corpus, tmp_path: Path
) -> None:
    strict = corpus.model_copy(update={"max_reject_ratio": 0.01})
    with pytest.raises(RejectRatioExceededError, match=r"4 of 204 rows rejected, over max_reject_ratio=0.01"):
        run_embed_job("v1", store, strict, job, settings)
    assert not (tmp_path / "work" / "runs" / "embeddings" / "v1" / "embeddings").exists()
    assert store.versions() == []


@pytest.mark.slow
def test_every_way_a_row_can_be_bad_is_a_reject_with_its_bytes_kept(
    ray_local, settings, store, job, small_corpus: Path, tmp_path: Path
) -> None:
    """Undecodable bytes in the text, the id or a payload column, a null, an oversize or blank
    text: each row is quarantined with its reason and its exact bytes; the rest is embedded. The
    text column is binary, as some writers produce it: valid UTF-8 there is a text like any other."""
    good = pq.read_table(small_corpus).to_pylist()[:60]
    columns = {name: [r[name] for r in good] for name in ("id", "title")}
    texts = [r["text"].encode() for r in good]
    bad = [
        ("bad-text", b"caf\xe9 au lait", "t"),
        ("bad-title", b"a fine text", "caf\xe9"),
        ("null-text", None, "t"),
        ("oversize", b"x" * 3000, "t"),
        ("blank", b" \n ", "t"),
    ]
    ids = [*(i.encode() for i in columns["id"]), *(b[0].encode() for b in bad), b"\xff\xfeid"]
    titles = [*(t.encode() for t in columns["title"]), *(b[2].encode("latin-1") for b in bad), b"t"]
    table = pa.table(
        {
            "id": pa.array(ids, pa.binary()).view(pa.string()),
            "text": pa.array([*texts, *(b[1] for b in bad), b"a text with a bad id"], pa.binary()),
            "title": pa.array(titles, pa.binary()).view(pa.string()),
        }
    )
    path = tmp_path / "bad.parquet"
    pq.write_table(table, path)
    corpus = CorpusInput(path=str(path), max_reject_ratio=0.1, max_text_bytes=2000)

    report = run_embed_job("v1", store, corpus, job, settings)

    assert (report.rows, report.rejects, report.loaded) == (66, 6, 60)
    rejects = pq.read_table(report.rejects_path)
    assert rejects.schema.field("id").type == pa.binary()  # it holds a row of invalid UTF-8
    assert (
        rejects.schema.field("text").type == pa.binary() and rejects.schema.field("title").type == pa.binary()
    )
    rejects = {r["id"]: r for r in rejects.to_pylist()}
    assert {i: r["reject_reason"] for i, r in rejects.items()} == {
        b"bad-text": "text is not valid UTF-8 (byte 3)",
        b"bad-title": "title is not valid UTF-8 (byte 3)",
        b"null-text": "text is null",
        b"oversize": "text is 3000 bytes, over max_text_bytes=2000",
        b"blank": "text is empty",
        b"\xff\xfeid": "id is not valid UTF-8 (byte 0)",
    }
    assert rejects[b"bad-text"]["text"] == b"caf\xe9 au lait" and rejects[b"bad-title"]["title"] == b"caf\xe9"
    assert store.count("v1") == 60
