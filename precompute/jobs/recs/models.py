"""The recommendation models, each as two towers whose dot product is the score, so that one exact
blocked top-k (jobs/recs/topk/exact.py BlockedTopK) serves them all.

    content  item: its text embedding; user: the normalised weighted mean of their items'
    itemknn  item j: column j of the item-item cosine similarity of the interaction matrix, each
             item's `neighbours` largest kept (implicit's CosineRecommender); user: their row
             of the interaction matrix
    ease     item j: column j of EASE's closed-form weights (Steck, "Embarrassingly Shallow
             Autoencoders", 2019); user: their row of the interaction matrix
    als      item: implicit's ALS item factors; user: ALS's least-squares solve of their row
             against the item factors (the training's own user step)
    transitions
             first-order transitions, the baseline of sequence models: item j: column j of the
             share of moves out of each item that went straight to j, in users' time order;
             user: their latest `history` items, the t-th latest weighted decay**t
    sequence SASRec (models/sequence.py, trained by jobs/recs/sequence/train.py): item j: its
             embedding; user: the network's state after their latest items, both through the
             engines its exported graphs passed the gate with
    towers   the pipeline's own two-tower model (models/towers.py): item j: its item tower's
             vector; user: their user tower's vector, looked up by id (jobs/recs/own_towers.py
             computes both once a run)
    hybrid   a collaborative model's towers beside the content towers: score = collaborative /
             scale + content_weight * cosine (jobs/recs/blend.py; scale: the users' median
             spread of collaborative scores). An item with no interactions has a zero
             collaborative column, so the content part is what ranks it (cold items).
    ensemble every collaborative model a night trained, each at its scale, added together
             (jobs/recs/blend.py), with the content towers

Collaborative models are trained here on one process's interaction matrix (users x items, CSR,
each user's items in time order: HISTORY_ORDER): EASE inverts an [items, items] Gram matrix (on the GPU where torch sees one), so it is for
catalogues up to ITEM_ITEM_MAX_ITEMS, as are item-kNN and transitions (their columns are dense
here); ALS scales
with the interactions.
"""

from __future__ import annotations

import warnings

import numpy as np
import scipy.sparse as sp
import torch
from threadpoolctl import threadpool_limits

from precompute.jobs.recs.blend import BlendTowers, spread_scale
from precompute.jobs.recs.history.seen import Seen, interaction_matrix
from precompute.jobs.recs.kept_als import KeptALS
from precompute.jobs.recs.sequence.towers import sequence
from precompute.jobs.recs.sequence.train import WarmStart
from precompute.jobs.recs.spec import Model, RecsSpec
from precompute.jobs.recs.towers import (
    ALSTowers,
    ContentTowers,
    OwnTowers,
    RowTowers,
    Towers,
    TransitionTowers,
    als_model,
)
from precompute.models.settings import EngineSettings

ITEM_ITEM_MAX_ITEMS = 20_000
"""Item-item models (EASE, item-kNN, transitions) hold an [items, items] float32 matrix: 1.6 GB
at 20,000 items (EASE's Gram matrix and inverse too; the ensemble holds EASE's and transitions'
side by side, 3.2 GB, in every top-k actor)."""


def check_item_item(name: str, items: int) -> None:
    if items > ITEM_ITEM_MAX_ITEMS:
        raise ValueError(
            f"{name} holds an [items, items] matrix: {items:,} items are more than "
            f"{ITEM_ITEM_MAX_ITEMS:,}; use als"
        )


def item_knn(matrix: sp.csr_matrix, neighbours: int) -> RowTowers:
    check_item_item("itemknn", matrix.shape[1])
    from implicit.nearest_neighbours import CosineRecommender
    from implicit.utils import ParameterWarning

    model = CosineRecommender(K=neighbours, num_threads=0)
    with warnings.catch_warnings():
        # It normalises the rows into a COO matrix itself, then warns that it got COO.
        warnings.simplefilter("ignore", ParameterWarning)
        model.fit(matrix, show_progress=False)
    return RowTowers("itemknn", model.similarity.toarray())


def ease(matrix: sp.csr_matrix, regularization: float) -> RowTowers:
    """B = I - P / diag(P), P = (X'X + lambda I)^-1, with B's diagonal zero (EASE's closed form)."""
    check_item_item("ease", matrix.shape[1])
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    gram = torch.tensor((matrix.T @ matrix).toarray(), dtype=torch.float32, device=device)
    gram.diagonal().add_(regularization)
    # X'X + lambda I is symmetric positive definite (lambda > 0): Cholesky inverts it faster than
    # a general inverse, which cannot use the symmetry.
    inverse = torch.cholesky_inverse(torch.linalg.cholesky(gram))
    weights = inverse / (-inverse.diagonal())
    weights.diagonal().zero_()
    return RowTowers("ease", weights.cpu().numpy())


def transitions(train: Seen, items: int, settings: RecsSpec) -> TransitionTowers:
    """Counts of each user's consecutive (item, next item) pairs, a repeat of one item left out,
    each row divided by its sum."""
    check_item_item("transitions", items)
    sources, targets = train.items[:-1], train.items[1:]
    pairs = sources != targets
    ends = train.offsets[1:-1] - 1  # a user's last item and the next user's first are no pair
    pairs[ends[(ends >= 0) & (ends < len(pairs))]] = False
    sources, targets = sources[pairs], targets[pairs]
    counts = sp.csr_matrix((np.ones(len(sources), np.float32), (sources, targets)), (items, items))
    outgoing = np.asarray(counts.sum(axis=1), np.float32)
    return TransitionTowers(counts.toarray() / np.maximum(outgoing, 1), settings.history, settings.decay)


def als(matrix: sp.csr_matrix, settings: RecsSpec) -> ALSTowers:
    """implicit's ALS: on the GPU where its CUDA build sees one (then copied to the CPU: the
    top-k actors solve users against it), else on every core."""
    import implicit.gpu

    with threadpool_limits(1, "blas"):  # implicit parallelises over users; BLAS threads under it thrash
        model = als_model(settings, implicit.gpu.HAS_CUDA)
        model.fit(matrix, show_progress=False)
    if implicit.gpu.HAS_CUDA:
        model = model.to_cpu()
    return ALSTowers(model)


def candidates(model: Model, items: int, ordered: bool) -> list[Model]:
    """The models a run trains: `model` itself, or for auto those the catalogue and the data
    afford, to publish the best on held-out data (jobs/recs/quality.py): the sequence model and
    transitions where histories have an order (a time column), EASE and item-kNN where their
    [items, items] matrices fit ITEM_ITEM_MAX_ITEMS, ALS past it. Item-kNN is a candidate alone,
    not a part of the ensemble (ENSEMBLED): it finds a shop's new items by co-purchase where EASE
    may not, and a third [items, items] matrix in every top-k actor costs more than it adds."""
    if model != "auto":
        return [model]
    small = items <= ITEM_ITEM_MAX_ITEMS
    sequential = ["sequence", "transitions"] if small else ["sequence"]
    return [*(sequential if ordered else []), *(["ease", "itemknn"] if small else ["als"])]


ENSEMBLED: tuple[Model, ...] = ("sequence", "transitions", "ease", "als")
"""The candidates whose ensemble (jobs/recs/blend.py) is a candidate too."""


def collaborative(
    name: Model, train: Seen, items: int, settings: RecsSpec, engine: EngineSettings, warm: WarmStart | None
) -> Towers:
    if name == "transitions":
        return transitions(train, items, settings)
    if name == "sequence":
        return sequence(train, items, settings.sequence, engine, warm)
    matrix = interaction_matrix(train, items)
    if name == "itemknn":
        return item_knn(matrix, settings.neighbours)
    if name == "ease":
        return ease(matrix, settings.regularization_ease)
    if name == "als":
        return als(matrix, settings)
    raise ValueError(f"{name!r} is not a collaborative model")


def train_towers(
    model: Model,
    train: Seen,
    item_vectors: np.ndarray,
    settings: RecsSpec,
    own: OwnTowers | None = None,
    engine: EngineSettings | None = None,
    warm: WarmStart | None = None,
    kept: KeptALS | None = None,
) -> Towers:
    """The towers of `model` trained on `train` (the towers model: `own`, already
    computed); with content_weight > 0 a collaborative model or own towers are the hybrid
    with the content towers of `item_vectors`. engine: how this machine runs engines (the
    sequence model's; None: from the environment, PRECOMPUTE_ENGINE_*). warm: the sequence
    model's start (jobs/recs/sequence/train.py warm_start; None: cold). kept: the published ALS
    and its scale, used instead of training one (jobs/recs/kept_als.py)."""
    if model == "auto":
        raise ValueError("auto is a choice among trained models (candidates), not one to train")
    content = ContentTowers(item_vectors)
    if model == "content":
        return content
    if model == "towers" and own is None:
        raise ValueError("model 'towers' needs the pipeline's own towers (jobs/recs/own_towers.py)")
    hybrid = content if settings.content_weight > 0 else None
    if model == "als" and kept is not None and kept.towers is not None:
        return BlendTowers([(kept.towers, kept.scale)], hybrid, settings.content_weight)
    towers = (
        own
        if model == "towers"
        else collaborative(model, train, len(item_vectors), settings, engine or EngineSettings(), warm)
    )
    return BlendTowers([(towers, spread_scale(towers, train))], hybrid, settings.content_weight)
