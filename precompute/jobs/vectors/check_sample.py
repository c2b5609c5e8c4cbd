"""The index check's queries, kept with a checked version (EXACT_FILE): their vectors, search keys,
exact neighbours and what each search found at the rung the check chose (its Searches' keys
name the searches from night to night). A copy of the version
(jobs/vectors/load.py) updates them with the rows it changed (CHANGES) instead of scoring every
staged row again, and searches again only the queries its changes can touch (`touched`): the
others carry the source's outcome, which jobs/vectors/index_check.py confirms on a sample of them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from functools import cached_property
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from precompute.jobs.text.embedding_cache import EMBEDDING, embeddings_column, embeddings_of
from precompute.jobs.vectors.exact_neighbours import Neighbours, moved_neighbours, unit_rows
from precompute.jobs.vectors.load import CHANGES
from precompute.jobs.work_dir import WorkPath
from precompute.models.text.kept_vectors import text_digest
from precompute.stores.vectors.store import SearchParams

KEPT_SAMPLE = 0.9
"""A copy's check draws its sample afresh once more than a tenth of its rows moved since it was
drawn (their queries leave the copies' checks one night at a time)."""
EXACT_FILE = "exact.parquet"
"""In a checked version's run folder: the check's queries, each search's key (Searches.keys), their
Neighbours and Outcomes at the chosen rung (its SearchParams in the file's metadata, RUNG)."""
RUNG = b"rung"


class Outcome(NamedTuple):
    """One query's search at a rung: the ids it returned (its own row left out, at most K), how
    many of them are among its exact K best (ties counted), of how many asked, and for a stored
    row's query whether its row was found (its canary)."""

    hits: list[str]
    good: int
    asked: int
    found: bool | None


class Asked(NamedTuple):
    """The check's queries: the stored rows' vectors (each row's id in `own`) and the searches'
    (own None; `keys` their Searches.keys, None for a row), with their exact Neighbours."""

    queries: np.ndarray
    own: list[str | None]
    keys: list[str | None]
    neighbours: list[Neighbours]


class Carried(NamedTuple):
    """What a copy's check may carry of its source's: each kept query's Outcome at the source's
    rung (`params`), and whether the copy's changes touch it (the rows a hit must be to count
    as right are others now, or a row of its hits moved): a touched query is searched again."""

    params: SearchParams
    outcomes: list[Outcome]
    touched: np.ndarray


@dataclass
class Searches:
    """The check's searches beyond its stored rows, held-out texts' opening words first, then the
    user's queries: how many of each, their texts (None: each is named by its vector), and their
    vectors, embedded on first use: a copy's check searches its source's vectors of the same
    texts and embeds none."""

    opening: int
    users: int
    texts: Sequence[str] | None
    embed: Callable[[], np.ndarray]
    """Their vectors, in order (unit or not)."""

    def __post_init__(self) -> None:
        if self.texts is not None and len(self.texts) != self.opening + self.users:
            raise ValueError(f"{len(self.texts)} search texts for {self.opening + self.users} searches")

    @classmethod
    def of(
        cls, dim: int, opening: np.ndarray | None = None, users: np.ndarray | None = None,
        texts: Sequence[str] | None = None,
    ) -> Searches:
        """Searches of `dim` dimensions whose vectors are at hand."""
        vectors = np.vstack([np.empty((0, dim), np.float32), *(q for q in (opening, users) if q is not None)])
        return cls(0 if opening is None else len(opening), 0 if users is None else len(users), texts, lambda: vectors)

    @cached_property
    def vectors(self) -> np.ndarray:
        return unit_rows(self.embed())

    def keys(self) -> list[str]:
        """What names a search from night to night: its text's digest where the texts are given
        (dynamic INT8 moves a text's vector with the texts batched beside it), else its vector's."""
        if self.texts is None:
            return [hashlib.sha256(vector.tobytes()).hexdigest()[:32] for vector in self.vectors]
        return [text_digest(text) for text in self.texts]


def save_checked(run_dir: WorkPath, asked: Asked, params: SearchParams, outcomes: list[Outcome]) -> None:
    """The check's queries (their vectors as EMBEDDING), search keys, Neighbours and Outcomes at
    `params`, the rung it chose, for a copy of this version (EXACT_FILE)."""
    queries, own, keys, neighbours = asked
    table = pa.table(
        {
            EMBEDDING: embeddings_column(queries),
            "own": pa.array(own, pa.string()),
            "search": pa.array(keys, pa.string()),
            "ids": pa.array([list(n.scores) for n in neighbours], pa.list_(pa.string())),
            "scores": pa.array([list(n.scores.values()) for n in neighbours], pa.list_(pa.float64())),
            "bound": pa.array([n.bound for n in neighbours], pa.float64()),
            "hits": pa.array([o.hits for o in outcomes], pa.list_(pa.string())),
            "good": pa.array([o.good for o in outcomes], pa.int32()),
            "asked": pa.array([o.asked for o in outcomes], pa.int32()),
            "found": pa.array([o.found for o in outcomes], pa.bool_()),
        }
    ).replace_schema_metadata({RUNG: json.dumps(asdict(params)).encode()})
    with (run_dir / EXACT_FILE).replaced() as tmp:
        pq.write_table(table, tmp.path, filesystem=tmp.fs)


def copied_neighbours(source_dir: WorkPath, run_dir: WorkPath, keys: list[str]) -> tuple[Asked, Carried | None] | None:
    """A copy's queries: its source version's check updated with the copy's CHANGES, less the
    rows that moved and the searches that are not among today's (`keys`), whose vectors are the
    source's; with what it may carry of the source's outcomes (None from a file that kept none).
    None where either file is missing, fewer than KEPT_SAMPLE of today's searches are among the
    source's, or a list lost its K best."""
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
    asked = Asked(queries[keep], [mine for mine, _ in kept], [key for _, key in kept], neighbours)
    return asked, carried(before, keep, lists, neighbours, removed)


def carried(
    before: pa.Table, keep: list[bool], lists: list[Neighbours], neighbours: list[Neighbours], removed: set[str]
) -> Carried | None:
    """The source's outcomes of the kept queries (`before`: its EXACT_FILE), each touched where
    its right rows changed (`lists` before, `neighbours` after) or its hits hold a row that moved."""
    rung = (before.schema.metadata or {}).get(RUNG)
    if rung is None:
        return None
    mask = pa.array(keep)
    outcomes = [
        Outcome(hits, good, asked, found)
        for hits, good, asked, found in zip(
            *(before[name].filter(mask).to_pylist() for name in ("hits", "good", "asked", "found")), strict=True
        )
    ]
    touched = np.array(
        [
            old.right() != new.right() or not removed.isdisjoint(outcome.hits)
            for old, new, outcome in zip(lists, neighbours, outcomes, strict=True)
        ],
        bool,
    )
    return Carried(SearchParams(**json.loads(rung)), outcomes, touched)
