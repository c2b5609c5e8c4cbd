"""One output's versions in the key-value store: the one a night writes, and those an operator lists.

`OutputVersions` is the `Versioned` (stores/versions.py) of one output: the night's lifecycle
(flows/lifecycle.py) checks, publishes, drops and collects its versions through it, and `status`
and `rollback` read it. `NewVersion` writes one version, so that no job handles buckets or copies:
it is created once the job knows how many records it will hold (fresh, or for an incremental night
the published version's records less those that left, as an overlay), then written through a Ray
Datasink.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from precompute.stores.errors import VersionNotFoundError
from precompute.stores.key_value.overlay import REBASE_SHARE
from precompute.stores.key_value.store import KeyValueStore
from precompute.stores.versions import Version

if TYPE_CHECKING:
    from precompute.stores.key_value.sink import KeyValueSink


@dataclass(frozen=True)
class CopyPlan:
    """How an incremental version starts: a copy of `version`, less the records `gone`; the job
    then writes only the records that changed, over the copied ones."""

    version: str
    gone: list[str]


class NewVersion:
    """A new version of `output`, written aside while readers keep the published one."""

    def __init__(
        self,
        store: KeyValueStore,
        output: str,
        version: str,
        meta: Callable[[], Mapping[str, Any]],
        meta_digest: str | None = None,
    ) -> None:
        self.store = store
        self.output = output
        self.version = version
        self.meta = meta
        """What is stored with the version (JSON): e.g. the vocabulary its values index into. Made
        only if stored: an overlay whose base has the same `meta_digest` reads the base's."""
        self.meta_digest = meta_digest

    def copyable(self, version: str) -> range:
        """Record counts a copy of `version` holds well (KeyValueStore.copyable)."""
        return self.store.copyable(self.output, version)

    def create(self, rows: int, copy: CopyPlan | None = None) -> None:
        """Register the version for `rows` records; with `copy`, start from that version's records.

        A copy is an overlay over the copied version's base (key_value_overlay.py): it holds only
        what the night writes and deletes, and the overlay that `copy` may already be, copied
        server-side. Once REBASE_SHARE of the base's records have changed, it is a whole version:
        the base's buckets copied server-side, then the overlay's changes applied."""
        digest = self.meta_digest
        if copy is None:
            self.store.create_version(self.output, self.version, rows, self.meta(), meta_digest=digest)
            return
        source = self.store.layout(self.output, copy.version)
        if source.base is None:
            meta = self._meta_over(copy.version)
            self.store.create_version(self.output, self.version, rows, meta, base=copy.version, meta_digest=digest)
        elif self.store.changed(self.output, copy.version) <= REBASE_SHARE * source.base_rows:
            meta, buckets = self._meta_over(source.base), source.buckets
            self.store.create_version(
                self.output, self.version, rows, meta, buckets=buckets, base=source.base, meta_digest=digest
            )
            self.store.copy_version(self.output, copy.version, self.version)
        else:
            buckets = source.whole_buckets
            self.store.create_version(self.output, self.version, rows, self.meta(), buckets=buckets, meta_digest=digest)
            self.store.copy_version(self.output, copy.version, self.version)
        self.store.delete(self.output, self.version, copy.gone)

    def _meta_over(self, base: str) -> Mapping[str, Any] | None:
        """The meta an overlay over `base` stores: none where it reads the base's (the same digest)."""
        return None if self.store.shares_meta(self.output, base, self.meta_digest) else self.meta()

    def sink(self) -> KeyValueSink:
        """A Ray Datasink writing (id, value) rows into the version, once it is created."""
        from precompute.stores.key_value.sink import KeyValueSink  # Ray Data: slow to import, for jobs only

        return KeyValueSink(self.store.settings, self.output, self.version)


class OutputVersions:
    """`Versioned` (versions.py) for one output of the key-value store."""

    def __init__(self, store: KeyValueStore, output: str) -> None:
        self.store = store
        self.output = output
        self.where = f"redis: {store.settings.prefix}:{output}"

    def current(self) -> str | None:
        return self.store.current(self.output)

    def versions(self) -> list[str]:
        return [v.name for v in self.store.versions(self.output)]

    def listing(self) -> list[Version]:
        now = datetime.now(UTC)
        return [
            Version(v.name, v.rows, (now - v.created).total_seconds(), v.is_current)
            for v in self.store.versions(self.output)
        ]

    def rollback(self, to: str | None = None) -> str:
        return self.store.rollback(self.output, to)

    def writer(
        self, version: str, meta: Callable[[], Mapping[str, Any]], meta_digest: str | None = None
    ) -> NewVersion:
        """What a night's job writes `version` through (created once it knows its record count)."""
        return NewVersion(self.store, self.output, version, meta, meta_digest)

    def check(self, version: str, samples: Mapping[str, bytes]) -> None:
        """Redis holds exactly the records the version was created for, and each sample reads back
        as written (stores/key_value/check.py); PublishValidationError otherwise."""
        self.store.check(self.output, version, samples)

    def publish(self, version: str) -> None:
        self.store.publish(self.output, version)

    def drop(self, version: str) -> None:
        """A failed night's version deleted whole, if it got as far as existing; never the published one."""
        if self.store.current(self.output) != version:
            with contextlib.suppress(VersionNotFoundError):  # it never got as far as existing
                self.store.drop_version(self.output, version)

    def collect(self, keep: int) -> list[str]:
        return self.store.collect_garbage(self.output, keep)
