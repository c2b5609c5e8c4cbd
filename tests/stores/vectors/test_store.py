"""The vector store contract, run alike on qdrant-edge and on qdrant-client's local mode.

Real engines only: an edge shard directory in tmp_path, and the server implementation over
an in-memory qdrant-client. The latter is a stand-in, named "server-local-mode" in every test id:
it receives the calls a Qdrant server receives, but it searches exactly, keeps no HNSW graph,
no payload indexes and no quantized vectors, and drops the collection configs it is sent. So on
it these tests show the server store's calls, filters, versions and pointers, never its recall,
its INT8 index or its index settings: those claims are listed in the README's "What was verified
where" as needing a real Qdrant server, which cannot be installed here.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import qdrant_edge as qe
from qdrant_client import QdrantClient

from precompute.jobs.staging import commit
from precompute.jobs.text.embedding_cache import EMBEDDING, embeddings_column
from precompute.jobs.vectors.index_check import check_index
from precompute.jobs.work_dir import WorkPath
from precompute.stores.errors import StoreError, VersionNotFoundError
from precompute.stores.vectors import open_vector_store
from precompute.stores.vectors.edge import QdrantEdgeStore
from precompute.stores.vectors.server import QdrantServerStore
from precompute.stores.vectors.settings import VectorStoreSettings
from precompute.stores.vectors.store import SearchParams, VectorStore
from tests.waiting import wait_for

DIM = 16
N = 60
V1, V2, V3 = "20261101T031500-aa01", "20261102T031500-bb02", "20261103T031500-cc03"


def unit_vectors(n: int, seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


VECTORS = unit_vectors(N, seed=0)
IDS = [f"item-{i}" for i in range(N)]


def payloads(version: str) -> list[dict[str, object]]:
    return [
        {"section": "games" if i % 3 == 0 else "mail", "free": i % 2 == 0, "tier": i % 4, "v": version}
        for i in range(N)
    ]


def load(store: VectorStore, version: str) -> None:
    store.create_version(version, DIM)
    store.upsert(version, IDS, VECTORS, payloads(version))
    store.finalize(version)


NAME = "corpus"
"""The collection the tests write."""


@pytest.fixture
def store_settings(tmp_path: Path) -> VectorStoreSettings:
    return VectorStoreSettings(path=tmp_path / "qdrant")


SERVER_LOCAL_MODE = "server-local-mode"
"""The server store over qdrant-client's local mode: exact search, no index, no quantization."""


@pytest.fixture(params=["edge", SERVER_LOCAL_MODE])
def store(request: pytest.FixtureRequest, store_settings: VectorStoreSettings) -> Iterator[VectorStore]:
    if request.param == "edge":
        opened: VectorStore = QdrantEdgeStore(store_settings, NAME, pointer_check_s=0)
    else:
        opened = QdrantServerStore(store_settings, NAME, client=QdrantClient(location=":memory:"))
    with opened:
        yield opened


def test_facade_picks_the_engine_from_settings(store_settings: VectorStoreSettings) -> None:
    with open_vector_store(store_settings, NAME) as store:
        assert isinstance(store, QdrantEdgeStore)
    with pytest.raises(ValueError, match="PRECOMPUTE_QDRANT_URL"):
        open_vector_store(store_settings.model_copy(update={"type": "server"}), NAME)


def test_write_publish_search(store: VectorStore) -> None:
    store.create_version(V1, DIM)
    store.upsert(V1, IDS, VECTORS, payloads(V1))
    assert store.count(V1) == N
    store.finalize(V1)
    assert store.current() is None
    with pytest.raises(VersionNotFoundError):
        store.search(VECTORS[0], k=3)

    store.publish(V1)
    assert store.current() == V1
    assert store.count(V1) == N
    for i in (0, 7, 31):
        top = store.search(VECTORS[i], k=5)
        assert len(top) == 5
        assert top[0].id == IDS[i]
        assert top[0].score == pytest.approx(1.0, abs=1e-5)
        assert top[0].payload == payloads(V1)[i]
        assert [h.score for h in top] == sorted((h.score for h in top), reverse=True)


def test_filters_are_an_exact_match_and(store: VectorStore) -> None:
    load(store, V1)
    store.publish(V1)
    games = store.search(VECTORS[1], k=10, filter={"section": "games"})
    assert len(games) == 10 and all(h.payload["section"] == "games" for h in games)
    assert IDS[1] not in {h.id for h in games}
    assert store.search(VECTORS[3], k=1, filter={"section": "games"})[0].id == IDS[3]
    free = store.search(VECTORS[1], k=10, filter={"free": True})
    assert len(free) == 10 and all(h.payload["free"] is True for h in free)
    both = store.search(VECTORS[0], k=N, filter={"section": "games", "free": False})
    assert {h.id for h in both} == {IDS[i] for i in range(N) if i % 3 == 0 and i % 2 == 1}
    assert store.search(VECTORS[0], k=3, filter={"section": "nope"}) == []
    tier = store.search(VECTORS[0], k=N, filter={"tier": 2})  # an integer field: a lookup-only index
    assert {h.id for h in tier} == {IDS[i] for i in range(N) if i % 4 == 2}


def test_a_copy_holds_the_source_points_and_takes_writes_that_leave_the_source_as_it_was(
    store: VectorStore,
) -> None:
    load(store, V1)
    store.publish(V1)
    store.copy_version(V1, V2, {"model": {"hash": "a"}})
    assert store.meta(V2) == {"model": {"hash": "a"}, "dim": DIM}
    moved = unit_vectors(1, seed=9)
    store.upsert(V2, [IDS[0], "item-new"], np.concatenate([moved, moved]), [{"section": "news"}] * 2)
    store.delete(V2, [IDS[1], "never-stored"])
    store.finalize(V2)

    assert (store.count(V1), store.count(V2)) == (N, N)  # one deleted, one new
    assert {h.id for h in store.search(moved[0], k=2, version=V2)} == {IDS[0], "item-new"}
    assert store.search(moved[0], k=2, version=V2, filter={"section": "news"})[0].payload["section"] == "news"
    assert IDS[1] not in {h.id for h in store.search(VECTORS[1], k=5, version=V2)}
    assert store.search(VECTORS[3], k=1, version=V2, filter={"section": "games"})[0].id == IDS[3]
    assert store.search(VECTORS[1], k=1, version=V1)[0].id == IDS[1]  # the source is untouched
    assert store.search(VECTORS[0], k=1, version=V1)[0].id == IDS[0]
    with pytest.raises(StoreError, match="finalized"):
        store.delete(V2, [IDS[2]])
    store.create_version(V3, DIM)
    with pytest.raises(VersionNotFoundError, match="not a finalized version"):
        store.copy_version(V3, "20261104T031500-dd04", {})


def test_the_dimension_travels_with_the_version_and_changes_only_with_the_model(store: VectorStore) -> None:
    store.create_version(V1, DIM, {"model": {"hash": "a"}})
    store.upsert(V1, IDS, VECTORS, payloads(V1))
    store.finalize(V1)
    store.publish(V1)
    assert store.meta(V1) == {"model": {"hash": "a"}, "dim": DIM}

    wider = unit_vectors(N, seed=3).repeat(2, axis=1) / np.sqrt(2)
    for version, model in ((V2, "a"), (V3, "b")):
        store.create_version(version, 2 * DIM, {"model": {"hash": model}})
        store.upsert(version, IDS, wider, payloads(version))
        store.finalize(version)
    with pytest.raises(StoreError, match=f"dimension {2 * DIM} differs .* with the same model"):
        store.publish(V2)
    assert store.current() == V1
    store.publish(V3)  # a new model: a new dimension, switched to like any version
    assert store.current() == V3 and store.search(wider[5], k=1)[0].id == IDS[5]


def test_rollback_and_gc_keep_the_current_and_the_newest_others(store: VectorStore) -> None:
    for version in (V1, V2, V3):
        load(store, version)
        store.publish(version)
    assert store.versions() == [V1, V2, V3]
    assert store.rollback() == V2
    assert store.current() == V2
    assert store.search(VECTORS[0], k=1)[0].payload["v"] == V2
    assert store.rollback(to=V3) == V3
    assert store.rollback() == V2

    assert store.collect(keep=1) == [V1]  # V3 is newer than the current V2, so it is the one kept
    assert store.versions() == [V2, V3]
    assert store.collect(keep=0) == [V3]
    assert store.versions() == [V2] and store.current() == V2
    assert store.search(VECTORS[0], k=1)[0].payload["v"] == V2
    with pytest.raises(VersionNotFoundError):
        store.rollback()


def test_gc_deletes_a_killed_runs_version_and_keeps_one_in_progress(store: VectorStore) -> None:
    load(store, V1)
    store.publish(V1)
    store.create_version(V2, DIM)  # a run that died before its finalize
    store.upsert(V2, IDS[:3], VECTORS[:3], [{}] * 3)
    store.create_version("20261231T031500-zz99", DIM)  # a run in progress, newer than the next publish
    load(store, V3)
    store.publish(V3)
    assert store.collect(keep=5) == [V2]
    assert store.versions() == [V1, V3, "20261231T031500-zz99"]


def test_unknown_versions_are_refused_and_the_current_stays(store: VectorStore) -> None:
    with pytest.raises(VersionNotFoundError):
        store.rollback()
    load(store, V1)
    store.publish(V1)
    missing = "20991231T000000-ffff"
    for call in (
        lambda: store.count(missing),
        lambda: store.search(VECTORS[0], k=1, version=missing),
        lambda: store.upsert(missing, IDS[:1], VECTORS[:1], [{}]),
        lambda: store.finalize(missing),
        lambda: store.publish(missing),
        lambda: store.rollback(to=missing),
    ):
        with pytest.raises(VersionNotFoundError, match=missing):
            call()
    assert store.current() == V1
    assert store.search(VECTORS[2], k=1)[0].id == IDS[2]


def test_unfinalized_version_cannot_be_published(store: VectorStore) -> None:
    load(store, V1)
    store.publish(V1)
    store.create_version(V2, DIM)
    store.upsert(V2, IDS, VECTORS, payloads(V2))
    with pytest.raises(StoreError, match="not finalized"):
        store.publish(V2)
    assert store.current() == V1
    with pytest.raises(StoreError, match="already exists"):
        store.create_version(V1, DIM)
    with pytest.raises(StoreError, match="is finalized"):
        store.upsert(V1, IDS[:1], VECTORS[:1], [{}])
    assert store.count(V1) == N


def test_bad_input_names_the_parameter(store: VectorStore) -> None:
    with pytest.raises(ValueError, match="version"):
        store.create_version("../escape", DIM)
    store.create_version(V1, DIM)
    with pytest.raises(ValueError, match="differ in length"):
        store.upsert(V1, IDS[:2], VECTORS[:3], payloads(V1)[:3])
    with pytest.raises(ValueError, match="k must be"):
        store.search(VECTORS[0], k=0, version=V1)


def test_edge_finalize_indexes_each_scalar_payload_field(store_settings: VectorStoreSettings) -> None:
    """Without a payload index a filter reads every point's payload: 30x slower at 5,000 points."""
    odd = [{**p, "mixed": i if i % 2 else str(i), "tags": ["a"]} for i, p in enumerate(payloads(V1))]
    with QdrantEdgeStore(store_settings, NAME) as store:
        store.create_version(V1, DIM)
        store.upsert(V1, IDS, VECTORS, odd)
        store.finalize(V1)
    shard = qe.EdgeShard.load(str(store_settings.path / NAME / V1))
    try:
        schema = shard.info().payload_schema
        assert set(schema) == {"section", "free", "tier", "v"}
        assert schema["tier"].params.range is False  # exact matches only: no per-range HNSW links
    finally:
        shard.close()


def test_edge_reader_picks_up_a_new_version_without_restart(store_settings: VectorStoreSettings) -> None:
    with (
        QdrantEdgeStore(store_settings, NAME) as writer,
        QdrantEdgeStore(store_settings, NAME, pointer_check_s=0.2) as reader,
    ):
        load(writer, V1)
        writer.publish(V1)
        assert reader.search(VECTORS[0], k=1)[0].payload["v"] == V1
        load(writer, V2)
        writer.publish(V2)
        wait_for(lambda: reader.search(VECTORS[0], k=1)[0].payload["v"] == V2, "the reader to serve V2")
        assert reader.current() == V2


def test_edge_published_shard_opens_in_two_processes(store_settings: VectorStoreSettings) -> None:
    """The service (another process) opens and searches the shard while this one, which wrote
    it, still holds it open (finalize keeps the writer's handle as this process's reader)."""
    with QdrantEdgeStore(store_settings, NAME) as writer:
        load(writer, V1)
        writer.publish(V1)
        assert writer.search(VECTORS[5], k=1)[0].id == IDS[5]  # this process holds V1 open
        script = (
            "import sys, numpy as np\n"
            "from precompute.stores.vectors.edge import QdrantEdgeStore\n"
            "from precompute.stores.vectors.settings import VectorStoreSettings\n"
            "with QdrantEdgeStore(VectorStoreSettings(path=sys.argv[1]), 'corpus') as s:\n"
            "    print(s.search(np.array([float(x) for x in sys.argv[2].split(',')]), k=1)[0].id)\n"
        )
        vector = ",".join(str(x) for x in VECTORS[5])
        out = subprocess.run(
            [sys.executable, "-c", script, str(store_settings.path), vector],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
            cwd=Path(__file__).resolve().parents[2],
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == IDS[5]
        assert writer.search(VECTORS[5], k=1)[0].id == IDS[5]


def test_publish_under_load_every_answer_is_one_whole_version(
    store: VectorStore, store_settings: VectorStoreSettings
) -> None:
    """Two reader threads (a threaded service) query canaries whose every hit names its version.

    On edge the readers use their own store object, as the service process does; the local-mode
    client cannot be shared between objects, so on server-local-mode they use the writer's.
    """
    canaries = VECTORS[:8]
    answers: list[list[set[object]]] = [[], []]
    errors: list[Exception] = []
    stop = threading.Event()
    with contextlib.ExitStack() as stack:
        reader = store
        if isinstance(store, QdrantEdgeStore):
            reader = stack.enter_context(QdrantEdgeStore(store_settings, NAME, pointer_check_s=0))

        def query_forever(out: list[set[object]]) -> None:
            i = 0
            while not stop.is_set():
                try:
                    out.append({h.payload["v"] for h in reader.search(canaries[i % len(canaries)], k=10)})
                except Exception as e:
                    errors.append(e)
                i += 1

        load(store, V1)
        store.publish(V1)
        threads = [threading.Thread(target=query_forever, args=(out,)) for out in answers]
        for thread in threads:
            thread.start()
        try:
            load(store, V2)
            store.publish(V2)
            wait_for(lambda: all(out and out[-1] == {V2} for out in answers), "both readers to serve V2")
            seen = [len(out) for out in answers]
            wait_for(
                lambda: all(len(out) >= n + 50 for out, n in zip(answers, seen, strict=True)),
                "50 more answers from each reader",
            )
        finally:
            stop.set()
            for thread in threads:
                thread.join()
    assert errors == []
    for out in answers:
        assert all(a in ({V1}, {V2}) for a in out)
        switch = out.index({V2})
        assert switch > 0 and all(a == {V2} for a in out[switch:])


def clustered(n: int, dim: int, seed: int) -> np.ndarray:
    """Unit vectors around 40 topics, like embeddings of a corpus (uniform random ones are
    the worst case for a graph index and nothing like real data)."""
    rng = np.random.default_rng(seed)
    topics = rng.standard_normal((40, dim))
    v = topics[rng.integers(0, 40, n)] + 0.6 * rng.standard_normal((n, dim))
    return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)


def int8_version(store: VectorStore, tmp_path: Path) -> tuple[list[str], np.ndarray, WorkPath]:
    """Writes a 2000-point INT8 version V1 and its run directory, for the recall gate to read."""
    ids = [f"doc-{i}" for i in range(2000)]
    vectors = clustered(len(ids), 64, seed=1)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    pq.write_table(pa.table({"id": ids, EMBEDDING: embeddings_column(vectors)}), run_dir / "part-0.parquet")
    commit(WorkPath.of(run_dir), [{"name": "part-0.parquet", "rows": len(ids), "computed": len(ids)}])
    store.create_version(V1, 64, quantization="int8")
    store.upsert(V1, ids, vectors, [{} for _ in ids])
    store.finalize(V1)
    return ids, vectors, WorkPath.of(run_dir)


def assert_exact_answers(store: VectorStore, ids: list[str], vectors: np.ndarray) -> None:
    for i in (0, 123, 1999):
        hits = store.search(vectors[i], k=10)
        assert hits[0].id == ids[i] and hits[0].score == pytest.approx(1.0, abs=1e-5)
        exact = [float(vectors[int(h.id.removeprefix("doc-"))] @ vectors[i]) for h in hits]
        assert [h.score for h in hits] == pytest.approx(exact, abs=1e-5)


def test_an_int8_version_is_gated_and_answers_with_exact_scores(
    store_settings: VectorStoreSettings, tmp_path: Path
) -> None:
    """INT8 is a setting like any precision: the flow's recall gate measures the quantized index
    (an HNSW graph over INT8 vectors in the shard, shown by its unrescored scores), and what
    readers get are FP32 cosines in FP32 order (rescored), not the INT8 approximations."""
    settings = store_settings.model_copy(update={"full_scan_threshold_kb": 1})
    with QdrantEdgeStore(settings, NAME, pointer_check_s=0) as store:
        ids, vectors, run_dir = int8_version(store, tmp_path)
        validation = check_index(store, V1, run_dir, queries=100, min_recall=0.99)
        assert validation.count == len(ids) and validation.canaries_found == 100
        assert validation.recall_at_10 >= 0.99
        store.publish(V1)
        assert_exact_answers(store, ids, vectors)
    shard = qe.EdgeShard.load(str(settings.path / NAME / V1))
    try:
        raw = shard.query(
            qe.QueryRequest(
                limit=1,
                query=qe.Query.Nearest(vectors[0].tolist()),
                params=qe.SearchParams(quantization=qe.QuantizationSearchParams(rescore=False)),
            )
        )
    finally:
        shard.close()
    assert abs(raw[0].score - 1.0) > 1e-4


def test_server_local_mode_int8_runs_the_calls_but_cannot_measure_recall(
    store_settings: VectorStoreSettings, tmp_path: Path
) -> None:
    """The server store's INT8 path end to end on the stand-in: the collection is created with its
    quantization config, searched with rescoring and gated. Local mode keeps no INT8 vectors and
    searches exactly, so recall here is 1.0 whatever the server would do: this test fails on a
    broken call, never on a poor INT8 index (README, "What was verified where")."""
    settings = store_settings.model_copy(update={"full_scan_threshold_kb": 1})
    with QdrantServerStore(settings, NAME, client=QdrantClient(location=":memory:")) as store:
        ids, vectors, run_dir = int8_version(store, tmp_path)
        validation = check_index(store, V1, run_dir, queries=100, min_recall=0.99)
        assert validation.count == len(ids) and validation.recall_at_10 == 1.0
        store.publish(V1)
        assert_exact_answers(store, ids, vectors)


def segments(store: QdrantEdgeStore, version: str) -> int:
    shard = qe.EdgeShard.load(str(store.root / version))
    try:
        return shard.info().segments_count
    finally:
        shard.close()


def test_a_copys_writes_never_merge_into_its_sources_segments(tmp_path: Path) -> None:
    """Merged into one of the source's segments, a night's few points would build that segment's
    graph again: each copy keeps its source's segments and one more, the nights' writes merged."""
    store = QdrantEdgeStore(VectorStoreSettings(path=tmp_path / "qdrant"), "docs", pointer_check_s=0)
    store.create_version(V1, DIM)
    for start in range(0, 4000, 1000):  # in several writes: the load leaves more than one segment
        store.upsert(V1, [f"p{i}" for i in range(start, start + 1000)], unit_vectors(1000, seed=start), [{}] * 1000)
    store.finalize(V1)
    built = segments(store, V1)
    for n, (source, copy) in enumerate([(V1, V2), (V2, V3)]):
        store.copy_version(source, copy, {})
        store.upsert(copy, [f"night-{n}-{i}" for i in range(20)], unit_vectors(20, seed=99 + n), [{}] * 20)
        store.finalize(copy)
        assert segments(store, copy) == built + 1
        assert store.count(copy) == 4000 + 20 * (n + 1)


def file_bytes(root: Path) -> dict[str, bytes]:
    return {str(f.relative_to(root)): f.read_bytes() for f in sorted(root.rglob("*")) if f.is_file()}


@pytest.mark.parametrize("quantization", ["none", "int8"])
def test_a_copy_shares_its_sources_vectors_and_graphs_and_its_writes_change_no_source_byte(
    tmp_path: Path, quantization: str
) -> None:
    """A copy hard-links the source's built vectors, INT8 codes, graphs and payload pages
    (share_or_copy); a night's upserts over kept ids, new ids, deletes and the build must then
    leave every file of the source byte for byte as it was. Deleting the source leaves the copy whole."""
    settings = VectorStoreSettings(path=tmp_path / "qdrant", graph_points=1_000, full_scan_threshold_kb=1)
    ids = [f"doc-{i}" for i in range(3_000)]
    vectors = clustered(len(ids), DIM, seed=4)
    sections = [{"section": "games" if i % 3 == 0 else "mail", "tier": i % 4} for i in range(len(ids))]
    with QdrantEdgeStore(settings, NAME, pointer_check_s=0) as store:
        store.create_version(V1, DIM, quantization=quantization)
        for start in range(0, len(ids), 500):
            store.upsert(V1, ids[start : start + 500], vectors[start : start + 500], sections[start : start + 500])
        store.finalize(V1)
        store.publish(V1)
        before = file_bytes(store.root / V1)

        store.copy_version(V1, V2, {})
        shared = [f for f in (store.root / V2).rglob("*") if f.is_file() and f.stat().st_nlink == 2]
        assert {f.name for f in shared} >= {"matrix.dat", "links_compressed.bin"}
        moved = clustered(300, DIM, seed=5)
        store.upsert(V2, ids[::20] + [f"new-{i}" for i in range(150)], moved, [{"section": "news"}] * 300)
        store.delete(V2, ids[1::10])
        store.finalize(V2)

        assert file_bytes(store.root / V1) == before
        assert store.search(vectors[20], k=1, version=V1)[0].id == ids[20]
        store.publish(V2)
        assert store.collect(keep=0) == [V1]
        assert store.count(V2) == len(ids) - len(ids[1::10]) + 150
        assert store.search(moved[0], k=1, version=V2, filter={"section": "news"})[0].id == ids[0]
        assert store.search(vectors[22], k=1, version=V2, filter={"tier": 2})[0].id == ids[22]


def test_edge_builds_a_version_past_graph_points_as_bounded_graphs_that_all_answer(tmp_path: Path) -> None:
    """A version of 3,500 points with graph_points 1,000 is built as four graphs (one build per
    part, so the load grows linearly); a search still finds the exact top 10 across them, and a
    filtered one too: each part's payload index existed when its graph was built."""
    settings = VectorStoreSettings(path=tmp_path / "qdrant", graph_points=1_000, full_scan_threshold_kb=1)
    ids = [f"doc-{i}" for i in range(3_500)]
    vectors = clustered(len(ids), 32, seed=2)
    games = np.arange(len(ids)) % 7 == 0
    with QdrantEdgeStore(settings, NAME, pointer_check_s=0) as store:
        store.create_version(V1, 32)
        for start in range(0, len(ids), 500):
            part = slice(start, start + 500)
            sections = [{"section": "games" if g else "mail"} for g in games[part]]
            store.upsert(V1, ids[part], vectors[part], sections)
        store.finalize(V1)
        assert segments(store, V1) >= 4
        store.publish(V1)
        deep = SearchParams(hnsw_ef=1024)
        for i in (0, 1_234, 3_499):
            exact = np.argsort(-(vectors @ vectors[i]))[:10]
            assert [h.id for h in store.search(vectors[i], k=10, params=deep)] == [ids[j] for j in exact]
            exact_games = np.flatnonzero(games)[np.argsort(-(vectors[games] @ vectors[i]))[:10]]
            hits = store.search(vectors[i], k=10, filter={"section": "games"}, params=deep)
            assert [h.id for h in hits] == [ids[j] for j in exact_games]
    shard = qe.EdgeShard.load(str(settings.path / NAME / V1))
    try:
        assert set(shard.info().payload_schema) == {"section"}
        assert shard.info().indexed_vectors_count == len(ids)
    finally:
        shard.close()


def test_edge_drops_the_index_of_a_field_whose_type_varies_after_a_graph_was_built(tmp_path: Path) -> None:
    """A field indexed as an integer before the first graph, then given a string, keeps no
    exact-match index (it would answer neither type whole): filters on it read the payloads."""
    settings = VectorStoreSettings(path=tmp_path / "qdrant", graph_points=1_000, full_scan_threshold_kb=1)
    ids = [f"doc-{i}" for i in range(1_200)]
    vectors = clustered(len(ids), 16, seed=3)
    tiers: list[object] = [i % 3 for i in range(1_000)] + ["gold"] * 200
    with QdrantEdgeStore(settings, NAME, pointer_check_s=0) as store:
        store.create_version(V1, 16)
        store.upsert(V1, ids[:1_000], vectors[:1_000], [{"tier": t} for t in tiers[:1_000]])
        store.upsert(V1, ids[1_000:], vectors[1_000:], [{"tier": t} for t in tiers[1_000:]])
        store.finalize(V1)
        store.publish(V1)
        assert {h.id for h in store.search(vectors[1_100], k=5, filter={"tier": "gold"})} <= set(ids[1_000:])
        assert all(int(h.id[4:]) % 3 == 1 for h in store.search(vectors[1], k=5, filter={"tier": 1}))
    shard = qe.EdgeShard.load(str(settings.path / NAME / V1))
    try:
        assert "tier" not in shard.info().payload_schema
    finally:
        shard.close()
