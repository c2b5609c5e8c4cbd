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
with (stores/vectors/store.py SearchParams). The last rung is an exact scan (unless exact_scan is
off): a version then fails only when even that misses, i.e. the load itself is broken. The
walked curve goes to the report. When no graph rung reached min_recall (the version passed by
scan, or was refused), the check asks the next build for a denser graph (stores/vectors/store.py
GraphParams.denser) in the output's cache folder: the next night's version is searched by its
graph again.

A copy of a checked version (jobs/vectors/load.py) holds its source's graph and the rows it
changed: its check takes the source's queries and exact neighbours updated with those rows
(jobs/vectors/check_sample.py), and at the source's rung searches again only the queries the changes
touch, with a sample of the others that must find what they found in the source: a fraction of
the searches on a night that changed a few rows (`precompute bench scale` times the rerun's check).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads

from precompute.jobs.staging import committed_dataset
from precompute.jobs.text.embedding_cache import EMBEDDING, embeddings_of
from precompute.jobs.vectors.check_sample import (
    KEPT_SAMPLE,
    Asked,
    Carried,
    Outcome,
    Searches,
    copied_neighbours,
    save_checked,
)
from precompute.jobs.vectors.exact_neighbours import TIE, K, exact_neighbours, unit_rows
from precompute.jobs.work_dir import WorkPath
from precompute.stores.vectors.settings import QUANTIZED_OVERSAMPLING
from precompute.stores.vectors.store import GraphParams, Hit, SearchParams, VectorStore

MAX_TIED = 4096
"""Hits a canary's search asks for at most while every hit ties with the best (exact duplicates
of its row: bench scale's 1M corpus repeats some texts more than K + 1 times)."""
CONFIRMED_SHARE, MIN_CONFIRMED = 0.1, 20
"""A copy's check searches again this share of the queries its changes do not touch (at least
MIN_CONFIRMED, at most all of them): each must score as it scored in the source, or every query
is searched again."""


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
    """The version whose check an unchanged night's copy carries, unmeasured (jobs/vectors/carried_check.py)."""


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


def asked_neighbours(
    parts: pads.Dataset,
    staged: int,
    run_dir: WorkPath,
    queries: int,
    searches: Searches,
    keys: list[str],
    copy_of: WorkPath | None,
) -> tuple[Asked, Carried | None]:
    """The check's queries (a seeded sample of `queries` staged rows, then `searches`, named by
    `keys`) and their exact Neighbours: a copy's from its source's (copied_neighbours, with the
    source's outcomes it may carry) while KEPT_SAMPLE of a full sample is left, else by scoring
    every staged row."""
    copied = None if copy_of is None else copied_neighbours(copy_of, run_dir, keys)
    sample = min(queries, staged)
    if copied is not None and sum(mine is not None for mine in copied[0].own) >= KEPT_SAMPLE * sample:
        return copied
    rows = np.random.default_rng(0).choice(staged, size=sample, replace=False)
    drawn = parts.take(pa.array(rows), columns=["id", EMBEDDING])
    asked = np.vstack([unit_rows(embeddings_of(drawn)), searches.vectors])
    own = [str(i) for i in drawn["id"].to_pylist()] + [None] * len(keys)
    return Asked(asked, own, [None] * sample + keys, exact_neighbours(parts, asked, own)), None


def ladder(start: SearchParams, max_ef: int, exact: bool) -> list[SearchParams]:
    """Cheapest first: the store's default, hnsw_ef doubled up to `max_ef`, more oversampling
    (INT8 versions; the others search the same with it), an exact scan where allowed."""
    rungs, ef = [start], start.hnsw_ef
    while ef < max_ef:
        ef = min(ef * 2, max_ef)
        rungs.append(SearchParams(ef, start.oversampling))
    more = SearchParams(ef, 2 * max(start.oversampling, QUANTIZED_OVERSAMPLING))
    return [*rungs, more, *([SearchParams(ef, more.oversampling, exact=True)] if exact else [])]


def measure(
    store: VectorStore, version: str, count: int, asked: Asked, params: SearchParams, which: np.ndarray
) -> tuple[list[Outcome], list[float]]:
    """The queries at `which` searched at `params`: each one's Outcome, and each search's seconds.
    A hit is right when its staged vector's exact cosine to the query reaches the K-th best one:
    ties among duplicates are not misses, and a point stored under a wrong vector is. A stored
    row's query is also its canary."""
    outcomes, times = [], []
    for q in which:
        query, mine, near = asked.queries[q], asked.own[q], asked.neighbours[q]
        k = min(K, count - (mine is not None))
        start = time.perf_counter()
        hits = store.search(query, k + (mine is not None), version=version, params=params)
        times.append(time.perf_counter() - start)
        found = None if mine is None else own_hit(store, version, params, query, mine, hits, k + 1)
        others = [h.id for h in hits if h.id != mine][:k]
        right = near.right()
        good = sum(hit in right for hit in others)
        outcomes.append(Outcome(others, int(good), k, found))
    return outcomes, times


def carried_outcomes(
    store: VectorStore, version: str, count: int, asked: Asked, carried: Carried
) -> tuple[list[Outcome], list[float]] | None:
    """A copy's Outcomes at its source's rung: the queries its changes touch searched again, the
    others carried from the source once a seeded sample of them (CONFIRMED_SHARE) scored as it
    scored there (as many right hits, its canary found alike; exact duplicates may swap places);
    None where one did not (a deleted point may reroute a graph walk), and every query is then
    searched."""
    untouched = np.flatnonzero(~carried.touched)
    confirm = min(len(untouched), max(MIN_CONFIRMED, math.ceil(CONFIRMED_SHARE * len(untouched))))
    sample = np.sort(np.random.default_rng(0).choice(untouched, confirm, replace=False))
    confirmed, times = measure(store, version, count, asked, carried.params, sample)
    source = [carried.outcomes[q] for q in sample]
    if any((o.good, o.asked, o.found) != (s.good, s.asked, s.found) for o, s in zip(confirmed, source, strict=True)):
        return None
    touched = np.flatnonzero(carried.touched)
    searched, more = measure(store, version, count, asked, carried.params, touched)
    outcomes = list(carried.outcomes)
    for q, outcome in zip(touched, searched, strict=True):
        outcomes[q] = outcome
    return outcomes, times + more


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
    searches: Searches | None = None,
    max_ef: int = 1024,
    exact: bool = True,
    cache: WorkPath | None = None,
    start: SearchParams | None = None,
    copy_of: WorkPath | None = None,
    count: int | None = None,
) -> Validation:
    """The version's figures at the first rung of the ladder that passes, whose params are then
    recorded with the version; IndexCheckError if none does. `searches`: held-out texts' opening
    words and the searches users make, measured beside the sampled rows. `max_ef`,
    `exact`: the ladder's limits (VectorStoreSettings.max_hnsw_ef, exact_scan). `cache`: the
    output's cache folder, where a denser graph is asked of the next build if no graph rung
    passes. `start`: the rung the walk begins at, where not the store's default: a copy's source
    version's (the copy holds its graph, where the rungs below fell short), unless that was an
    exact scan or lies outside today's ladder (below the store's default hnsw_ef, above
    `max_ef`). `copy_of`: that source's run folder, whose check's exact neighbours the copy
    updates with the rows it changed (copied_neighbours), where it can, instead of scoring
    every staged row, and whose searches its changes do not touch it carries at the source's
    rung (carried_outcomes). `count`: the version's points as its load counted them (else
    counted here)."""
    built = GraphParams.of(store.meta(version))
    parts = committed_dataset(run_dir)
    staged = parts.count_rows()
    count = store.count(version) if count is None else count
    if count != staged:
        raise IndexCheckError(f"version {version} holds {count} points, {staged} were staged")
    searches = searches or Searches.of(parts.schema.field(EMBEDDING).type.list_size)
    keys = searches.keys()
    opening_keys = set(keys[: searches.opening])
    checked, carried = asked_neighbours(parts, staged, run_dir, queries, searches, keys, copy_of)
    own = checked.own
    opening = sum(key in opening_keys for key in checked.keys)
    canaries = sum(mine is not None for mine in own)
    curve: list[dict[str, Any]] = []
    default = store.default_search
    within = start is not None and not start.exact and default.hnsw_ef <= start.hnsw_ef <= max_ef
    first = start if within else default
    for params in ladder(first, max_ef, exact):
        got = None
        if carried is not None and params == carried.params:
            got = carried_outcomes(store, version, count, checked, carried)
        outcomes, times = got or measure(store, version, count, checked, params, np.arange(len(own)))
        asked = sum(o.asked for o in outcomes)
        recall = sum(o.good for o in outcomes) / asked if asked else 1.0
        found = sum(o.found is True for o in outcomes)
        ms, p99 = np.percentile(times, [50, 99]) * 1000 if times else (0.0, 0.0)
        curve.append(
            {**asdict(params), "recall_at_10": round(recall, 4), "median_ms": round(ms, 3), "p99_ms": round(p99, 3),
             "searched": len(times)}
        )
        if found == canaries and recall >= min_recall:
            save_checked(run_dir, checked, params, outcomes)
            store.record_search(version, params)
            denser = ask_denser(cache, built) if params.exact and cache is not None else None
            users = len(own) - canaries - opening
            return Validation(
                count, canaries, found, round(recall, 4), users, opening, asdict(params), curve, asdict(built),
                None if denser is None else asdict(denser),
            )
    shown = ""
    if not exact and cache is not None:  # without a scan, the graph is all search has
        denser = ask_denser(cache, built)
        shown = f"; the next build makes a denser graph (m={denser.m}, ef_construct={denser.ef_construct})"
    if found < canaries:
        raise IndexCheckError(f"version {version}: {canaries - found} of {canaries} canaries not found{shown}")
    reached = "even by exact scan" if exact else f"at hnsw_ef {max_ef} (exact scan off)"
    raise IndexCheckError(f"version {version}: recall@10 {recall:.4f} < min_recall={min_recall} {reached}{shown}")
