"""A key-value version's meta digest (precompute/kinds/keyed.py) and the vocabulary digest under
it (jobs/recs/state.py): equal exactly when the meta would be, since an overlay with its base's
digest answers with its base's vocabulary, and a recs night copies values only under the same
vocabulary."""

from __future__ import annotations

import pyarrow as pa

from precompute.kinds.keyed import VersionVocabulary


def meta_digest(entries: pa.StringArray, integer_entries: bool = False) -> str:
    return VersionVocabulary.of(entries, integer_entries=integer_entries).meta_digest()


def test_lists_that_join_alike_flags_and_order_tell_metas_apart() -> None:
    entries = pa.array(["a\nb", "c"])
    assert meta_digest(entries) == meta_digest(pa.array(["x", "a\nb", "c"]).slice(1))
    assert meta_digest(entries) != meta_digest(pa.array(["a", "b\nc"]))
    assert meta_digest(entries) != meta_digest(pa.array(["c", "a\nb"]))
    assert meta_digest(entries) != meta_digest(entries, integer_entries=True)
