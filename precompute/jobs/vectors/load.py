"""A new vector version from a run's staged parts: loaded whole, or a copy of the published
version with only what moved written into it.

Whole: every staged point is upserted into an empty version, whose graph `finalize` builds over
all of them (most of a large night's load: `precompute bench scale`).

Copy: the published version as it is stored (the store's `copy_version`: on edge its segments
and their graphs), then the staged rows it does not hold are upserted (a new id, a changed text,
a changed payload) and the ids this run no longer has are deleted; `finalize` indexes the new
points' segment alone. A row is the same when its id, content key (the model and the text) and
payload are: its vector is then the published one, the same model's embedding of the same text.
A copy is taken when
- the published version's staged parts are there to compare with (its run folder, kept while
  the version is: jobs/work_dir.py collect_runs);
- it was built as this version would be: the same meta (model, reference, dimension, payload
  fields and types, graph, quantization), the search parameters its check chose aside;
- at most COPY_SHARE of its points change.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq

from precompute.jobs.staging import COMPUTED, committed_dataset, dictionary_columns, is_committed
from precompute.jobs.text.content_cache import KEY, changes, digests
from precompute.jobs.text.embedding_cache import EMBEDDING, embeddings_of
from precompute.jobs.work_dir import WorkPath
from precompute.stores.vectors.settings import Quantization
from precompute.stores.vectors.store import SEARCH_KEY, VectorStore

NOT_PAYLOAD = {"text", KEY, EMBEDDING, COMPUTED, "id"}
LOAD_BATCH = 256
CHANGES = "changes.parquet"
"""In a copied version's run folder: each row the copy wrote (its id, content key and vector) and
each id it deleted (a null vector), with the source version's name in the file's metadata
(SOURCE): its index check updates the source version's exact neighbours with them rather than
score every row again (jobs/vectors/index_check.py), and the recommendations patch the source's item
table (jobs/recs/item_table.py)."""
SOURCE = b"source"
COPY_SHARE = 0.2
"""Changed and deleted points, as a share of the published version's, past which a version is
loaded whole: Qdrant's vacuum rewrites a segment past 20% deleted points anyway (its default
`deleted_threshold`), and the changed points' own segment would grow toward a full build."""


@dataclass(frozen=True)
class Loaded:
    count: int
    """Points in the new version."""
    mode: str
    """"whole" or "copy"."""
    reason: str
    """Why a version was loaded whole, or which version it copies."""
    written: int
    """Points upserted."""
    deleted: int
    """Points deleted from the copy."""


class Copy(NamedTuple):
    source: str
    changed: pa.Array
    """Ids of the staged rows to write."""
    gone: list[str]
    """Ids of the source's points this run does not have."""


def payload_kind(kind: pa.DataType) -> str:
    """A payload field's type as a search filter sees it: str, int and bool are matched exactly."""
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return "str"
    if pa.types.is_integer(kind):
        return "int"
    return "bool" if pa.types.is_boolean(kind) else str(kind)


def load_version(
    store: VectorStore,
    version: str,
    run_dir: WorkPath,
    meta: dict[str, Any],
    quantization: Quantization,
    published: tuple[str, WorkPath] | None,
    same_rows: bool = False,
) -> Loaded:
    """Load the committed parts in `run_dir` into a new, unpublished version, indexed: a copy of
    `published` (its version and staged parts) where that is possible, else whole. `same_rows`:
    the parts are a copy of the published run's (an unchanged night), so no row is compared."""
    parts = committed_dataset(run_dir)
    payload_columns = [c for c in parts.schema.names if c not in NOT_PAYLOAD]
    meta = {
        **meta,
        "payload": {c: payload_kind(parts.schema.field(c).type) for c in payload_columns},
        "integer_ids": pa.types.is_integer(parts.schema.field("id").type),  # answered as numbers
        "quantization": quantization,
        "dim": parts.schema.field(EMBEDDING).type.list_size,
    }
    copy, reason = plan_copy(store, parts, meta, published, same_rows)
    if copy is None:
        store.create_version(version, meta["dim"], meta, quantization)
        written = write(store, version, parts, payload_columns, None)
    else:
        store.copy_version(copy.source, version, meta)
        store.delete(version, copy.gone)
        with changes_file(run_dir, parts.schema, copy.source) as changes:
            written = write(store, version, parts, payload_columns, copy.changed, changes)
            nothing = pa.nulls(len(copy.gone))
            gone = pa.table({"id": copy.gone, KEY: nothing, EMBEDDING: nothing}, changes.schema)
            changes.write_table(gone)
    store.finalize(version)
    mode, deleted = ("whole", 0) if copy is None else ("copy", len(copy.gone))
    return Loaded(store.count(version), mode, reason, written, deleted)


def plan_copy(
    store: VectorStore,
    parts: pads.Dataset,
    meta: dict[str, Any],
    published: tuple[str, WorkPath] | None,
    same_rows: bool,
) -> tuple[Copy | None, str]:
    """What a copy of the published version writes and deletes, or None and why not."""
    if published is None:
        return None, "nothing is published"
    source, source_dir = published
    if not is_committed(source_dir):
        return None, f"the published version {source}'s staged parts are gone"
    old = store.meta(source)
    differs = sorted(k for k in old.keys() | meta.keys() if k != SEARCH_KEY and old.get(k) != meta.get(k))
    if differs:
        return None, f"the published version {source} differs in {', '.join(differs)}"
    if same_rows:  # hashing both tables would read every row to find nothing
        return Copy(source, pa.array([], parts.schema.field("id").type), []), f"a copy of {source}, no row moved"
    columns, payload = ["id", KEY, *meta["payload"]], list(meta["payload"])
    new = digests(parts.to_table(columns=columns), payload)
    previous = digests(committed_dataset(source_dir).to_table(columns=columns), payload)
    moved_rows, gone_rows = changes(new, previous)
    changed, gone = moved_rows["id"], gone_rows["id"]
    moved = len(changed) + len(gone)
    if moved > COPY_SHARE * max(len(previous), 1):
        return None, f"{moved} of the published version {source}'s {len(previous)} points change"
    ids = changed.to_arrow().cast(parts.schema.field("id").type)
    return Copy(source, ids, [str(i) for i in gone.to_list()]), f"a copy of {source}"


@contextmanager
def changes_file(run_dir: WorkPath, staged: pa.Schema, source: str) -> Iterator[pq.ParquetWriter]:
    """The CHANGES of a copy of `source` whose staged parts have the schema `staged`, written as
    its rows are upserted."""
    fields = [("id", pa.string()), staged.field(KEY), staged.field(EMBEDDING)]
    schema = pa.schema(fields, metadata={SOURCE: source.encode()})
    with (run_dir / CHANGES).replaced() as tmp:
        dictionary = dictionary_columns(schema)
        with pq.ParquetWriter(tmp.path, schema, filesystem=tmp.fs, use_dictionary=dictionary) as writer:
            yield writer


def write(
    store: VectorStore,
    version: str,
    parts: pads.Dataset,
    payload_columns: list[str],
    only: pa.Array | None,
    changes: pq.ParquetWriter | None = None,
) -> int:
    """Upsert the staged rows (those whose id is in `only`, when given), each also to `changes`
    when given; return how many."""
    if only is not None and not len(only):
        return 0
    chosen = None if only is None else pc.field("id").isin(only)
    written = 0
    for batch in parts.to_batches(batch_size=LOAD_BATCH, filter=chosen):
        table = pa.Table.from_batches([batch])
        if table.num_rows:
            ids = [str(i) for i in table["id"].to_pylist()]
            store.upsert(version, ids, embeddings_of(table), table.select(payload_columns).to_pylist())
            if changes is not None:
                changes.write_table(pa.table({"id": ids, KEY: table[KEY], EMBEDDING: table[EMBEDDING]}, changes.schema))
            written += table.num_rows
    return written
