"""`precompute status` and `precompute rollback` on the real stores: an edge shard directory and redis-server."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from precompute.cli.main import app
from precompute.stores.key_value.records import encode_ranked
from precompute.stores.key_value.settings import RedisSettings
from precompute.stores.key_value.store import KeyValueStore
from precompute.stores.vectors import open_vector_store
from precompute.stores.vectors.settings import VectorStoreSettings

V1, V2 = "20261121T010000Z-aaaaaa", "20261122T010000Z-bbbbbb"


@pytest.fixture
def stores(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[VectorStoreSettings, RedisSettings]:
    """Two published versions of each output (V2 served); the CLI finds them by PRECOMPUTE_* variables."""
    monkeypatch.setenv("PRECOMPUTE_QDRANT_PATH", str(tmp_path / "qdrant"))
    monkeypatch.setenv("PRECOMPUTE_REDIS_URL", redis_url)
    monkeypatch.setenv("PRECOMPUTE_REDIS_PREFIX", f"t{uuid.uuid4().hex[:8]}")
    vectors, redis = VectorStoreSettings(), RedisSettings()
    rng = np.random.default_rng(0)
    with open_vector_store(vectors, "corpus") as store:  # the demo pipeline's collection
        for points, version in ((3, V1), (4, V2)):
            store.create_version(version, 8)
            store.upsert(
                version, [f"i{n}" for n in range(points)], rng.normal(size=(points, 8)), [{}] * points
            )
            store.finalize(version)
            store.publish(version)
    with KeyValueStore(redis) as store:
        for output, records in (("labels", 5), ("recs", 7)):
            for version in (V1, V2):
                ids = [f"{output}-{n}" for n in range(records)]
                store.create_version(output, version, records, {"vocabulary": ["x"]})
                store.write(
                    output, version, ids, encode_ranked(np.zeros((records, 1)), np.ones((records, 1)))
                )
                store.publish(output, version)
    return vectors, redis


def invoke(*args: str) -> str:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def served(statuses: list[dict]) -> dict[str, str | None]:
    return {s["output"]: s["current"] for s in statuses}


def test_status_shows_each_outputs_versions_and_counts(stores) -> None:
    statuses = json.loads(invoke("status", "--json"))
    assert served(statuses) == {"embeddings": V2, "labels": V2, "recs": V2, "related": None}
    counts = {s["output"]: [(v["name"], v["count"], v["current"]) for v in s["versions"]] for s in statuses}
    assert counts == {
        "embeddings": [(V1, 3, False), (V2, 4, True)],
        "labels": [(V1, 5, False), (V2, 5, True)],
        "recs": [(V1, 7, False), (V2, 7, True)],
        "related": [],  # nothing published: listed all the same
    }
    table = invoke("status")
    assert "labels (labels, redis: " in table and f"): serving {V2}" in table and f"* {V2}" in table


def test_rollback_moves_one_output_only(stores) -> None:
    assert invoke("rollback", "labels").strip() == f"labels: serving {V1}"
    assert served(json.loads(invoke("status", "--json"))) == {"embeddings": V2, "labels": V1, "recs": V2, "related": None}
    assert invoke("rollback", "embeddings").strip() == f"embeddings: serving {V1}"
    assert invoke("rollback", "labels", "--to", V2).strip() == f"labels: serving {V2}"
    assert served(json.loads(invoke("status", "--json"))) == {"embeddings": V1, "labels": V2, "recs": V2, "related": None}


def test_rollback_refuses_what_it_cannot_do(stores) -> None:
    bad_output = CliRunner().invoke(app, ["rollback", "ratings"])
    assert bad_output.exit_code == 2 and "'ratings' is not an output of" in bad_output.output
    unknown = CliRunner().invoke(app, ["rollback", "recs", "--to", "20260101T000000Z-nope00"])
    assert (
        unknown.exit_code == 1
        and "error: version '20260101T000000Z-nope00' of output 'recs' does not exist" in unknown.output
    )
    assert served(json.loads(invoke("status", "--json")))["recs"] == V2
