"""The nightly flow on a Ray cluster of separate node processes (a head and two workers, the
`ray_cluster` fixture), joined through the jobs' address settings, its sequence model trained
on both worker nodes; and a worker node killed while it embeds: the job finishes on the other,
and every row is staged and published once."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from precompute.demo_data import DEMO_CORPUS
from precompute.flows.nightly import nightly
from precompute.jobs.staging import committed_dataset
from precompute.jobs.text.content_cache import previous_run
from precompute.jobs.work_dir import WorkPath
from precompute.stores.key_value.settings import RedisSettings
from precompute.stores.key_value.store import KeyValueStore
from precompute.stores.vectors import open_vector_store
from precompute.stores.vectors.settings import VectorStoreSettings
from tests.flows.conftest import THREE_OUTPUTS

if TYPE_CHECKING:
    from ray.cluster_utils import Cluster

pytestmark = pytest.mark.slow

POOLS = ("EmbedActor", "LabelActor", "TopKActor")
"""The inference actor pools of the three jobs."""

SEQUENCE_RECS = (
    THREE_OUTPUTS
    + """model = "sequence"
content_weight = 0

[outputs.recs.sequence]
dim = 32
blocks = 1
history = 8
learning_rate = 0.01
batch = 16
max_epochs = 30
calibration_rows = 16
gate_users = 16
train_workers = 2  # Ray Train: a worker on each worker node
"""
)

EMBEDDINGS_ONLY = """
[outputs.docs]
kind = "embeddings"
input = {{ path = "{corpus}" }}
engine = {{ gate_texts = 16, calibration_texts = 16 }}
"""


@pytest.fixture
def environment(
    settings, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ray_cluster: Cluster
) -> Path:
    """Machine settings as in production, every job pointed at the cluster by its address setting."""
    env = {
        "PRECOMPUTE_JOB_RAY_ADDRESS": ray_cluster.address,
        "PRECOMPUTE_REDIS_URL": redis_url,
        "PRECOMPUTE_REDIS_PREFIX": f"multinode{tmp_path.name}",
        "PRECOMPUTE_JOB_WORK_DIR": str(tmp_path / "work"),
        "PRECOMPUTE_QDRANT_PATH": str(tmp_path / "qdrant"),
        "PRECOMPUTE_ENGINE_CACHE_DIR": str(settings.machine.cache_dir),
        "PRECOMPUTE_JOB_TOPK_DRIVER_USERS": "0",  # the top-k actors, not the driver, rank the few users
        "PRECOMPUTE_JOB_DRIVER_ROWS": "0",  # the actors, not the driver, embed and label the few rows
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return tmp_path


def use_pipeline(environment: Path, monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    path = environment / "precompute.toml"
    path.write_text(text)
    monkeypatch.setenv("PRECOMPUTE_PIPELINE", str(path))


def pool_actors(cluster: Cluster, pool: str, state: str | None = None) -> list[dict[str, Any]]:
    """The actors of an actor pool the cluster ran (dead ones included), read from its GCS.
    Ray Data names them after the pool's class: `MapWorker(MapBatches(EmbedActor))`."""
    actors = cluster.global_state.actor_table(None, actor_state_name=state).values()
    return [a for a in actors if f"MapBatches({pool})" in a["ActorClassName"]]


def cycle_walks(corpus: Path, path: Path, users: int = 200, steps: int = 10) -> Path:
    """Users walking the corpus's packages in one fixed cycle, a day a step: what follows a
    user's latest package is learnable from the order, and most-popular cannot know it."""
    ids = pq.read_table(corpus, columns=["id"])["id"].to_pylist()[:200]  # the valid rows
    rng = np.random.default_rng(0)
    rows = []
    for user in range(users):
        first = int(rng.integers(len(ids)))
        rows += [
            {"user_id": f"u{user}", "item_id": ids[(first + t) % len(ids)], "timestamp": 1_700_000_000 + 86_400 * t}
            for t in range(steps)
        ]
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_nightly_on_a_two_node_cluster_publishes_every_output(
    prefect_api,
    ray_cluster,
    environment: Path,
    small_corpus: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The recs are the sequence model's, trained by Ray Train's workers one on each worker node."""
    interactions = cycle_walks(small_corpus, tmp_path / "walks.parquet")
    use_pipeline(environment, monkeypatch, SEQUENCE_RECS.format(corpus=small_corpus, interactions=interactions))

    report = nightly()

    embeddings, labels, recs = (report["outputs"][o] for o in ("embeddings", "labels", "recs"))
    assert report["failed"] == {}
    assert (embeddings["rows"], embeddings["rejects"], embeddings["computed"]) == (204, 4, 200)
    assert embeddings["validation"]["count"] == 200
    assert (labels["items"], labels["rejects"]) == (200, 4)
    assert recs["users"] > 10 and recs["k"] == 100
    models = recs["validation"]["models"]
    assert models["published"]["ndcg"] > models["most_popular"]["ndcg"]
    training = recs["sequence"]["training"]
    assert (training["workers"], training["nodes"]) == (2, 2), training
    with open_vector_store(VectorStoreSettings(), "corpus") as store:
        assert store.current() == embeddings["version"] and store.count(store.current()) == 200
    with KeyValueStore(RedisSettings()) as store:
        assert store.current("labels") == labels["version"]
        assert store.current("recs") == recs["version"]
    # Each job's actor pool ran in the cluster, on worker nodes (the head has no CPUs to offer).
    workers = {node.node_id for node in ray_cluster.worker_nodes}
    for pool in POOLS:
        actors = pool_actors(ray_cluster, pool)
        assert actors and {a["Address"]["NodeID"] for a in actors} <= workers, (pool, actors)


def kill_the_embedding_node(cluster: Cluster, done: threading.Event, killed: dict[str, Any]) -> None:
    """SIGKILL every process (raylet, object store, workers) of the worker node whose embedding
    actor is up: it is ALIVE once its engine loaded, and then takes its first batches, so most
    of the corpus is still to embed."""
    while not done.wait(0.2):
        alive = {a["Address"]["NodeID"] for a in pool_actors(cluster, "EmbedActor", "ALIVE")}
        victims = [node for node in cluster.worker_nodes if node.node_id in alive]
        if victims:
            time.sleep(1)
            killed["node"] = victims[0].node_id
            cluster.remove_node(victims[0], allow_graceful=False)
            return


def test_a_worker_node_killed_mid_embedding_publishes_every_row_once(
    prefect_api,
    ray_cluster,
    environment: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    corpus = tmp_path / "corpus.parquet"
    pq.write_table(pq.read_table(DEMO_CORPUS).take(list(range(0, 5000, 6))), corpus)  # 834 rows
    use_pipeline(environment, monkeypatch, EMBEDDINGS_ONLY.format(corpus=corpus))
    monkeypatch.setenv("PRECOMPUTE_JOB_ROWS_PER_BATCH", "32")  # 27 batches: the kill lands mid-job
    runs = environment / "work" / "runs" / "docs"
    killed: dict[str, Any] = {}
    done = threading.Event()
    killer = threading.Thread(target=kill_the_embedding_node, args=(ray_cluster, done, killed))
    killer.start()
    try:
        report = nightly()
    finally:
        done.set()
        killer.join()

    docs = report["outputs"]["docs"]
    assert "node" in killed and killed["node"] not in {n.node_id for n in ray_cluster.worker_nodes}
    assert report["failed"] == {}
    valid = docs["rows"] - docs["rejects"]
    assert docs["rows"] == 834 and docs["computed"] == valid and docs["validation"]["count"] == valid
    assert [p.name for p in runs.iterdir()] == [docs["version"]]  # the job survived: no retried attempt
    run_dir = WorkPath.of(runs / docs["version"] / "embeddings")
    ids = committed_dataset(run_dir).to_table(columns=["id"])["id"].to_pylist()
    assert len(ids) == len(set(ids)) == valid
    cached = committed_dataset(previous_run(WorkPath.of(environment / "work" / "cache" / "docs"))).to_table(columns=["id"])
    assert sorted(cached["id"].to_pylist()) == sorted(ids)
    with open_vector_store(VectorStoreSettings(), "docs") as store:
        assert store.current() == docs["version"] and store.count(docs["version"]) == valid
    # The embedding actor was restarted on the surviving worker and finished the job there.
    survivor = {n.node_id for n in ray_cluster.worker_nodes}
    embedders = pool_actors(ray_cluster, "EmbedActor")
    assert any(a["NumRestarts"] >= 1 and a["Address"]["NodeID"] in survivor for a in embedders), embedders
