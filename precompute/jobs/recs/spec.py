"""What a recommendations output computes: the pipeline file's fields of a recs output that the
job reads (its model, list length, weights and hyperparameters), declared once here."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from precompute.models.towers import GatedTowers

Model = Literal["auto", "content", "itemknn", "ease", "als", "transitions", "sequence", "towers"]


class SequenceSpec(GatedTowers):
    """The sequence model (models/sequence.py), its training (jobs/recs/sequence/train.py) and its
    engines (exported as a pair of towers: the same ladder and gate as the towers model's, on
    the training users' histories). The network's defaults are SASRec's for MovieLens-1M (Kang
    and McAuley, 2018), its step size larger."""

    history: int = Field(200, ge=1)
    """Each user's latest items the model reads."""
    dim: int = Field(64, ge=8)
    """Width of the item vectors and of the network."""
    blocks: int = Field(2, ge=1)
    """Transformer blocks."""
    heads: int = Field(1, ge=1)
    """Attention heads per block (dim must be a multiple)."""
    dropout: float = Field(0.2, ge=0, lt=1)
    """Dropout on the embeddings and each block's residual branches while training."""
    learning_rate: float = Field(4e-3, gt=0)
    """Adam's step size. Above SASRec's 1e-3 because a night has minutes, not hours: in a
    night's training time on ML-1M, 4e-3 reaches a far better held-out NDCG@10 than 1e-3, and
    8e-3 no better than 4e-3 (docs/recommendations.md)."""
    loss: Literal["softmax", "gbce"] = "softmax"
    """softmax: cross-entropy over the whole catalogue at every position. gbce: gSASRec's
    generalised binary cross-entropy over `negatives` items sampled per step (Petrov and
    Macdonald, RecSys 2023): for catalogues whose full softmax does not fit a step."""
    negatives: int = Field(256, ge=1)
    """gbce: items sampled (uniformly, shared by the step's positions) as negatives."""
    gbce_t: float = Field(0.75, ge=0, le=1)
    """gbce: the calibration t, how far the loss corrects the sampled negatives' overconfidence (1: fully)."""
    batch: int = Field(128, ge=1)
    """Users per training step."""
    max_epochs: int = Field(200, ge=1)
    """Passes over the histories at most."""
    patience: int = Field(5, ge=1)
    """Training stops after this many checks (each epoch, or every jobs/recs/sequence/train.py
    EVAL_STEPS steps if sooner) without a better validation NDCG@10."""
    train_budget_s: float = Field(900, gt=0)
    """Training stops here whatever the validation says, keeping its best check's weights."""
    train_workers: int = Field(1, ge=1, le=1024)
    """1: training runs in the job's own process (on its GPU where torch sees one). More: Ray
    Train's TorchTrainer on the job's Ray cluster, this many data-parallel workers, each step's
    users split among them and their gradients averaged (jobs/recs/sequence/cluster.py): one a node
    on CPUs, one GPU each where the cluster has GPUs; more workers than the cluster has CPUs
    (GPUs) are refused."""


class RecsSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    k: int = Field(10, ge=1, le=100)
    """Recommendations per user. A value is 6 bytes a pair (stores/key_value/records.py): up to 10 pairs
    stay within Redis's 64-byte listpack value limit, which keeps the store compact; past that
    (product pages show 20-50 and rerank) it costs more memory (stores/key_value/settings.py)."""

    model: Model = "auto"
    """jobs/recs/models.py. auto: every model the data affords is trained and the best by
    held-out NDCG@10 published (with a time column: sequence, transitions, EASE, item-kNN and the
    ensemble of the first three, jobs/recs/blend.py; without one: EASE and item-kNN; ALS in their
    place past 20,000 items).
    transitions and sequence read each user's
    history in the input's time order. towers: the pipeline's own two-tower model (its `towers`
    table)."""

    seen: Literal["auto", "exclude", "include"] = "auto"
    """A user's own items in their list. exclude: never (films, articles: what one has seen is
    done). include: they come back, each scored up by how often and how lately the user had it
    (jobs/recs/topk/repeat.py: groceries, pet food, music). auto: included where the held-out items
    say it ranks better (jobs/recs/quality.py), else excluded."""

    topk: Literal["auto", "exact", "ivf"] = "auto"
    """How each user's top k is found (jobs/recs/topk/candidates.py). exact: every user against every
    item, users x items (N² when both grow with the input). ivf: candidates from an inverted-file
    index of about √items lists over the item vectors (users x √items), at the fewest probed
    lists whose top k keeps `min_recall` of the exact top k on up to 500 sampled users (exact
    where none does). auto: ivf past 50,000 items on CPUs when more than 2,000 users are ranked or
    an earlier night's index is kept (fewer repay no build: an incremental night's), exact
    otherwise."""

    min_recall: float = Field(0.99, gt=0, le=1)
    """ivf: the share of the exact top k the index's must keep on the sample."""

    content_weight: float = Field(0.1, ge=0)
    """The hybrid: a collaborative model's score (in units of its spread: jobs/recs/blend.py) plus
    this times the content cosine, which ranks the items nobody interacted with yet. The quality
    check publishes the model without content where that ranks the held-out items as well
    (jobs/recs/quality.py): item texts that say nothing a user acts on weigh 0. 0: none."""

    popularity_weight: float = Field(0.4, ge=0)
    """Weight of the popularity prior added to the score (0: none). Chosen for the content model
    by the leave-one-out hit-rate on the demo data (data/README.md); more favours the head items."""

    neighbours: int = Field(100, ge=1)
    """itemknn: similar items kept per item."""

    regularization_ease: float = Field(500.0, gt=0)
    """EASE's lambda, added to the Gram matrix's diagonal."""

    factors: int = Field(64, ge=1)
    """ALS: latent factors per user and item."""

    regularization_als: float = Field(0.05, ge=0)
    """ALS: the L2 penalty on the factors."""

    alpha: float = Field(2.0, gt=0)
    """ALS: confidence per unit of interaction weight."""

    iterations: int = Field(15, ge=1)
    """ALS: alternating least-squares sweeps."""

    retrain_share: float = Field(0.05, ge=0, le=1)
    """ALS: the published model is kept (not trained again) while at most this share of the
    interactions changed since it was trained, so a night rescores only the users who moved
    (jobs/recs/kept_als.py); 0 trains every night."""

    history: int = Field(3, ge=1)
    """transitions: each user's latest items it scores from."""

    decay: float = Field(0.5, gt=0, le=1)
    """transitions: the weight of a user's t-th latest item is decay**t (the last one's is 1)."""

    sequence: SequenceSpec = SequenceSpec()
    """sequence: the network and its training, e.g. { dim = 64, train_budget_s = 600 }."""


RelatedModel = Literal["auto", "transitions", "itemknn", "ease", "als"]


class RelatedSpec(BaseModel):
    """What a related-items output computes (jobs/recs/related.py): each item's top k items from
    an item-to-item model, the item itself never among them."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    k: int = Field(10, ge=1, le=100)
    """Related items per item."""

    model: RelatedModel = "auto"
    """transitions: the items that came next after it, in users' time order. itemknn: the items
    bought or watched by the same users (cosine). ease: EASE's item-item weights. als: ALS's item
    factors (any catalogue size; the others hold an [items, items] matrix, up to 20,000 items).
    auto: each the data affords, measured as the service uses the lists (an anonymous session's
    items, merged: stores/key_value/records.py merge_ranked) on each user's held-out items; the best published."""

    seen: Literal["auto", "exclude", "include"] = "auto"
    """A session's own items in its answer (POST /v1/recs:forItems). exclude: never. include:
    where another session item's list holds them. auto: whichever ranks the held-out items better."""

    popularity_weight: float = Field(0.0, ge=0)
    """Weight of the popularity prior added to each list's scores (0: none): more fills lists with
    the head items whatever the item."""

    neighbours: int = Field(100, ge=1)
    """itemknn: similar items kept per item."""

    regularization_ease: float = Field(500.0, gt=0)
    """EASE's lambda, added to the Gram matrix's diagonal."""

    factors: int = Field(64, ge=1)
    """ALS: latent factors per item."""

    def recs(self) -> RecsSpec:
        """The recommendation settings its models are trained with (no content, one item of history)."""
        fields = {"neighbours", "regularization_ease", "factors", "popularity_weight"}
        return RecsSpec(content_weight=0, history=1, **{name: getattr(self, name) for name in fields})
