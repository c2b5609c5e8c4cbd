"""Typed settings of the recommendations job, read from PRECOMPUTE_RECS_* variables; the pipeline
file sets the input, k and popularity weight of each recs output."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from models.settings import DEMO_CORPUS

DEMO_INTERACTIONS = DEMO_CORPUS.with_name("interactions.parquet")


class RecsJobSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PRECOMPUTE_RECS_", frozen=True)

    k: int = Field(10, ge=1, le=10)
    """Recommendations per user. A value is 6 bytes a pair (stores/records.py); 10 pairs stay
    within Redis's 64-byte listpack limit, which keeps the per-user hash compact."""

    popularity_weight: float = Field(0.4, ge=0)
    """Weight of the popularity prior added to the cosine (0: content only). Chosen by the
    leave-one-out hit-rate on the demo data (data/README.md); more favours the head items."""

    users_per_block: int = Field(512, ge=1)
    """Users scored per matrix multiply, against tiles of items whose [block, tile] float32 score
    buffer (at most 512 MB, jobs/recommend.py) is allocated once per actor."""

    actors: int = Field(1, ge=1)
    """Top-k actors, each holding the whole item matrix; one GPU each where there are GPUs."""

    ray_address: str | None = None
    """A Ray cluster (ray://host:10001 or auto); None starts a local Ray for this process."""
