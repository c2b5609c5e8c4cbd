"""The recommendations job on real Ray and real Parquet: exact top-k, rejects, values, leave-one-out."""

from __future__ import annotations

import math
import sys
import uuid
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from ray import cloudpickle
from ray.data.block import Block, BlockAccessor
from ray.data.datasource import Datasink

from jobs.content_cache import content_keys
from jobs.recommend import RECIPE, RecsJobReport, Seen, run_recs_job, top_k
from jobs.recs_settings import DEMO_INTERACTIONS, RecsJobSettings
from jobs.recs_state import CopyPlan, Items, Previous, model_fingerprint, plan
from jobs.validate import RejectRatioExceededError
from models import Encoder
from models.settings import DEMO_CORPUS
from precompute.pipeline import InteractionsInput
from stores.records import decode_ranked

ITEMS = 60
BAD_ROWS = [
    {"user_id": None, "item_id": "emacsen-common", "weight": 1.0},
    {"user_id": "u-null-item", "item_id": None, "weight": 1.0},
    {"user_id": "u-nan", "item_id": "emacsen-common", "weight": math.nan},
    {"user_id": "u-negative", "item_id": "emacsen-common", "weight": -1.0},
    {"user_id": "u-unknown", "item_id": "no-such-package", "weight": 1.0},
    {"user_id": "u-inf", "item_id": "emacsen-common", "weight": math.inf},
    {"user_id": b"u-\xff", "item_id": "emacsen-common", "weight": 1.0},  # not UTF-8
]


class ParquetSink(Datasink[None]):
    """Stands in for the Redis sink a flow passes: each block a Parquet part, read back by the test."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, blocks: Iterable[Block], ctx: Any) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        for block in blocks:
            pq.write_table(
                BlockAccessor.for_block(block).to_arrow(), self.path / f"{uuid.uuid4().hex}.parquet"
            )


# Ray's workers cannot import a test module: ship ParquetSink's code with it instead.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def brute_force(users: np.ndarray, items: np.ndarray, seen: list[set[int]], prior: np.ndarray) -> np.ndarray:
    """Every user's score for every item, seen items at -inf: the reference top-k is its argsort."""
    scores = users.astype(np.float64) @ items.T.astype(np.float64) + prior
    for row, seen_items in enumerate(seen):
        scores[row, list(seen_items)] = -np.inf
    return scores


def csr(seen: list[list[int]]) -> Seen:
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in seen])]).astype(np.int64)
    items = np.array([i for s in seen for i in s], np.int64)
    return Seen(offsets, items, np.ones(len(items), np.float32))


@pytest.mark.parametrize("tile", [1024, 64, 2], ids=["one-tile", "items-in-tiles", "tiles-under-k"])
def test_top_k_is_exact_and_never_returns_a_seen_item(tile: int) -> None:
    rng = np.random.default_rng(7)
    users, items = rng.normal(size=(50, 32)), rng.normal(size=(200, 32))
    users /= np.linalg.norm(users, axis=1, keepdims=True)
    items /= np.linalg.norm(items, axis=1, keepdims=True)
    prior = rng.uniform(0, 0.3, 200)
    seen = [sorted(rng.choice(200, size=rng.integers(0, 40), replace=False).tolist()) for _ in range(49)]
    seen.append(list(range(197)))  # only three unseen items left for k=5

    indices, scores = top_k(users, items, csr(seen), k=5, block=16, prior=prior, tile=tile)

    reference = brute_force(users, items, [set(s) for s in seen], prior)
    expected = np.argsort(-reference, axis=1, kind="stable")[:, :5]
    np.testing.assert_array_equal(indices[:49], expected[:49])
    np.testing.assert_allclose(scores[:49], np.take_along_axis(reference, expected, 1)[:49], atol=1e-5)
    assert indices[49].tolist() == [*expected[49, :3].tolist(), -1, -1]
    assert np.isneginf(scores[49, 3:]).all()
    assert all(not set(row) & set(s) for row, s in zip(indices.tolist(), seen, strict=True))


@pytest.fixture(scope="module")
def items(encoder: Encoder) -> Items:
    """The demo's most interacted-with packages, embedded from their real descriptions."""
    counts = Counter(pq.read_table(DEMO_INTERACTIONS, columns=["item_id"])["item_id"].to_pylist())
    ids = sorted(item for item, _ in counts.most_common(ITEMS))
    corpus = {
        row["id"]: row["text"] for row in pq.read_table(DEMO_CORPUS, columns=["id", "text"]).to_pylist()
    }
    texts = [corpus[i] for i in ids]
    return Items(ids, encoder.encode(texts), content_keys("minilm", texts))


@pytest.fixture(scope="module")
def interactions(items: Items, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Real interactions with those items, plus one row of each kind the contract rejects."""
    ids = set(items.ids)
    good = [row for row in pq.read_table(DEMO_INTERACTIONS).to_pylist() if row["item_id"] in ids]
    path = tmp_path_factory.mktemp("interactions") / "interactions.parquet"
    rows = good + BAD_ROWS
    users = pa.array(
        [u.encode() if isinstance(u, str) else u for u in (r["user_id"] for r in rows)], pa.binary()
    )
    table = pa.table(
        {
            "user_id": users.view(pa.string()),  # a string column holding one row of invalid UTF-8
            "item_id": pa.array([r["item_id"] for r in rows], pa.string()),
            "weight": pa.array([r["weight"] for r in rows], pa.float32()),
        }
    )
    pq.write_table(table, path)
    return path


def test_job_writes_the_exact_top_k_of_every_user_and_quarantines_bad_rows(
    ray_local, items, interactions: Path, tmp_path: Path
) -> None:
    ids, vectors, _ = items
    settings = RecsJobSettings(k=10, users_per_block=256, popularity_weight=0.4, model="content")
    sized: list[tuple[int, object, bool]] = []
    report = run_recs_job(
        InteractionsInput(path=str(interactions)),
        settings,
        items,
        ParquetSink(tmp_path / "out"),
        tmp_path / "work",
        before_write=lambda users, copy: sized.append((users, copy, (tmp_path / "out").exists())),
    )

    rejects = pq.read_table(report.rejects_path).to_pylist()
    assert sorted((r["user_id"] or b"", r["reject_reason"]) for r in rejects) == sorted(
        [
            (b"", "user_id is null"),
            (b"u-\xff", "user_id is not valid UTF-8 (byte 2)"),
            (b"u-inf", "weight is infinite"),
            (b"u-nan", "weight is NaN"),
            (b"u-negative", "weight -1.0 is negative"),
            (b"u-null-item", "item_id is null"),
            (b"u-unknown", "item_id 'no-such-package' is not in the item table"),
        ]
    )

    table = pq.read_table(interactions)
    good = table.slice(0, table.num_rows - len(BAD_ROWS)).to_pylist()
    position = {item: i for i, item in enumerate(ids)}
    history: dict[str, dict[int, float]] = {}
    for row in good:
        history.setdefault(row["user_id"], {})[position[row["item_id"]]] = row["weight"]
    counts = np.bincount([position[row["item_id"]] for row in good], minlength=len(ids))
    prior = 0.4 * np.log1p(counts) / np.log1p(counts.max())
    users = sorted(history)
    profiles = np.stack([sum(w * vectors[i] for i, w in history[u].items()) for u in users])
    profiles /= np.linalg.norm(profiles, axis=1, keepdims=True)
    reference = brute_force(profiles, vectors, [set(history[u]) for u in users], prior)

    written = pq.read_table(tmp_path / "out").sort_by("id")
    assert written["id"].to_pylist() == users
    assert (report.rows, report.rejects, report.users, report.k) == (
        table.num_rows,
        len(BAD_ROWS),
        len(users),
        10,
    )
    assert (report.mode, report.mode_reason, report.rescored, report.copied) == (
        "full",
        "nothing published yet",
        len(users),
        0,
    )
    for row, value in enumerate(written["value"].to_pylist()):
        indices, scores = decode_ranked(value)
        best = np.sort(reference[row])[::-1][:10]
        # Items with the reference's top-k scores, in order (ties may swap); fp16 scores on the wire.
        np.testing.assert_allclose(reference[row, indices], best, atol=1e-5)
        np.testing.assert_allclose(scores, best, atol=2e-3)
    assert sized == [(len(users), None, False)]
    assert report.vocabulary == ids
    stored = dict(zip(written["id"].to_pylist(), written["value"].to_pylist(), strict=True))
    assert len(report.samples) == 5 and report.samples.items() <= stored.items()


def test_too_many_rejects_fail_before_any_top_k(ray_local, items, interactions: Path, tmp_path: Path) -> None:
    strict = InteractionsInput(path=str(interactions), max_reject_ratio=0.001)
    with pytest.raises(
        RejectRatioExceededError, match=r"7 of \d+ interactions rejected, over max_reject_ratio=0.001"
    ):
        run_recs_job(strict, RecsJobSettings(), items, ParquetSink(tmp_path / "out"), tmp_path / "work")
    assert not (tmp_path / "out").exists()


MODEL = "minilm"


class Run(NamedTuple):
    report: RecsJobReport
    written: dict[str, bytes]
    """What the job wrote through its sink: the rescored users' values."""
    copy: CopyPlan | None


def recs_run(
    items: Items,
    interactions: Path,
    run_dir: Path,
    previous: Previous | None = None,
    model: str = "content",
) -> Run:
    plans: list[CopyPlan | None] = []
    report = run_recs_job(
        InteractionsInput(path=str(interactions)),
        RecsJobSettings(users_per_block=256, model=model),
        items,
        ParquetSink(run_dir / "out"),
        run_dir,
        before_write=lambda users, copy: plans.append(copy),
        items_model=MODEL,
        previous=previous,
    )
    written = {}
    if (run_dir / "out").exists():
        table = pq.read_table(run_dir / "out")
        written = dict(zip(table["id"].to_pylist(), table["value"].to_pylist(), strict=True))
    return Run(report, written, plans[0])


@pytest.fixture(scope="module")
def published(ray_local, items: Items, interactions: Path, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """A full run whose version counts as published: the next runs copy from it."""
    return recs_run(items, interactions, tmp_path_factory.mktemp("published"))


def previous_of(published: Run, users: range = range(10**6)) -> Previous:
    return Previous("20261124T030000Z-aaaaaa", Path(published.report.rejects_path).parent, users)


def assert_same_values(got: dict[str, bytes], want: dict[str, bytes]) -> None:
    """The same items in the same order, scores equal to fp16's precision: a block of 2 users
    and one of 256 may sum the matrix product in another order."""
    assert got.keys() == want.keys()
    for user, value in got.items():
        (indices, scores), (want_indices, want_scores) = decode_ranked(value), decode_ranked(want[user])
        np.testing.assert_array_equal(indices, want_indices)
        np.testing.assert_allclose(scores, want_scores, atol=2e-3)


def good_rows(path: Path) -> list[dict[str, Any]]:
    table = pq.read_table(path)
    return table.slice(0, table.num_rows - len(BAD_ROWS)).to_pylist()


def histories(path: Path) -> dict[str, list[str]]:
    held: dict[str, list[str]] = {}
    for row in good_rows(path):
        held.setdefault(row["user_id"], []).append(row["item_id"])
    return held


def test_a_rerun_with_nothing_changed_copies_every_user(
    items: Items, interactions: Path, published: Run, tmp_path: Path
) -> None:
    rerun = recs_run(items, interactions, tmp_path, previous_of(published))
    assert (rerun.report.mode, rerun.report.rescored, rerun.report.copied) == (
        "incremental",
        0,
        published.report.users,
    )
    assert rerun.report.mode_reason == "copied from 20261124T030000Z-aaaaaa"
    assert rerun.copy == CopyPlan("20261124T030000Z-aaaaaa", [])
    assert rerun.written == {}


def test_changed_new_and_gone_users_are_rescored_or_deleted_and_no_one_else(
    items: Items, interactions: Path, published: Run, tmp_path: Path
) -> None:
    held = histories(interactions)
    changed, gone, *_ = (user for user, items_held in sorted(held.items()) if len(items_held) >= 3)
    rows = good_rows(interactions)
    first_of_changed = next(i for i, row in enumerate(rows) if row["user_id"] == changed)
    rows = [row for i, row in enumerate(rows) if i != first_of_changed and row["user_id"] != gone]
    rows += [{"user_id": "u-new", "item_id": item, "weight": 1.0} for item in items.ids[:2]]
    moved = tmp_path / "interactions.parquet"
    pq.write_table(pa.Table.from_pylist(rows), moved)

    rerun = recs_run(items, moved, tmp_path / "incremental", previous_of(published))
    assert (rerun.report.mode, rerun.report.rescored) == ("incremental", 2)
    assert rerun.report.copied == rerun.report.users - 2 == published.report.users - 1 - 1
    assert rerun.copy == CopyPlan("20261124T030000Z-aaaaaa", [gone])
    full = recs_run(items, moved, tmp_path / "full")
    assert_same_values(rerun.written, {user: full.written[user] for user in (changed, "u-new")})


def test_an_items_changed_text_rescores_exactly_the_users_who_hold_it(
    items: Items, interactions: Path, published: Run, tmp_path: Path
) -> None:
    edited = len(items.ids) // 2
    keys = [*items.keys]
    keys[edited] = content_keys(MODEL, ["a new description"])[0]
    vectors = items.vectors.copy()
    vectors[edited] = vectors[edited - 1]
    rerun = recs_run(Items(items.ids, vectors, keys), interactions, tmp_path, previous_of(published))
    holders = {user for user, held in histories(interactions).items() if items.ids[edited] in held}
    assert rerun.report.mode == "incremental" and 0 < len(holders) < rerun.report.users
    assert set(rerun.written) == holders and rerun.report.rescored == len(holders)


def test_users_past_what_the_published_buckets_hold_run_in_full(
    items: Items, interactions: Path, published: Run, tmp_path: Path
) -> None:
    rerun = recs_run(items, interactions, tmp_path, previous_of(published, users=range(10)))
    assert rerun.report.mode == "full" and rerun.copy is None
    assert (
        rerun.report.mode_reason
        == f"{published.report.users} users outgrow the buckets of 20261124T030000Z-aaaaaa"
    )
    assert_same_values(rerun.written, published.written)


def test_a_change_of_model_or_items_plans_a_full_run(items: Items, published: Run, tmp_path: Path) -> None:
    previous = previous_of(published)

    def scoring(weight: float = 0.4) -> dict[str, object]:
        return {"model": "content", "trained": None, "content_weight": None, "popularity_weight": weight}

    def reason(items: Items = items, model: str = MODEL, k: int = 10, weight: float = 0.4) -> str:
        planned = plan(model_fingerprint(model, k, scoring(weight), items.ids, RECIPE), items, previous)
        return planned.reason if planned.mode == "full" else "incremental"

    added = Items([*items.ids, "zzz-new"], items.vectors, [*items.keys, b"0" * 16])
    removed = Items(items.ids[1:], items.vectors[1:], items.keys[1:])
    assert reason() == "incremental"
    assert reason(k=5) == "k changed from 10 to 5"
    assert reason(weight=0.2) == "popularity_weight changed from 0.4 to 0.2"
    assert reason(model="mpnet") == "items_model changed from 'minilm' to 'mpnet'"
    assert reason(added) == "the items changed: 1 added, 0 removed"
    assert reason(removed) == "the items changed: 0 added, 1 removed"
    nothing = Previous(previous.version, tmp_path, previous.users)
    assert plan(model_fingerprint(MODEL, 10, scoring(), items.ids, RECIPE), items, nothing).reason == (
        "the published version 20261124T030000Z-aaaaaa left no recs state"
    )


def test_a_collaborative_model_copies_nobody_once_it_is_retrained(
    items: Items, interactions: Path, tmp_path: Path
) -> None:
    """Retrained on other interactions, EASE's item tower moves: every user is rescored. On the
    same interactions it is the same model, and the rerun copies everyone."""
    first = recs_run(items, interactions, tmp_path / "first", model="ease")
    assert first.report.users == len(first.written)
    previous = Previous("20261124T030000Z-bbbbbb", tmp_path / "first", range(10**6))
    same = recs_run(items, interactions, tmp_path / "same", previous, model="ease")
    assert (same.report.mode, same.report.rescored) == ("incremental", 0)
    rows = good_rows(interactions)[1:]
    moved = tmp_path / "interactions.parquet"
    pq.write_table(pa.Table.from_pylist(rows), moved)
    retrained = recs_run(items, moved, tmp_path / "retrained", previous, model="ease")
    assert retrained.report.mode == "full"
    assert retrained.report.mode_reason.startswith("trained changed from")
