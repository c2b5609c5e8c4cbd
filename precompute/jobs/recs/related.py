"""Related items ("customers who bought this also bought"), as a job: read -> validate -> train
-> each item's top k -> the caller's sink, keyed by item.

An item's list is its model's recommendations for a history of that one item (the same towers
and exact top-k as users' lists, jobs/recs/topk/exact.py), the item itself masked: the items that
came next after it (transitions), or that the same users had (item-kNN, EASE, ALS).

Quality: what the service does with the lists. Each user's last basket or interaction is held
out (jobs/recs/held_out.py); of a seeded sample of them, each user's latest SESSION_ITEMS training
items are an anonymous session, whose items' lists are merged as POST /v1/recs:forItems merges
them (stores/key_value/records.py merge_ranked) and scored against the held-out items, beside most-popular (the
session's items excluded). With model auto every model the data affords is measured and the best
by NDCG published; with seen auto, the session's own items are allowed back where that ranks
better. The published lists are the measured model's (trained on the split's training part, as the
recommendations' are: what was measured is what is served). A night recomputes every list: one
row of the model per item.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import ray
import torch

from precompute.jobs import progress
from precompute.jobs.inputs import InteractionsInput
from precompute.jobs.ray_session import ray_session
from precompute.jobs.recs.held_out import EVAL_K, Held, ModelQuality, hold_out, scored
from precompute.jobs.recs.history.interaction_files import validated_interactions
from precompute.jobs.recs.history.interactions import INDEX
from precompute.jobs.recs.history.seen import Seen, users_subset
from precompute.jobs.recs.models import ITEM_ITEM_MAX_ITEMS, train_towers
from precompute.jobs.recs.quality import MAX_USERS, measure
from precompute.jobs.recs.recommend import ranked_values
from precompute.jobs.recs.spec import RelatedModel, RelatedSpec
from precompute.jobs.recs.state import Items
from precompute.jobs.recs.topk.exact import BlockedTopK, popularity_prior
from precompute.jobs.recs.towers import Towers
from precompute.jobs.settings import JobSettings
from precompute.jobs.validate import REJECTS
from precompute.jobs.work_dir import WorkPath
from precompute.models.engines.gate import few_held_out
from precompute.stores.key_value.records import merge_ranked
from precompute.stores.key_value.sink import KeyValueSink

SESSION_ITEMS = 5
"""A held-out user's latest training items that stand for an anonymous session."""
ITEMS_PER_BLOCK = 1024
"""Items whose lists are ranked at once: an item-item model's [block, items] user rows."""


@dataclass(frozen=True)
class RelatedQuality:
    published: str
    split: str
    target: str
    users: int
    sampled_from: int
    k: int
    seen: str
    """Whether a session's own items may come back, and why."""
    include_seen: bool
    models: dict[str, ModelQuality] = field(default_factory=dict)
    """"published" and "most_popular", on the same sessions."""
    candidates: dict[str, ModelQuality] = field(default_factory=dict)
    note: str = ""


@dataclass(frozen=True)
class RelatedJobReport:
    rows: int
    rejects: int
    rejects_path: str
    items: int
    seconds: dict[str, float]
    samples: dict[str, bytes]
    quality: RelatedQuality


def candidates(model: RelatedModel, items: int, ordered: bool) -> list[RelatedModel]:
    if model != "auto":
        return [model]
    if items > ITEM_ITEM_MAX_ITEMS:
        return ["als"]
    return [*(["transitions"] if ordered else []), "itemknn", "ease"]


def item_lists(
    towers: Towers, prior: np.ndarray | None, k: int, counter: progress.Counter | None = None
) -> list[bytes]:
    """Each item's value: the top k for a history of that one item, itself excluded."""
    items = len(towers.items)
    ranker = BlockedTopK(towers.items, min(k, max(items - 1, 1)), ITEMS_PER_BLOCK, prior)
    values: list[bytes] = []
    for start in range(0, items, ITEMS_PER_BLOCK):
        stop = min(start + ITEMS_PER_BLOCK, items)
        one_each = Seen(np.arange(stop - start + 1), np.arange(start, stop), np.ones(stop - start, np.float32))
        indices, scores = ranker(torch.from_numpy(towers.users(one_each)), one_each)
        values += ranked_values(indices, scores)
        progress.add(counter, stop - start)
    return values


def sessions_of(train: Seen, users: np.ndarray) -> list[np.ndarray]:
    """Each user's latest SESSION_ITEMS training items, oldest first."""
    return [train.items[max(train.offsets[u], train.offsets[u + 1] - SESSION_ITEMS) : train.offsets[u + 1]] for u in users]


def session_quality(
    values: list[bytes], sessions: list[np.ndarray], sample: Seen, held: Held, items: int, include: bool
) -> ModelQuality:
    """The merged lists of each session (stores/key_value/records.py merge_ranked, as the service answers), scored."""
    indices = np.full((len(sessions), EVAL_K), -1, np.int64)
    scores = np.full((len(sessions), EVAL_K), -np.inf, np.float32)
    for row, session in enumerate(sessions):
        found, found_scores = merge_ranked([values[i] for i in session], EVAL_K, None if include else session)
        indices[row, : len(found)], scores[row, : len(found)] = found, found_scores
    return scored(indices, scores, sample, held, items, indices)


def evaluate_related(good: pa.Table, items: int, settings: RelatedSpec, seed: int = 0) -> tuple[RelatedQuality, Towers]:
    """Every candidate trained on the split's training part, its lists merged for each sampled
    session and scored on the held-out items; the published model's towers, as measured."""
    split = hold_out(good, seed)
    evaluated = split.held.users()
    if not len(evaluated):
        raise ValueError(f"no user has two or more valid {split.target}s: there is nothing to hold out")
    rng = np.random.default_rng(seed)
    users = np.sort(rng.choice(evaluated, size=min(MAX_USERS, len(evaluated)), replace=False))
    sample, held = users_subset(split.train, users), split.held.subset(users)
    sessions = sessions_of(split.train, users)
    counts = np.bincount(split.train.items, minlength=items).astype(np.float32)
    weight = settings.popularity_weight
    prior = popularity_prior(counts, weight) if weight else None
    modes = {"exclude": [False], "include": [True], "auto": [False, True]}[settings.seen]
    judged: dict[tuple[str, bool], ModelQuality] = {}
    chosen: tuple[str, bool] | None = None
    vectors = np.zeros((items, 1), np.float32)
    for candidate in candidates(settings.model, items, split.name == "temporal"):
        towers = train_towers(candidate, split.train, vectors, settings.recs())
        values = item_lists(towers, prior, settings.k)
        for allowed in modes:
            measured = judged[candidate, allowed] = session_quality(values, sessions, sample, held, items, allowed)
            note = f"held-out NDCG@{EVAL_K} {measured.ndcg:.4f} (session items {'allowed' if allowed else 'excluded'})"
            progress.note(candidate, note)
            if chosen is None or measured.ndcg > judged[chosen].ndcg:  # a tie: the first, seen excluded
                chosen, best = (candidate, allowed), towers  # the others' matrices are let go
    assert chosen is not None  # candidates and modes are never empty
    name, include = chosen
    lengths = [len(session) for session in sessions]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    popular = measure(None, counts, Seen(offsets, np.concatenate(sessions), np.ones(sum(lengths), np.float32)), held, items)
    how = "allowed" if include else "excluded"
    quality = RelatedQuality(
        published=name,
        split=split.name,
        target=split.target,
        users=len(users),
        sampled_from=len(evaluated),
        k=EVAL_K,
        seen=f"{how} (the output's seen = {settings.seen!r})" if settings.seen != "auto" else f"{how}: it ranked the held-out items better",
        include_seen=include,
        models={"published": judged[name, include], "most_popular": popular},
        candidates={f"{model}, session items {'allowed' if allowed else 'excluded'}": q for (model, allowed), q in judged.items()},
        note=few_held_out(len(users), "users"),
    )
    return quality, best


def run_related_job(
    interactions: InteractionsInput,
    settings: RelatedSpec,
    job: JobSettings,
    items: Items,
    sink: KeyValueSink,
    work_dir: WorkPath,
    before_write: Callable[[int, bool], None],
    output: str = "related",
) -> RelatedJobReport:
    """Every item's related list, trained and measured on the night's interactions, written
    through `sink` (before_write: called with the number of records, and whether a session's own
    items may be answered, before the first write)."""
    rejects_path = work_dir / REJECTS
    seconds: dict[str, float] = {}
    with ray_session(job.ray_address):
        start = time.perf_counter()
        validated = validated_interactions(interactions, items.ids, rejects_path)
        seconds["validate"] = time.perf_counter() - start

        start = time.perf_counter()
        with progress.stage(output, "train"):
            quality, towers = evaluate_related(validated.good, len(items.ids), settings)
        seconds["train"] = time.perf_counter() - start

        start = time.perf_counter()
        counts = np.bincount(validated.good[INDEX].to_numpy(), minlength=len(items.ids))
        prior = popularity_prior(counts, settings.popularity_weight) if settings.popularity_weight else None
        with progress.stage(output, "top-k", len(items.ids), counted="driver") as counter:
            values = item_lists(towers, prior, settings.k, counter)
        seconds["top-k"] = time.perf_counter() - start

        start = time.perf_counter()
        table = pa.table({"id": items.ids, "value": pa.array(values, pa.binary())})
        with progress.stage(output, "write"):
            before_write(table.num_rows, quality.include_seen)
            sink.routed(ray.data.from_arrow(table), table.num_rows).write_datasink(sink)
        seconds["write"] = time.perf_counter() - start
    samples = dict(zip(items.ids.to_pylist()[:5], values[:5], strict=True))
    return RelatedJobReport(
        rows=validated.rows,
        rejects=validated.rejects,
        rejects_path=str(rejects_path),
        items=len(values),
        seconds={stage: round(value, 3) for stage, value in seconds.items()},
        samples=samples,
        quality=quality,
    )
