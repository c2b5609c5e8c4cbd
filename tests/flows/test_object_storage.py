"""A warehouse export on object storage, end to end: hive-partitioned Parquet on an S3-compatible
server (moto, a separate process over HTTP), integer ids, dictionary-encoded text and labels,
Arrow timestamps. The nightly flow reads the partitions `where` names, publishes all three
outputs with its work directory in the same bucket, and the service answers the integer ids as
integers; the next night reads its caches from there."""

from __future__ import annotations

import datetime
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
import ray
from starlette.testclient import TestClient

from precompute.flows.nightly import nightly
from precompute.jobs.ray_session import start_local, stop_local
from precompute.lookup.settings import ServiceSettings
from precompute.pipeline import load_pipeline
from precompute.stores.key_value.server import free_port
from tests.conftest import LOCAL_RAY
from tests.flows.conftest import CONTENT_RECS
from tests.lookup.apps import app_of
from tests.waiting import wait_for

pytestmark = pytest.mark.slow  # seconds to minutes each: left out of `pytest -m "not slow"`

BUCKET = "warehouse"
DAYS = ("2026-11-25", "2026-11-26")
"""The partitions the pipeline file reads; a third day beside them holds only broken rows."""
CREDENTIALS = ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[pafs.S3FileSystem]:
    """moto's S3 server on a free port, found through AWS_ENDPOINT_URL as the AWS SDKs find it;
    credentials from the environment, as a user's would be."""
    port = free_port()
    log = (tmp_path / "moto.log").open("wb")
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=log
    )
    try:
        endpoint = f"http://127.0.0.1:{port}"
        wait_for(lambda: _answers(endpoint) or server.poll() is not None, "moto's S3 server")
        assert server.poll() is None, (tmp_path / "moto.log").read_text()[-2000:]
        for name, value in zip(CREDENTIALS, (endpoint, "test", "test", "us-east-1"), strict=True):
            monkeypatch.setenv(name, value)
        fs = pafs.S3FileSystem(endpoint_override=endpoint, allow_bucket_creation=True)
        fs.create_dir(BUCKET)
        yield fs
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


@pytest.fixture
def ray_with_credentials(s3) -> Iterator[None]:
    """A local Ray whose workers hold the credentials, from their environment as a cluster's
    nodes would (the run's shared Ray started before `s3` set them: anonymous writes, which moto
    stores with their chunk framing). The shared one is started again after, without them."""
    had_local = ray.is_initialized()
    stop_local()
    start_local(**LOCAL_RAY)
    try:
        yield
    finally:
        stop_local()
        if had_local:
            with pytest.MonkeyPatch.context() as env:
                for name in CREDENTIALS:
                    env.delenv(name, raising=False)
                start_local(**LOCAL_RAY)


def _answers(endpoint: str) -> bool:
    try:
        return httpx.get(endpoint, timeout=1).status_code < 500
    except httpx.TransportError:
        return False


def export(small_corpus: Path, fs: pafs.S3FileSystem) -> dict[str, int]:
    """The small corpus as a warehouse would export it: integer ids (the rejected rows keep their
    faults: a null id, a duplicated one, an empty text), dictionary text and labels, one folder
    per day; interactions of integer users with Arrow timestamps. Returns the ids by package name."""
    rows = pq.read_table(small_corpus).to_pylist()
    numbers = {name: i + 1000 for i, name in enumerate(dict.fromkeys(r["id"] for r in rows if r["id"]))}
    users = {name: i + 1 for i, name in enumerate(sorted({r["maintainer"] for r in rows}))}
    corpus = pa.table(
        {
            "id": pa.array([numbers.get(r["id"]) for r in rows], pa.int64()),
            "text": pa.array([r["text"] for r in rows]).dictionary_encode(),
            "title": pa.array([r["title"] for r in rows], pa.large_string()),
            "section": pa.array([r["section"] for r in rows]).dictionary_encode(),
        }
    )
    half = corpus.num_rows // 2
    for day, part in zip(DAYS, (corpus.slice(0, half), corpus.slice(half)), strict=True):
        pq.write_table(part, f"{BUCKET}/corpus/dt={day}/part-0.parquet", filesystem=fs)
    broken = corpus.slice(0, 50).set_column(1, "text", pa.nulls(50, pa.string()))
    pq.write_table(broken, f"{BUCKET}/corpus/dt=2026-11-24/part-0.parquet", filesystem=fs)
    start = datetime.datetime(2026, 11, 1, tzinfo=datetime.UTC)
    picked = [r for r in rows if r["id"] not in (None, "dup")]
    interactions = pa.table(
        {
            "user_id": pa.array([users[r["maintainer"]] for r in picked], pa.int32()),
            "item_id": pa.array([numbers[r["id"]] for r in picked], pa.int64()),
            "timestamp": pa.array(
                [start + datetime.timedelta(minutes=i) for i in range(len(picked))], pa.timestamp("ms", tz="UTC")
            ),
        }
    )
    pq.write_table(interactions, f"{BUCKET}/interactions/dt={DAYS[1]}/part-0.parquet", filesystem=fs)
    return numbers


def test_a_partitioned_export_on_object_storage_publishes_three_outputs_answered_by_integer_ids(
    prefect_api, ray_with_credentials, settings, small_corpus: Path, redis_url: str, s3, tmp_path: Path, monkeypatch
) -> None:
    numbers = export(small_corpus, s3)
    where = f'where = {{ dt = ["{DAYS[0]}", "{DAYS[1]}"] }}'
    body = CONTENT_RECS.format(corpus=f"s3://{BUCKET}/corpus", interactions=f"s3://{BUCKET}/interactions")
    pipeline = tmp_path / "precompute.toml"
    pipeline.write_text(body.replace("max_reject_ratio = 0.05 }", f"max_reject_ratio = 0.05, {where} }}"))
    for name, value in {
        "PRECOMPUTE_PIPELINE": str(pipeline),
        "PRECOMPUTE_REDIS_URL": redis_url,
        "PRECOMPUTE_REDIS_PREFIX": f"s3{tmp_path.name}",
        "PRECOMPUTE_JOB_WORK_DIR": f"s3://{BUCKET}/precompute",
        "PRECOMPUTE_QDRANT_PATH": str(tmp_path / "qdrant"),
        "PRECOMPUTE_ENGINE_CACHE_DIR": str(settings.machine.cache_dir),
    }.items():
        monkeypatch.setenv(name, value)

    report = nightly()
    assert report["failed"] == {}
    embeddings, labels, recs = (report["outputs"][o] for o in ("embeddings", "labels", "recs"))
    # 204 rows of the two days read, the broken day's 50 not: the same 4 rejects as from a local file.
    assert (embeddings["rows"], embeddings["rejects"]) == (204, 4)
    assert (labels["items"], labels["rejects"]) == (200, 4)
    assert recs["users"] > 10
    assert_work_dir_in_the_bucket(s3, report)

    item = numbers[pq.read_table(small_corpus)["id"][10].as_py()]
    app = app_of(ServiceSettings(warmup_queries=1), settings, pipeline=load_pipeline(pipeline))
    with TestClient(app) as client:
        hits = client.post("/v1/search", json={"query": "a text editor", "k": 3}).json()["hits"]
        assert hits and all(isinstance(hit["id"], int) for hit in hits)
        labelled = client.get(f"/v1/labels/{item}").json()
        assert labelled["id"] == item and labelled["labels"]
        user = 1
        listed = client.get(f"/v1/recs/{user}").json()
        assert listed["id"] == user and len(listed["items"]) == recs["k"]  # an empty list would pass the all() below
        assert all(isinstance(entry["id"], int) for entry in listed["items"])
        batch = client.post("/v1/recs:batchGet", json={"ids": [user, "2", 99999]}).json()
        assert [r["id"] for r in batch["results"]] == [1, 2] and batch["missing"] == [99999]

    # The next night reads what the first left in the bucket: every embedding and label from the
    # caches, the recs version copied whole (its interactions, items and settings unchanged).
    again = nightly()
    assert again["failed"] == {}
    assert (again["outputs"]["embeddings"]["reused"], again["outputs"]["embeddings"]["computed"]) == (200, 0)
    assert (again["outputs"]["labels"]["reused"], again["outputs"]["labels"]["computed"]) == (200, 0)
    assert again["outputs"]["recs"]["mode"] == "unchanged"
    assert again["outputs"]["recs"]["rescored"] == 0


def assert_work_dir_in_the_bucket(fs: pafs.S3FileSystem, report: dict) -> None:
    """Reports, metrics, rejects, committed parts, cache pointers and recs state are objects in
    the bucket, under the work directory's prefix."""
    work = f"{BUCKET}/precompute"
    objects = {f.path.removeprefix(work + "/") for f in fs.get_file_info(pafs.FileSelector(work, recursive=True))}
    versions = {name: report["outputs"][name]["version"] for name in ("embeddings", "labels", "recs")}
    assert {
        f"reports/{report['run']}.json",
        f"reports/{report['run']}.html",
        "metrics/nightly.prom",
        f"runs/embeddings/{versions['embeddings']}/rejects.parquet",
        f"runs/embeddings/{versions['embeddings']}/embeddings/manifest.json",
        f"runs/labels/{versions['labels']}/labels/manifest.json",
        f"runs/recs/{versions['recs']}/recs_state/model.json",
        "cache/embeddings/CURRENT",
        "cache/labels/CURRENT",
    } <= objects
    rejects = pq.read_table(f"{work}/runs/embeddings/{versions['embeddings']}/rejects.parquet", filesystem=fs)
    assert rejects.num_rows == 4
    assert not [name for name in objects if name.endswith(".tmp")]
