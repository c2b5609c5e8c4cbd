"""Users' histories kept from night to night: a night whose interactions only gained files
regroups only the users those files touch.

Grouping every valid interaction by user (jobs/recs/history/user_histories.py group_all: one sort of every
row) and fingerprinting every user grow with all the interactions, every night, the 1% one
too; regrouping only a night's new rows grows with those rows (`precompute bench scale`, its
1% rerun). A run stages in its recs_state/ (jobs/recs/state.py) every valid
interaction in the grouped order (HISTORIES: item position, weight, time) and what they came
from (HISTORIES_FILES: the vocabulary, and the input's files as their kept validations' entry
names, jobs/recs/history/interaction_files.py), beside each user's id, fingerprint and number of rows
(users.arrow). The next night regroups from them when the vocabulary is the same and every file
they came from is still there: the rows of the files added since are sorted with the kept rows
of the users they touch, and those users alone are spliced into the kept arrays and
fingerprinted. Anything else (a file changed or gone, another vocabulary, no state) groups
every row. Both give the identical grouping: a user's rows sort the same with or without
anyone else's.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from precompute.jobs.nights import Previous
from precompute.jobs.recs.history.interaction_files import Validated
from precompute.jobs.recs.history.interactions import INDEX, SECONDS, USER, WEIGHT
from precompute.jobs.recs.history.seen import GROUPED_ORDER, Seen, as_seen, ranges, user_ids, visit_numbers
from precompute.jobs.recs.history.user_histories import Grouped, fingerprints, group_all
from precompute.jobs.recs.state import FINGERPRINT, HISTORIES, HISTORIES_FILES, LENGTH, STATE, USERS_FILE
from precompute.jobs.text.content_cache import key_array
from precompute.jobs.work_dir import WorkPath, read_ipc, write_ipc

COLUMNS = [INDEX, WEIGHT, SECONDS]


class Kept(NamedTuple):
    """A published night's grouping, as staged."""

    users: pa.Table
    """id, fingerprint and length (rows) of each user, by id."""
    rows: pa.Table
    """COLUMNS of every row, in the grouped order."""


def grouped(valid: Validated, vocabulary: str, previous: Previous | None) -> tuple[Grouped, str]:
    """The night's grouping, and how it was made: regrouped from the published night's where
    only files were added since, else from every row."""
    kept = kept_grouping(valid, vocabulary, previous)
    if isinstance(kept, str):
        return group_all(valid.good), f"every row grouped: {kept}"
    histories, new = kept
    added = pa.concat_tables([valid.good.slice(start, rows) for start, rows in new]) if new else valid.good.slice(0, 0)
    return regrouped(histories, added), f"{len(added):,} new rows regrouped with their users' kept ones"


def kept_grouping(valid: Validated, vocabulary: str, previous: Previous | None) -> tuple[Kept, list[tuple[int, int]]] | str:
    """(the published night's grouping, the (start, rows) of tonight's good rows from files it
    did not read), or why it cannot be regrouped from."""
    if previous is None:
        return "nothing published yet"
    state = previous.run_dir / STATE
    if not all((state / name).is_file() for name in (HISTORIES, HISTORIES_FILES, USERS_FILE)):
        return f"{previous.version} kept no histories"
    before = json.loads((state / HISTORIES_FILES).read_text())
    if before["vocabulary"] != vocabulary:
        return "the items changed"
    if not valid.files:
        return "the files' validations are not kept"
    left, new, start = Counter(before["files"]), [], 0
    for name, rows in valid.files:
        if left[name] > 0:
            left[name] -= 1
        else:
            new.append((start, rows))
        start += rows
    if +left:
        return f"{sum((+left).values())} files read then moved or went"
    return Kept(read_ipc(state / USERS_FILE), read_ipc(state / HISTORIES)), new


def regrouped(kept: Kept, added: pa.Table) -> Grouped:
    """`kept` with the `added` rows (clean rows, any order) sorted in among their users' rows."""
    ids, lengths = kept.users["id"].combine_chunks(), kept.users[LENGTH].to_numpy()
    offsets = np.zeros(len(ids) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    touched = pc.unique(added[USER].combine_chunks()).sort()
    # Each kept user's place among the touched, probing the few touched ids (no hash over every id).
    found = pc.index_in(ids, value_set=touched).to_numpy(zero_copy_only=False)
    was = np.flatnonzero(~np.isnan(found))
    kept_at = np.full(len(touched), -1, np.int64)
    kept_at[found[was].astype(np.int64)] = was
    old = kept.rows.take(ranges(offsets[was], lengths[was]))
    old = pa.table({USER: ids.take(np.repeat(was, lengths[was])), **{name: old[name] for name in COLUMNS}})
    together = pa.concat_tables([old, added.select(old.column_names).cast(old.schema)]).sort_by(GROUPED_ORDER)
    part = as_seen(together)

    fresh = touched.filter(pa.array(kept_at < 0))
    if len(fresh):  # new users: every user's place in the merged order
        everyone = pa.concat_arrays([ids, fresh])
        order = pc.sort_indices(everyone).to_numpy()
        place = np.empty(len(everyone), np.int64)
        place[order] = np.arange(len(everyone))
        ids = everyone.take(order)
        kept_place, fresh_place = place[: len(lengths)], place[len(lengths) :]
    else:
        kept_place, fresh_place = np.arange(len(lengths)), np.zeros(0, np.int64)
    touched_place = np.empty(len(touched), np.int64)
    touched_place[kept_at >= 0] = kept_place[kept_at[kept_at >= 0]]
    touched_place[kept_at < 0] = fresh_place

    users = len(ids)
    length, start = np.zeros(users, np.int64), np.zeros(users, np.int64)
    length[kept_place], start[kept_place] = lengths, offsets[:-1]
    length[touched_place], start[touched_place] = np.diff(part.offsets), offsets[-1] + part.offsets[:-1]
    prints = np.zeros(users, "S16")
    prints[kept_place] = key_array(kept.users[FINGERPRINT])
    prints[touched_place] = fingerprints(part)

    new_offsets = np.zeros(users + 1, np.int64)
    np.cumsum(length, out=new_offsets[1:])
    rows = ranges(start, length)
    seconds = pa.concat_arrays([kept.rows[SECONDS].combine_chunks(), together[SECONDS].combine_chunks()]).take(rows)
    seen = Seen(
        new_offsets,
        np.concatenate([kept.rows[INDEX].to_numpy(), part.items])[rows],
        np.concatenate([kept.rows[WEIGHT].to_numpy(), part.weights])[rows],
        user_ids(ids),
        visit_numbers(new_offsets, seconds.to_numpy(zero_copy_only=False)),
    )
    return Grouped(seen, ids, prints, seconds)


def keep_grouping(state: WorkPath, grouping: Grouped, valid: Validated, vocabulary: str) -> None:
    """Stage the night's rows in the grouped order and what they came from (the users are
    staged with the state: recs_state.stage). Nothing where the files' validations are not
    kept: the next night could not tell which rows are new."""
    if not valid.files:
        return
    seen = grouping.seen
    table = pa.table(
        {INDEX: pa.array(seen.items), WEIGHT: pa.array(seen.weights, pa.float32()), SECONDS: grouping.seconds}
    )
    write_ipc(state / HISTORIES, table)
    (state / HISTORIES_FILES).write_text(
        json.dumps({"vocabulary": vocabulary, "files": [name for name, _ in valid.files]})
    )
