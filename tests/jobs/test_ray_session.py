"""How jobs read Parquet on Ray: Ray Data 2.60's default reader starts 32 footer-reader actors, a
process each, for every read; a job's session reads through the first datasource, which starts
none, in blocks of a bounded size."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray
from ray.data import DataContext

from precompute.jobs import ray_session as ray_session_module
from precompute.jobs.ray_session import actor_pool, ray_session, ray_stopped_last, start_local, stop_local
from tests.conftest import LOCAL_RAY


def footer_readers() -> int:
    """Footer-reader actors this Ray has started, alive or gone (the GCS keeps dead actors' entries)."""
    return sum(actor["ActorClassName"] == "FooterReader" for actor in ray._private.state.actors().values())


@pytest.mark.slow
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


def test_a_jobs_blocks_stay_within_the_target_whatever_the_inputs_size(
    ray_local, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read task's output, and what each later task holds, is cut at TARGET_BLOCK_BYTES: past
    it a process's memory no longer grows with the input (Ray Data's default, 128 MiB, was
    reached between bench scale's 100,000 and 1M rows)."""
    target = 256 * 1024
    monkeypatch.setattr(ray_session_module, "TARGET_BLOCK_BYTES", target)
    monkeypatch.setattr(DataContext.get_current(), "target_max_block_size", 128 * 1024 * 1024)  # Ray's default
    path = tmp_path / "wide.parquet"
    pq.write_table(pa.table({"id": [str(i) for i in range(20_000)], "text": ["x" * 200] * 20_000}), path)
    with ray_session(None):
        blocks = ray.data.read_parquet(str(path)).materialize().get_internal_block_refs()
        sizes = [table.nbytes for table in ray.get(blocks)]
    assert sum(sizes) > 8 * target and len(sizes) > 8
    assert max(sizes) <= 1.5 * target


class Poisoned:
    """An actor whose process dies on the batch holding row 13, every time: out of memory, or a
    crash inside an engine, as a user's data can cause."""

    def __call__(self, batch: dict) -> dict:
        if 13 in batch["id"]:
            os._exit(1)
        return batch


@pytest.mark.slow
def test_a_batch_that_kills_its_actor_every_time_fails_the_job_after_bounded_retries(ray_local) -> None:
    """With Ray Data's defaults the pool restarts the actor and retries the batch for ever; the
    pool's bounds fail the dataset naming the actor's death, after ACTOR_RESTARTS restarts."""
    rows = ray.data.range(64, override_num_blocks=8)
    with pytest.raises(ray.exceptions.ActorDiedError):
        rows.map_batches(Poisoned, batch_size=8, **actor_pool(1, gpus=False)).materialize()
    assert sum(1 for _ in rows.map_batches(lambda b: b).iter_rows()) == 64  # Ray itself carries on


@pytest.mark.slow
@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_ray_a_job_starts_in_a_stopped_last_block_is_stopped_after_what_encloses_the_job_cleaned_up(
    error: type[BaseException],
) -> None:
    """A keyed output's version is dropped before Ray's shutdown when its job fails or is
    stopped (precompute/kinds/keyed.py): the drop sees Ray still up. After a failure Ray is
    down; after an interrupt (Prefect raises one on SIGTERM) it is left to the process's exit,
    as stopping it raced the threads still winding the interrupted work down."""
    had_local = ray.is_initialized()
    stop_local()
    dropped_with_ray_up = []

    @contextmanager
    def new_version() -> Iterator[None]:
        try:
            yield
        finally:
            dropped_with_ray_up.append(ray.is_initialized())

    try:
        with pytest.raises(error), ray_stopped_last(), new_version():
            with ray_session(None):
                assert ray.get(ray.put(1)) == 1
            assert ray.is_initialized()  # the session handed its shutdown to the block
            with ray_session(None):  # the next job's session is the same Ray
                assert ray.get(ray.put(2)) == 2
            raise error
        assert dropped_with_ray_up == [True]
        assert ray.is_initialized() == (error is KeyboardInterrupt)
    finally:
        stop_local()
        if had_local:
            start_local(**LOCAL_RAY)
