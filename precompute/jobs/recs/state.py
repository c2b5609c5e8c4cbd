"""What a recommendations run leaves for the next one, and what the next one may copy instead of rescoring.

A run stages, in its run folder, `recs_state/`:

    model.json     the model fingerprint: item embeddings' model, k, the recs model and weights, item
                   vocabulary (in order), the scoring recipe; any change -> a full run
    items.arrow    item_id -> content key of its text (the embeddings' staged `content_key`): a
                   base, linked from the published state's where the ids are the same
    items.delta.arrow
                   beside a linked base: the positions whose keys differ from it, and their keys
                   (writing every item's id and key whole would cost each night a pass over
                   the catalogue: `precompute bench scale`, its 1% rerun)
    users.arrow    user_id -> fingerprint of the user's valid interactions (item, weight), and
                   how many they are
    histories.arrow, histories.json
                   every valid interaction in the grouped order, and the files they came from:
                   the next night regroups only the users its new files touch
                   (jobs/recs/history/kept_histories.py)
    sequence.pt    the sequence model's weights, when it was published: the next night starts
                   from them (jobs/recs/sequence/train.py warm_start)
    als.npz        ALS's item factors and scale, when it was published, with a sketch of the
                   interactions it was trained on: the next night keeps them through small
                   changes (jobs/recs/kept_als.py)
    index.npz      the items' IVF lists (centroids and each item's list, without the vectors)
                   and the content keys they were built over, when the top k was ranked by
                   them: the next incremental night searches them instead of scoring
                   exactly (jobs/recs/topk/kept_index.py)
    check.npz      the recall check's sample users with their exact best items, beside
                   index.npz: the next night scores only the items that moved for them
                   (jobs/recs/topk/kept_check.py)
    night.json     a digest of everything the version was made from (the interactions' files,
                   the items, the settings), with what the run measured of it (rows, rejects,
                   held-out quality)

The next run compares itself with the published version's state. When its inputs' digest is
the published one's, nothing moved: the version is copied whole, with its state and its
measured quality, and nothing is validated, trained, grouped or scored (an unchanged night).
Else a user is rescored when their interactions changed, when they are new, or when they hold
an item whose content key changed; every other user's record is copied from the published
version server-side, and users who are gone are deleted from the copy. A value indexes the
vocabulary, so a copy is valid only under the identical vocabulary in the identical order
(sorted by id): an item added or removed runs everything.

What a copy does not follow: the popularity prior moves with everyone's interactions, and a
changed item's new vector can move it into or out of other users' top-k; copied users keep
last night's list on both counts until their own interactions change or a full run comes.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from precompute.jobs import nights
from precompute.jobs.nights import NIGHT, Night, Previous, copy_files, same_night
from precompute.jobs.recs.towers import ALSTowers, OwnTowers, Towers
from precompute.jobs.text.content_cache import KEY, differ, key_array, key_column
from precompute.jobs.validate import REJECTS
from precompute.jobs.work_dir import WorkPath, copy_file, read_ipc, write_ipc
from precompute.models.datasets import Digests
from precompute.models.settings import EngineSettings

if TYPE_CHECKING:
    from precompute.jobs.inputs import InteractionsInput
    from precompute.jobs.recs.blend import BlendTowers
    from precompute.jobs.recs.spec import RecsSpec

STATE = "recs_state"
MODEL, ITEMS_FILE, USERS_FILE, SEQUENCE_WEIGHTS, ALS_FILE, INDEX_FILE, CHECK_FILE = (
    "model.json",
    "items.arrow",
    "users.arrow",
    "sequence.pt",
    "als.npz",
    "index.npz",
    "check.npz",
)
HISTORIES, HISTORIES_FILES, ITEMS_DELTA = "histories.arrow", "histories.json", "items.delta.arrow"
POSITION = "position"
KEYS_REBASE_SHARE = 0.05
"""Items whose key differs from the linked base, as a share of them, past which a night writes
its items whole (a base of its own): each night's delta holds every key moved since the base."""
FINGERPRINT, LENGTH = "fingerprint", "length"


class Items(NamedTuple):
    """The item tower, sorted by id: a value's indices point into `ids`."""

    ids: pa.StringArray
    """Kept in Arrow as the item table holds them: a Python list of every id, and back again,
    would cost every night a pass over the catalogue."""
    vectors: np.ndarray
    """[items, dim] float32, L2-normalised; row i is the embedding of ids[i]."""
    keys: np.ndarray
    """[items] 16-byte strings (content_cache.key_array): the content key of each item's text,
    which changes exactly when its embedding may change."""
    vocabulary: str
    """vocabulary_digest(ids): the item table keeps it with its base (jobs/recs/item_table.py), whose
    ids every version carried from it shares, so a night hashes no id (it hashed every id twice
    a night before: the job's digest and the version's meta digest)."""

    @classmethod
    def of(cls, ids: pa.StringArray, vectors: np.ndarray, keys: np.ndarray) -> Items:
        """Items whose ids are checked unique and whose vocabulary digest is hashed here (the item
        table does both once per base)."""
        check_unique(ids)
        return cls(ids, vectors, keys, vocabulary_digest(ids))


def check_unique(ids: pa.StringArray) -> None:
    """ValueError if an item id repeats. Items come sorted by id, so a strictly rising array is
    told unique by comparing neighbours, far cheaper than counting them by a hash."""
    if len(ids) < 2 or pc.all(pc.less(ids[:-1], ids[1:])).as_py():
        return
    if (repeated := len(ids) - len(pc.unique(ids))) > 0:
        raise ValueError(f"item ids must be unique: {repeated} duplicates")


class ItemsBase(NamedTuple):
    """The published state's items file, where its ids are tonight's, and the positions whose
    keys tonight differ from it: `stage` links the file and writes only those."""

    file: WorkPath
    moved: np.ndarray


class Plan(NamedTuple):
    """Which users a run scores: all of them (full), or only those whose inputs moved (incremental)."""

    mode: str
    reason: str
    previous: Previous | None
    """None in a full run."""
    changed_items: np.ndarray
    """Whether each item's content key changed (all False in a full run): a mask, so that a
    user's check is one lookup per item they hold (np.isin against the changed positions
    built a table per user, which made an incremental night's group stage slower than a full
    run's: `precompute bench scale`, its 1% rerun)."""
    users: pa.Table | None
    """The previous version's user_id -> fingerprint (incremental runs)."""
    items_base: ItemsBase | None = None


def model_fingerprint(items_model: str, k: int, scoring: dict[str, Any], items: int, vocabulary: str, recipe: str) -> dict:
    """Everything that, changed, changes every user's values or what their indices mean.

    scoring: the recommendations model, its weights, and for a trained (collaborative) one a hash
    of its item tower, which moves with any night's training: only a kept ALS
    (jobs/recs/kept_als.py) lets such a run be incremental."""
    return {
        "items_model": items_model,
        "recipe": recipe,
        "k": k,
        **scoring,
        "items": items,
        "vocabulary": vocabulary,
    }


def vocabulary_digest(ids: pa.StringArray) -> str:
    """The item ids in order: what a value's indices and a model's item rows mean (the ids
    joined by newlines, joined in Arrow, and each one's length, so that no two lists of ids
    join alike, newlines in ids and all)."""
    joined = pc.binary_join(pa.ListArray.from_arrays(pa.array([0, len(ids)], pa.int32()), ids), "\n")
    digest = hashlib.sha256(joined[0].as_buffer())
    digest.update(pc.binary_length(ids).to_numpy(zero_copy_only=False).astype("<i8").tobytes())
    return digest.hexdigest()[:16]


def trained_digest(towers: BlendTowers, own: OwnTowers | None) -> str:
    """What a trained model's scores depend on beyond its settings: its trained parts' item
    matrices and scales (not the content part's vectors: a changed item's holders are rescored,
    as under the content model), and the towers model's user vectors (a user whose features
    moved must be rescored, so all are)."""
    digest = hashlib.sha256()
    for part, scale in towers.parts:
        digest.update(part_digest(part))
        digest.update(np.float64(scale).tobytes())
    if own is not None:
        digest.update(rows_digest(own.user_vectors))
    return digest.hexdigest()[:32]


def part_digest(part: Towers) -> bytes:
    """A trained part's item matrix hashed. An ALS keeps its digest (ALSTowers.digest) and saves
    it with its factors, so that a night that keeps the ALS does not hash 1M items' factors
    again (a pass over every factor, in a night that changed few of them)."""
    if not isinstance(part, ALSTowers):
        return rows_digest(part.items)
    if part.digest is None:
        part.digest = rows_digest(part.items)
    return part.digest


HASHED_ROWS = 65_536


def rows_digest(matrix: np.ndarray) -> bytes:
    """`matrix`'s bytes hashed row by row, HASHED_ROWS rows at a time: a part of a blend is a
    view of its columns, which a contiguous copy whole would first write out (1M items' ALS
    factors: 256 MB). SHA-256, which most x86 cores run in hardware (SHA-NI), where it is
    faster than blake2b."""
    digest = hashlib.sha256()
    for start in range(0, len(matrix), HASHED_ROWS):
        digest.update(np.ascontiguousarray(matrix[start : start + HASHED_ROWS]).data)
    return digest.digest()


def inputs_digest(
    interactions: InteractionsInput,
    files: Digests,
    settings: RecsSpec,
    vocabulary: str,
    keys: np.ndarray,
    items_model: str,
    recipe: str,
    own: OwnTowers | None,
    engine: EngineSettings | None,
) -> str:
    """Everything a version is made from: the interactions' files (`files`: their digests) and
    how they are read, the items (their `vocabulary` digest and content `keys`), the settings,
    the towers' vectors and the scoring code (`recipe`)."""
    described = [interactions, settings, engine or EngineSettings()]
    towers = [] if own is None else [own.items, own.user_vectors, "\n".join(map(str, own.user_ids))]
    return nights.inputs_digest(
        files.whole,
        items_model,
        recipe,
        *(part.model_dump_json() for part in described),
        vocabulary,
        keys,
        *towers,
    )


def plan(fingerprint: dict[str, Any], items: Items, previous: Previous | None) -> Plan:
    """Full, with the reason, unless the published version's state matches this run's model."""

    def full(reason: str, base: ItemsBase | None = None) -> Plan:
        return Plan("full", reason, None, np.zeros(len(items.ids), bool), None, base)

    if previous is None:
        return full("nothing published yet")
    state = previous.run_dir / STATE
    if not all((state / name).is_file() for name in (MODEL, ITEMS_FILE, USERS_FILE)):
        return full(f"the published version {previous.version} left no recs state")
    before = json.loads((state / MODEL).read_text())
    old_items = read_ipc(state / ITEMS_FILE)
    if before["vocabulary"] != fingerprint["vocabulary"]:
        old, new = set(old_items["id"].to_pylist()), set(items.ids.to_pylist())
        return full(f"the items changed: {len(new - old)} added, {len(old - new)} removed")
    from_base = differ(key_array(old_items[KEY]), items.keys)
    base = ItemsBase(state / ITEMS_FILE, np.flatnonzero(from_base))
    for field, value in fingerprint.items():
        if before.get(field) != value:
            return full(f"{field} changed from {before.get(field)!r} to {value!r}", base)
    changed = since_delta(state, from_base, items.keys)
    users = read_ipc(state / USERS_FILE)
    return Plan("incremental", f"copied from {previous.version}", previous, changed, users, base)


def since_delta(state: WorkPath, from_base: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Which of tonight's `keys` differ from a staged state's: from its base's (`from_base`, a
    mask), but at the positions its delta holds, from the delta's keys."""
    if not (state / ITEMS_DELTA).is_file() or not (delta := read_ipc(state / ITEMS_DELTA)).num_rows:
        return from_base
    positions = delta[POSITION].to_numpy()
    changed = from_base.copy()
    changed[positions] = differ(key_array(delta[KEY]), keys[positions])
    return changed


def rescore(users: pa.Table, previous: pa.Table) -> tuple[np.ndarray, list[str]]:
    """(mask of `users` to rescore, ids of previous users now gone).

    users: this run's id, fingerprint and holds_changed (the user holds a changed item). Where
    the users are the previous ones, in the same order (most nights: no user new or gone), their
    fingerprints are compared row by row, without a hash table over the users' ids.
    """
    ids, ids_before = users["id"], previous["id"]
    if len(ids) == len(ids_before) and ids.equals(ids_before):
        before, gone = previous[FINGERPRINT], []
    else:
        before = previous[FINGERPRINT].take(pc.index_in(ids, value_set=ids_before))
        gone = pc.filter(ids_before, pc.invert(pc.is_in(ids_before, value_set=ids))).to_pylist()
    same = pc.fill_null(pc.equal(before, users[FINGERPRINT]), False)
    return pc.or_(pc.invert(same), users["holds_changed"]).to_numpy(zero_copy_only=False), gone


def stage(
    run_dir: WorkPath,
    fingerprint: dict[str, Any],
    item_ids: pa.Array,
    keys: np.ndarray,
    users: pa.Table,
    items_base: ItemsBase | None = None,
) -> None:
    """What the next run compares with (the items' ids and content `keys`, the users'
    fingerprints), in Arrow IPC files (several times faster to write than Parquet);
    written before the version exists, read only once it is published. items_base: the
    published state's items, where its ids are these (Plan.items_base)."""
    state = run_dir / STATE
    state.mkdir()
    stage_items(state, item_ids, keys, items_base)
    write_ipc(state / USERS_FILE, users.select(["id", FINGERPRINT, LENGTH]))
    (state / MODEL).write_text(json.dumps(fingerprint, indent=2))


def stage_items(state: WorkPath, item_ids: pa.Array, keys: np.ndarray, base: ItemsBase | None) -> None:
    """The items' ids and keys: `base` linked (work_dir.copy_file) with the keys that differ from
    it beside it, while they are at most KEYS_REBASE_SHARE of the items; else written whole."""
    if base is not None and len(base.moved) <= KEYS_REBASE_SHARE * len(keys):
        copy_file(base.file.fs, base.file.path, (state / ITEMS_FILE).path)
        moved = pa.array(base.moved, pa.int64())
        write_ipc(state / ITEMS_DELTA, pa.table({POSITION: moved, KEY: key_column(keys[base.moved])}))
        return
    write_ipc(state / ITEMS_FILE, pa.table({"id": item_ids, KEY: key_column(keys)}))


def unchanged_night(inputs: str, previous: Previous | None, run_dir: WorkPath) -> Night | None:
    """The published version's night (figures: rows, rejects, users, quality) when it was made
    from exactly `inputs`, its state then copied into `run_dir` (the next night compares with
    it, and warm-starts from its sequence weights); None when anything moved, or a copy of it
    would not hold its users well."""
    night = same_night(inputs, None if previous is None else previous.run_dir / STATE)
    if night is None or previous is None or night.figures["users"] not in previous.records:
        return None
    copy_files(
        previous.run_dir / STATE,
        run_dir / STATE,
        [MODEL, ITEMS_FILE, ITEMS_DELTA, USERS_FILE, SEQUENCE_WEIGHTS, ALS_FILE, INDEX_FILE, CHECK_FILE, HISTORIES, HISTORIES_FILES, NIGHT],
    )
    copy_files(previous.run_dir, run_dir, [REJECTS])
    return night
