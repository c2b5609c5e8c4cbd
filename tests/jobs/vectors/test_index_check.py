"""The checks an embeddings version passes before it is published (jobs/vectors/index_check.py), on a real
qdrant-edge store: a whole version passes with its figures, and each refusal names what failed.

Vectors are unit vectors around topics, like a corpus's embeddings. Below the store's full-scan
threshold a search is exact, so recall is 1.0 there; the approximate index is forced by a 1 KB
threshold and a one-candidate search (hnsw_ef=1), which the check then raises rung by rung.
"""

from __future__ import annotations

import re
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from precompute.jobs.staging import commit, committed_dataset
from precompute.jobs.text.content_cache import KEY
from precompute.jobs.text.embedding_cache import EMBEDDING, embeddings_column, embeddings_of
from precompute.jobs.vectors import exact_neighbours as neighbours_module
from precompute.jobs.vectors import index_check
from precompute.jobs.vectors.carried_check import carried_check, checked_under, keep_check
from precompute.jobs.vectors.check_sample import EXACT_FILE, Searches
from precompute.jobs.vectors.exact_neighbours import DEPTH, TIE, K, Neighbours, moved_neighbours, unit_rows
from precompute.jobs.vectors.index_check import GRAPH_FILE, IndexCheckError, check_index, next_graph
from precompute.jobs.vectors.load import load_version
from precompute.jobs.work_dir import WorkPath
from precompute.stores.vectors.edge import QdrantEdgeStore
from precompute.stores.vectors.settings import VectorStoreSettings
from precompute.stores.vectors.store import GRAPH_KEY, GraphParams, SearchParams

DIM = 32
ROWS = 300
V1 = "20261101T031500-aa01"


def embeddings(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    topics = rng.standard_normal((12, DIM))
    v = topics[rng.integers(0, 12, n)] + 0.6 * rng.standard_normal((n, DIM))
    return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)


IDS = [f"doc-{i}" for i in range(ROWS)]
VECTORS = embeddings(ROWS, seed=0)


def staged(tmp_path: Path, vectors: np.ndarray = VECTORS) -> WorkPath:
    """A run directory whose committed part holds what the job embedded."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    pq.write_table(pa.table({"id": IDS, EMBEDDING: embeddings_column(vectors)}), run_dir / "part-0.parquet")
    commit(WorkPath.of(run_dir), [{"name": "part-0.parquet", "rows": ROWS, "computed": ROWS}])
    return WorkPath.of(run_dir)


def store(
    tmp_path: Path, ids: list[str], vectors: np.ndarray, graph: GraphParams | None = None, **settings: object
) -> QdrantEdgeStore:
    """The version as the store holds it, which a faulty write can make differ from the staged rows."""
    opened = QdrantEdgeStore(
        VectorStoreSettings(path=tmp_path / "qdrant", **settings), "docs", pointer_check_s=0
    )
    opened.create_version(V1, DIM, None if graph is None else {GRAPH_KEY: asdict(graph)})
    opened.upsert(V1, ids, vectors, [{} for _ in ids])
    opened.finalize(V1)
    return opened


def test_a_whole_version_passes_with_its_figures(tmp_path: Path) -> None:
    with store(tmp_path, IDS, VECTORS) as version:
        validation = check_index(version, V1, staged(tmp_path), queries=50, min_recall=1.0)
        assert (validation.count, validation.canaries, validation.canaries_found) == (ROWS, 50, 50)
        assert validation.recall_at_10 == 1.0 and len(validation.curve) == 1
        assert validation.search == {"hnsw_ef": 64, "oversampling": 2.0, "exact": False}


def test_more_queries_than_rows_sample_every_row_once(tmp_path: Path) -> None:
    with store(tmp_path, IDS, VECTORS) as version:
        validation = check_index(version, V1, staged(tmp_path), queries=ROWS + 1, min_recall=1.0)
    assert (validation.canaries, validation.canaries_found) == (ROWS, ROWS)


def test_a_point_missing_from_the_version_is_refused_by_its_count(tmp_path: Path) -> None:
    with store(tmp_path, IDS[1:], VECTORS[1:]) as version, pytest.raises(IndexCheckError) as refused:
        check_index(version, V1, staged(tmp_path), queries=50, min_recall=0.0)
    assert str(refused.value) == f"version {V1} holds {ROWS - 1} points, {ROWS} were staged"


def test_a_point_the_run_did_not_stage_is_refused_by_its_count(tmp_path: Path) -> None:
    """A stray point (a retried write's, or another run's) is as wrong as a missing one."""
    extra = np.vstack([VECTORS, embeddings(1, seed=1)])
    with store(tmp_path, [*IDS, "stray"], extra) as version, pytest.raises(IndexCheckError) as refused:
        check_index(version, V1, staged(tmp_path), queries=50, min_recall=0.0)
    assert str(refused.value) == f"version {V1} holds {ROWS + 1} points, {ROWS} were staged"


def test_points_stored_under_other_vectors_are_missing_canaries(tmp_path: Path) -> None:
    """Ids stored under a wrong vector: two far from their own (not among their neighbours at all),
    one under another row's vector, one slightly off while another id holds its vector exactly
    (among its query's neighbours, but not first), and that other id."""
    wrong = VECTORS.copy()
    wrong[0] = -VECTORS[0]
    wrong[6] = -VECTORS[6]
    wrong[1] = VECTORS[2]
    wrong[3] = VECTORS[3] + 0.4 * VECTORS[4]
    wrong[3] /= np.linalg.norm(wrong[3])
    wrong[5] = VECTORS[3]
    with store(tmp_path, IDS, wrong) as version:
        hits = [h.id for h in version.search(VECTORS[3], 10, version=V1)]
        assert hits[0] == IDS[5] and IDS[3] in hits
        with pytest.raises(IndexCheckError) as refused:
            check_index(version, V1, staged(tmp_path), queries=ROWS, min_recall=0.0)
    assert str(refused.value) == f"version {V1}: 5 of {ROWS} canaries not found"


def test_a_version_of_shifted_vectors_finds_no_canary(tmp_path: Path) -> None:
    """Every id stored under the next row's vector: each query's nearest point is another id."""
    with (
        store(tmp_path, IDS, np.roll(VECTORS, -1, axis=0)) as version,
        pytest.raises(IndexCheckError) as refused,
    ):
        check_index(version, V1, staged(tmp_path), queries=50, min_recall=0.0)
    assert str(refused.value) == f"version {V1}: 50 of 50 canaries not found"


def test_exact_duplicates_find_each_other_as_canaries(tmp_path: Path) -> None:
    """Rows with the same vector: any of them first is each one's answer (a tie), also where
    they are more than a search's K + 1 hits (bench scale's 1M corpus repeats some texts more
    often: one such row was refused as a missing canary)."""
    duplicated = VECTORS.copy()
    duplicated[1] = duplicated[0]
    duplicated[100:160] = duplicated[99]
    with store(tmp_path, IDS, duplicated) as version:
        validation = check_index(version, V1, staged(tmp_path, duplicated), queries=ROWS, min_recall=1.0)
    assert validation.canaries_found == ROWS


def test_exact_neighbours_read_step_by_step_are_every_row_within_tie_of_the_depth_th_best(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scored 7 rows at a time over three parts, a query's neighbours are those scoring every row
    at once finds down to the DEPTH-th best less TIE, ties past it included (25 copies of one
    vector), its own row left out; its floor is the K-th best."""
    monkeypatch.setattr(neighbours_module, "READ_ROWS", 7)
    vectors = VECTORS.copy()
    vectors[100:125] = vectors[0]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for n, rows in enumerate((slice(0, 100), slice(100, 113), slice(113, ROWS))):
        table = pa.table({"id": IDS[rows], EMBEDDING: embeddings_column(vectors[rows])})
        pq.write_table(table, run_dir / f"part-{n}.parquet")
    commit(WorkPath.of(run_dir), [{"name": f"part-{n}.parquet", "rows": 0, "computed": 0} for n in range(3)])
    queries = vectors[[0, 5, 150]]
    own = [IDS[0], None, IDS[150]]

    found = neighbours_module.exact_neighbours(committed_dataset(WorkPath.of(run_dir)), queries, own)

    for query, mine, near in zip(queries, own, found, strict=True):
        scores = {i: float(s) for i, s in zip(IDS, vectors @ query, strict=True) if i != mine}
        ranked = sorted(scores.values(), reverse=True)
        deepest = ranked[DEPTH - 1]
        assert near.floor == pytest.approx(ranked[K - 1], abs=1e-6)
        assert near.bound == pytest.approx(deepest - TIE, abs=1e-6)
        assert set(near.scores) == {i for i, s in scores.items() if s >= deepest - TIE}
    assert set(found[0].scores) == {f"doc-{i}" for i in range(100, 125)}  # tied past the DEPTH-th best


def test_the_check_raises_hnsw_ef_until_recall_reaches_its_minimum_and_records_it(tmp_path: Path) -> None:
    """From one candidate (hnsw_ef=1: Qdrant keeps at least the 11 asked for) the graph misses
    neighbours; the check doubles hnsw_ef until
    recall@10 reaches min_recall, records that rung with the version, and a fresh reader (the
    service) searches with it: its answers are the ones the check measured."""
    approximate = {"full_scan_threshold_kb": 1, "hnsw_ef": 1}
    with store(tmp_path, IDS, VECTORS, **approximate) as version:
        validation = check_index(version, V1, staged(tmp_path), queries=ROWS, min_recall=1.0)
        version.publish(V1)
    curve = validation.curve
    assert len(curve) > 1 and curve[0]["hnsw_ef"] == 1
    assert [rung["hnsw_ef"] for rung in curve] == [2**i for i in range(len(curve))]
    assert all(rung["recall_at_10"] < 1.0 for rung in curve[:-1]) and curve[-1]["recall_at_10"] == 1.0
    assert validation.recall_at_10 == curve[-1]["recall_at_10"]
    assert all(rung["p99_ms"] >= rung["median_ms"] > 0 for rung in curve)  # every query timed
    assert validation.search == {"hnsw_ef": curve[-1]["hnsw_ef"], "oversampling": 2.0, "exact": False}
    reader = QdrantEdgeStore(VectorStoreSettings(path=tmp_path / "qdrant", hnsw_ef=1), "docs", pointer_check_s=0)
    with reader:
        assert reader.meta(V1)["search"] == validation.search
        tuned = SearchParams(**validation.search)
        for v in VECTORS[:20]:
            assert reader.search(v, 10) == reader.search(v, 10, params=tuned)


def test_a_walk_begins_at_the_rung_it_is_given_unless_that_is_an_exact_scan(tmp_path: Path) -> None:
    """A copy's check begins where its source's passed (the rungs below fell short on the same
    graph); a source that passed only by exact scan, or at a rung past today's max_ef, gives no
    such start."""
    approximate = {"full_scan_threshold_kb": 1, "hnsw_ef": 1}
    with store(tmp_path, IDS, VECTORS, **approximate) as version:
        run_dir = staged(tmp_path)
        started = check_index(version, V1, run_dir, queries=50, min_recall=0.0, start=SearchParams(64, 2.0))
        scanned = check_index(version, V1, run_dir, queries=50, min_recall=0.0, start=SearchParams(64, 2.0, exact=True))
        bounded = check_index(version, V1, run_dir, queries=50, min_recall=0.0, max_ef=32, start=SearchParams(64, 2.0))
    assert [rung["hnsw_ef"] for rung in started.curve] == [64]
    assert [rung["hnsw_ef"] for rung in scanned.curve] == [1]
    assert [rung["hnsw_ef"] for rung in bounded.curve] == [1]  # past today's max_ef: from the default


def test_recall_short_of_its_minimum_even_by_exact_scan_is_refused_with_the_figure(tmp_path: Path) -> None:
    """Stored vectors a little off the staged ones (a faulty write): each still finds itself, but
    its neighbours are not the staged vectors' neighbours, whatever the search parameters. The
    check walks every rung, ends with an exact scan, and refuses with its recall."""
    noisy = VECTORS + 0.03 * np.random.default_rng(5).standard_normal(VECTORS.shape).astype(np.float32)
    noisy /= np.linalg.norm(noisy, axis=1, keepdims=True)
    with store(tmp_path, IDS, noisy, full_scan_threshold_kb=1) as version:
        run_dir = staged(tmp_path)
        with pytest.raises(IndexCheckError) as refused:
            check_index(version, V1, run_dir, queries=ROWS, min_recall=1.0)
        line = str(refused.value)
        match = re.fullmatch(rf"version {V1}: recall@10 (0\.\d{{4}}) < min_recall=1\.0 even by exact scan", line)
        assert match, line
        assert 0.5 < float(match.group(1)) < 1.0
        assert version.meta(V1).get("search") is None
        passed = check_index(version, V1, run_dir, queries=ROWS, min_recall=0.5)
    assert passed.search["hnsw_ef"] == 64 and passed.search["exact"] is False


def test_the_users_queries_and_opening_words_searches_are_measured_beside_the_stored_rows(tmp_path: Path) -> None:
    """Searches (a user's file, held-out texts' opening words) are no stored row: all 10 of their
    hits count, none is a canary. Vectors stored a little off the staged ones miss some of their
    neighbours, and the figure says so, for either kind of search alone; the same version with the
    right vectors finds them all."""
    queries, opening = embeddings(40, seed=7), embeddings(30, seed=8)
    with store(tmp_path, IDS, VECTORS, full_scan_threshold_kb=1) as version:
        run_dir = staged(tmp_path)
        validation = check_index(
            version, V1, run_dir, queries=50, min_recall=1.0, searches=Searches.of(DIM, opening, queries)
        )
    assert (validation.canaries, validation.user_queries, validation.opening_queries) == (50, 40, 30)
    assert validation.recall_at_10 == 1.0
    noisy = VECTORS + 0.03 * np.random.default_rng(5).standard_normal(VECTORS.shape).astype(np.float32)
    noisy /= np.linalg.norm(noisy, axis=1, keepdims=True)
    (tmp_path / "again").mkdir()
    with store(tmp_path / "again", IDS, noisy, full_scan_threshold_kb=1) as version:
        run_dir = staged(tmp_path / "again")
        for searches in (Searches.of(DIM, users=queries), Searches.of(DIM, opening)):
            with pytest.raises(IndexCheckError, match="even by exact scan"):
                check_index(version, V1, run_dir, queries=1, min_recall=1.0, searches=searches)


def test_with_the_exact_scan_off_a_version_short_of_recall_at_max_hnsw_ef_is_refused(tmp_path: Path) -> None:
    """An operator who would rather refuse a version than serve it by exact scan caps the ladder."""
    with store(tmp_path, IDS, VECTORS, full_scan_threshold_kb=1, hnsw_ef=1) as version:
        run_dir = staged(tmp_path)
        with pytest.raises(IndexCheckError, match=r"< min_recall=1\.0 at hnsw_ef 1 \(exact scan off\)$"):
            check_index(version, V1, run_dir, queries=ROWS, min_recall=1.0, max_ef=1, exact=False)
        assert version.meta(V1).get("search") is None


def test_a_graph_that_search_alone_cannot_take_to_min_recall_is_built_denser_the_next_night(tmp_path: Path) -> None:
    """A sparse graph searched with one candidate at most (max_ef=1) passes only by exact scan:
    the check asks the next build for twice the links and construction width, which the next
    version is built with; with the scan off the refusal says so too."""
    cache = WorkPath.of(tmp_path / "cache")
    sparse = GraphParams(m=4, ef_construct=8)
    with store(tmp_path, IDS, VECTORS, full_scan_threshold_kb=1, hnsw_ef=1, graph=sparse) as version:
        run_dir = staged(tmp_path)
        passed = check_index(version, V1, run_dir, queries=ROWS, min_recall=1.0, max_ef=1, cache=cache)
        assert passed.search["exact"] and passed.graph == asdict(sparse)
        assert passed.next_graph == {"m": 8, "ef_construct": 16} and next_graph(cache) == GraphParams(8, 16)
        (cache / GRAPH_FILE).unlink()
        with pytest.raises(IndexCheckError, match=r"the next build makes a denser graph \(m=8, ef_construct=16\)$"):
            check_index(version, V1, run_dir, queries=ROWS, min_recall=1.0, max_ef=1, exact=False, cache=cache)
        assert next_graph(cache) == GraphParams(8, 16)
    assert next_graph(tmp_path / "elsewhere") == GraphParams()


def staged_run(tmp_path: Path, name: str, ids: list[str], vectors: np.ndarray, keys: list[str]) -> WorkPath:
    """A run folder whose committed part holds rows as the embed job stages them (a content key
    each: what the load compares to find the rows a copy writes)."""
    run_dir = tmp_path / name
    run_dir.mkdir()
    pq.write_table(pa.table({"id": ids, KEY: keys, EMBEDDING: embeddings_column(vectors)}), run_dir / "part-0.parquet")
    commit(WorkPath.of(run_dir), [{"name": "part-0.parquet", "rows": len(ids), "computed": len(ids)}])
    return WorkPath.of(run_dir)


def copied_night(
    tmp_path: Path, moved: int, opening: np.ndarray, texts: list[str] | None = None
) -> tuple[QdrantEdgeStore, WorkPath, WorkPath]:
    """V1 loaded whole and checked (its searches `opening`, of `texts`), then V2 loaded as its
    copy: `moved` rows given new vectors (among them 5 copies of one vector, tied), 3 rows gone,
    4 new. (store, V1's run, V2's run)."""
    keys = [f"k-{i}" for i in range(ROWS)]
    opened = QdrantEdgeStore(VectorStoreSettings(path=tmp_path / "qdrant"), "docs", pointer_check_s=0)
    first = staged_run(tmp_path, "run-1", IDS, VECTORS, keys)
    load_version(opened, V1, first, {}, "none", None)
    check_index(opened, V1, first, queries=100, min_recall=0.9, searches=Searches.of(DIM, opening, texts=texts))
    vectors, ids = VECTORS.copy(), list(IDS)
    vectors[:moved] = embeddings(moved, seed=2)
    vectors[:5] = vectors[0]
    keys = [f"k2-{i}" if i < moved else k for i, k in enumerate(keys)]
    vectors, ids, keys = vectors[:-3], ids[:-3], keys[:-3]
    vectors, ids, keys = np.vstack([vectors, embeddings(4, seed=3)]), [*ids, *(f"new-{i}" for i in range(4))], [*keys, *"abcd"]
    second = staged_run(tmp_path, "run-2", ids, vectors, keys)
    loaded = load_version(opened, V2, second, {}, "none", (V1, first))
    assert (loaded.mode, loaded.written, loaded.deleted) == ("copy", moved + 4, 3)
    return opened, first, second


V2 = "20261102T031500-aa02"
OPENING = embeddings(20, seed=4)


def test_a_copys_check_updates_its_sources_exact_neighbours_with_the_rows_it_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No staged row is scored again: the copy's lists are its source's less the rows that left,
    plus the rows it wrote, and equal scoring every row (the K best within TIE, ties included);
    the source's queries whose own row moved leave the sample."""
    opened, first, second = copied_night(tmp_path, moved=15, opening=OPENING)
    source = pq.read_table((first / EXACT_FILE).path)
    monkeypatch.setattr(index_check, "exact_neighbours", None)  # a full scan would raise

    with opened:
        validation = check_index(
            opened, V2, second, queries=100, min_recall=0.9, searches=Searches.of(DIM, OPENING), copy_of=first
        )

    moved_own = sum(own is not None and int(own.split("-")[1]) < 15 for own in source["own"].to_pylist())
    assert validation.canaries == validation.canaries_found == 100 - moved_own
    assert 0 < moved_own <= 10 and validation.opening_queries == len(OPENING)
    monkeypatch.undo()
    saved = pq.read_table((second / EXACT_FILE).path)
    queries = embeddings_of(saved)
    full = index_check.exact_neighbours(committed_dataset(second), queries, saved["own"].to_pylist())
    for ids, scores, near in zip(saved["ids"].to_pylist(), saved["scores"].to_pylist(), full, strict=True):
        copied = Neighbours(dict(zip(ids, scores, strict=True)), 0.0)
        assert copied.floor == pytest.approx(near.floor, abs=1e-6)
        tied = {i for i, s in near.scores.items() if s >= near.floor - TIE}
        assert tied == {i for i, s in copied.scores.items() if s >= copied.floor - TIE}


@pytest.mark.parametrize(
    ("moved", "opening", "why"),
    [
        (15, embeddings(20, seed=5), "other searches than the source measured"),
        (45, OPENING, "more than a tenth of the source's sample moved"),
    ],
)
def test_a_copys_check_scores_every_row_again_when_its_sources_lists_do_not_serve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, moved: int, opening: np.ndarray, why: str
) -> None:
    opened, first, second = copied_night(tmp_path, moved=moved, opening=OPENING)
    scanned = []
    full = index_check.exact_neighbours
    monkeypatch.setattr(index_check, "exact_neighbours", lambda *a: scanned.append(1) or full(*a))
    with opened:
        validation = check_index(opened, V2, second, queries=100, min_recall=0.9, searches=Searches.of(DIM, opening), copy_of=first)
    assert scanned == [1], why
    assert validation.canaries == validation.canaries_found == 100


@pytest.mark.parametrize(("new", "scanned"), [(1, []), (3, [1])])
def test_a_copys_check_keeps_its_sources_searches_by_text_though_tonights_vectors_moved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, new: int, scanned: list[int]
) -> None:
    """A dynamically quantized engine's vector of a text moves with the texts batched beside it,
    and a night that edits one gate text moves the batches after it: tonight's searches of the
    source's texts are a little off its vectors. The copy keeps the source's searches by text,
    their vectors and lists, less those whose text is gone, while at most a tenth of tonight's
    texts are new (1 of 20); past that (3 of 20) every row is scored again."""
    texts = [f"opening words {i}" for i in range(len(OPENING))]
    opened, first, second = copied_night(tmp_path, moved=15, opening=OPENING, texts=texts)
    drifted = OPENING + 1e-3 * np.random.default_rng(9).standard_normal(OPENING.shape).astype(np.float32)
    tonight = texts[: len(texts) - new] + [f"a new text {i}" for i in range(new)]
    calls: list[int] = []
    full = index_check.exact_neighbours
    monkeypatch.setattr(index_check, "exact_neighbours", lambda *a: calls.append(1) or full(*a))
    with opened:
        validation = check_index(
            opened, V2, second, queries=100, min_recall=0.9, searches=Searches.of(DIM, drifted, texts=tonight), copy_of=first
        )
    assert calls == scanned
    saved = pq.read_table((second / EXACT_FILE).path)
    searches = embeddings_of(saved)[[own is None for own in saved["own"].to_pylist()]]
    if scanned:
        assert validation.opening_queries == len(OPENING) and np.allclose(searches, unit_rows(drifted))
    else:
        assert validation.opening_queries == len(OPENING) - new
        assert np.allclose(searches, unit_rows(OPENING[: len(OPENING) - new]), atol=1e-6)


def test_a_list_that_lost_more_than_its_depth_beyond_k_no_longer_knows_its_k_best() -> None:
    query = np.eye(1, DIM, dtype=np.float32)
    near = Neighbours({f"r{i}": 1.0 - i / 100 for i in range(20)}, 0.8 - TIE)
    lost = {f"r{i}" for i in range(11)}  # 9 of 20 left: the 10th best may be any row outside the list
    assert moved_neighbours([near], query, lost, [], np.empty((0, DIM), np.float32)) is None
    kept = moved_neighbours([near], query, lost - {"r0"}, [], np.empty((0, DIM), np.float32))
    assert kept is not None and kept[0].floor == pytest.approx(0.81)


def test_an_unchanged_nights_copy_carries_its_sources_check_unless_a_point_is_missing(tmp_path: Path) -> None:
    """A copy in which no point was written or deleted searches as its source: the source's
    figures and search parameters are carried, unmeasured, with its exact neighbours for the
    next copy, while tonight's check would be measured under the same conditions; a copy short
    of a staged row is refused; a source whose check was not kept, or was measured under
    another bar, ladder or searches, is measured again (None)."""
    keys = [f"k-{i}" for i in range(ROWS)]
    opened = QdrantEdgeStore(VectorStoreSettings(path=tmp_path / "qdrant"), "docs", pointer_check_s=0)
    first = staged_run(tmp_path, "run-1", IDS, VECTORS, keys)
    with opened:
        load_version(opened, V1, first, {}, "none", None)
        checked = check_index(opened, V1, first, queries=50, min_recall=0.9, start=SearchParams(hnsw_ef=128))
        second = staged_run(tmp_path, "run-2", IDS, VECTORS, keys)
        loaded = load_version(opened, V2, second, {}, "none", (V1, first), same_rows=True)
        tonight = checked_under(opened, 0.9, {"max_ef": 1024, "exact": True}, 50, (["opening"], None))
        assert carried_check(opened, V2, second, (V1, first), loaded.count, tonight) is None  # V1's not kept

        keep_check(first, checked, tonight)
        for other in (
            checked_under(opened, 0.99, {"max_ef": 1024, "exact": True}, 50, (["opening"], None)),
            checked_under(opened, 0.9, {"max_ef": 1, "exact": False}, 50, (["opening"], None)),
            checked_under(opened, 0.9, {"max_ef": 1024, "exact": True}, 50, (["opening"], ["a user's"])),
        ):
            assert carried_check(opened, V2, second, (V1, first), loaded.count, other) is None
        carried = carried_check(opened, V2, second, (V1, first), loaded.count, tonight)
        assert carried == replace(checked, carried_from=V1)
        assert opened.searched_with(V2) == SearchParams(**checked.search) == SearchParams(hnsw_ef=128)
        assert (second / EXACT_FILE).is_file()
        with pytest.raises(IndexCheckError, match=f"version {V2} holds {ROWS - 1} points, {ROWS} were staged"):
            carried_check(opened, V2, second, (V1, first), ROWS - 1, tonight)


def saved_asked(run_dir: WorkPath) -> index_check.Asked:
    saved = pq.read_table((run_dir / EXACT_FILE).path)
    neighbours = [
        Neighbours(dict(zip(ids, scores, strict=True)), bound)
        for ids, scores, bound in zip(*(saved[c].to_pylist() for c in ("ids", "scores", "bound")), strict=True)
    ]
    return index_check.Asked(embeddings_of(saved), saved["own"].to_pylist(), saved["search"].to_pylist(), neighbours)


def test_a_copys_check_searches_again_only_what_its_changes_touch(tmp_path: Path) -> None:
    """At its source's rung a copy's check searches the queries whose exact list or hits its
    changes touched, and a sample of the others, each of which finds what it found in the
    source; its figures are those of searching every query."""
    opened, first, second = copied_night(tmp_path, moved=5, opening=OPENING)
    with opened:
        validation = check_index(opened, V2, second, queries=100, min_recall=0.9, searches=Searches.of(DIM, OPENING), copy_of=first)
        asked = saved_asked(second)
        params = SearchParams(**validation.search)
        every, _ = index_check.measure(opened, V2, validation.count, asked, params, np.arange(len(asked.own)))

    assert validation.curve[0]["searched"] < len(asked.own)
    assert validation.recall_at_10 == round(sum(o.good for o in every) / sum(o.asked for o in every), 4)
    assert validation.canaries_found == sum(o.found is True for o in every) == validation.canaries


def test_a_copys_check_searches_every_query_when_one_it_would_carry_scores_otherwise(tmp_path: Path) -> None:
    """The source's outcomes are only carried while the sample of untouched queries scores as the
    source scored them: here the source's file says every search found nothing right."""
    opened, first, second = copied_night(tmp_path, moved=5, opening=OPENING)
    exact = (first / EXACT_FILE).path
    source = pq.read_table(exact)
    nothing = pa.array([0] * source.num_rows, pa.int32())
    pq.write_table(source.set_column(source.schema.get_field_index("good"), "good", nothing), exact)
    with opened:
        validation = check_index(opened, V2, second, queries=100, min_recall=0.9, searches=Searches.of(DIM, OPENING), copy_of=first)
    assert validation.curve[0]["searched"] == validation.canaries + validation.opening_queries


def test_a_copys_check_embeds_no_search_its_source_measured(tmp_path: Path) -> None:
    """A copy searches its source's vectors of tonight's texts: the engine is never opened."""
    texts = [f"opening words {i}" for i in range(len(OPENING))]
    opened, first, second = copied_night(tmp_path, moved=5, opening=OPENING, texts=texts)

    def embed() -> np.ndarray:
        raise AssertionError("a copy's check embedded its searches")

    with opened:
        validation = check_index(
            opened, V2, second, queries=100, min_recall=0.9, searches=Searches(len(texts), 0, texts, embed), copy_of=first
        )
    assert validation.opening_queries == len(texts)
