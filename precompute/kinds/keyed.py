"""What the kinds kept in the key-value store share: a new version each run, status, rollback, routes.

Each record is one id's ranked list, (index, score) pairs into the version's vocabulary
(stores/key_value/records.py): label names for labels, item ids for recommendations.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from precompute.jobs import work_dir
from precompute.stores.key_value.store import KeyValueStore
from precompute.stores.key_value.versions import NewVersion, OutputVersions

if TYPE_CHECKING:
    import pyarrow as pa

    from precompute.flows.steps import RunContext
    from precompute.jobs.nights import Previous
    from precompute.pipeline import Pipeline
    from precompute.settings import Machine


@dataclass(frozen=True)
class VersionVocabulary:
    """What a version's values index, and how the service answers its ids and entries."""

    entries: pa.StringArray
    """Label names for labels, item ids for recommendations, as strings."""
    digest: str
    """recs_state.vocabulary_digest(entries): for recommendations, the one the item table keeps
    (jobs/recs/item_table.py), so that 1M item ids are not hashed again for the meta."""
    integer_ids: bool = False
    """The records' ids (items for labels, users for recommendations) were integers in the input."""
    integer_entries: bool = False
    """So were the entries (integer labels, integer item ids): answered as JSON numbers."""

    @classmethod
    def of(cls, entries: pa.StringArray, integer_ids: bool = False, integer_entries: bool = False) -> VersionVocabulary:
        """A vocabulary whose digest is hashed from `entries` here."""
        from precompute.jobs.recs.state import vocabulary_digest

        return cls(entries, vocabulary_digest(entries), integer_ids, integer_entries)

    def flags(self) -> dict[str, bool]:
        return {"integer_ids": self.integer_ids, "integer_vocabulary": self.integer_entries}

    def meta_digest(self) -> str:
        """The version's meta told apart without making it (stores/key_value/meta.py): its
        entries in order and its flags."""
        return hashlib.sha256(json.dumps([self.digest, self.flags()], sort_keys=True).encode()).hexdigest()[:32]


class JobReport(Protocol):
    samples: dict[str, bytes]
    """A few id -> value as written, read back before the version is published."""


Report = TypeVar("Report", bound=JobReport)


@contextmanager
def key_value_versions(pipeline: Pipeline, name: str, machine: Machine) -> Iterator[OutputVersions]:
    with KeyValueStore(machine.redis) as store:
        yield OutputVersions(store, pipeline.store(name))


def store_line(pipeline: Pipeline, name: str, machine: Machine) -> str:
    keep = pipeline.outputs[name].keep_versions
    where = f"redis keys {machine.redis.prefix}:{pipeline.store(name)}:<version>"
    return f"  store   {where}: a new version each run, {keep} kept for rollback"


def published_run(run: RunContext, name: str, new: NewVersion) -> Previous | None:
    """The published version a new one may copy from, with its run folder; None before the first."""
    from precompute.jobs.nights import Previous

    current = new.store.current(new.output)
    if current is None:
        return None
    return Previous(current, work_dir.run_dir(run.work_dir, name, current), new.copyable(current))


def publish_new_version(
    run: RunContext, name: str, vocabulary: VersionVocabulary, job: Callable[[NewVersion, work_dir.WorkPath], Report]
) -> tuple[Report, str]:
    """Run `job(new_version, run_folder)` into a new version of the output and publish it with its
    samples checked. A version that failed before its publish is dropped whole. Returns (job
    report, version)."""
    from precompute.jobs.ray_session import ray_stopped_last  # Ray: for the jobs, not the service

    def meta() -> dict[str, Any]:
        """1M item ids made a list and encoded (0.1-0.2 s): only on a night whose base's differ."""
        return {"vocabulary": vocabulary.entries.to_pylist(), **vocabulary.flags()}

    with (
        ray_stopped_last(),  # after the version is dropped, if the job fails or is stopped
        KeyValueStore(run.machine.redis) as store,
        NewVersion(store, run.pipeline.store(name), meta, vocabulary.meta_digest()) as new,
    ):
        report = job(new, work_dir.run_dir(run.work_dir, name, new.version))
        new.publish(report.samples)
    return report, new.version


def collect_garbage(run: RunContext, name: str) -> list[str]:
    """Delete all but the output's published version and `keep` older ones, with their run
    folders; the versions deleted, oldest first. A step of its own after the publish, so that an
    outage here retries the collection, never the job of a version already published."""
    output = run.pipeline.store(name)
    with KeyValueStore(run.machine.redis) as store:
        deleted = store.collect_garbage(output, run.keep(name))
        kept = {v.name for v in store.versions(output)}
        work_dir.collect_runs(work_dir.runs(run.work_dir, name), store.current(output), kept)
    return deleted
