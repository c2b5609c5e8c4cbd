"""A user's own two-tower model: features in, engines gated, vectors on real Ray, exact top-k out."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from precompute.jobs.inputs import InteractionsInput
from precompute.jobs.recs.own_towers import own_towers
from precompute.jobs.recs.quality import evaluate, valid_interactions
from precompute.jobs.recs.recommend import run_recs_job
from precompute.jobs.recs.spec import RecsSpec
from precompute.jobs.recs.state import Items
from precompute.jobs.settings import JobSettings
from precompute.jobs.validate import RejectRatioExceededError
from precompute.jobs.work_dir import WorkPath
from precompute.models.settings import EngineSettings
from precompute.models.towers import (
    FeaturesInput,
    TowerEngines,
    TowerInput,
    TowersSpec,
    choose_engines,
    column_problem,
    feature_reasons,
)
from precompute.stores.key_value.records import decode_ranked
from tests.jobs.recs.inputs import ParquetSink
from tests.models.tiny import tiny_towers

ITEMS, USERS, K = 40, 30, 5
BAD_USERS = [
    {"user_id": "u-null-age", "age": None, "taste": [0.1] * 8},
    {"user_id": "u-short", "age": 30.0, "taste": [0.1] * 7},
    {"user_id": "u-nan", "age": 30.0, "taste": [math.nan] + [0.1] * 7},
    {"user_id": "u-dup", "age": 30.0, "taste": [0.1] * 8},
    {"user_id": "u-dup", "age": 31.0, "taste": [0.2] * 8},
]
"""Feature rows the job must quarantine; each of these users has interactions too."""


@pytest.fixture(scope="module")
def towers_data(tmp_path_factory: pytest.TempPathFactory) -> tuple[TowersSpec, Items, Path]:
    """Towers, features (with bad rows, a user and an item without any) and interactions."""
    folder = tmp_path_factory.mktemp("towers")
    user, item = tiny_towers(folder)
    rng = np.random.default_rng(3)
    ids = [f"i{n:02d}" for n in range(ITEMS)]
    pq.write_table(
        pa.table(
            {
                "item_id": [*ids[:-1], "i38"],  # i39 has no row; i38's second row duplicates it
                "category": rng.integers(0, 10, ITEMS),
                "price": [*rng.uniform(1, 200, ITEMS - 1), 5.0],
            }
        ),
        folder / "items.parquet",
    )
    users = [f"u{n:02d}" for n in range(USERS)]
    good = [
        {"user_id": u, "age": float(rng.integers(18, 80)), "taste": rng.normal(size=8).tolist()}
        for u in users
    ]
    features = good[:-1] + BAD_USERS  # the last user has interactions and no features row
    pq.write_table(
        pa.Table.from_pylist(
            features,
            pa.schema([("user_id", pa.string()), ("age", pa.float64()), ("taste", pa.list_(pa.float32()))]),
        ),
        folder / "users.parquet",
    )
    rows = [
        {"user_id": u, "item_id": ids[i]}
        for u in users + sorted({r["user_id"] for r in BAD_USERS})
        for i in rng.choice(ITEMS, size=4, replace=False)
    ]
    pq.write_table(pa.Table.from_pylist(rows), folder / "interactions.parquet")
    spec = TowersSpec(
        user=str(user),
        item=str(item),
        users=FeaturesInput(path=str(folder / "users.parquet"), id="user_id", max_reject_ratio=0.5),
        items=FeaturesInput(path=str(folder / "items.parquet"), id="item_id", max_reject_ratio=0.5),
        precision="fp32",
    )
    vectors = rng.normal(size=(ITEMS, 8)).astype(np.float32)
    items = Items.of(pa.array(ids, pa.string()), vectors / np.linalg.norm(vectors, axis=1, keepdims=True), np.zeros(ITEMS, "S16"))
    return spec, items, folder / "interactions.parquet"


def fp32_vectors(graph: str, table: pa.Table) -> np.ndarray:
    """A tower's FP32 vectors, fed straight from the table by ONNX Runtime's own input types."""
    session = ort.InferenceSession(graph, providers=["CPUExecutionProvider"])
    feeds = {
        arg.name: np.asarray(
            table[arg.name].to_pylist(), np.int64 if arg.type == "tensor(int64)" else np.float32
        )
        for arg in session.get_inputs()
    }
    return session.run(None, feeds)[0]


@pytest.mark.slow
def test_the_job_ranks_by_the_users_own_towers_and_quarantines_feature_rows_it_cannot_feed(
    ray_local, towers_data, tmp_path: Path
) -> None:
    spec, items, interactions = towers_data
    settings = RecsSpec(k=K, model="towers", content_weight=0, popularity_weight=0)
    own = own_towers(spec, items.ids, WorkPath.of(tmp_path / "work"), EngineSettings(cache_dir=tmp_path / "cache"))
    report = run_recs_job(
        InteractionsInput(path=str(interactions)),
        settings,
        JobSettings(),
        items,
        ParquetSink(tmp_path / "out"),
        WorkPath.of(tmp_path / "work"),
        own=own,
    )

    user_rejects = pq.read_table(own.report["user_rejects_path"]).to_pylist()
    assert sorted((r["user_id"], r["reject_reason"]) for r in user_rejects) == [
        ("u-dup", "id 'u-dup' is duplicated"),
        ("u-dup", "id 'u-dup' is duplicated"),
        ("u-nan", "taste is not finite (NaN or infinite)"),
        ("u-null-age", "age is null"),
        ("u-short", "taste has 7 values, not 8"),
    ]
    item_rejects = pq.read_table(own.report["item_rejects_path"]).to_pylist()
    assert sorted(r["reject_reason"] for r in item_rejects) == ["id 'i38' is duplicated"] * 2
    assert report.towers is not None
    assert (report.towers["precision"], report.towers["items_without_features"]) == ("fp32", 2)
    assert report.towers["users_without_features"] == 4 + 1  # four bad users, one without a row

    # The reference: FP32 vectors from ONNX Runtime directly, exact top-k of their dot products.
    users = pq.read_table(spec.users.path).to_pylist()
    good_users = {r["user_id"]: r for r in users[: USERS - 1]}
    user_table = pa.Table.from_pylist(list(good_users.values()), pq.read_schema(spec.users.path))
    user_vectors = dict(zip(good_users, fp32_vectors(spec.user, user_table), strict=True))
    item_table = pq.read_table(spec.items.path).slice(0, ITEMS - 2)
    item_vectors = np.zeros((ITEMS, 16), np.float32)
    item_vectors[: ITEMS - 2] = fp32_vectors(spec.item, item_table)
    history: dict[str, set[int]] = {}
    for row in pq.read_table(interactions).to_pylist():
        history.setdefault(row["user_id"], set()).add(items.ids.to_pylist().index(row["item_id"]))
    written = {row["id"]: row["value"] for row in pq.read_table(tmp_path / "out").to_pylist()}
    assert set(written) == set(history)
    for user, vector in user_vectors.items():
        scores = item_vectors @ vector
        scores[list(history[user])] = -np.inf
        indices, _ = decode_ranked(written[user])
        np.testing.assert_allclose(scores[indices], np.sort(scores)[::-1][:K], rtol=1e-4, atol=1e-5)
    for user in {r["user_id"] for r in BAD_USERS} | {f"u{USERS - 1:02d}"}:
        indices, _ = decode_ranked(written[user])
        assert len(indices) == K and not set(indices) & history[user]  # served, from the prior alone

    good = valid_interactions(pq.read_table(interactions), items.ids)
    quality, _ = evaluate(good, items.vectors, settings.model_copy(update={"content_weight": 0.1}), own=own)
    assert quality.published == "towers+content"
    assert {"published", "most_popular", "itemknn", "content", "collaborative"} <= set(quality.models)


def test_int8_is_static_with_explicit_qdq_and_auto_takes_the_fastest_engine_that_passes(
    towers_data, tmp_path: Path
) -> None:
    spec, _, _ = towers_data
    users = pq.read_table(spec.users.path).slice(0, USERS - 1)
    items = pq.read_table(spec.items.path).slice(0, ITEMS - 2)
    graphs = {"user": Path(spec.user).read_bytes(), "item": Path(spec.item).read_bytes()}

    def choose(precision: str, overlap: float) -> TowerEngines:
        policy = spec.model_copy(update={"precision": precision, "gate_overlap": overlap})
        return choose_engines(
            policy, graphs, (users, users), (items, items), "cpu", EngineSettings(cache_dir=tmp_path)
        )

    engines = choose("auto", 0.5)
    assert [g.precision for g in engines.gates] == ["int8", "fp32"]  # the ladder's order
    assert engines.gates[-1].overlap == 1.0
    passing = [g for g in engines.gates if g.passed]
    fastest = min(g.seconds for g in passing)
    assert engines.precision in {g.precision for g in passing if g.seconds == fastest}  # a tie: either

    ops = {node.op_type for node in onnx.load_from_string(choose("int8", 0.01).user).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear", "Gemm"} <= ops

    strict = choose("int8", 1.0)  # fp32 wherever int8 moved any user's top 10
    assert strict.precision == ("int8" if strict.gates[0].overlap == 1.0 else "fp32")
    assert [g.precision for g in strict.gates] == (["int8"] if strict.precision == "int8" else ["int8", "fp32"])


def test_a_precision_that_moves_users_top_items_falls_back_to_fp32(towers_data, tmp_path: Path) -> None:
    """Prices a million from zero and within one of each other: static INT8's one scale for the
    item layer's input cannot keep the categories beside them, every item looks alike, and users'
    top 10 moves; the gate refuses INT8 and the towers run in FP32."""
    spec, _, _ = towers_data
    users = pq.read_table(spec.users.path).slice(0, USERS - 1)
    rng = np.random.default_rng(5)
    items = pa.table(
        {
            "item_id": [f"i{n:02d}" for n in range(ITEMS)],
            "category": rng.integers(0, 10, ITEMS),
            "price": 1e6 + rng.uniform(0, 1, ITEMS),
        }
    )
    graphs = {"user": Path(spec.user).read_bytes(), "item": Path(spec.item).read_bytes()}
    policy = spec.model_copy(update={"precision": "auto", "gate_overlap": 0.9})
    engines = choose_engines(
        policy, graphs, (users, users), (items, items), "cpu", EngineSettings(cache_dir=tmp_path)
    )
    int8, fp32 = engines.gates
    assert (fp32.precision, fp32.passed, int8.precision, int8.passed) == ("fp32", True, "int8", False)
    assert int8.overlap is not None and int8.overlap < 0.9 and "overlap" in int8.reason
    assert engines.precision == "fp32" and engines.item == graphs["item"] and engines.user == graphs["user"]


def test_every_way_a_feature_row_cannot_be_fed_is_named() -> None:
    inputs = [TowerInput("age", np.float32, None), TowerInput("taste", np.float32, 3)]
    table = pa.table(
        {
            "age": pa.array([30.0, None, math.inf, 30.0, 30.0, 30.0]),
            "taste": pa.array([[1.0, 2, 3], [1.0, 2, 3], [1.0, 2, 3], [1.0, 2], None, [1.0, None, 3]]),
        }
    )
    assert feature_reasons(table, inputs) == [
        None,
        "age is null",
        "age is not finite (NaN or infinite)",
        "taste has 2 values, not 3",
        "taste is null",
        "taste holds a null",
    ]
    assert column_problem(pa.string(), inputs[0]) == "is string, not numbers"
    assert column_problem(pa.float64(), inputs[1]) == "is double, not a list of 3 numbers"
    assert column_problem(pa.float64(), TowerInput("category", np.int64, None)) == "is double, not integers"
    assert column_problem(pa.list_(pa.float32()), inputs[1]) is None


def test_feature_rows_past_the_reject_ratio_fail_the_job_with_their_reasons_kept(
    ray_local, towers_data, tmp_path: Path
) -> None:
    spec, items, _ = towers_data
    strict = spec.model_copy(update={"users": spec.users.model_copy(update={"max_reject_ratio": 0.01})})
    with pytest.raises(RejectRatioExceededError, match=r"^5 of \d+ user features rejected, over max_reject_ratio=0\.01"):
        own_towers(strict, items.ids, WorkPath.of(tmp_path / "work"), EngineSettings(cache_dir=tmp_path / "cache"))
    rejects = pq.read_table(tmp_path / "work" / "user_features_rejects.parquet")
    assert rejects.num_rows == 5 and set(rejects.column_names) >= {"user_id", "reject_reason"}
