"""The recommendation models and their held-out evaluation, on hand-made catalogues whose right
answers are known: collaborative models learn what co-occurs, content ranks the cold item."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch

from precompute.jobs.recs.held_out import hold_out
from precompute.jobs.recs.history.seen import Seen
from precompute.jobs.recs.models import train_towers
from precompute.jobs.recs.quality import beats_most_popular, evaluate, valid_interactions
from precompute.jobs.recs.spec import RecsSpec, SequenceSpec
from precompute.jobs.recs.topk.exact import BlockedTopK
from precompute.jobs.recs.towers import Towers

IDS = ["a0", "a1", "b0", "b1", "cold", "popular"]
A0, A1, B0, B1, COLD, POPULAR = range(6)
FILLERS = 14


def vectors() -> np.ndarray:
    """Orthogonal texts, except the item nobody took, which reads like a0."""
    matrix = np.eye(6, dtype=np.float32)
    matrix[COLD] = [0.9, 0, 0, 0, np.sqrt(1 - 0.81), 0]
    return matrix


def histories() -> list[list[int]]:
    """Pairs that co-occur (a0 with a1, b0 with b1), a popular item on its own, and the user under
    test, who took a0 only. a1 is the least taken of the others: a ranking by popularity puts it
    last, so only a model that learned what co-occurs puts it first."""
    return [[A0, A1]] * 10 + [[B0, B1]] * 30 + [[POPULAR]] * 40 + [[A0]]


def csr(rows: list[list[int]]) -> Seen:
    offsets = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
    items = np.array([i for r in rows for i in r], np.int64)
    return Seen(offsets, items, np.ones(len(items), np.float32))


def recommend_users(towers: Towers, ranker: BlockedTopK, seen: Seen) -> tuple[np.ndarray, np.ndarray]:
    """(indices, scores) of the users in `seen`: their tower, then the exact top-k, as the job ranks."""
    return ranker(torch.from_numpy(towers.users(seen)), seen)


def ranking(model: str, content_weight: float) -> list[int]:
    train = csr(histories())
    settings = RecsSpec(model=model, content_weight=content_weight, factors=4, iterations=30)
    towers = train_towers(model, train, vectors(), settings)
    tester = csr([[A0]])
    indices, scores = recommend_users(towers, BlockedTopK(towers.items, 5, 8), tester)
    assert np.isneginf(scores[0, A0:]).sum() == 0 and A0 not in indices[0]
    return indices[0].tolist()


@pytest.mark.parametrize("model", ["itemknn", "ease", "als"])
def test_collaborative_models_recommend_what_co_occurs_though_the_texts_differ(model: str) -> None:
    counts = np.bincount(csr(histories()).items, minlength=len(IDS))
    assert [item for item in np.argsort(-counts, kind="stable") if item != A0][:3] == [POPULAR, B0, B1]
    assert ranking(model, content_weight=0)[0] == A1


def test_content_finds_the_item_that_reads_alike_and_the_hybrid_ranks_it_after_the_co_occurring_one() -> None:
    assert ranking("content", content_weight=0)[0] == COLD
    assert ranking("ease", content_weight=0.1)[:2] == [A1, COLD]
    assert ranking("ease", content_weight=0)[1] != COLD  # nobody took it: no collaborative signal


def test_transitions_follow_the_users_latest_items_in_order() -> None:
    """Histories a0 -> a1 -> b0 and b1 -> a0 -> b0: what follows a user's last item ranks first,
    then what follows the one before, at decay's weight; the same items in another order differ."""
    train = csr([[A0, A1, B0]] * 10 + [[B1, A0, B0]] * 4)
    settings = RecsSpec(model="transitions", content_weight=0, history=2, decay=0.5)
    towers = train_towers("transitions", train, vectors(), settings)
    indices, scores = recommend_users(towers, BlockedTopK(towers.items, 2, 8), csr([[B1, A1], [A1, B1]]))
    assert indices[0].tolist() == [B0, A0]  # after a1: b0 (1.0); after b1: a0 (0.5)
    assert scores[0, 1] == pytest.approx(0.5 * scores[0, 0])  # in the hybrid's units
    assert indices[1].tolist() == [A0, B0]  # after b1: a0 (1.0); after a1: b0 (0.5)
    empty = towers.users(csr([[]]))
    assert not empty.any()


def test_transitions_never_cross_from_one_user_to_the_next_nor_count_a_repeat() -> None:
    """u1 took a0, a0 again, then a1; u2 b0 then b1. In the rows, u1's last item (a1) sits next to
    u2's first (b0): that is no move, and neither is a0 after a0."""
    settings = RecsSpec(model="transitions", content_weight=0, history=1)
    towers = train_towers("transitions", csr([[A0, A0, A1], [B0, B1]]), vectors(), settings)
    moves = towers.parts[0][0].items.T  # row i: the shares of the moves out of item i
    assert moves[A0].tolist() == [0, 1, 0, 0, 0, 0]  # a0 -> a1 only: a0 -> a0 is a repeat
    assert moves[B0].tolist() == [0, 0, 0, 1, 0, 0]
    assert not moves[A1].any() and not moves[B1].any()  # a1 -> b0 would cross users


@pytest.mark.slow
@pytest.mark.parametrize(("loss", "epochs"), [("softmax", 12), ("gbce", 30)])  # gBCE on 16 of 39 negatives
def test_the_sequence_model_learns_a_fixed_next_item_in_seconds(loss: str, epochs: int) -> None:
    """Items in one cycle of 40 (each item's successor fixed): users walk 3 to 13 steps of it, and
    the model ranks the step after each user's latest item first, from the history alone,
    through the engines its exported graphs passed the gate with."""
    rng = np.random.default_rng(0)
    cycle = rng.permutation(40)
    successor = np.empty(40, np.int64)
    successor[cycle] = np.roll(cycle, -1)
    walks, following = [], []
    for _ in range(300):
        walk = [int(rng.integers(40))]
        for _ in range(int(rng.integers(2, 13))):
            walk.append(int(successor[walk[-1]]))
        walks.append(walk)
        following.append(successor[walk[-1]])
    spec = SequenceSpec(
        dim=32,
        blocks=1,
        history=16,
        dropout=0.1,
        learning_rate=1e-2,
        batch=32,
        max_epochs=epochs,
        loss=loss,
        negatives=16,
    )
    settings = RecsSpec(model="sequence", content_weight=0, sequence=spec)
    towers = train_towers("sequence", csr(walks), np.eye(40, dtype=np.float32), settings)
    report = towers.parts[0][0].report
    assert report.best_ndcg10 > 0.9 and report.epochs <= epochs
    engines = towers.parts[0][0].engines
    reference = engines["gates"][-1]  # auto tries every rung, fp32 last
    assert (reference["precision"], reference["passed"], reference["overlap"]) == ("fp32", True, 1.0)
    assert engines["precision"] in {gate["precision"] for gate in engines["gates"] if gate["passed"]}
    indices, _ = recommend_users(towers, BlockedTopK(towers.items, 1, 64), csr(walks))
    assert (indices[:, 0] == np.array(following)).mean() >= 0.95


def test_ease_refuses_a_catalogue_too_large_for_its_inverse() -> None:
    settings = RecsSpec(model="ease")
    with pytest.raises(
        ValueError,
        match="ease holds an \\[items, items\\] matrix: 20,001 items are more than 20,000; use als",
    ):
        train_towers("ease", csr([[0]]), np.zeros((20_001, 2), np.float32), settings)


def interactions(times: bool) -> pa.Table:
    """Trios a0/a1 and b0/b1 plus the popular item, in shuffled time order, and loners of the popular item."""
    rng = np.random.default_rng(0)
    rows = []
    for user in range(40):
        trio = [IDS[A0], IDS[A1], IDS[POPULAR]] if user % 2 else [IDS[B0], IDS[B1], IDS[POPULAR]]
        rows += [(f"u{user}", item, float(t)) for item, t in zip(trio, rng.permutation(3), strict=True)]
    rows += [(f"loner{user}", IDS[POPULAR], 0.0) for user in range(20)]
    table = pa.table({"user_id": [r[0] for r in rows], "item_id": [r[1] for r in rows]})
    return table.append_column("time", pa.array([r[2] for r in rows])) if times else table


def test_the_temporal_split_holds_out_each_users_latest_interaction() -> None:
    table = interactions(times=True)
    good = valid_interactions(table, IDS)
    split = hold_out(good, seed=0)
    assert (split.name, split.target) == ("temporal", "interaction")
    latest = {}
    for user, item, time in zip(*(table[c].to_pylist() for c in ("user_id", "item_id", "time")), strict=True):
        if time >= latest.get(user, (-1.0, ""))[0]:
            latest[user] = (time, item)
    users = sorted(latest)
    want = [[IDS.index(latest[u][1])] if u.startswith("u") else [] for u in users]
    held = split.held
    assert [held.items[a:b].tolist() for a, b in zip(held.offsets, held.offsets[1:], strict=False)] == want
    assert len(split.train.items) == table.num_rows - 40
    random_split = hold_out(valid_interactions(interactions(times=False), IDS), seed=0)
    assert random_split.name == "random"
    again = hold_out(valid_interactions(interactions(times=False), IDS), seed=0)
    np.testing.assert_array_equal(random_split.held.items, again.held.items)
    # One of each trio user's own items, held out alone; another seed holds out others.
    held, train = random_split.held, random_split.train
    for user in range(len(held.offsets) - 1):
        kept = train.items[train.offsets[user] : train.offsets[user + 1]].tolist()
        out = held.items[held.offsets[user] : held.offsets[user + 1]].tolist()
        assert len(out) == (1 if len(kept) == 2 else 0)
        assert not out or len({*kept, *out}) == 3  # the trio: the held item is the third
    other = hold_out(valid_interactions(interactions(times=False), IDS), seed=1)
    assert (other.held.items != random_split.held.items).any()


def test_the_published_model_is_measured_beside_the_baselines_and_refused_unless_it_beats_most_popular() -> (
    None
):
    # Fillers nobody took, so that a top 10 cannot hold every item a user has not seen.
    ids = IDS + [f"filler{i}" for i in range(FILLERS)]
    texts = np.eye(len(ids), dtype=np.float32)
    texts[: len(IDS), : len(IDS)] = vectors()
    quality, towers = evaluate(valid_interactions(interactions(times=True), ids), texts, RecsSpec())
    assert (quality.split, quality.users, quality.k) == ("temporal", 40, 10)
    # auto: every model timed histories afford, trained and measured, and their ensemble; the best
    # published, as measured.
    trained = {
        "sequence+content",
        "transitions+content",
        "ease+content",
        "itemknn+content",
        "sequence+transitions+ease+content",
    }
    # ... and the best of them without its content part, published where that ranks as well.
    (alone,) = set(quality.candidates) - trained
    assert trained <= set(quality.candidates) and f"{alone}+content" in trained
    assert quality.candidates[f"{alone}+content"].ndcg == max(quality.candidates[name].ndcg for name in trained)
    best = max(q.ndcg for q in quality.candidates.values())
    assert towers.name == quality.published and quality.candidates[quality.published].ndcg == best
    assert quality.models["published"] == quality.candidates[quality.published]
    assert set(quality.models) == {
        "published",
        "most_popular",
        "personal_top_frequency",
        "itemknn",
        "markov",
        "content",
    } | ({"collaborative"} if quality.published.endswith("+content") else set())  # a hybrid's part alone
    published, popular = quality.models["published"], quality.models["most_popular"]
    unseen = len(ids) - 2  # a trio user's catalogue less the two items it trained on
    assert unseen > quality.k and published.hit_rate == 1.0  # the held-out item made the top 10 of 18
    # Given two of a trio, the third is known: first for (nearly) every user, where popularity
    # puts the shared popular item first and the held-out pair item second.
    assert published.ndcg >= 0.95 and published.ndcg >= popular.ndcg + 0.2
    assert 0 < popular.coverage <= 1 and 0 < published.coverage <= 1
    assert beats_most_popular(quality, min_lift=1.0) is None
    refusal = beats_most_popular(quality, min_lift=100.0)
    assert refusal is not None and refusal.startswith(f"{quality.published}'s held-out NDCG@10")
    assert "is not above 100.0 x most-popular's" in refusal


def test_a_user_who_took_only_an_item_nobody_else_took_is_served_by_the_hybrid() -> None:
    """Cold: EASE alone scores every item 0 for them; content and the prior give a ranked list."""
    train = csr([*histories(), [COLD]])
    settings = RecsSpec(model="ease")
    towers = train_towers("ease", train, vectors(), settings)
    user = torch.from_numpy(towers.users(csr([[COLD]])))
    _, scores = BlockedTopK(towers.items, 3, 8)(user, csr([[COLD]]))
    assert scores[0, 0] > scores[0, -1]
    alone = train_towers("ease", train, vectors(), settings.model_copy(update={"content_weight": 0}))
    _, flat = BlockedTopK(alone.items, 3, 8)(torch.from_numpy(alone.users(csr([[COLD]]))), csr([[COLD]]))
    assert flat[0, 0] == flat[0, -1] == 0


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="torch sees no CUDA GPU: EASE's inverse runs on the CPU here"
)
def test_ease_on_the_gpu_matches_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(1)
    rows = [sorted(rng.choice(300, size=rng.integers(1, 20), replace=False).tolist()) for _ in range(500)]
    settings = RecsSpec(model="ease", content_weight=0)
    on_gpu = train_towers("ease", csr(rows), np.eye(300, dtype=np.float32), settings)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    on_cpu = train_towers("ease", csr(rows), np.eye(300, dtype=np.float32), settings)
    np.testing.assert_allclose(on_gpu.items, on_cpu.items, atol=1e-4)


def test_a_catalogue_smaller_than_k_gives_each_user_every_unseen_item() -> None:
    towers = train_towers("content", csr([[A0]]), vectors(), RecsSpec(model="content", content_weight=1))
    indices, scores = recommend_users(towers, BlockedTopK(towers.items, 50, 8), csr([[A0]]))
    assert sorted(indices[0][np.isfinite(scores[0])].tolist()) == [A1, B0, B1, COLD, POPULAR]
