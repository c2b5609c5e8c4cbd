"""How jobs read Parquet on Ray: Ray Data 2.60's default reader starts 32 footer-reader actors, a
process each, for every read; a job's session reads through the first datasource, which starts none."""

from __future__ import annotations

from pathlib import Path

import pytest
import ray
from ray.data import DataContext

from precompute.jobs.ray_session import ray_session


def footer_readers() -> int:
    """Footer-reader actors this Ray has started, alive or gone (the GCS keeps dead actors' entries)."""
    return sum(actor["ActorClassName"] == "FooterReader" for actor in ray._private.state.actors().values())


def test_a_jobs_parquet_read_starts_no_footer_reader_actors(
    ray_local, small_corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(DataContext.get_current(), "use_datasource_v2", True)  # Ray's default
    before = footer_readers()
    ray.data.read_parquet(str(small_corpus)).materialize()
    started = footer_readers()
    assert started > before  # what the probe sees with Ray's default

    with ray_session(None):
        assert ray.data.read_parquet(str(small_corpus)).materialize().count() == 204
    assert footer_readers() == started
