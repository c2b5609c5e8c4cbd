"""Each user's history, grouped on the driver: who moved since the published version, and what
the top-k actors read.

The driver holds the night's valid interactions already (it trains on them), so grouping them
by user is one sort there (jobs/recs_models.py seen_by_user), not a Ray Data shuffle. The
shuffle (group by user, then a Python call per user) cost a fixed half minute at 46,500
interactions on 2 CPUs and most of the recs job's time past its top-k at 1M rows (README,
"Scale"), and its reduce workers' memory grew with the input.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import ray

from precompute.jobs.recs_models import Seen, user_ids, users_subset
from precompute.jobs.recs_state import FINGERPRINT, interactions_fingerprint

ITEMS, WEIGHTS = "items", "weights"
HOLDS = "holds_changed"


def user_rows(seen: Seen, changed: np.ndarray) -> pa.Table:
    """Every user's id, fingerprint (their history: jobs/recs_state.py interactions_fingerprint)
    and whether they hold an item that `changed` (a mask over the items) marks: what decides
    who is rescored, and what the next night compares with (about 40 bytes a user)."""
    bounds = zip(seen.offsets[:-1], seen.offsets[1:], strict=True)
    fingerprints = [interactions_fingerprint(seen.items[a:b], seen.weights[a:b]) for a, b in bounds]
    holds = np.logical_or.reduceat(changed[seen.items], seen.offsets[:-1]) if len(seen.items) else []
    return pa.table(
        {
            "id": pa.array(seen.ids, pa.string()),
            FINGERPRINT: pa.array(fingerprints, pa.binary()),
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
    )
