"""What a recommendations output computes: the pipeline file's fields of a recs output that the
job reads (its model, list length, weights and hyperparameters), declared once here."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Model = Literal["auto", "content", "itemknn", "ease", "als", "towers"]


class RecsSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    k: int = Field(10, ge=1, le=100)
    """Recommendations per user. A value is 6 bytes a pair (stores/records.py): up to 10 pairs
    stay within Redis's 64-byte listpack value limit, which keeps the store compact; past that
    (product pages show 20-50 and rerank) it costs more memory (stores/redis_settings.py)."""

    model: Model = "auto"
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
    """ALS: the L2 penalty on the factors."""

    alpha: float = Field(2.0, gt=0)
    """ALS: confidence per unit of interaction weight."""

    iterations: int = Field(15, ge=1)
    """ALS: alternating least-squares sweeps."""
