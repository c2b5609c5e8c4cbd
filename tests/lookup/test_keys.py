"""Key lookups (`/v1/labels`, `/v1/recs`, their `:batchGet`) on a real redis-server, through the ASGI app.

No embeddings are published in these tests: key lookups must not depend on them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import pytest
import redis as redis_client
from starlette.testclient import TestClient

from precompute.lookup.errors import unavailable
from precompute.lookup.settings import ServiceSettings
from precompute.stores.errors import StoreUnavailableError
from precompute.stores.key_value.records import encode_ranked
from precompute.stores.key_value.server import redis_server
from precompute.stores.key_value.settings import RedisSettings, output_keys
from precompute.stores.key_value.store import KeyValueStore
from precompute.stores.vectors.settings import VectorStoreSettings
from tests.lookup.apps import app_of

V1, V2 = "20261121T010000Z-aaaaaa", "20261122T010000Z-bbbbbb"
LABEL_NAMES = ["games", "python", "editors", "libs", 'say "hi"']
ITEMS = [f"pkg-{i}" for i in range(20)] + ["a/b", "café"]
USERS = [f"user-{i}" for i in range(10)]
SCORES = [0.9, 0.5, 0.25, 0.125]
"""Exact in float16 or printed back as written: answers must show these numbers."""
TOKEN = "s3cret"


def labels_of(ordinal: int) -> list[list[int]]:
    """Per item, three label indices; the first tells the version (ordinal) apart."""
    return [[(i + ordinal) % len(LABEL_NAMES), (i + 2) % len(LABEL_NAMES), 4] for i in range(len(ITEMS))]


def recs_of(ordinal: int) -> list[list[int]]:
    return [[(u + ordinal + j) % len(ITEMS) for j in range(4)] for u in range(len(USERS))]


def publish(redis: RedisSettings, output: str, version: str, ids: list[str], rows: list[list[int]]) -> None:
    vocabulary = LABEL_NAMES if output == "labels" else ITEMS
    k = len(rows[0])
    values = encode_ranked(np.array(rows), np.array([SCORES[:k]] * len(rows)))
    with KeyValueStore(redis) as store:
        store.create_version(output, version, len(ids), {"vocabulary": vocabulary})
        store.write(output, version, ids, values)
        store.publish(output, version)
        store.collect_garbage(output, keep=1)


def publish_both(redis: RedisSettings, version: str, ordinal: int) -> None:
    publish(redis, "labels", version, ITEMS, labels_of(ordinal))
    publish(redis, "recs", version, USERS, recs_of(ordinal))


def expected_labels(item: str, ordinal: int) -> list[dict]:
    row = labels_of(ordinal)[ITEMS.index(item)]
    return [{"label": LABEL_NAMES[i], "score": s} for i, s in zip(row, SCORES, strict=False)]


def expected_items(user: str, ordinal: int, k: int = 4) -> list[dict]:
    row = recs_of(ordinal)[USERS.index(user)]
    return [{"id": ITEMS[i], "score": s} for i, s in zip(row, SCORES, strict=True)][:k]


def redis_for_test(url: str) -> RedisSettings:
    """A prefix per test: tests share one server and never see each other's keys."""
    return RedisSettings(url=url, prefix=f"t{uuid.uuid4().hex[:8]}")


def app(engine, tmp_path: Path, redis: RedisSettings, **service):
    """No embeddings published: an empty in-process vector store."""
    stores = VectorStoreSettings(type="edge", path=tmp_path / "qdrant")
    return app_of(ServiceSettings(warmup_queries=1, **service), engine, stores, redis)


@pytest.fixture(scope="module")
def served(
    encoder, settings, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TestClient]:
    """One app for the read-only tests: V1 of both outputs, bearer auth on."""
    redis = redis_for_test(redis_url)
    publish_both(redis, V1, 1)
    with TestClient(
        app(settings, tmp_path_factory.mktemp("keys"), redis, auth_token=TOKEN),
        headers={"Authorization": f"Bearer {TOKEN}"},
    ) as client:
        yield client


@pytest.fixture
def redis(redis_url: str) -> RedisSettings:
    return redis_for_test(redis_url)


@pytest.fixture
def client(encoder, settings, tmp_path: Path, redis: RedisSettings) -> Iterator[TestClient]:
    """An app of its own, on a Redis prefix of its own, nothing published yet."""
    with TestClient(app(settings, tmp_path, redis)) as client:
        yield client


@pytest.mark.slow
def test_a_top_100_is_served_whole(
    encoder, settings, tmp_path: Path, redis: RedisSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """k = 100 (product pages rerank 20-50): 600-byte values, past Redis's listpack value limit."""
    monkeypatch.setenv("PRECOMPUTE_OUTPUTS__RECS__K", "100")
    vocabulary = [f"item-{i}" for i in range(150)]
    ranked = np.array([[(u + j) % 150 for j in range(100)] for u in range(len(USERS))])
    scores = np.linspace(1, 0, 100, dtype=np.float16)
    with KeyValueStore(redis) as store:
        store.create_version("recs", V1, len(USERS), {"vocabulary": vocabulary})
        store.write("recs", V1, USERS, encode_ranked(ranked, np.array([scores] * len(USERS))))
        store.publish("recs", V1)
    with TestClient(app(settings, tmp_path, redis)) as client:
        answer = client.get("/v1/recs/user-3?k=100").json()["items"]
        assert [item["id"] for item in answer] == [vocabulary[i] for i in ranked[3]]
        assert client.get("/v1/recs/user-3?k=101").status_code == 422


@pytest.mark.parametrize("item", ["pkg-3", "a/b", "café"])
def test_labels_of_one_item(served: TestClient, item: str) -> None:
    answer = served.get(f"/v1/labels/{item.replace('/', '%2F')}")
    assert answer.status_code == 200
    assert answer.json() == {"version": V1, "id": item, "labels": expected_labels(item, 1)}


def test_recs_of_one_user_all_or_k(served: TestClient) -> None:
    assert served.get("/v1/recs/user-2").json() == {
        "version": V1,
        "id": "user-2",
        "items": expected_items("user-2", 1),
    }
    assert served.get("/v1/recs/user-2?k=2").json()["items"] == expected_items("user-2", 1, k=2)
    assert served.get("/v1/recs/user-2?k=10").json()["items"] == expected_items("user-2", 1)


def test_batch_get_lists_the_missing(served: TestClient) -> None:
    answer = served.post("/v1/labels:batchGet", json={"ids": ["pkg-1", "nope", "café", "pkg-1"]})
    assert answer.status_code == 200
    assert answer.json() == {
        "version": V1,
        "results": [{"id": item, "labels": expected_labels(item, 1)} for item in ["pkg-1", "café", "pkg-1"]],
        "missing": ["nope"],
    }
    recs = served.post("/v1/recs:batchGet", json={"ids": ["user-0", "ghost", "user-9"], "k": 3}).json()
    assert recs == {
        "version": V1,
        "results": [{"id": u, "items": expected_items(u, 1, k=3)} for u in ["user-0", "user-9"]],
        "missing": ["ghost"],
    }


def test_unknown_id_is_404_naming_it(served: TestClient) -> None:
    for path in ("/v1/labels/nope", "/v1/recs/nope"):
        answer = served.get(path)
        assert answer.status_code == 404
        assert answer.json()["id"] == "nope" and "'nope'" in answer.json()["error"]


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("/v1/recs/user-1?k=0", "k"),
        ("/v1/recs/user-1?k=11", "k"),  # the file's k: what a record holds
        ("/v1/recs/user-1?k=abc", "k"),
        ("/v1/recs/user-1?k=2.5", "k"),
        ("/v1/recs/user-1?k=-1", "k"),
        ("/v1/recs/user-1?limit=3", "limit"),
        ("/v1/labels/pkg-1?k=3", "k"),
        (f"/v1/labels/{'x' * 257}", "id"),
        ("/v1/labels/", "id"),
    ],
)
def test_bad_gets_are_422_naming_the_field(served: TestClient, path: str, field: str) -> None:
    answer = served.get(path)
    assert answer.status_code == 422
    assert answer.json()["field"] == field


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/labels:batchGet", {"ids": []}, "ids"),
        ("/v1/labels:batchGet", {}, "ids"),
        ("/v1/labels:batchGet", {"ids": "pkg-1"}, "ids"),
        ("/v1/labels:batchGet", {"ids": ["pkg-1", 7.5]}, "ids.1"),
        ("/v1/labels:batchGet", {"ids": ["pkg-1", ""]}, "ids.1"),
        ("/v1/labels:batchGet", {"ids": ["x" * 257]}, "ids.0"),
        ("/v1/labels:batchGet", {"ids": ["pkg-1"] * 501}, "ids"),
        ("/v1/labels:batchGet", {"ids": ["pkg-1"], "k": 2}, "k"),
        ("/v1/recs:batchGet", {"ids": ["user-1"], "k": 0}, "k"),
        ("/v1/recs:batchGet", {"ids": ["user-1"], "k": 11}, "k"),
        ("/v1/recs:batchGet", {"ids": ["user-1"], "k": "3"}, "k"),
        ("/v1/recs:batchGet", {"ids": ["user-1", True], "k": 0}, "ids.1"),  # the first of two wrong fields
    ],
)
def test_bad_batches_are_422_naming_the_field(served: TestClient, path: str, body: dict, field: str) -> None:
    answer = served.post(path, json=body)
    assert answer.status_code == 422
    assert answer.json()["field"] == field


def test_malformed_batch_is_400_and_auth_guards_lookups(served: TestClient) -> None:
    for body, status in (
        (b"{not json", 400),
        (b'{"ids": ' + b"[" * 2000 + b"]" * 2000 + b"}", 400),
        (b'{"ids": ["' + b"x" * 300_000 + b'"]}', 413),
    ):
        answer = served.post("/v1/recs:batchGet", content=body, headers={"content-type": "application/json"})
        assert answer.status_code == status
    assert served.get("/v1/labels/pkg-1", headers={"Authorization": "Bearer wrong"}).status_code == 401


def test_readiness_metrics_and_schema(served: TestClient) -> None:
    ready = served.get("/readyz").json()
    assert ready["versions"] == {"embeddings": None, "labels": V1, "recs": V1, "related": None}
    assert ready["engines"] == {}  # key lookups run none; embeddings, with one, has nothing published
    served.get("/v1/labels/pkg-1")
    metrics = served.get("/metrics").text
    assert 'precompute_request_seconds_count{route="/v1/labels/{id}",status="200"}' in metrics
    assert 'precompute_version_age_seconds{output="recs"}' in metrics
    assert 'precompute_request_seconds_bucket{le="0.0001",route="/v1/labels/{id}",status="200"}' in metrics
    bounds = re.findall(
        r'precompute_request_seconds_bucket\{le="([^"]+)",route="/v1/labels/\{id\}",status="200"', metrics
    )
    # 0.1 ms to 1 s, finest around the 1-5 ms the service is for
    assert bounds == "0.0001 0.00025 0.0005 0.00075 0.001 0.0015 0.0025 0.005 0.01 0.025 0.1 1.0 +Inf".split()
    paths = served.get("/openapi.json").json()["paths"]
    assert {"/v1/labels/{id}", "/v1/recs/{id}", "/v1/labels:batchGet", "/v1/recs:batchGet"} <= set(paths)
    assert "/openapi.json" not in paths  # the schema describes the API, not itself
    assert paths["/v1/recs:batchGet"]["post"]["requestBody"]["content"]["application/json"]["schema"][
        "properties"
    ].keys() == {"ids", "k"}


@pytest.mark.parametrize(("retry_after", "header"), [(0.1, "1"), (1.0, "1"), (2.6, "3"), (10.0, "10")])
def test_a_store_outage_says_when_to_retry_in_whole_seconds(retry_after: float, header: str) -> None:
    """Retry-After is delay-seconds (RFC 9110): a whole number, never 0 (a client would spin)."""
    answer = unavailable("key-value store", StoreUnavailableError("down", retry_after=retry_after))
    assert (answer.status_code, answer.headers["Retry-After"]) == (503, header)


def test_the_service_is_sized_and_announced_as_its_settings_say(
    encoder, settings, tmp_path: Path, redis: RedisSettings, caplog: pytest.LogCaptureFixture
) -> None:
    """Query caches of query_cache_mb each; a search thread per core (queries are not batched
    on a CPU); and one start-up line naming every output and the version it serves."""
    caplog.set_level(logging.INFO, logger="lookup")
    publish(redis, "labels", V1, ITEMS, labels_of(1))
    with TestClient(app(settings, tmp_path, redis, query_cache_mb=3)) as client:
        service = client.app.state.service
        assert service.answers.max_bytes == service.vectors.max_bytes == 3 * 2**20
        assert service.search_threads.total_tokens == len(os.sched_getaffinity(0))
        host, port = service.settings.host, service.settings.port
    started = [r.getMessage() for r in caplog.records if r.getMessage().startswith("serving on")]
    assert started == [
        f"serving on http://{host}:{port}: embeddings (nothing published), labels {V1}, recs (nothing published), related (nothing published)"
    ]


def test_not_ready_before_its_start_up_has_run(
    encoder, settings, tmp_path: Path, redis: RedisSettings
) -> None:
    """Requests that arrive before the lifespan's start-up (outputs opened, engines warmed) ran."""
    early = TestClient(app(settings, tmp_path, redis)).get("/readyz")
    assert (early.status_code, early.json(), early.headers["Retry-After"]) == (
        503,
        {"error": "warming up"},
        "1",
    )


def test_nothing_published_is_503_yet_ready(client: TestClient, redis: RedisSettings) -> None:
    ready = client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["versions"] == {"embeddings": None, "labels": None, "recs": None, "related": None}
    for answer in (client.get("/v1/labels/pkg-1"), client.post("/v1/recs:batchGet", json={"ids": ["u"]})):
        assert answer.status_code == 503 and answer.headers["Retry-After"] == "5"
    publish(redis, "labels", V1, ITEMS, labels_of(1))
    assert client.get("/v1/labels/pkg-1").json()["labels"] == expected_labels("pkg-1", 1)
    assert client.get("/v1/recs/user-1").status_code == 503


def test_new_version_and_rollback_are_served_without_restart(
    client: TestClient, redis: RedisSettings
) -> None:
    publish_both(redis, V1, 1)
    assert client.get("/v1/labels/pkg-4").json()["labels"] == expected_labels("pkg-4", 1)
    publish_both(redis, V2, 2)
    assert client.get("/v1/labels/pkg-4").json() == {
        "version": V2,
        "id": "pkg-4",
        "labels": expected_labels("pkg-4", 2),
    }
    batch = client.post("/v1/recs:batchGet", json={"ids": ["user-3"]}).json()
    assert batch["version"] == V2 and batch["results"][0]["items"] == expected_items("user-3", 2)
    with KeyValueStore(redis) as store:
        assert store.rollback("labels") == V1
    assert client.get("/v1/labels/pkg-4").json()["labels"] == expected_labels("pkg-4", 1)
    assert client.get("/readyz").json()["versions"] == {"embeddings": None, "labels": V1, "recs": V2, "related": None}


def test_redis_down_is_503_then_recovers(
    encoder, settings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="lookup")
    with contextlib.ExitStack() as server:
        redis = RedisSettings(url=server.enter_context(redis_server(tmp_path / "redis")))
        publish_both(redis, V1, 1)
        with TestClient(app(settings, tmp_path, redis)) as client:
            assert client.get("/v1/labels/pkg-1").status_code == 200
            server.close()
            answer = client.get("/v1/labels/pkg-1")
            assert answer.status_code == 503 and answer.headers["Retry-After"] == "1"
            assert answer.json()["error"] == "key-value store unavailable"  # not its address
            assert client.post("/v1/recs:batchGet", json={"ids": ["user-1"]}).status_code == 503
            assert client.get("/readyz").status_code == 503
            assert 'precompute_store_errors_total{output="labels"} 1.0' in client.get("/metrics").text
            with redis_server(tmp_path / "redis", port=urlparse(redis.url).port):
                publish_both(redis, V2, 2)  # nothing was persisted: the nightly publishes again
                assert client.get("/v1/labels/pkg-1").json()["labels"] == expected_labels("pkg-1", 2)
                assert client.get("/readyz").json()["versions"]["recs"] == V2
    outages = [r.getMessage() for r in caplog.records if r.name == "lookup"]
    assert len(outages) == 2, outages  # one line down (with the address), one line back
    assert outages[0].startswith("redis unavailable: Redis at") and "recovered after" in outages[1]


def test_a_crash_is_a_500_and_counted_like_any_answer(redis: RedisSettings, settings, tmp_path: Path) -> None:
    """A corrupt registry entry (not JSON) is a fault no handler expects: the answer is Starlette's
    500 page, and the metrics count it under its route, as every other status."""
    publish(redis, "labels", V1, ITEMS, labels_of(1))
    with TestClient(app(settings, tmp_path, redis), raise_server_exceptions=False) as client:
        publish(redis, "labels", V2, ITEMS, labels_of(2))
        with redis_client.from_url(redis.url) as raw:
            raw.hset(output_keys(redis, "labels").registry, V2, b"{not json")  # what readers read next
        assert client.get("/v1/labels/pkg-1").status_code == 500
        assert client.get("/v1/nowhere").status_code == 404
        metrics = client.get("/metrics").text
    assert 'precompute_request_seconds_count{route="/v1/labels/{id}",status="500"} 1.0' in metrics
    assert 'precompute_request_seconds_count{route="unmatched",status="404"} 1.0' in metrics


def requests_of(document: dict) -> list[tuple[str, str, dict | None]]:
    """(method, path, JSON body) of every operation in an OpenAPI document, ids filled in and a body
    that passes validation (its schema's required fields)."""
    bodies = {"query": "editor", "ids": ["pkg-1"]}
    requests = []
    for template, operations in document["paths"].items():
        for method, operation in operations.items():
            schema = (
                operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
            )
            body = None if schema is None else {name: bodies[name] for name in schema.get("required", [])}
            requests.append((method.upper(), template.replace("{id}", "pkg-1"), body))
    return requests


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER", "bEaReR"])
@pytest.mark.parametrize("spaces", [" ", "  "])
def test_the_bearer_scheme_is_case_insensitive_as_rfc_6750_says(served: TestClient, scheme: str, spaces: str) -> None:
    """RFC 6750 2.1 and RFC 9110 11.1: the scheme's case does not matter, and one or more spaces
    part it from the token; a field value's trailing whitespace is not part of it."""
    for value in (f"{scheme}{spaces}{TOKEN}", f"{scheme}{spaces}{TOKEN} "):
        assert served.get("/v1/labels/pkg-1", headers={"Authorization": value}).status_code == 200, value


@pytest.mark.parametrize(
    ("token", "challenge"),
    [
        (None, 'Bearer realm="precompute"'),
        ("Bearer wrong", 'Bearer realm="precompute", error="invalid_token"'),
        (f"Basic {TOKEN}", 'Bearer realm="precompute"'),
        (TOKEN, 'Bearer realm="precompute"'),
    ],
)
def test_every_data_route_in_the_schema_refuses_a_missing_or_wrong_token(
    served: TestClient, token: str | None, challenge: str
) -> None:
    """Read off /openapi.json, so a route added later is covered without anyone remembering it;
    each 401 carries RFC 6750's challenge."""
    requests = requests_of(served.get("/openapi.json").json())
    data = [(m, p, b) for m, p, b in requests if p.startswith("/v1/")]
    assert {p for _, p, _ in data} >= {
        "/v1/search",
        "/v1/labels/pkg-1",
        "/v1/recs:batchGet",
        "/v1/search/embeddings",
    }
    headers = {} if token is None else {"Authorization": token}
    for method, path, body in data:
        refused = served.request(method, path, json=body, headers={"Authorization": ""} | headers)
        assert refused.status_code == 401 and refused.headers["www-authenticate"] == challenge, (method, path)
        assert served.request(method, path, json=body).status_code != 401, (method, path)  # the right token
    for method, path, body in requests:
        if not path.startswith("/v1/"):  # health and readiness stay open
            assert served.request(method, path, json=body, headers={"Authorization": ""}).status_code == 200
