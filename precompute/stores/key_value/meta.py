"""A key-value version's meta (e.g. the vocabulary its values index into): its own key, or its
base's where an overlay's meta is the same.

The recs' vocabulary is every item id, 14 MB of JSON at 1M items. Every incremental night made
it a Python list, encoded it and stored it again, though the items had not changed (time, and
14 MB of Redis a version), and the service decoded and escaped it again at each switch, holding
its event loop for a time that grows with the items. A version created with a `meta_digest`, the caller's
own cheap identity of its meta, records the digest in its registry entry. An overlay whose base
has the same digest stores no meta and names the base's (META_OF). GC keeps a base's meta key
with its buckets for as long as a registered overlay holds the base.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from precompute.stores.errors import VersionNotFoundError
from precompute.stores.key_value.settings import OutputKeys

DIGEST = "meta_digest"
META_OF = "meta_of"
"""In an overlay's registry entry: the base whose meta key it reads."""


def shares(base: Mapping[str, Any], digest: str | None) -> bool:
    """Whether an overlay with this meta digest over the version whose entry is `base` reads its meta."""
    return digest is not None and base.get(DIGEST) == digest


def encoded(meta: Mapping[str, Any] | None) -> bytes:
    try:  # orjson: several times faster than json.dumps on a large vocabulary
        return orjson.dumps(dict(meta or {}))
    except TypeError as e:
        raise ValueError(f"meta must be JSON-serializable: {e}") from e


def owner(version: str, entry: Mapping[str, Any]) -> str:
    """The version whose meta key `version` (registry entry `entry`) reads: its own, or its base's."""
    return entry.get(META_OF, version)


def stored_meta(raw: bytes | None, keys: OutputKeys, version: str, entry: Mapping[str, Any]) -> dict[str, Any]:
    """A version's meta from the GET of its owner's meta key. A version registered before meta had a key
    holds it inline in its registry entry; an overlay whose base's meta is gone has none."""
    if raw is not None:
        return orjson.loads(raw)
    if META_OF in entry:
        raise VersionNotFoundError(
            f"version {entry[META_OF]!r} of output {keys.output!r}, whose meta {version!r} reads, is gone"
        )
    return entry.get("meta", {})
