"""Checks a new vector-store version must pass before anyone can read it, and the search
parameters it is read with (the embeddings kind's).

Count: every staged row is in the version. Canaries: a stored vector's nearest neighbour is
itself (or an exact duplicate of it). Recall@10: held-out queries (the stored vectors of a
seeded sample of the input's rows, each leaving itself out of both answers; searches made of
held-out texts' opening words, which land between the stored points as users' searches do; and
the vectors of the user's own queries where the pipeline file names a file of them) searched in
the index against exact FP32 search over the same vectors.

The check tunes the version: it walks a ladder of search parameters, cheapest first (hnsw_ef
doubled up to max_hnsw_ef; INT8 versions then oversample more before the FP32 rescoring), and
records the first rung that reaches min_recall with the version, which readers then search
with (stores/vectors.py SearchParams). The last rung is an exact scan (unless exact_scan is
off): a version then fails only when even that misses, i.e. the load itself is broken. The
walked curve goes to the report. When no graph rung reached min_recall (the version passed by
scan, or was refused), the check asks the next build for a denser graph (stores/vectors.py
GraphParams.denser) in the output's cache folder: the next night's version is searched by its
graph again.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence, Set
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq

from precompute.jobs.embedding_cache import EMBEDDING, embeddings_column, embeddings_of
from precompute.jobs.staging import committed_dataset
from precompute.jobs.vector_load import CHANGES
from precompute.jobs.work_dir import WorkPath
from precompute.models.text_vectors import text_digest
from precompute.stores.vector_settings import QUANTIZED_OVERSAMPLING
from precompute.stores.vectors import GraphParams, Hit, SearchParams, VectorStore

K = 10
TIE = 1e-5
DEPTH = 2 * K
"""Rows a query's exact list keeps: a copy's check drops the rows that moved from its source's
lists, and a list still knows its K best while no more than DEPTH - K of its rows moved."""
KEPT_SAMPLE = 0.9
"""A copy's check draws its sample afresh once more than a tenth of its rows moved since it was
drawn (their queries leave the copies' checks one night at a time)."""
EXACT_FILE = "exact.parquet"
"""In a checked version's run folder: the check's queries, each search's key (search_keys) and
their Neighbours, which a copy of the version updates with the rows it changed
(jobs/vector_load.py CHANGES) instead of scoring every staged row again."""
EXACT_CHUNK = 32
"""Queries scored against a step's rows at once: bounds the [queries, rows] score matrix."""
READ_ROWS = 65_536
"""Staged rows read and scored per step: 96 MB of 384-d vectors, whatever the corpus's size."""
MAX_TIED = 4096
"""Hits a canary's search asks for at most while every hit ties with the best (exact duplicates
of its row: bench scale's 1M corpus repeats some texts more than K + 1 times)."""


class IndexCheckError(Exception):
    """The new version is not fit to publish; the current version stays."""


@dataclass(frozen=True)
class Validation:
    count: int
    canaries: int
    canaries_found: int
    recall_at_10: float
    user_queries: int = 0
    """Of the queries measured, those from the user's queries file."""
    opening_queries: int = 0
    """Of the queries measured, those made of held-out texts' opening words."""
    search: dict[str, Any] = field(default_factory=dict)
    """The SearchParams recorded with the version."""
    curve: list[dict[str, Any]] = field(default_factory=list)
    """Each rung walked: its params, recall@10, median and 99th-percentile search ms in this process."""
    graph: dict[str, Any] = field(default_factory=dict)
    """The GraphParams the version was built with."""
    next_graph: dict[str, Any] | None = None
    """The denser graph asked of the next build, when this one's search alone fell short."""
    carried_from: str | None = None
    """The version whose check an unchanged night's copy carries, unmeasured (jobs/carried_check.py)."""


GRAPH_FILE = "graph.json"
"""In the output's cache folder: the GraphParams the next build makes."""


def next_graph(cache: WorkPath) -> GraphParams:
    """The graph the next version is built with: the default until a check asked for denser."""
    asked = cache / GRAPH_FILE
    return GraphParams(**json.loads(asked.read_text())) if asked.is_file() else GraphParams()


def ask_denser(cache: WorkPath, built: GraphParams) -> GraphParams:
    denser = built.denser()
    (cache / GRAPH_FILE).write_text(json.dumps(asdict(denser)))
    return denser


@dataclass(frozen=True)
class Neighbours:
    """A query's exact neighbours among the staged rows, its own row left out: every row scoring
    at least `bound`, which lies at or below the K-th best less TIE."""

    scores: dict[str, float]
    """Exact cosine by id."""
    bound: float
    """Every row not in `scores` scores below it: the DEPTH-th best less TIE after a full scan;
    -inf where fewer than DEPTH rows are there (all of them are in `scores`)."""

    @cached_property
    def floor(self) -> float:
        """The K-th best cosine; -inf where fewer than K rows are there to rank. Cached: measure
        compares every hit of every rung with it."""
        return sorted(self.scores.values(), reverse=True)[K - 1] if len(self.scores) >= K else -np.inf


def exact_neighbours(parts: pads.Dataset, queries: np.ndarray, own: list[str | None]) -> list[Neighbours]:
    """Each query's Neighbours, READ_ROWS staged rows at a time: no process holds every vector.
    Rows below a query's DEPTH-th best so far, less TIE, cannot be within TIE of its final
    DEPTH-th best (more rows only raise it), so they are dropped as each step is scored."""
    best = [np.empty(0, np.float32) for _ in queries]
    named = [np.empty(0, object) for _ in queries]
    floor = np.full(len(queries), -np.inf, np.float32)
    asked = {mine: q for q, mine in enumerate(own) if mine is not None}
    for batch in parts.to_batches(columns=["id", EMBEDDING], batch_size=READ_ROWS):
        if not batch.num_rows:
            continue
        table = pa.Table.from_batches([batch])
        ids = np.array([str(i) for i in table["id"].to_pylist()], dtype=object)
        unit = unit_rows(embeddings_of(table))
        mine = [(asked[i], row) for row, i in enumerate(ids) if i in asked]  # stored rows' own queries
        for start in range(0, len(queries), EXACT_CHUNK):
            scores = queries[start : start + EXACT_CHUNK] @ unit.T
            for q, row in mine:
                if start <= q < start + len(scores):
                    scores[q - start, row] = -np.inf  # a stored row's query leaves itself out
            if len(ids) >= DEPTH:
                step = -np.partition(-scores, DEPTH - 1, axis=1)[:, DEPTH - 1]
            else:
                step = np.full(len(scores), -np.inf)
            for j, row_scores in enumerate(scores):
                q = start + j
                kept = np.flatnonzero(row_scores >= max(floor[q], step[j]) - TIE)
                merged, names = np.concatenate([best[q], row_scores[kept]]), np.concatenate([named[q], ids[kept]])
                if len(merged) >= DEPTH:
                    floor[q] = -np.partition(-merged, DEPTH - 1)[DEPTH - 1]
                near = merged >= floor[q] - TIE
                best[q], named[q] = merged[near], names[near]
    return [
        Neighbours(dict(zip(names.tolist(), scores.tolist(), strict=True)), float(bottom - TIE))
        for scores, names, bottom in zip(best, named, floor, strict=True)
    ]


def moved_neighbours(
    before: list[Neighbours], queries: np.ndarray, removed: Set[str], ids: list[str], vectors: np.ndarray
) -> list[Neighbours] | None:
    """Each query's Neighbours once the rows `removed` left and the rows `ids` (unit `vectors`)
    came, from its Neighbours before: rows outside a list scored below its bound and still do.
    None where some list no longer knows its K best within TIE (too many of its rows left)."""
    scores = queries @ vectors.T
    after = []
    for near, row in zip(before, scores, strict=True):
        kept = {i: s for i, s in near.scores.items() if i not in removed}
        kept.update((ids[j], float(row[j])) for j in np.flatnonzero(row >= near.bound))
        ranked = sorted(kept.values(), reverse=True)
        known = ranked[K - 1] - TIE >= near.bound if len(ranked) >= K else near.bound == -np.inf
        if not known:
            return None
        bound = max(near.bound, ranked[DEPTH - 1] - TIE) if len(ranked) >= DEPTH else near.bound
        after.append(Neighbours({i: s for i, s in kept.items() if s >= bound}, bound))
    return after


def search_keys(searches: np.ndarray, texts: Sequence[str] | None) -> list[str]:
    """What names a search from night to night: its text's digest where the caller gives the texts
    (dynamic INT8 moves a text's vector with the texts batched beside it), else its vector's."""
    if texts is None:
        return [hashlib.sha256(vector.tobytes()).hexdigest()[:32] for vector in searches]
    if len(texts) != len(searches):
        raise ValueError(f"{len(texts)} search texts for {len(searches)} searches")
    return [text_digest(text) for text in texts]


def save_neighbours(run_dir: WorkPath, asked: Asked) -> None:
    """The check's queries (their vectors as EMBEDDING), search keys and Neighbours, for a copy of
    this version (EXACT_FILE)."""
    queries, own, keys, neighbours = asked
    table = pa.table(
        {
            EMBEDDING: embeddings_column(queries),
            "own": pa.array(own, pa.string()),
            "search": pa.array(keys, pa.string()),
            "ids": pa.array([list(n.scores) for n in neighbours], pa.list_(pa.string())),
            "scores": pa.array([list(n.scores.values()) for n in neighbours], pa.list_(pa.float64())),
            "bound": pa.array([n.bound for n in neighbours], pa.float64()),
        }
    )
    with (run_dir / EXACT_FILE).replaced() as tmp:
        pq.write_table(table, tmp.path, filesystem=tmp.fs)


class Asked(NamedTuple):
    """The check's queries: the stored rows' vectors (each row's id in `own`) and the searches'
    (own None; `keys` their search_keys, None for a row), with their exact Neighbours."""

    queries: np.ndarray
    own: list[str | None]
    keys: list[str | None]
    neighbours: list[Neighbours]


def copied_neighbours(source_dir: WorkPath, run_dir: WorkPath, keys: list[str]) -> Asked | None:
    """A copy's queries: its source version's check updated with the copy's CHANGES, less the
    rows that moved and the searches that are not among today's (`keys`), whose vectors are the
    source's. None where either file is missing, fewer than KEPT_SAMPLE of today's searches are
    among the source's, or a list lost its K best."""
    exact, changes = source_dir / EXACT_FILE, run_dir / CHANGES
    if not (exact.is_file() and changes.is_file()):
        return None
    before = pq.read_table(exact.path, filesystem=exact.fs)
    if "search" not in before.column_names:
        return None
    moved = pq.read_table(changes.path, filesystem=changes.fs)
    queries, own, named = embeddings_of(before), before["own"].to_pylist(), before["search"].to_pylist()
    today = set(keys)
    if sum(key in today for key in named) < KEPT_SAMPLE * len(today):
        return None
    removed = {str(i) for i in moved["id"].to_pylist()}
    keep = [key in today if mine is None else mine not in removed for mine, key in zip(own, named, strict=True)]
    columns = (before[name].to_pylist() for name in ("ids", "scores", "bound"))
    lists = [
        Neighbours(dict(zip(ids, scores, strict=True)), bound)
        for ids, scores, bound, kept in zip(*columns, keep, strict=True)
        if kept
    ]
    added = moved.filter(pc.is_valid(moved[EMBEDDING]))
    vectors = unit_rows(embeddings_of(added))
    neighbours = moved_neighbours(lists, queries[keep], removed, added["id"].to_pylist(), vectors)
    if neighbours is None:
        return None
    kept = [(mine, key) for mine, key, k in zip(own, named, keep, strict=True) if k]
    return Asked(queries[keep], [mine for mine, _ in kept], [key for _, key in kept], neighbours)


def asked_neighbours(
    parts: pads.Dataset,
    staged: int,
    run_dir: WorkPath,
    queries: int,
    searches: np.ndarray,
    keys: list[str],
    copy_of: WorkPath | None,
) -> Asked:
    """The check's queries (a seeded sample of `queries` staged rows, then `searches`, named by
    `keys`) and their exact Neighbours: a copy's from its source's (copied_neighbours) while
    KEPT_SAMPLE of a full sample is left, else by scoring every staged row."""
    copied = None if copy_of is None else copied_neighbours(copy_of, run_dir, keys)
    sample = min(queries, staged)
    if copied is not None and sum(mine is not None for mine in copied.own) >= KEPT_SAMPLE * sample:
        return copied
    rows = np.random.default_rng(0).choice(staged, size=sample, replace=False)
    drawn = parts.take(pa.array(rows), columns=["id", EMBEDDING])
    asked = np.vstack([unit_rows(embeddings_of(drawn)), searches])
    own = [str(i) for i in drawn["id"].to_pylist()] + [None] * len(searches)
    return Asked(asked, own, [None] * sample + keys, exact_neighbours(parts, asked, own))


def ladder(start: SearchParams, max_ef: int, exact: bool) -> list[SearchParams]:
    """Cheapest first: the store's default, hnsw_ef doubled up to `max_ef`, more oversampling
    (INT8 versions; the others search the same with it), an exact scan where allowed."""
    rungs, ef = [start], start.hnsw_ef
    while ef < max_ef:
        ef = min(ef * 2, max_ef)
        rungs.append(SearchParams(ef, start.oversampling))
    more = SearchParams(ef, 2 * max(start.oversampling, QUANTIZED_OVERSAMPLING))
    return [*rungs, more, *([SearchParams(ef, more.oversampling, exact=True)] if exact else [])]


def unit_rows(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)


def measure(
    store: VectorStore, version: str, count: int, queries: np.ndarray, own: list[str | None],
    neighbours: list[Neighbours], params: SearchParams,
) -> tuple[float, int, float, float]:
    """(recall@10, canaries found, median ms, 99th percentile ms). A hit is right when its staged
    vector's exact cosine to the query reaches the K-th best one: ties among duplicates are not
    misses, and a point stored under a wrong vector is. A stored row's query is also its canary."""
    found, good, asked, times = 0, 0, 0, []
    for query, mine, near in zip(queries, own, neighbours, strict=True):
        k = min(K, count - (mine is not None))
        start = time.perf_counter()
        hits = store.search(query, k + (mine is not None), version=version, params=params)
        times.append(time.perf_counter() - start)
        if mine is not None:
            found += own_hit(store, version, params, query, mine, hits, k + 1)
        others = [h.id for h in hits if h.id != mine][:k]
        good += sum(near.scores.get(hit, -np.inf) >= near.floor - TIE for hit in others)
        asked += k
    median, p99 = np.percentile(times, [50, 99]) * 1000
    return (good / asked if asked else 1.0), found, float(median), float(p99)


def own_hit(
    store: VectorStore, version: str, params: SearchParams, query: np.ndarray, mine: str, hits: list[Hit], asked: int
) -> bool:
    """Whether the row `mine`, whose stored vector `query` is, is among the `asked` hits that tie
    with the best: its own point, or behind its exact duplicates. Where every hit ties, there may
    be more duplicates than hits: the search is asked again 4x deeper, up to MAX_TIED hits."""
    while hits:
        tied = {h.id for h in hits if h.score >= hits[0].score - TIE}
        if mine in tied or len(tied) < asked or 4 * asked > MAX_TIED:
            return mine in tied
        asked *= 4
        hits = store.search(query, asked, version=version, params=params)
    return False


def check_index(
    store: VectorStore,
    version: str,
    run_dir: WorkPath,
    queries: int,
    min_recall: float,
    user_queries: np.ndarray | None = None,
    opening_queries: np.ndarray | None = None,
    search_texts: Sequence[str] | None = None,
    max_ef: int = 1024,
    exact: bool = True,
    cache: WorkPath | None = None,
    start: SearchParams | None = None,
    copy_of: WorkPath | None = None,
) -> Validation:
    """The version's figures at the first rung of the ladder that passes, whose params are then
    recorded with the version; IndexCheckError if none does. `user_queries`, `opening_queries`:
    vectors of the searches users make and of held-out texts' opening words, measured beside the
    sampled rows; `search_texts`: their texts, opening words first (search_keys). `max_ef`,
    `exact`: the ladder's limits (VectorStoreSettings.max_hnsw_ef, exact_scan). `cache`: the
    output's cache folder, where a denser graph is asked of the next build if no graph rung
    passes. `start`: the rung the walk begins at, where not the store's default: a copy's source
    version's (the copy holds its graph, where the rungs below fell short), unless that was an
    exact scan or lies outside today's ladder (below the store's default hnsw_ef, above
    `max_ef`). `copy_of`: that source's run folder, whose check's exact neighbours the copy
    updates with the rows it changed (copied_neighbours), where it can, instead of scoring
    every staged row."""
    built = GraphParams.of(store.meta(version))
    parts = committed_dataset(run_dir)
    staged, count = parts.count_rows(), store.count(version)
    if count != staged:
        raise IndexCheckError(f"version {version} holds {count} points, {staged} were staged")
    dim = parts.schema.field(EMBEDDING).type.list_size
    searched = [q for q in (opening_queries, user_queries) if q is not None]
    searches = unit_rows(np.vstack([np.empty((0, dim), np.float32), *searched]))
    keys = search_keys(searches, search_texts)
    opening_keys = set(keys[: 0 if opening_queries is None else len(opening_queries)])
    checked = asked_neighbours(parts, staged, run_dir, queries, searches, keys, copy_of)
    save_neighbours(run_dir, checked)
    asked, own, neighbours = checked.queries, checked.own, checked.neighbours
    opening = sum(key in opening_keys for key in checked.keys)
    canaries = sum(mine is not None for mine in own)
    curve: list[dict[str, Any]] = []
    default = store.default_search
    within = start is not None and not start.exact and default.hnsw_ef <= start.hnsw_ef <= max_ef
    first = start if within else default
    for params in ladder(first, max_ef, exact):
        recall, found, ms, p99 = measure(store, version, count, asked, own, neighbours, params)
        curve.append({**asdict(params), "recall_at_10": round(recall, 4), "median_ms": round(ms, 3), "p99_ms": round(p99, 3)})
        if found == canaries and recall >= min_recall:
            store.record_search(version, params)
            denser = ask_denser(cache, built) if params.exact and cache is not None else None
            users = len(own) - canaries - opening
            return Validation(
                count, canaries, found, round(recall, 4), users, opening, asdict(params), curve, asdict(built),
                None if denser is None else asdict(denser),
            )
    asked = ""
    if not exact and cache is not None:  # without a scan, the graph is all search has
        denser = ask_denser(cache, built)
        asked = f"; the next build makes a denser graph (m={denser.m}, ef_construct={denser.ef_construct})"
    if found < canaries:
        raise IndexCheckError(f"version {version}: {canaries - found} of {canaries} canaries not found{asked}")
    reached = "even by exact scan" if exact else f"at hnsw_ef {max_ef} (exact scan off)"
    raise IndexCheckError(f"version {version}: recall@10 {recall:.4f} < min_recall={min_recall} {reached}{asked}")
