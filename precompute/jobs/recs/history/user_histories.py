"""Each user's history, grouped on the driver: who moved since the published version, and what
the top-k actors read.

The driver holds the night's valid interactions already (it trains on them), so grouping them
by user is one sort there (`group_all`), not a Ray Data shuffle. The shuffle (group by user,
then a Python call per user) had a large fixed cost on small inputs and took most of the recs
job's time past its top-k on large ones (`precompute bench scale`), and its reduce workers'
memory grew with the input. A night that only adds files regroups from the published night's
grouping instead (jobs/recs/history/kept_histories.py).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import ray

from precompute.jobs.recs.history.interactions import SECONDS
from precompute.jobs.recs.history.seen import GROUPED_ORDER, Seen, as_seen, user_ids, users_subset
from precompute.jobs.recs.state import FINGERPRINT, LENGTH
from precompute.jobs.text.content_cache import key_column

ITEMS, WEIGHTS, VISITS = "items", "weights", "visits"
HOLDS = "holds_changed"
LANES = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xD1B54A32D192ED03))
"""Two seeds of the fingerprint's 64-bit halves."""


def mixed(values: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer (Steele, Lea and Flood, 2014) of each uint64: a change of one bit of
    the input changes each bit of the output with probability about one half."""
    z = values.copy()
    z ^= z >> np.uint64(30)
    z *= np.uint64(0xBF58476D1CE4E5B9)
    z ^= z >> np.uint64(27)
    z *= np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def fingerprints(seen: Seen) -> np.ndarray:
    """Each user's history (item positions and weights, in the job's history order: the order a
    sequence model reads) -> 16 bytes, for every user at once: each interaction hashed with its
    place in the history, the hashes summed per user, in two 64-bit lanes. Positions are enough
    because a run compares fingerprints only under the identical vocabulary. Not a cryptographic
    hash: two histories a night tells apart collide with a chance of about 2**-128. A blake2b
    digest per user would cost a Python call per user, every night."""
    lengths = np.diff(seen.offsets)
    place = np.arange(len(seen.items), dtype=np.uint64) - np.repeat(seen.offsets[:-1], lengths).astype(np.uint64)
    row = (seen.items.astype(np.uint64) << np.uint64(32)) ^ seen.weights.astype("<f4").view(np.uint32)
    lanes = np.zeros((len(lengths), 2), np.uint64)
    for lane, seed in enumerate(LANES):
        hashed = mixed(mixed(row ^ seed) ^ (place * seed))
        if len(hashed):
            lanes[:, lane] = np.add.reduceat(hashed, seen.offsets[:-1])
    return lanes.astype("<u8").view("S16").reshape(-1)


class Grouped(NamedTuple):
    """The night's valid interactions grouped by user, with what the next night regroups from."""

    seen: Seen
    ids: pa.StringArray
    """seen.ids in Arrow."""
    fingerprints: np.ndarray
    """Each user's `fingerprints`, 16-byte strings."""
    seconds: pa.Array
    """Each of seen's rows' time (null: none): what a later night's regrouping sorts them by."""


def group_all(good: pa.Table) -> Grouped:
    """Every user's history, from every valid row: one sort."""
    ordered = good.sort_by(GROUPED_ORDER)
    seen = as_seen(ordered)
    return Grouped(seen, pa.array(seen.ids, pa.string()), fingerprints(seen), ordered[SECONDS].combine_chunks())


def user_rows(grouped: Grouped, changed: np.ndarray) -> pa.Table:
    """Every user's id, fingerprint (their history: `fingerprints`), number of interactions and
    whether they hold an item that `changed` (a mask over the items) marks: what decides who is
    rescored, and what the next night compares with and regroups from (about 50 bytes a user)."""
    seen = grouped.seen
    holds = np.logical_or.reduceat(changed[seen.items], seen.offsets[:-1]) if len(seen.items) else []
    return pa.table(
        {
            "id": grouped.ids,
            FINGERPRINT: pc.cast(key_column(grouped.fingerprints), pa.binary()),
            LENGTH: pa.array(np.diff(seen.offsets), pa.int64()),
            HOLDS: pa.array(holds, pa.bool_()),
        }
    )


def history_blocks(seen: Seen, users: np.ndarray, block: int) -> ray.data.Dataset:
    """The histories of `users` (positions, ascending) in blocks of `block` users: one top-k
    actor call each."""
    chosen = users_subset(seen, users)
    table = pa.table(
        {
            "id": pa.array(chosen.ids, pa.string()),
            ITEMS: pa.LargeListArray.from_arrays(chosen.offsets, chosen.items),
            WEIGHTS: pa.LargeListArray.from_arrays(chosen.offsets, chosen.weights),
            **({} if chosen.visits is None else {VISITS: pa.LargeListArray.from_arrays(chosen.offsets, chosen.visits)}),
        }
    )
    return ray.data.from_arrow([table.slice(start, block) for start in range(0, table.num_rows, block)])


def seen_of(batch: pa.Table) -> Seen:
    """A block of `history_blocks` as the ranker takes it."""
    items, weights = batch[ITEMS].combine_chunks(), batch[WEIGHTS].combine_chunks()
    offsets = items.offsets.to_numpy()
    return Seen(
        offsets=(offsets - offsets[0]).astype(np.int64),  # a slice's offsets start where it does
        items=items.flatten().to_numpy().astype(np.int64),
        weights=weights.flatten().to_numpy().astype(np.float32),
        ids=user_ids(batch["id"]),
        visits=batch[VISITS].combine_chunks().flatten().to_numpy().astype(np.int64) if VISITS in batch.column_names else None,
    )
