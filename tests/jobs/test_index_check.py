"""The checks an embeddings version passes before it is published (jobs/index_check.py), on a real
qdrant-edge store: a whole version passes with its figures, and each refusal names what failed.

Vectors are unit vectors around topics, like a corpus's embeddings. Below the store's full-scan
threshold a search is exact, so recall is 1.0 there; the approximate index is forced by a 1 KB
threshold and a one-candidate search (hnsw_ef=1).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from precompute.jobs.embedding_cache import EMBEDDING, embeddings_column
from precompute.jobs.index_check import IndexCheckError, Validation, check_index
from precompute.jobs.staging import commit
from precompute.stores.qdrant_edge_store import QdrantEdgeStore
from precompute.stores.vector_settings import VectorStoreSettings

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


def staged(tmp_path: Path, vectors: np.ndarray = VECTORS) -> Path:
    """A run directory whose committed part holds what the job embedded."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    pq.write_table(pa.table({"id": IDS, EMBEDDING: embeddings_column(vectors)}), run_dir / "part-0.parquet")
    commit(run_dir, [{"name": "part-0.parquet", "rows": ROWS, "computed": ROWS}])
    return run_dir


def store(tmp_path: Path, ids: list[str], vectors: np.ndarray, **settings: object) -> QdrantEdgeStore:
    """The version as the store holds it, which a faulty write can make differ from the staged rows."""
    opened = QdrantEdgeStore(
        VectorStoreSettings(path=tmp_path / "qdrant", **settings), "docs", pointer_check_s=0
    )
    opened.create_version(V1, DIM)
    opened.upsert(V1, ids, vectors, [{} for _ in ids])
    opened.finalize(V1)
    return opened


def test_a_whole_version_passes_with_its_figures(tmp_path: Path) -> None:
    with store(tmp_path, IDS, VECTORS) as version:
        assert check_index(version, V1, staged(tmp_path), queries=50, min_recall=1.0) == Validation(
            count=ROWS, canaries=50, canaries_found=50, recall_at_10=1.0
        )


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
    """Two rows with the same vector: either id first is its query's answer (a tie)."""
    duplicated = VECTORS.copy()
    duplicated[1] = duplicated[0]
    with store(tmp_path, IDS, duplicated) as version:
        validation = check_index(version, V1, staged(tmp_path, duplicated), queries=ROWS, min_recall=1.0)
    assert validation.canaries_found == ROWS


def test_recall_below_its_minimum_is_refused_with_the_figure(tmp_path: Path) -> None:
    """The graph searched with one candidate misses neighbours, though each canary finds itself.
    A minimum equal to the recall reached passes: the refusal is below it, not at it."""
    approximate = {"full_scan_threshold_kb": 1, "hnsw_ef": 1}
    with store(tmp_path, IDS, VECTORS, **approximate) as version:
        run_dir = staged(tmp_path)
        with pytest.raises(IndexCheckError) as refused:
            check_index(version, V1, run_dir, queries=ROWS, min_recall=1.0)
        line = str(refused.value)
        match = re.fullmatch(rf"version {V1}: recall@10 (0\.\d{{4}}) < min_recall=1\.0", line)
        assert match, line
        recall = round(float(match.group(1)) * 10 * ROWS) / (10 * ROWS)  # neighbours found of 10 per query
        assert 0.3 < recall < 1.0
        exact = np.argsort(-(VECTORS @ VECTORS.T), axis=1)[:, :10]
        found = [{h.id for h in version.search(v, 10, version=V1)} for v in VECTORS]
        assert recall == sum(len(f & {IDS[i] for i in e}) for f, e in zip(found, exact, strict=True)) / (
            10 * ROWS
        )
        reached = check_index(version, V1, run_dir, queries=ROWS, min_recall=recall)
        above = check_index(version, V1, run_dir, queries=ROWS, min_recall=0.3)
    assert (
        reached
        == above
        == Validation(count=ROWS, canaries=ROWS, canaries_found=ROWS, recall_at_10=round(recall, 4))
    )
