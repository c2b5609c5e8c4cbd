"""`POST /v1/search` and the health endpoints, on a real engine and a real in-process Qdrant."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from starlette.testclient import TestClient

from precompute.demo_data import DEMO_CORPUS
from precompute.lookup.metrics import Metrics
from precompute.lookup.query_cache import QueryCache
from precompute.lookup.search import Encoders, Searcher
from precompute.lookup.settings import ServiceSettings
from precompute.stores.key_value.server import free_port
from precompute.stores.key_value.settings import RedisSettings
from precompute.stores.vectors import open_vector_store
from precompute.stores.vectors.settings import VectorStoreSettings
from tests.lookup.apps import app_of
from tests.waiting import wait_for

V1, V2 = "20261121T010000Z-aaaaaa", "20261122T010000Z-bbbbbb"


def write_version(stores: VectorStoreSettings, version: str, rows: list[dict], encoder) -> None:
    vectors = encoder.encode([r["text"] for r in rows])
    with open_vector_store(stores, "corpus") as store:  # the demo pipeline's collection
        store.create_version(version, encoder.dim, {"payload": {"title": "str", "section": "str"}})
        store.upsert(
            version,
            [r["id"] for r in rows],
            vectors,
            [{"title": r["title"], "section": r["section"]} for r in rows],
        )
        store.finalize(version)
        store.publish(version)


@pytest.fixture
def stores(tmp_path: Path) -> VectorStoreSettings:
    return VectorStoreSettings(type="edge", path=tmp_path / "qdrant")


@pytest.fixture
def redis(redis_url: str) -> RedisSettings:
    """Key lookups' store, reachable and empty (a prefix of its own): readiness needs it to answer."""
    return RedisSettings(url=redis_url, prefix=f"t{uuid.uuid4().hex[:8]}")


@pytest.fixture
def rows() -> list[dict]:
    return pq.read_table(DEMO_CORPUS).slice(0, 150).to_pylist()


@pytest.fixture
def client(encoder, settings, stores, redis, rows) -> Iterator[TestClient]:
    write_version(stores, V1, rows, encoder)
    app = app_of(ServiceSettings(warmup_queries=2), settings, stores, redis)
    with TestClient(app) as client:
        yield client


@pytest.mark.slow
def test_search_returns_the_nearest_documents(client: TestClient, rows) -> None:
    target = next(r for r in rows if r["section"] == "games")
    answer = client.post("/v1/search", json={"query": target["title"], "k": 5})
    assert answer.status_code == 200
    body = answer.json()
    assert body["version"] == V1 and len(body["hits"]) == 5
    assert body["hits"][0]["id"] == target["id"]
    assert body["hits"][0]["payload"] == {"title": target["title"], "section": "games"}
    scores = [h["score"] for h in body["hits"]]
    assert scores == sorted(scores, reverse=True)


def test_filter_restricts_by_payload(client: TestClient) -> None:
    body = client.post(
        "/v1/search", json={"query": "command line tool", "k": 10, "filter": {"section": "python"}}
    ).json()
    assert body["hits"] and {h["payload"]["section"] for h in body["hits"]} == {"python"}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"query": ""}, "query"),
        ({"query": "   "}, "query"),
        ({"query": "x" * 20_001}, "query"),
        ({"query": "ok", "k": 0}, "k"),
        ({"query": "ok", "k": 101}, "k"),
        ({"query": "ok", "k": "10"}, "k"),
        ({"query": "ok", "filter": {"section": ["a"]}}, "filter.section"),
        ({"query": "ok", "filter": {"sectoin": "python"}}, "filter.sectoin"),  # not in the payload
        ({"query": "ok", "filter": {"section": 3}}, "filter.section"),  # the field holds strings
        ({"query": "ok", "filter": {"section": 2**70}}, "filter"),  # beyond int64
        ({"query": "ok", "filter": {"sec\x00tion": "python"}}, "filter"),
        ({"query": "ok", "filter": {f"f{i}": "x" for i in range(17)}}, "filter"),
        ({"query": "ok", "limit": 3}, "limit"),
        ({}, "query"),
    ],
)
def test_bad_requests_are_4xx_naming_the_field(client: TestClient, body: dict, field: str) -> None:
    answer = client.post("/v1/search", json=body)
    assert answer.status_code == 422
    assert answer.json()["field"].startswith(field)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b"{not json", 400),
        (b"\xff\xfe{}", 400),
        (b"[" * 2000 + b"]" * 2000, 400),  # deeper than Python's parser recurses
        (b'{"query": ' + b"[" * 2000 + b"]" * 2000 + b"}", 400),
        (b'{"query": "' + b"x" * 300_000 + b'"}', 413),
    ],
)
def test_bodies_no_parser_could_take_are_4xx(client: TestClient, body: bytes, status: int) -> None:
    answer = client.post("/v1/search", content=body, headers={"content-type": "application/json"})
    assert answer.status_code == status and "error" in answer.json()


def test_health_readiness_metrics_and_schema(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz").json()
    assert ready["versions"] == {"embeddings": V1, "labels": None, "recs": None, "related": None}
    assert set(ready["engines"]) == {"embeddings"}  # one per embeddings output
    # MiniLM's INT8 query graph keeps the demo corpus's known-item answers (test_gate.py).
    assert ready["engines"]["embeddings"] == "onnxruntime/cpu/int8"
    client.post("/v1/search", json={"query": "editor"})
    metrics = client.get("/metrics").text
    assert 'precompute_request_seconds_bucket{le="0.00025",route="/v1/search",status="200"}' in metrics
    assert 'precompute_version_age_seconds{output="embeddings"}' in metrics  # readiness set it
    assert "/v1/search" in client.get("/openapi.json").json()["paths"]


@pytest.mark.slow
def test_a_new_version_is_served_without_restart(client: TestClient, encoder, stores, rows) -> None:
    write_version(stores, V2, rows[:50], encoder)
    answer = client.post("/v1/search", json={"query": rows[100]["title"], "k": 3}).json()
    assert answer["version"] == V2
    assert all(h["id"] in {r["id"] for r in rows[:50]} for h in answer["hits"])


@pytest.mark.slow
def test_a_search_of_a_version_collected_meanwhile_answers_from_the_published_one(
    encoder, settings, stores, rows
) -> None:
    """A reader's pointer may be a moment old when another process publishes and collects: the
    version it names is gone, and the search answers from the one published now."""
    write_version(stores, V1, rows, encoder)
    searcher = Searcher("embeddings", open_vector_store(stores, "corpus"), Encoders(ServiceSettings()), settings,
                        QueryCache("vectors", 0, lambda v: v.nbytes, Metrics()))
    try:
        write_version(stores, V2, rows[:50], encoder)
        with open_vector_store(stores, "corpus") as other:
            assert other.collect(0) == [V1]
        version, found = searcher.search_published(V1, rows[10]["title"], 3, None)
        assert version == V2 and {h.id for h in found.hits} <= {r["id"] for r in rows[:50]}
    finally:
        searcher.store.close()
        searcher.encoders.close()


def test_nothing_published_is_503_yet_ready(encoder, settings, stores, redis) -> None:
    """Ready (the stores answer), with no version to name; search answers 503 until one is published."""
    with TestClient(app_of(ServiceSettings(warmup_queries=1), settings, stores, redis)) as client:
        ready = client.get("/readyz")
        assert ready.status_code == 200 and ready.json()["versions"]["embeddings"] is None
        answer = client.post("/v1/search", json={"query": "editor"})
        assert answer.status_code == 503 and "Retry-After" in answer.headers


def test_bearer_token_guards_v1_only(encoder, settings, stores, redis, rows) -> None:
    write_version(stores, V1, rows[:20], encoder)
    with TestClient(
        app_of(ServiceSettings(auth_token="s3cret", warmup_queries=1), settings, stores, redis)
    ) as client:
        assert client.post("/v1/search", json={"query": "editor"}).status_code == 401
        for wrong in (
            "Bearer s3cre",
            "Bearer s3cret x",
            "Basic s3cret",
            "s3cret",
            b"Bearer \xfc",  # not ASCII: compared as bytes, never a 500
        ):
            answer = client.post("/v1/search", json={"query": "editor"}, headers={"Authorization": wrong})
            assert answer.status_code == 401, wrong
        ok = client.post("/v1/search", json={"query": "editor"}, headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200
        assert client.get("/healthz").status_code == 200


@pytest.mark.slow
def test_a_repeated_search_is_answered_from_the_cache_until_a_new_version(
    client: TestClient, encoder, stores, rows
) -> None:
    service = client.app.state.service
    query = {"query": rows[3]["title"], "k": 5, "filter": {"section": rows[3]["section"]}}
    first = client.post("/v1/search", json=query)
    again = client.post("/v1/search", json=query)
    assert first.status_code == again.status_code == 200
    assert again.content == first.content and first.json()["version"] == V1
    assert (len(service.answers), len(service.vectors)) == (1, 1)
    # Server-Timing: what a computed answer's steps took; a cached answer has none of its own.
    assert re.fullmatch(r"embed;dur=\d+\.\d{3}, index;dur=\d+\.\d{3}", first.headers["server-timing"])
    assert "server-timing" not in again.headers
    metrics = client.get("/metrics").text
    assert 'precompute_query_cache_total{cache="answers",result="hit"} 1.0' in metrics
    assert 'precompute_query_cache_bytes{cache="answers"}' in metrics

    write_version(stores, V2, rows[:50], encoder)
    # The service re-reads the pointer every pointer_check_s: until then it answers V1 (cached).
    answered = wait_for(
        lambda: (answer := client.post("/v1/search", json=query)).json()["version"] == V2 and answer,
        "the service to serve V2",
    )
    newer = answered.json()
    assert {h["id"] for h in newer["hits"]} <= {r["id"] for r in rows[:50]}
    assert re.fullmatch(r"index;dur=\d+\.\d{3}", answered.headers["server-timing"])  # the vector was cached
    assert len(service.answers) == 1  # V1's answer died with V1; the vector (same model) is reused
    assert 'cache="vectors",result="hit"} 1.0' in client.get("/metrics").text


@pytest.mark.slow
def test_a_filter_true_is_not_the_cached_answer_of_a_filter_1(client: TestClient) -> None:
    assert client.post("/v1/search", json={"query": "editor", "filter": {"section": 1}}).status_code == 422
    assert client.post("/v1/search", json={"query": "editor", "filter": {"section": True}}).status_code == 422


@pytest.mark.slow
def test_a_key_lookup_is_answered_while_a_search_is_embedding(client: TestClient) -> None:
    service = client.app.state.service
    with ThreadPoolExecutor(2) as pool:
        with service.encoders._lock:  # the search's thread now waits inside its embedding
            search = pool.submit(client.post, "/v1/search", json={"query": "a query nobody asked yet"})
            wait_for(lambda: service.search_threads.borrowed_tokens == 1, "the search to take its thread")
            lookup = pool.submit(client.get, "/v1/labels/some-item")
            assert lookup.result(timeout=30).status_code == 503  # answered: nothing published
            assert not search.done()
        assert search.result(timeout=30).status_code == 200


@pytest.mark.slow
def test_a_query_past_max_query_tokens_is_cut_and_the_answer_says_so(
    encoder, settings, stores, redis, rows
) -> None:
    """Cut, not refused: the first max_query_tokens tokens (the closing one kept) are embedded, and
    the answer names the cut. Past the model's window (256 tokens) a query is cut there by default."""
    write_version(stores, V1, rows, encoder)
    target = next(r for r in rows if r["section"] == "games")
    long_query = target["title"] + " and" * 400
    with TestClient(app_of(ServiceSettings(warmup_queries=1, max_query_tokens=16), settings, stores, redis)) as client:
        cut = client.post("/v1/search", json={"query": long_query, "k": 3}).json()
        short = client.post("/v1/search", json={"query": "a chess engine", "k": 3}).json()
    assert cut["query_cut_to_tokens"] == 16 and "query_cut_to_tokens" not in short
    ids, was_cut = encoder.tokenizer.query_ids(long_query, 16)
    assert was_cut and len(ids) == 16 and ids[-1] == encoder.tokenizer.ids("x")[-1]  # [SEP] kept
    with open_vector_store(stores, "corpus") as store:
        expected = store.search(encoder.encode_ids(ids), 3, version=V1)
    assert [h["id"] for h in cut["hits"]] == [h.id for h in expected]
    with TestClient(app_of(ServiceSettings(warmup_queries=1), settings, stores, redis)) as client:
        window = client.post("/v1/search", json={"query": long_query, "k": 3}).json()
    assert window["query_cut_to_tokens"] == encoder.tokenizer.max_seq_length


@pytest.mark.slow
def test_long_queries_leave_a_search_thread_to_short_ones(client: TestClient) -> None:
    """Long queries wait for each other rather than take every search thread: a short query that
    arrives behind them runs at once."""
    service = client.app.state.service
    threads, long_threads = service.search_threads.total_tokens, service.long_searches.total_tokens
    if threads < 2:
        pytest.skip("one core: a long query holds the only search thread")
    assert long_threads == threads - 1
    long_query = "a long query about chess engines and graphical boards " * 6
    with ThreadPoolExecutor(threads + 2) as pool:
        with service.encoders._lock:  # each search's thread now waits inside its embedding
            longs = [
                pool.submit(client.post, "/v1/search", json={"query": f"{long_query} {i}"}) for i in range(threads)
            ]
            wait_for(lambda: service.search_threads.borrowed_tokens == long_threads, "long queries to take threads")
            wait_for(lambda: service.long_searches.statistics().tasks_waiting == 1, "one long query to wait")
            short = pool.submit(client.post, "/v1/search", json={"query": "a short query"})
            wait_for(lambda: service.search_threads.borrowed_tokens == threads, "the short query to take a thread")
        assert short.result(timeout=60).status_code == 200
        assert all(f.result(timeout=60).status_code == 200 for f in longs)


@pytest.mark.slow
def test_batched_queries_are_embedded_by_a_static_engine(encoder, settings, stores, redis, rows) -> None:
    write_version(stores, V1, rows, encoder)
    app = app_of(ServiceSettings(warmup_queries=2, query_batch="on"), settings, stores, redis)
    with TestClient(app) as client:
        # The static INT8 graph (models.engines.load.peer_independent), which keeps the demo's answers.
        assert client.get("/readyz").json()["engines"] == {"embeddings": "onnxruntime/cpu/int8"}
        with ThreadPoolExecutor(4) as pool:
            answers = list(
                pool.map(lambda r: client.post("/v1/search", json={"query": r["title"], "k": 3}), rows[:8])
            )
        for row, answer in zip(rows[:8], answers, strict=True):
            assert answer.status_code == 200 and answer.json()["hits"][0]["id"] == row["id"]


def test_replicas_share_answers_through_redis(encoder, settings, stores, redis, rows) -> None:
    write_version(stores, V1, rows, encoder)
    shared = ServiceSettings(warmup_queries=2, query_cache_redis=True)
    query = {"query": rows[7]["title"], "k": 5}
    with TestClient(app_of(shared, settings, stores, redis)) as first:
        computed = first.post("/v1/search", json=query)
    with TestClient(app_of(shared, settings, stores, redis)) as second:  # its own caches are empty
        again = second.post("/v1/search", json=query)
        metrics = second.get("/metrics").text
    assert computed.status_code == again.status_code == 200 and again.content == computed.content
    assert 'precompute_query_cache_total{cache="answers_redis",result="hit"} 1.0' in metrics
    assert 'cache="vectors",result="miss"} 0.0' in metrics  # the second replica embedded nothing


@pytest.mark.slow
def test_a_search_is_answered_when_the_shared_cache_is_down(encoder, settings, stores, rows) -> None:
    write_version(stores, V1, rows, encoder)
    down = RedisSettings(url=f"redis://127.0.0.1:{free_port()}/0", socket_timeout=0.5)  # nothing listens
    app = app_of(ServiceSettings(warmup_queries=2, query_cache_redis=True), settings, stores, down)
    with TestClient(app) as client:
        answer = client.post("/v1/search", json={"query": rows[2]["title"], "k": 3})
        assert answer.status_code == 200 and answer.json()["hits"][0]["id"] == rows[2]["id"]
        assert 'cache="answers_redis",result="error"} 2.0' in client.get("/metrics").text  # its get and put
