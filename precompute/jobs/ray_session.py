"""Join the Ray cluster named in settings, or start a local Ray for this process; how Ray Data
reads Parquet; the resources every inference actor pool asks for, and when a few rows skip it."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import psutil
import pyarrow as pa
import ray
from ray import ObjectRef
from ray.data import ActorPoolStrategy, DataContext

from precompute.jobs.settings import JobSettings

TARGET_BLOCK_BYTES = 32 * 1024 * 1024
"""Ray Data's largest block (its default: 128 MiB). A read task builds, and each task and actor
downstream holds, a block at a time, so a process's memory grows with the input until its
blocks reach this size, and no further (`precompute bench scale` reports each stage's peak
memory by size)."""
LOCAL_START_ATTEMPTS = 3
"""Ray waits a fixed half minute for a local node's raylet to register, too little on a loaded machine."""

log = logging.getLogger(__name__)


def worker_pool(num_cpus: int) -> dict[str, int]:
    """Ray's system config for a node's pool of worker processes. By default Ray kills an idle
    worker after a second once a node runs more workers than CPUs (actors count), so on a small
    node each stage of a run starts new ones, each importing Ray Data, pandas and pyarrow
    again (`precompute bench scale` times the stages). Kept a minute, up to four per
    CPU, they are reused from stage to stage."""
    return {"num_workers_soft_limit": 4 * num_cpus, "idle_worker_killing_time_threshold_ms": 60_000}


def start_local(num_cpus: int, **options: Any) -> None:
    """Start a local Ray, retrying a start that timed out; what a failed start left running is
    stopped first, so no attempt leaks processes."""
    for attempt in range(1, LOCAL_START_ATTEMPTS + 1):
        try:
            # "local": never join the cluster `ray start` or a test cluster recorded in
            # /tmp/ray/ray_current_cluster, which a plain ray.init() would.
            init(
                address="local",
                num_cpus=num_cpus,
                include_dashboard=False,
                _system_config=worker_pool(num_cpus),
                **options,
            )
            return
        except Exception as e:
            stop_local()
            if attempt == LOCAL_START_ATTEMPTS:
                raise
            log.warning("local Ray start %d of %d failed (%s); retrying", attempt, LOCAL_START_ATTEMPTS, e)


def init(**options: Any) -> None:
    """ray.init, keeping this process's SIGTERM handler. Ray's replaces it with a bare exit, and in
    a flow run Prefect's (which tells the server the run ended) must stay: a scheduled run stopped
    by SIGTERM would otherwise be shown running forever."""
    previous = signal.getsignal(signal.SIGTERM)
    try:
        ray.init(**options)
    finally:
        if previous is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, previous)


def stop_local() -> None:
    """Shut Ray down, then stop any of its processes this one started that are still running
    (a failed start has no node to shut down). Waiting for the node's processes to exit means
    none is still running when its handle is dropped (a ResourceWarning, an error in the tests)."""
    ray.shutdown(wait_for_processes=True)
    leftovers = [p for p in psutil.Process().children(recursive=True) if _is_ray(p)]
    for process in leftovers:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs(leftovers, timeout=10)


def _is_ray(process: psutil.Process) -> bool:
    try:
        return any("/ray/" in part or part.startswith("ray::") for part in process.cmdline())
    except psutil.Error:
        return False


_deferred: list[Callable[[], None]] | None = None
"""While a ray_stopped_last block is open: the shutdowns of the Ray sessions started in it."""


@contextmanager
def ray_session(address: str | None) -> Iterator[None]:
    """A caller that already initialised Ray (a test, a flow) keeps its session and owns its
    shutdown; inside ray_stopped_last, the block does.

    Parquet is read through Ray Data's first datasource: its second (2.60's default) starts 32
    FooterReader actors, one process each, for every read, to fetch the footers of what here is
    a handful of files. Blocks are at most TARGET_BLOCK_BYTES."""
    context = DataContext.get_current()
    context.use_datasource_v2 = False
    context.target_max_block_size = TARGET_BLOCK_BYTES
    if ray.is_initialized():
        yield
        return
    if address:
        init(address=address)
    else:
        start_local(len(os.sched_getaffinity(0)))
    stop = ray.shutdown if address else stop_local
    if _deferred is not None:
        _deferred.append(stop)
        yield
        return
    with stopped_unless_interrupted([stop]):
        yield


@contextmanager
def ray_stopped_last() -> Iterator[None]:
    """Ray that a job in this block starts stays up until the block exits, so what encloses the
    job inside the block cleans up first: a run stopped by SIGTERM deletes its unpublished
    version before Ray goes. Around a night (flows/nightly.py), the first job's Ray serves the
    jobs after it: a local Ray's start and stop, and its workers' imports, are seconds each."""
    global _deferred
    if _deferred is not None:
        yield
        return
    _deferred = []
    try:
        with stopped_unless_interrupted(_deferred):
            yield
    finally:
        _deferred = None


def stop_deferred() -> None:
    """Stop now the Ray sessions a ray_stopped_last block holds: the next job starts its own."""
    stops = list(_deferred or [])
    if _deferred is not None:
        _deferred.clear()
    for stop in stops:
        stop()


@contextmanager
def stopped_unless_interrupted(stops: list[Callable[[], None]]) -> Iterator[None]:
    """Call `stops` when the block ends, unless a termination (what Prefect raises on SIGTERM)
    or Ctrl-C ends it. Ray's shutdown then raced the threads still winding down the interrupted
    work (Ray Data's executor, Prefect's task runs): one that touched Ray after it made Ray's core
    worker end the process on the spot, before Prefect marked the run crashed, and a scheduled
    run showed Running for ever. The process is ending anyway: Ray's exit handler stops Ray, and
    a local Ray's processes die with this one if it is killed (Ray's kernel fate sharing)."""
    interrupted = False
    try:
        yield
    except BaseException as e:
        interrupted = not isinstance(e, Exception)
        raise
    finally:
        if not interrupted:
            for stop in stops:
                stop()


def one_node() -> bool:
    """Whether the Ray cluster is this one machine: there, work Ray would fan out to its workers
    shares the driver's CPUs, and the driver's own threads spare the workers' start."""
    return sum(node["Alive"] for node in ray.nodes()) == 1


ACTOR_RESTARTS = 3
"""Times an inference actor is restarted after its process died before the job fails: the bound
on a batch that kills its actor every time."""


def waited(ref: ObjectRef) -> tuple[Any, float]:
    """(the task's result, the seconds this process waited for it): what a job's report calls
    its engine stage, the wait past the work it overlapped."""
    start = time.perf_counter()
    return ray.get(ref), time.perf_counter() - start


def actor_pool(size: int, gpus: bool) -> dict[str, Any]:
    """`map_batches` options of an inference actor pool: one GPU per actor where there are
    GPUs. On CPU the engine's threads use every core anyway; half a CPU in Ray's books leaves
    room for the read tasks, while an actor taking all CPUs of a node hangs the dataset
    silently (STACK.md).

    A lost node or a killed actor process: the actor is started again on a node with room and
    the batches it had in flight are retried (tests/flows/test_multinode.py kills a node
    mid-embedding). Ray Data's defaults restart the actor for ever, so a batch that kills its
    actor every time (out of memory, a crash in the engine) would never fail the job; bounded
    at ACTOR_RESTARTS restarts, the job fails naming the actor's death
    (tests/jobs/test_ray_session.py). The bound is on restarts, not on task retries: Ray counts
    each submit to an actor not yet known dead ("temporarily unavailable") as a retry, and a
    lost node's in-flight batches spend several of them at once, before its actor is even
    restarting; every retry that finds the actor dead spends a restart, so the restarts bound
    the retries too (Ray's actor fault-tolerance guide). Ray 2.60 takes both only as
    `ray_remote_args`, which it deprecates for 2.64."""
    return {
        "compute": ActorPoolStrategy(size=size),
        "num_gpus": 1 if gpus else 0,
        "num_cpus": 1 if gpus else 0.5,
        "max_restarts": ACTOR_RESTARTS,
        "max_task_retries": -1,
    }


class Inference(Protocol):
    """An inference actor: opens its engine when made, maps a batch, closes the engine."""

    def __call__(self, batch: pa.Table) -> pa.Table: ...

    def close(self) -> None: ...


def map_inference(
    rows: ray.data.Dataset,
    actor: Callable[..., Inference],
    kwargs: dict[str, Any],
    count: int,
    settings: JobSettings,
    gpus: bool,
) -> ray.data.Dataset:
    """`rows` (`count` of them) through `actor`'s batches: by an actor pool (actor_pool), or in
    this process where they are at most `settings.driver_rows` and there is no GPU, the
    night's few changed rows sparing an actor's start."""
    if count > settings.driver_rows or gpus:
        return rows.map_batches(
            actor,
            fn_constructor_kwargs=kwargs,
            batch_size=settings.rows_per_batch,
            batch_format="pyarrow",
            **actor_pool(settings.actors, gpus),
        )
    mapper = actor(**kwargs)
    try:
        batches = rows.iter_batches(batch_size=settings.rows_per_batch, batch_format="pyarrow")
        return ray.data.from_arrow([mapper(batch) for batch in batches])
    finally:
        mapper.close()
