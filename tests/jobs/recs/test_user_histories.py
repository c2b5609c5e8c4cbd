"""Users' histories grouped on the driver (jobs/recs/history/user_histories.py): the rows that decide who is
rescored, and the blocks the top-k actors read back as the same histories."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from precompute.jobs.recs.history.interactions import INDEX, SECONDS, USER, WEIGHT
from precompute.jobs.recs.history.seen import Seen, seen_by_user
from precompute.jobs.recs.history.user_histories import (
    HOLDS,
    fingerprints,
    group_all,
    history_blocks,
    seen_of,
    user_rows,
)
from precompute.jobs.recs.state import FINGERPRINT, LENGTH


def interactions() -> pa.Table:
    """Three users in no order; u1's rows out of time order."""
    return pa.table(
        {
            USER: ["u2", "u1", "u3", "u1", "u2", "u1"],
            INDEX: pa.array([4, 2, 0, 1, 3, 5], pa.int64()),
            WEIGHT: pa.array([1.0, 0.5, 1.0, 1.0, 0.25, 2.0], pa.float32()),
            SECONDS: pa.array([10, 30, 5, 20, 11, 25], pa.int64()),
        }
    )


def test_each_user_gets_a_fingerprint_of_their_history_in_time_order_and_whether_they_hold_a_changed_item() -> None:
    changed = np.zeros(6, bool)
    changed[[3, 5]] = True  # held by u1 (item 5) and u2 (item 3)

    rows = user_rows(group_all(interactions()), changed)

    assert rows["id"].to_pylist() == ["u1", "u2", "u3"] and rows[HOLDS].to_pylist() == [True, True, False]
    assert rows[LENGTH].to_pylist() == [3, 2, 1]
    alone = fingerprints(Seen(np.array([0, 3]), np.array([1, 5, 2]), np.array([1.0, 2.0, 0.5], np.float32)))
    assert rows[FINGERPRINT][0].as_py() == alone[0] and len(alone[0]) == 16
    assert len(set(rows[FINGERPRINT].to_pylist())) == 3


def test_a_fingerprint_moves_with_any_item_weight_or_place_in_the_history_and_only_its_users() -> None:
    """Users' histories fingerprinted at once: the same history gives the same fingerprint
    whoever holds it and wherever it is in the table; an item, a weight, an order, one more or
    one fewer interaction gives another."""

    def of(*histories: list[tuple[int, float]]) -> list[bytes]:
        offsets = np.cumsum([0, *map(len, histories)])
        items = np.array([item for h in histories for item, _ in h], np.int64)
        weights = np.array([weight for h in histories for _, weight in h], np.float32)
        return list(fingerprints(Seen(offsets, items, weights)))

    history = [(3, 1.0), (7, 0.5), (1, 1.0)]
    variants = [
        [(3, 1.0), (7, 0.5), (2, 1.0)],  # an item
        [(3, 1.0), (7, 0.25), (1, 1.0)],  # a weight
        [(7, 0.5), (3, 1.0), (1, 1.0)],  # the order
        [(3, 1.0), (7, 0.5)],  # one fewer
        [*history, (1, 1.0)],  # one more, repeating an item
        [(1, 1.0), (3, 1.0), (7, 0.5)],
    ]
    printed = of(history, *variants, history)
    assert printed[0] == printed[-1] == of([(0, 1.0)], history)[1]
    assert len(set(printed[:-1])) == len(variants) + 1

def test_the_blocks_of_chosen_users_read_back_as_their_histories(ray_local) -> None:
    seen = seen_by_user(interactions())

    blocks = history_blocks(seen, np.array([0, 2]), block=1)  # u1 and u3, a block each

    read = [seen_of(batch) for batch in blocks.iter_batches(batch_size=None, batch_format="pyarrow")]
    assert [list(s.ids) for s in read] == [["u1"], ["u3"]]
    assert [s.items.tolist() for s in read] == [[1, 5, 2], [0]]
    assert [s.offsets.tolist() for s in read] == [[0, 3], [0, 1]]
    assert read[0].weights.tolist() == [1.0, 2.0, 0.5]
