"""Held-out quality of the recommendations: does the model the output publishes beat the field's
baselines on behaviour it did not see?

Split: every user with two or more valid interactions has their last one held out: last by the
input's time column, or a seeded random one without it. Every model is trained on the rest (all
users), and evaluated on a seeded sample of at most MAX_USERS of the users with a held-out item:
scoring is O(users x items), and a few thousand users measure a rate to about +-0.01.

The published model is the one measured: trained here on the split, it is what the job scores
users with (their whole histories as input), so the figure estimates what users see and the
model is trained once a night. With model auto, every candidate the data affords is trained
(jobs/recs/models.py candidates), and where there are several, their ensemble
(jobs/recs/blend.py: each at its scale, added together); the best by NDCG is published.

Models, side by side on the same split: the published one (the output's model and weights),
item-kNN (the field's simplest collaborative baseline, alone), markov (first-order transitions
from each user's latest item alone: the simplest sequence baseline), content (text embeddings and the
popularity prior), most-popular (training counts), and when the published model is a hybrid,
its collaborative part alone. Metrics at EVAL_K: hit-rate (the held-out item in the top
EVAL_K), NDCG (one relevant item: 1 / log2(rank + 2)), catalogue coverage (distinct items
recommended to the sample over the catalogue), and for cold users (COLD_HISTORY or fewer
training interactions) the share served: a list ranked by some signal, its first score above
its last (a model that knows nothing of a user scores every item alike).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from precompute.jobs.inputs import InteractionsInput
from precompute.jobs.recs.blend import BlendTowers, ensemble
from precompute.jobs.recs.interactions import INDEX, SECONDS, clean, column_renames, tag_rejects
from precompute.jobs.recs.kept_als import KeptALS
from precompute.jobs.recs.models import ITEM_ITEM_MAX_ITEMS, candidates, train_towers
from precompute.jobs.recs.seen import Seen, seen_by_user, users_subset
from precompute.jobs.recs.sequence.train import WarmStart
from precompute.jobs.recs.spec import RecsSpec
from precompute.jobs.recs.topk.exact import BlockedTopK, popularity_prior, recommend_users
from precompute.jobs.recs.towers import OwnTowers, Towers
from precompute.jobs.validate import REASON
from precompute.models.datasets import arrow_dataset
from precompute.models.engines.gate import few_held_out
from precompute.models.settings import EngineSettings

MAX_USERS = 5000
EVAL_K = 10
COLD_HISTORY = 2


@dataclass(frozen=True)
class ModelQuality:
    hit_rate: float
    ndcg: float
    coverage: float
    cold_served: float | None
    """None when the sample holds no cold user."""


@dataclass(frozen=True)
class RecsQuality:
    published: str
    """The name of the model the output publishes (e.g. ease+content)."""
    split: str
    """"temporal" (each user's last interaction) or "random" (a seeded one: no time column)."""
    users: int
    """Users evaluated: a sample of those with a held-out interaction."""
    sampled_from: int
    cold_users: int
    k: int
    models: dict[str, ModelQuality] = field(default_factory=dict)
    """"published", "most_popular", "itemknn" and "markov" (up to ITEM_ITEM_MAX_ITEMS items),
    "content" and, for a hybrid, "collaborative"."""
    candidates: dict[str, ModelQuality] = field(default_factory=dict)
    """Every model trained to choose the published one from, by name (model auto: several,
    jobs/recs/models.py candidates; else the one named)."""
    note: str = ""
    """Set when few users were evaluated (models/engines/gate.py few_held_out): read the rates with care."""


def quality_of(fields: dict[str, Any]) -> RecsQuality:
    """A RecsQuality from its asdict() form (jobs/recs/state.py keeps it with the version)."""
    models = {name: ModelQuality(**q) for name, q in fields["models"].items()}
    candidates = {name: ModelQuality(**q) for name, q in fields["candidates"].items()}
    return RecsQuality(**{**fields, "models": models, "candidates": candidates})


def interactions_table(interactions: InteractionsInput) -> pa.Table:
    """The input's user, item, weight and time columns (those present) under the job's names."""
    table = arrow_dataset(interactions).to_table()
    renames = column_renames(interactions, table.column_names)
    return table.rename_columns([renames.get(c, c) for c in table.column_names])


def valid_interactions(table: pa.Table, item_ids: list[str] | pa.Array) -> pa.Table:
    """The contract's valid rows in the job's types (jobs/recs/interactions.py clean), their item
    positions in `item_ids` (in any order); rejected rows are left out (the job quarantines them)."""
    ids = pa.array(item_ids, pa.string())
    order = pc.sort_indices(ids)
    tagged = tag_rejects(table, ids.take(order))
    good = clean(tagged.filter(pc.is_null(tagged[REASON])))
    return good.set_column(good.schema.get_field_index(INDEX), INDEX, order.take(good[INDEX]).cast(pa.int64()))


def hold_out_last(good: pa.Table, seed: int) -> tuple[Seen, np.ndarray, str]:
    """(training part of every user, users in id order; the held-out item position per user, -1
    for users with fewer than two interactions; the split's name). Without times, a seeded
    random order stands in for them."""
    split = "temporal" if good.num_rows and not good[SECONDS].null_count else "random"
    if split == "random":
        order = np.random.default_rng(seed).random(good.num_rows)
        good = good.set_column(good.schema.get_field_index(SECONDS), SECONDS, pa.array(order))
    seen = seen_by_user(good)
    lengths = np.diff(seen.offsets)
    eligible = lengths >= 2
    last = seen.offsets[1:] - 1
    targets = np.where(eligible, seen.items[last], -1)
    keep = np.ones(len(seen.items), bool)
    keep[last[eligible]] = False
    offsets = np.zeros_like(seen.offsets)
    np.cumsum(lengths - eligible, out=offsets[1:])
    return Seen(offsets, seen.items[keep], seen.weights[keep], seen.ids), targets, split


def measure(
    towers: Towers | None, prior: np.ndarray | None, sample: Seen, targets: np.ndarray, items: int
) -> ModelQuality:
    """Metrics of one model over the sample; towers None: the prior alone (most-popular)."""
    k = min(EVAL_K, items)
    if towers is None:
        ranker = BlockedTopK(np.zeros((items, 1), np.float32), k, 512, prior)
        indices, scores = ranker(torch.zeros((len(targets), 1)), sample)
    else:
        indices, scores = recommend_users(towers, BlockedTopK(towers.items, k, 512, prior), sample)
    hits = indices == targets[:, None]
    ranks = hits.argmax(axis=1)
    found = hits.any(axis=1)
    cold = np.diff(sample.offsets) <= COLD_HISTORY
    served = np.isfinite(scores[:, 0]) & (scores[:, 0] > scores[:, -1])
    return ModelQuality(
        hit_rate=round(float(found.mean()), 4),
        ndcg=round(float(np.where(found, 1 / np.log2(ranks + 2), 0).mean()), 4),
        coverage=round(len(np.unique(indices[indices >= 0])) / items, 4),
        cold_served=round(float(served[cold].mean()), 4) if cold.any() else None,
    )


def evaluate(
    good: pa.Table,
    item_vectors: np.ndarray,
    settings: RecsSpec,
    seed: int = 0,
    max_users: int = MAX_USERS,
    own: OwnTowers | None = None,
    engine: EngineSettings | None = None,
    warm: WarmStart | None = None,
    kept: KeptALS | None = None,
) -> tuple[RecsQuality, Towers]:
    """Every model trained on the split's training part and evaluated on its held-out items
    (the towers model, `own`, is the user's, trained elsewhere: it is measured as it is); and
    the published model's towers as measured, which the job scores with: what users see is
    what was measured, and a model is trained once a night."""
    items = len(item_vectors)
    train, targets, split = hold_out_last(good, seed)
    evaluated = np.flatnonzero(targets >= 0)
    if not len(evaluated):
        raise ValueError("no user has two or more valid interactions: there is nothing to hold out")
    ordered = split == "temporal"
    names = candidates(settings.model, items, ordered)
    if names == ["als"] and kept is not None and kept.towers is not None and kept.quality is not None:
        towers = train_towers("als", train, item_vectors, settings, kept=kept)
        return replace(quality_of(kept.quality), note=f"measured the night ALS was trained; {kept.reason}"), towers
    rng = np.random.default_rng(seed)
    sample_users = np.sort(rng.choice(evaluated, size=min(max_users, len(evaluated)), replace=False))
    sample, sample_targets = users_subset(train, sample_users), targets[sample_users]
    counts = np.bincount(train.items, minlength=items).astype(np.float32)
    prior = popularity_prior(counts, settings.popularity_weight) if settings.popularity_weight else None
    trained = [train_towers(name, train, item_vectors, settings, own, engine, warm, kept) for name in names]
    if len(trained) > 1:
        trained.append(ensemble(trained))
    judged = {towers.name: measure(towers, prior, sample, sample_targets, items) for towers in trained}
    published = max(trained, key=lambda towers: judged[towers.name].ndcg)  # a tie: the first
    baselines: dict[str, tuple[Towers | None, np.ndarray | None]] = {"most_popular": (None, counts)}
    if items <= ITEM_ITEM_MAX_ITEMS:  # past it, their dense columns do not fit: no baselines
        no_content = settings.model_copy(update={"content_weight": 0})
        baselines["itemknn"] = (train_towers("itemknn", train, item_vectors, no_content), None)
        first_order = no_content.model_copy(update={"history": 1})
        baselines["markov"] = (train_towers("transitions", train, item_vectors, first_order), None)
    baselines["content"] = (train_towers("content", train, item_vectors, settings), prior)
    if isinstance(published, BlendTowers) and published.content is not None:
        # The hybrid's collaborative (or own towers) parts, at their scales: the same models, not trained twice.
        alone = BlendTowers(published.parts, None, 0)
        baselines["collaborative"] = (alone, prior)
    quality = RecsQuality(
        published=published.name,
        split=split,
        users=len(sample_users),
        sampled_from=len(evaluated),
        cold_users=int((np.diff(sample.offsets) <= COLD_HISTORY).sum()),
        k=min(EVAL_K, items),
        models={
            "published": judged[published.name],
            **{
                name: measure(towers, model_prior, sample, sample_targets, items)
                for name, (towers, model_prior) in baselines.items()
            },
        },
        candidates=judged,
        note=few_held_out(len(sample_users), "users"),
    )
    return quality, published


def beats_most_popular(quality: RecsQuality, min_lift: float) -> str | None:
    """Why the published model may not be published (None: it may): its NDCG must be above
    `min_lift` times most-popular's (at the default 1.0: beat it; two zeros do not)."""
    ours, baseline = quality.models["published"], quality.models["most_popular"]
    if ours.ndcg > min_lift * baseline.ndcg:
        return None
    return (
        f"{quality.published}'s held-out NDCG@{quality.k} {ours.ndcg:.4f} is not above "
        f"{min_lift} x most-popular's {baseline.ndcg:.4f} ({quality.split} split, {quality.users} users)"
    )
