"""A key-value version's meta digest (precompute/kinds/keyed.py) and the vocabulary digest under
it (jobs/recs_state.py): equal exactly when the meta would be, since an overlay with its base's
digest answers with its base's vocabulary, and a recs night copies values only under the same
vocabulary."""

from __future__ import annotations

import pyarrow as pa

from precompute.kinds.keyed import meta_digest

FLAGS = {"integer_ids": False, "integer_vocabulary": False}


def test_lists_that_join_alike_flags_and_order_tell_metas_apart() -> None:
    entries = pa.array(["a\nb", "c"])
    assert meta_digest(entries, FLAGS) == meta_digest(pa.array(["x", "a\nb", "c"]).slice(1), FLAGS)
    assert meta_digest(entries, FLAGS) != meta_digest(pa.array(["a", "b\nc"]), FLAGS)
    assert meta_digest(entries, FLAGS) != meta_digest(pa.array(["c", "a\nb"]), FLAGS)
    assert meta_digest(entries, FLAGS) != meta_digest(entries, {**FLAGS, "integer_vocabulary": True})
