"""Related items and anonymous sessions (`/v1/related`, `/v1/recs:forItems`) on a real redis-server,
through the ASGI app, from versions written as a related output's night writes them."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from starlette.testclient import TestClient

from precompute.lookup.settings import ServiceSettings
from precompute.pipeline import load_pipeline
from precompute.stores.key_value.records import SESSION_DECAY, encode_ranked, merge_ranked
from precompute.stores.key_value.settings import RedisSettings
from precompute.stores.key_value.store import KeyValueStore
from precompute.stores.vectors.settings import VectorStoreSettings
from tests.lookup.apps import app_of
from tests.lookup.test_keys import redis_for_test

VERSION = "20261121T010000Z-aaaaaa"
ITEMS = [f"p{i:02}" for i in range(12)]
SCORES = [0.875, 0.5, 0.25]
TOKEN = "s3cret"
PIPELINE = """
[outputs.shelf]
kind = "related"
input = {{ path = "{data}" }}
k = 3

[outputs.again]
kind = "related"
input = {{ path = "{data}" }}
k = 3
seen = "include"
"""


def lists() -> list[list[int]]:
    """Item i's related items: the next three, round the catalogue."""
    return [[(i + j) % len(ITEMS) for j in (1, 2, 3)] for i in range(len(ITEMS))]


def publish(redis: RedisSettings, output: str, session_items: bool) -> None:
    values = encode_ranked(np.array(lists()), np.array([SCORES] * len(ITEMS)))
    with KeyValueStore(redis) as store:
        store.create_version(output, VERSION, len(ITEMS), {"vocabulary": ITEMS, "session_items": session_items})
        store.write(output, VERSION, ITEMS, values)
        store.publish(output, VERSION)


@pytest.fixture(scope="module")
def client(settings, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    folder = tmp_path_factory.mktemp("related")
    pq.write_table(pa.table({"user_id": ["u1"], "item_id": [ITEMS[0]]}), folder / "interactions.parquet")
    (folder / "precompute.toml").write_text(PIPELINE.format(data=folder / "interactions.parquet"))
    redis = redis_for_test(redis_url)
    publish(redis, "shelf", session_items=False)
    publish(redis, "again", session_items=False)  # seen = "include" in the file: allowed whatever the night chose
    stores = VectorStoreSettings(type="edge", path=folder / "qdrant")
    service = ServiceSettings(warmup_queries=1, auth_token=TOKEN)
    app = app_of(service, settings, stores, redis, pipeline=load_pipeline(folder / "precompute.toml"))
    with TestClient(app, headers={"Authorization": f"Bearer {TOKEN}"}) as client:
        yield client


def test_an_items_related_list_by_id_and_in_batches(client: TestClient) -> None:
    answer = client.get("/v1/related/p03")
    assert answer.status_code == 200, answer.text
    assert answer.json() == {
        "version": VERSION,
        "id": "p03",
        "items": [{"id": ITEMS[i], "score": s} for i, s in zip([4, 5, 6], SCORES, strict=True)],
    }
    assert client.get("/v1/related/again/p11?k=1").json()["items"] == [{"id": "p00", "score": 0.875}]
    batch = client.post("/v1/related:batchGet", json={"ids": ["p00", "nope"], "k": 2}).json()
    assert batch["results"] == [{"id": "p00", "items": [{"id": "p01", "score": 0.875}, {"id": "p02", "score": 0.5}]}]
    assert batch["missing"] == ["nope"]


def test_a_session_is_answered_from_its_items_lists_without_its_own_items(client: TestClient) -> None:
    """p01, p02, then an unknown id (no list): p01's list (p02 p03 p04) weighs SESSION_DECAY**2,
    p02's (p03 p04 p05) SESSION_DECAY; p02, the session's own, is left out."""
    answer = client.post("/v1/recs:forItems", json={"ids": ["p01", "p02", "unknown"]})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    d = SESSION_DECAY
    expected = {"p03": 0.5 * d**2 + 0.875 * d, "p04": 0.25 * d**2 + 0.5 * d, "p05": 0.25 * d}
    assert [item["id"] for item in body["items"]] == ["p03", "p04", "p05"]
    assert [item["score"] for item in body["items"]] == pytest.approx(list(expected.values()), rel=2e-3)
    assert body["missing"] == ["unknown"] and body["version"] == VERSION
    # seen = "include": the session's own p02 comes back, from p01's list.
    allowed = client.post("/v1/recs/again:forItems", json={"ids": ["p01", "p02"], "k": 3}).json()["items"]
    assert "p02" in [item["id"] for item in allowed]


def test_merge_ranked_weighs_the_latest_item_most_and_skips_items_without_a_list() -> None:
    values = encode_ranked(np.array([[1, 2], [2, 3]]), np.array([[1.0, 0.5], [1.0, 0.5]]))
    indices, scores = merge_ranked([values[0], None, values[1]], k=5, exclude=np.array([3]))
    # ages: values[1] is the latest (weight 1), values[0] two back (SESSION_DECAY**2).
    assert indices.tolist() == [2, 1]
    np.testing.assert_allclose(scores, [1.0 + 0.5 * SESSION_DECAY**2, SESSION_DECAY**2], rtol=1e-3)
    assert merge_ranked([None], k=3)[0].tolist() == []


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"ids": []}, "ids"),
        ({"ids": [""]}, "ids.0"),
        ({"ids": ["p01"], "k": 4}, "k"),
        ({"ids": ["p01"], "k": 0}, "k"),
        ({"items": ["p01"]}, "ids"),
        ({"ids": "p01"}, "ids"),
    ],
)
def test_a_bad_session_is_a_422_naming_its_field(client: TestClient, body: dict, field: str) -> None:
    answer = client.post("/v1/recs:forItems", json=body)
    assert answer.status_code == 422 and answer.json()["field"] == field, answer.text
    assert "\n" not in answer.json()["error"]


def test_every_related_route_asks_for_the_token(client: TestClient) -> None:
    for method, path, body in [
        ("GET", "/v1/related/p01", None),
        ("POST", "/v1/related:batchGet", {"ids": ["p01"]}),
        ("POST", "/v1/recs:forItems", {"ids": ["p01"]}),
        ("POST", "/v1/recs/shelf:forItems", {"ids": ["p01"]}),
    ]:
        refused = client.request(method, path, json=body, headers={"Authorization": "bearer nope"})
        assert refused.status_code == 401 and refused.headers["www-authenticate"].startswith("Bearer"), path
        assert client.request(method, path, json=body).status_code == 200, path
    assert client.get("/openapi.json").json()["paths"].keys() >= {
        "/v1/related/{id}",
        "/v1/related:batchGet",
        "/v1/recs:forItems",
        "/v1/recs/shelf:forItems",
    }
