"""Typed settings of the recommendations job, read from PRECOMPUTE_RECS_* variables; the pipeline
file sets the input, model, k and weights of each recs output."""

from __future__ import annotations

from typing import Literal

from precompute.models.settings import DEMO_CORPUS
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

DEMO_INTERACTIONS = DEMO_CORPUS.with_name("interactions.parquet")


class RecsJobSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PRECOMPUTE_RECS_", frozen=True)

    k: int = Field(10, ge=1, le=100)
    """Recommendations per user. A value is 6 bytes a pair (stores/records.py): up to 10 pairs
    stay within Redis's 64-byte listpack value limit, which keeps the per-user hash compact;
    past that (product pages show 20-50 and rerank) the bucket holding it becomes a hash table."""

    model: Literal["auto", "content", "itemknn", "ease", "als", "towers"] = "auto"
    """jobs/recs_models.py. auto: EASE where the catalogue is small enough for it, else ALS.
    towers: the pipeline's own two-tower model (its `towers` table)."""

    content_weight: float = Field(0.1, ge=0)
    """The hybrid: a collaborative model's score (in units of the users' median best score) plus
    this times the content cosine, which ranks the items nobody interacted with yet. 0: none."""

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

    alpha: float = Field(2.0, gt=0)
    """ALS: confidence per unit of interaction weight."""

    iterations: int = Field(15, ge=1)
    """ALS: alternating least-squares sweeps."""

    users_per_block: int = Field(512, ge=1)
    """Users scored per matrix multiply, against tiles of items whose [block, tile] float32 score
    buffer (at most 512 MB, jobs/recommend.py) is allocated once per actor."""

    actors: int = Field(1, ge=1)
    """Top-k actors, each holding the whole item matrix; one GPU each where there are GPUs."""

    ray_address: str | None = None
    """A Ray cluster (ray://host:10001 or auto); None starts a local Ray for this process."""
