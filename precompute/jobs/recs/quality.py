"""Held-out quality of the recommendations: does the model the output publishes beat the field's
baselines on behaviour it did not see?

Split and metrics: jobs/recs/held_out.py (each user's last basket, or last interaction, held
out). Every model is trained on the rest (all users), and evaluated on a seeded sample of at most
MAX_USERS of the users held out: scoring is O(users x items), and a few thousand users measure a
rate to about +-0.01.

The published model is the one measured: trained here on the split, it is what the job scores
users with (their whole histories as input), so the figure estimates what users see and the
model is trained once a night. With model auto, every candidate the data affords is trained
(jobs/recs/models.py candidates), and where there are several, their ensemble
(jobs/recs/blend.py: each at its scale, added together); the best by NDCG is published, without
its content part where that ranks as well (content_weight 0: a text that says nothing). Then,
unless the output says `seen = "exclude"`, the best one is tried with the user's own items
allowed back (jobs/recs/topk/repeat.py: each weight and decay of its grid); they are published where
they rank the held-out items better (`auto`; on ties, and where no held-out item is one the
user had, seen items stay excluded) or always (`include`).

Models, side by side on the same split: the published one (the output's model and weights),
item-kNN (the field's simplest collaborative baseline, alone), markov (first-order transitions
from each user's latest item alone: the simplest sequence baseline), content (text embeddings and the
popularity prior), most-popular (training counts), personal top-frequency (each user's own
items by how often they had them, most-popular after them: the repeat baseline), and when the
published model is a hybrid, its collaborative part alone.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from precompute.jobs import progress
from precompute.jobs.inputs import InteractionsInput
from precompute.jobs.recs.blend import BlendTowers, ensemble
from precompute.jobs.recs.held_out import COLD_HISTORY, EVAL_K, Held, ModelQuality, hold_out, scored
from precompute.jobs.recs.history.interactions import INDEX, clean, column_renames, tag_rejects
from precompute.jobs.recs.history.seen import Seen, pair_keys, users_subset
from precompute.jobs.recs.kept_als import KeptALS
from precompute.jobs.recs.models import ENSEMBLED, ITEM_ITEM_MAX_ITEMS, candidates, train_towers
from precompute.jobs.recs.sequence.towers import SequenceTowers
from precompute.jobs.recs.sequence.train import WarmStart
from precompute.jobs.recs.spec import RecsSpec
from precompute.jobs.recs.topk.exact import BlockedTopK, popularity_prior
from precompute.jobs.recs.topk.repeat import (
    DECAYS,
    DUES,
    PERSONAL_FIRST,
    WEIGHTS,
    Repeat,
    seen_scores,
    with_repeats,
)
from precompute.jobs.recs.towers import OwnTowers, Towers
from precompute.jobs.validate import REASON
from precompute.models.datasets import arrow_dataset
from precompute.models.engines.gate import few_held_out
from precompute.models.settings import EngineSettings

MAX_USERS = 5000


@dataclass(frozen=True)
class RecsQuality:
    published: str
    """The name of the model the output publishes (e.g. ease+content)."""
    split: str
    """"temporal" (each user's last basket or interaction) or "random" (a seeded one: no time column)."""
    users: int
    """Users evaluated: a sample of those with a held-out interaction."""
    sampled_from: int
    cold_users: int
    k: int
    models: dict[str, ModelQuality] = field(default_factory=dict)
    """"published", "most_popular", "personal_top_frequency", "itemknn" and "markov" (up to
    ITEM_ITEM_MAX_ITEMS items), "content" and, for a hybrid, "collaborative"."""
    candidates: dict[str, ModelQuality] = field(default_factory=dict)
    """Every model trained to choose the published one from, by name (model auto: several,
    jobs/recs/models.py candidates; else the one named)."""
    note: str = ""
    """Set when few users were evaluated (models/engines/gate.py few_held_out): read the rates with care."""
    target: str = "interaction"
    """What was held out of each user: their last "basket" or "interaction" (jobs/recs/held_out.py)."""
    repeats: float | None = None
    """The share of held-out items the user had before: the evidence for allowing repeats."""
    repeat: dict[str, float] | None = None
    """The published lists' repeat weight, decay and due weight (jobs/recs/topk/repeat.py Repeat); None:
    seen items excluded."""
    seen: str = "excluded"
    """Why seen items are excluded or how they are allowed back, in words."""
    curves: dict[str, list[float]] = field(default_factory=dict)
    """The validation NDCG@10 at each training check of each candidate that trains in steps (the
    sequence model, jobs/recs/sequence/train.py), by candidate: the run page charts them."""


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
    """The contract's valid rows in the job's types (jobs/recs/history/interactions.py clean), their item
    positions in `item_ids` (in any order); rejected rows are left out (the job quarantines them)."""
    ids = pa.array(item_ids, pa.string())
    order = pc.sort_indices(ids)
    tagged = tag_rejects(table, ids.take(order))
    good = clean(tagged.filter(pc.is_null(tagged[REASON])))
    return good.set_column(good.schema.get_field_index(INDEX), INDEX, order.take(good[INDEX]).cast(pa.int64()))


def ranked_lists(
    towers: Towers | None, prior: np.ndarray | None, sample: Seen, items: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(indices, scores) of one model's top EVAL_K unseen items for the sample, and its user and
    item vectors (towers None: the prior alone, most-popular)."""
    if towers is None:
        users, vectors = np.zeros((len(sample.offsets) - 1, 1), np.float32), np.zeros((items, 1), np.float32)
    else:
        users, vectors = towers.users(sample), towers.items
    indices, scores = BlockedTopK(vectors, min(EVAL_K, items), 512, prior)(torch.from_numpy(users), sample)
    return indices, scores, users, vectors


def measure(
    towers: Towers | None,
    prior: np.ndarray | None,
    sample: Seen,
    held: Held,
    items: int,
    repeat: Repeat | None = None,
) -> ModelQuality:
    """Metrics of one model over the sample (jobs/recs/held_out.py scored); towers None: the
    prior alone (most-popular); repeat: the user's own items allowed back."""
    indices, scores, users, vectors = ranked_lists(towers, prior, sample, items)
    if repeat is None:
        return scored(indices, scores, sample, held, items, indices)
    own = seen_scores(users, vectors, prior, sample)
    return scored(*with_repeats(indices, scores, own, repeat), sample, held, items, indices)


def with_seen(
    towers: Towers, prior: np.ndarray | None, sample: Seen, held: Held, items: int
) -> tuple[Repeat, ModelQuality]:
    """The best of the repeat grid (jobs/recs/topk/repeat.py) for `towers`, by NDCG."""
    indices, scores, users, vectors = ranked_lists(towers, prior, sample, items)
    own = seen_scores(users, vectors, prior, sample)
    tried = {}
    for weight, decay, due in itertools.product(WEIGHTS, DECAYS, DUES):
        repeat = Repeat(weight, decay, due)
        tried[repeat] = scored(*with_repeats(indices, scores, own, repeat), sample, held, items, indices)
    best = max(tried, key=lambda repeat: tried[repeat].ndcg)  # a tie: the first
    return best, tried[best]


def repeat_share(sample: Seen, held: Held, items: int) -> float:
    """The share of the sample's held-out items that its user had in training."""
    own = pair_keys(sample.offsets, sample.items, items)
    wanted = pair_keys(held.offsets, held.items, items)
    return round(float(np.isin(wanted, own).mean()), 4) if len(wanted) else 0.0


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
    split = hold_out(good, seed)
    train = split.train
    evaluated = split.held.users()
    if not len(evaluated):
        raise ValueError(f"no user has two or more valid {split.target}s: there is nothing to hold out")
    names = candidates(settings.model, items, split.name == "temporal")
    if names == ["als"] and kept is not None and kept.towers is not None and kept.quality is not None:
        towers = train_towers("als", train, item_vectors, settings, kept=kept)
        measured = quality_of(kept.quality)
        if isinstance(towers, BlendTowers) and not measured.published.endswith("+content"):
            towers = BlendTowers(towers.parts, None, 0)  # published without content that night
        return replace(measured, note=f"measured the night ALS was trained; {kept.reason}"), towers
    rng = np.random.default_rng(seed)
    sample_users = np.sort(rng.choice(evaluated, size=min(max_users, len(evaluated)), replace=False))
    sample, held = users_subset(train, sample_users), split.held.subset(sample_users)
    counts = np.bincount(train.items, minlength=items).astype(np.float32)
    prior = popularity_prior(counts, settings.popularity_weight) if settings.popularity_weight else None
    trained = [train_towers(name, train, item_vectors, settings, own, engine, warm, kept) for name in names]
    curves = {
        towers.name: part.report.curve
        for towers in trained
        for part, _ in getattr(towers, "parts", [])
        if isinstance(part, SequenceTowers)
    }
    parts = [towers for towers, name in zip(trained, names, strict=True) if name in ENSEMBLED]
    if len(parts) > 1:
        trained.append(ensemble(parts))
    judged = {}
    for towers in trained:
        judged[towers.name] = measure(towers, prior, sample, held, items)
        progress.note(towers.name, f"held-out NDCG@{EVAL_K} {judged[towers.name].ndcg:.4f} ({split.target}s of {len(sample_users):,} users)")
    published = max(trained, key=lambda towers: judged[towers.name].ndcg)  # a tie: the first
    if isinstance(published, BlendTowers) and published.content is not None:
        # Content stays in the blend only where it ranks the held-out items better: item texts
        # may say nothing a shopper acts on (or be made up for a catalogue of ids).
        alone = BlendTowers(published.parts, None, 0)
        judged[alone.name] = measure(alone, prior, sample, held, items)
        progress.note(alone.name, f"held-out NDCG@{EVAL_K} {judged[alone.name].ndcg:.4f} (without content)")
        if judged[alone.name].ndcg >= judged[published.name].ndcg:
            published = alone
    chosen, repeats = judged[published.name], repeat_share(sample, held, items)
    repeat, seen = None, "excluded (the output's seen = \"exclude\")"
    if settings.seen == "auto" and not repeats:
        seen = "excluded: no held-out item was one its user had before"
    elif settings.seen != "exclude":
        best, quality = with_seen(published, prior, sample, held, items)
        judged[f"{published.name}, seen allowed"] = quality
        if settings.seen == "include" or quality.ndcg > chosen.ndcg:
            repeat, chosen = best, quality
            seen = f"allowed: {best.describe()}, NDCG@{EVAL_K} {quality.ndcg:.4f}"
        else:
            seen = f"excluded: allowing them ({best.describe()}) ranked lower, NDCG@{EVAL_K} {quality.ndcg:.4f}"
    progress.note("seen items", seen)
    baselines: dict[str, tuple[Towers | None, np.ndarray | None, Repeat | None]] = {
        "most_popular": (None, counts, None),
        "personal_top_frequency": (None, counts, Repeat(PERSONAL_FIRST, 1.0)),
    }
    if items <= ITEM_ITEM_MAX_ITEMS:  # past it, their dense columns do not fit: no baselines
        no_content = settings.model_copy(update={"content_weight": 0})
        baselines["itemknn"] = (train_towers("itemknn", train, item_vectors, no_content), None, None)
        first_order = no_content.model_copy(update={"history": 1})
        baselines["markov"] = (train_towers("transitions", train, item_vectors, first_order), None, None)
    baselines["content"] = (train_towers("content", train, item_vectors, settings), prior, None)
    if isinstance(published, BlendTowers) and published.content is not None:
        # The hybrid's collaborative (or own towers) parts, at their scales: the same models, not trained twice.
        baselines["collaborative"] = (BlendTowers(published.parts, None, 0), prior, repeat)
    quality = RecsQuality(
        published=published.name,
        split=split.name,
        users=len(sample_users),
        sampled_from=len(evaluated),
        cold_users=int((np.diff(sample.offsets) <= COLD_HISTORY).sum()),
        k=min(EVAL_K, items),
        models={
            "published": chosen,
            **{
                name: measure(towers, model_prior, sample, held, items, model_repeat)
                for name, (towers, model_prior, model_repeat) in baselines.items()
            },
        },
        candidates=judged,
        note=few_held_out(len(sample_users), "users"),
        target=split.target,
        repeats=repeats,
        repeat=None if repeat is None else asdict(repeat),
        seen=seen,
        curves=curves,
    )
    return quality, published


class Measured(Protocol):
    """A held-out check's figures: a recs output's (RecsQuality) or a related one's."""

    published: str
    split: str
    users: int
    k: int
    models: dict[str, ModelQuality]


def beats_most_popular(quality: Measured, min_lift: float) -> str | None:
    """Why the published model may not be published (None: it may): its NDCG must be above
    `min_lift` times most-popular's (at the default 1.0: beat it; two zeros do not)."""
    ours, baseline = quality.models["published"], quality.models["most_popular"]
    if ours.ndcg > min_lift * baseline.ndcg:
        return None
    return (
        f"{quality.published}'s held-out NDCG@{quality.k} {ours.ndcg:.4f} is not above "
        f"{min_lift} x most-popular's {baseline.ndcg:.4f} ({quality.split} split, {quality.users} users)"
    )
