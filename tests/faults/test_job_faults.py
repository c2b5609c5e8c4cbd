"""Faults in real processes while a run publishes: its Redis killed mid-write, the flow process
killed mid-embedding, two runs started at once. Nothing half-written is ever served, the next run
succeeds, and garbage collection leaves no orphan keys or directories."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis

from precompute.demo_data import DEMO_CORPUS
from precompute.flows.nightly import nightly
from precompute.stores.errors import VersionNotFoundError
from precompute.stores.key_value.server import redis_server
from precompute.stores.key_value.settings import RedisSettings, output_keys
from precompute.stores.key_value.store import KeyValueStore
from precompute.stores.vectors import open_vector_store
from precompute.stores.vectors.settings import VectorStoreSettings
from tests.waiting import wait_for

pytestmark = pytest.mark.slow  # seconds to minutes each: left out of `pytest -m "not slow"`

LABELS = """
[outputs.labels]
kind = "labels"
input = {{ path = "{corpus}", label = "section", max_reject_ratio = 0.05 }}
train_texts = 400
fine_tune_seconds = 0
engine = {{ gate_texts = 16, calibration_texts = 16 }}
"""

PAUSE_MS = 500
"""How long Redis holds writes while the killer looks (released at once when it does not kill);
a killer that died mid-look frees the run after this."""

EMBEDDINGS = """
[outputs.docs]
kind = "embeddings"
input = {{ path = "{corpus}", max_reject_ratio = 0.05 }}
engine = {{ gate_texts = 64, calibration_texts = 32 }}
"""


def environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, settings, pipeline: str, **env: str) -> None:
    path = tmp_path / "precompute.toml"
    path.write_text(pipeline)
    for name, value in {
        "PRECOMPUTE_PIPELINE": str(path),
        "PRECOMPUTE_JOB_WORK_DIR": str(tmp_path / "work"),
        "PRECOMPUTE_QDRANT_PATH": str(tmp_path / "qdrant"),
        "PRECOMPUTE_ENGINE_CACHE_DIR": str(settings.machine.cache_dir),
        "PRECOMPUTE_ENGINE_GATE_TEXTS": str(settings.policy.gate_texts),
        "PRECOMPUTE_ENGINE_CALIBRATION_TEXTS": str(settings.policy.calibration_texts),
        **env,
    }.items():
        monkeypatch.setenv(name, value)


def orphan_keys(client: redis.Redis, settings: RedisSettings, output: str) -> list[str]:
    """Keys of the output that belong to no registered version, nor a base a registered overlay
    holds, nor its bookkeeping."""
    keys = output_keys(settings, output)
    registered = {v.decode() for v in [*client.hkeys(keys.registry), *client.hvals(keys.bases)]}
    bookkeeping = {keys.pointer, keys.registry, keys.published, keys.dropping, keys.bases}
    orphans = []
    for key in client.scan_iter(match=f"*{settings.prefix}:{output}*", count=1000):
        name = key.decode()
        if name not in bookkeeping and name.split(":")[2] not in registered:
            orphans.append(name)
    return orphans


@contextlib.contextmanager
def redis_killed_when(
    url: str, ready: Callable[[redis.Redis], bool], restart: Callable[[], object]
) -> Iterator[tuple[list[str | None], threading.Event]]:
    """SIGKILL the redis-server at `url` the moment `ready(client)` holds, and `restart` it a second
    later, while a watcher records every value of the labels pointer. `ready` is checked while the
    server holds every write (CLIENT PAUSE WRITE): the run cannot move past the state checked
    before the kill, however slow or fast this machine is. Yields (pointers seen, killed)."""
    client, reader = redis.Redis.from_url(url), redis.Redis.from_url(url, socket_timeout=1)
    pointer = output_keys(RedisSettings(), "labels").pointer
    seen: list[str | None] = []
    killed, stop = threading.Event(), threading.Event()

    def kill() -> None:
        while not stop.is_set():
            with contextlib.suppress(redis.RedisError):
                client.client_pause(PAUSE_MS, all=False)  # all=False: writes wait, reads go on
                if ready(client):
                    os.kill(client.info()["process_id"], signal.SIGKILL)
                    killed.set()
                    time.sleep(1)
                    restart()
                    return
                client.client_unpause()
            time.sleep(0.001)

    def watch() -> None:
        while not stop.is_set():
            with contextlib.suppress(redis.RedisError):
                value = reader.get(pointer)
                seen.append(value.decode() if value else None)
            time.sleep(0.01)

    threads = [threading.Thread(target=kill), threading.Thread(target=watch)]
    for thread in threads:
        thread.start()
    try:
        yield seen, killed
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
    assert killed.is_set(), "the run finished before Redis could be killed"


def rewrite_every_text(corpus: Path) -> None:
    """The same rows with every valid text changed, so that the next night labels and writes them all
    (the blank text stays blank: still a reject)."""
    table = pq.read_table(corpus)
    texts = [text if text is None or not text.strip() else f"{text} (revised)" for text in table["text"].to_pylist()]
    pq.write_table(table.set_column(table.schema.get_field_index("text"), "text", pa.array(texts)), corpus)


@pytest.mark.parametrize("persistent", [True, False], ids=["persistent", "not-persistent"])
def test_redis_killed_mid_publish_then_back(
    prefect_api,
    ray_local,
    settings,
    small_corpus: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    persistent: bool,
) -> None:
    corpus = tmp_path / "corpus.parquet"
    pq.write_table(pq.read_table(small_corpus), corpus)
    with contextlib.ExitStack() as servers:
        url = servers.enter_context(redis_server(tmp_path / "redis", persistent=persistent))
        environment(
            monkeypatch,
            tmp_path,
            settings,
            LABELS.format(corpus=corpus),
            PRECOMPUTE_REDIS_URL=url,
            PRECOMPUTE_REDIS_PREFIX="fault",
            PRECOMPUTE_REDIS_WRITE_BATCH="8",  # 25 write tasks: the kill lands between two
        )
        store_settings = RedisSettings()
        keys = output_keys(store_settings, "labels")
        old = nightly()["outputs"]["labels"]["version"]
        rewrite_every_text(corpus)  # every record written again: an unchanged night is one COPY round trip

        def mid_write(client: redis.Redis) -> bool:
            """The new version has records and is not published yet."""
            new = [v.decode() for v in client.hkeys(keys.registry) if v.decode() != old]
            return bool(new) and client.get(keys.pointer) != new[0].encode() and bool(
                next(client.scan_iter(match=f"fault:labels:{new[0]}:*", count=1000), None)
            )

        def restart() -> None:
            servers.enter_context(redis_server(tmp_path / "redis", port=urlparse(url).port, persistent=persistent))

        with redis_killed_when(url, mid_write, restart) as (seen, _):
            report = nightly()  # the step retries once Redis is back
        labels = report["outputs"]["labels"]
        assert labels["published"] and labels["items"] == labels["written"] == 200
        new = labels["version"]
        with KeyValueStore(store_settings) as store:
            assert store.current("labels") == new and store.versions("labels")[-1].rows == 200
            if persistent:  # the old version was served until the flip, and is still a rollback target
                assert set(seen) == {old, new} and seen.index(new) > 0
                assert [v.name for v in store.versions("labels")] == [old, new]
            else:  # Redis came back empty: nothing was served until the retry published
                assert set(seen) <= {old, None, new} and seen[-1] == new
                assert [v.name for v in store.versions("labels")] == [new]
            with pytest.raises(VersionNotFoundError):
                store.rollback("labels", to="20260101T000000Z-gone00")  # collected or never made
            assert store.current("labels") == new
        assert orphan_keys(redis.Redis.from_url(url), store_settings, "labels") == []
        runs = tmp_path / "work" / "runs" / "labels"
        assert sorted(p.name for p in runs.iterdir()) == sorted(
            v for v in {old, new} if persistent or v == new
        )


def test_redis_killed_after_the_flip_publishes_once_and_collects_later(
    prefect_api, ray_local, settings, small_corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A version is published once its pointer flipped: an outage during the garbage collection
    that follows retries the collection, not the labelling into yet another version."""
    corpus = tmp_path / "corpus.parquet"
    pq.write_table(pq.read_table(small_corpus), corpus)
    with contextlib.ExitStack() as servers:
        url = servers.enter_context(redis_server(tmp_path / "redis", persistent=True))
        pipeline = LABELS.format(corpus=corpus) + "keep_versions = 0\n"  # the flip dooms the old one
        environment(monkeypatch, tmp_path, settings, pipeline, PRECOMPUTE_REDIS_URL=url, PRECOMPUTE_REDIS_PREFIX="fault")
        store_settings = RedisSettings()
        keys = output_keys(store_settings, "labels")
        old = nightly()["outputs"]["labels"]["version"]
        rewrite_every_text(corpus)  # a whole new version, not an overlay that would hold the old one

        def flipped(client: redis.Redis) -> bool:
            return client.get(keys.pointer) not in (None, old.encode())

        def restart() -> None:
            servers.enter_context(redis_server(tmp_path / "redis", port=urlparse(url).port, persistent=True))

        with redis_killed_when(url, flipped, restart) as (seen, _):
            report = nightly()
        labels = report["outputs"]["labels"]
        new = labels["version"]
        assert labels["published"] and labels["deleted_versions"] == [old]
        assert set(seen) == {old, new}, "the labelling ran again into another version"
        with KeyValueStore(store_settings) as store:
            assert [(v.name, v.is_current) for v in store.versions("labels")] == [(new, True)]
        assert orphan_keys(redis.Redis.from_url(url), store_settings, "labels") == []
        assert [p.name for p in (tmp_path / "work" / "runs" / "labels").iterdir()] == [new]


def precompute_run(env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "precompute", "run"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # the run and every process it starts (Ray) share a group to kill
    )


def test_flow_killed_mid_embedding_then_rerun(
    prefect_api: str, settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, redis_url: str
) -> None:
    corpus = tmp_path / "corpus.parquet"
    pq.write_table(pq.read_table(DEMO_CORPUS).take(list(range(0, 5000, 5))), corpus)  # 1,000 rows
    environment(
        monkeypatch,
        tmp_path,
        settings,
        EMBEDDINGS.format(corpus=corpus),
        PRECOMPUTE_REDIS_URL=redis_url,
        PRECOMPUTE_JOB_ROWS_PER_BATCH="32",  # 32 parts: the kill lands after the first, mid-job
        PRECOMPUTE_JOB_DRIVER_ROWS="0",  # the actor pool streams the parts (1,000 rows: else the driver)
        PREFECT_API_URL=prefect_api,
    )
    runs = tmp_path / "work" / "runs" / "docs"
    killed = precompute_run(dict(os.environ))
    def embedding() -> bool:
        assert killed.poll() is None, "the run ended before it embedded"
        return any(runs.glob("*/embeddings/part-*.parquet"))

    wait_for(embedding, "the run's first embedded part", ceiling_s=600)
    os.killpg(killed.pid, signal.SIGKILL)
    killed.communicate()
    (dead,) = [p.name for p in runs.iterdir()]

    rerun = precompute_run(dict(os.environ))
    output = rerun.communicate(timeout=900)[0].decode()
    assert rerun.returncode == 0, output
    assert re.search(r"^docs embed: 1,000 rows in [\d.]+ s", output, re.MULTILINE), output  # its progress
    with open_vector_store(VectorStoreSettings(), "docs") as store:
        new = store.current()
        assert new > dead and store.versions() == [new] and store.count(new) == 1000
    assert re.search(rf"docs .* {new} .* 1,000 ", output), output  # the summary table's row
    assert [p.name for p in runs.iterdir()] == [new]  # the killed run's folder is collected
    assert pq.read_table(next((runs / new / "embeddings").glob("part-*.parquet"))).num_rows > 0

    # A version its checks refuse is never published: a graph searched with one candidate
    # (hnsw_ef 1, which the check may not raise, and no exact scan) misses some of the exact
    # top 10 that min_recall 1.0 demands.
    refusing = {
        **os.environ,
        "PRECOMPUTE_QDRANT_HNSW_EF": "1",
        "PRECOMPUTE_QDRANT_MAX_HNSW_EF": "1",
        "PRECOMPUTE_QDRANT_EXACT_SCAN": "false",
        "PRECOMPUTE_QDRANT_FULL_SCAN_THRESHOLD_KB": "1",
        "PRECOMPUTE_OUTPUTS__DOCS__MIN_RECALL": "1.0",
    }
    refused = precompute_run(refusing)
    output = refused.communicate(timeout=900)[0].decode()
    assert refused.returncode == 1, output
    refusal = (
        r"^error: docs failed at check: IndexCheckError: version \S+: recall@10 0\.\d+ < min_recall=1\.0 "
        r"at hnsw_ef 1 \(exact scan off\); the next build makes a denser graph \(m=32, ef_construct=200\)$"
    )
    assert re.search(refusal, output, re.MULTILINE), output
    with open_vector_store(VectorStoreSettings(), "docs") as store:
        assert store.current() == new and store.count(new) == 1000  # still served
        assert len(store.search(np.full(384, 0.05, np.float32), 3)) == 3  # and answers from it


def test_two_runs_started_at_once(
    prefect_api: str, settings, small_corpus: Path, tmp_path: Path, monkeypatch, redis_url
) -> None:
    environment(
        monkeypatch,
        tmp_path,
        settings,
        EMBEDDINGS.replace("64", "16").replace("32", "16").format(corpus=small_corpus),  # not in the path
        PRECOMPUTE_REDIS_URL=redis_url,
        PREFECT_API_URL=prefect_api,
    )
    first, second = precompute_run(dict(os.environ)), precompute_run(dict(os.environ))
    outputs = [p.communicate(timeout=900)[0].decode() for p in (first, second)]
    codes = sorted(p.returncode for p in (first, second))
    assert codes == [0, 1], outputs
    refused = outputs[[first.returncode, second.returncode].index(1)]
    assert "another run is in progress" in refused and len(refused.strip().splitlines()) == 1, refused
    with open_vector_store(VectorStoreSettings(), "docs") as store:
        (version,) = store.versions()
        assert store.current() == version and store.count(version) == 200
