"""What the kinds kept in the key-value store share: their versions, their check before a publish,
their plan's store line and their routes.

Each record is one id's ranked list, (index, score) pairs into the version's vocabulary
(stores/key_value/records.py): label names for labels, item ids for recommendations. A keyed kind
says what its compute writes and how the API shows a record (`format`); the rest is here.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import pyarrow as pa

from precompute.jobs.nights import Previous
from precompute.kinds import Output, OutputKind, RunContext, Target
from precompute.kinds.report import Computed
from precompute.lookup.keys import KeyFormat
from precompute.lookup.served import Served
from precompute.lookup.serving import Serving
from precompute.settings import Machine
from precompute.stores.key_value.store import KeyValueStore
from precompute.stores.key_value.versions import NewVersion, OutputVersions


@dataclass(frozen=True)
class VersionVocabulary:
    """What a version's values index, and how the service answers its ids and entries."""

    entries: pa.StringArray
    """Label names for labels, item ids for recommendations, as strings."""
    digest: str
    """vocabulary_digest(entries): for recommendations, the one the item table keeps
    (jobs/recs/item_table.py), so that a large catalogue's ids are not hashed again for the meta."""
    integer_ids: bool = False
    """The records' ids (items for labels, users for recommendations) were integers in the input."""
    integer_entries: bool = False
    """So were the entries (integer labels, integer item ids): answered as JSON numbers."""

    @classmethod
    def of(cls, entries: pa.StringArray, integer_ids: bool = False, integer_entries: bool = False) -> VersionVocabulary:
        """A vocabulary whose digest is hashed from `entries` here."""
        from precompute.jobs.recs.state import vocabulary_digest  # imports Ray: the jobs', not the service's

        return cls(entries, vocabulary_digest(entries), integer_ids, integer_entries)

    def flags(self) -> dict[str, bool]:
        return {"integer_ids": self.integer_ids, "integer_vocabulary": self.integer_entries}

    def meta_digest(self) -> str:
        """The version's meta told apart without making it (stores/key_value/meta.py): its
        entries in order and its flags."""
        return hashlib.sha256(json.dumps([self.digest, self.flags()], sort_keys=True).encode()).hexdigest()[:32]

    def meta(self) -> dict[str, Any]:
        """Made only on a night whose base's meta differs: a large vocabulary as a list is costly."""
        return {"vocabulary": self.entries.to_pylist(), **self.flags()}


C = TypeVar("C", bound=Computed)


class KeyedKind(OutputKind[OutputVersions, C]):
    """An output kind whose versions are key-value records, answered by key."""

    store_family = "redis"
    format: ClassVar[KeyFormat]
    """How the API shows a record (lookup/keys.py)."""

    @contextmanager
    def versions(self, output: Output, machine: Machine) -> Iterator[OutputVersions]:
        with KeyValueStore(machine.redis) as store:
            yield OutputVersions(store, output.store)

    def validate(self, run: RunContext, output: Output, target: Target[OutputVersions], computed: C) -> Any:
        """Redis holds the records the version was created for, and the samples read back as written."""
        target.store.check(target.version, computed.samples)
        return None

    def max_k(self, output: Output) -> int:
        """The most entries a record holds (0: the service's max_k)."""
        return 0

    def serve(self, serving: Serving, output: Output, machine: Machine) -> Served:
        return serving.keys.serve(output.name, output.store, self.format, max_k=self.max_k(output))


def store_line(output: Output, machine: Machine) -> str:
    where = f"redis keys {machine.redis.prefix}:{output.store}:<version>"
    return f"  store   {where}: a new version each night, {output.spec.keep_versions} kept for rollback"


def writer(target: Target[OutputVersions], vocabulary: VersionVocabulary) -> NewVersion:
    """What the night's job writes its version through, its meta the vocabulary."""
    return target.store.writer(target.version, vocabulary.meta, vocabulary.meta_digest())


def published_run(run: RunContext, output: Output, target: Target[OutputVersions]) -> Previous | None:
    """The published version the new one may copy from, with its run folder; None before the first."""
    current = target.store.current()
    if current is None:
        return None
    return Previous(current, run.run_dir(output.name, current), target.store.store.copyable(output.store, current))
