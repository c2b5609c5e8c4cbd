"""The pipeline's own two-tower model in the recs job: both towers' vectors, computed once a run.

    engines: the head of each features file -> valid rows -> calibration rows, gate rows
             -> models/towers.py choose_engines (in a Ray task: on a GPU where the actors get one)
    vectors: features Parquet -> tag rejects (id null or duplicated, a feature null, NaN or of
             the wrong width) -> rejects file (fail past max_reject_ratio) -> TowerActor pool
             -> (ids, vectors) on the driver, sorted by id

Item vectors are then aligned to the item table; user vectors stay sorted by id, and the top-k
actors look their users up (jobs/recs/models.py OwnTowers). A user or item without a features
row gets a zero vector: the popularity prior (and in the hybrid, content) ranks for them.
The graphs travel as bytes (ray.put), so actors on any node run exactly the gated engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import ray
from ray.data.expressions import col

from precompute.jobs.inputs import read_input
from precompute.jobs.ray_session import actor_pool
from precompute.jobs.recs.towers import OwnTowers, rows_of
from precompute.jobs.validate import REASON, duplicate_ids, id_key, quarantine
from precompute.jobs.work_dir import WorkPath
from precompute.models.backends.base import ConcreteDevice
from precompute.models.datasets import arrow_dataset
from precompute.models.settings import EngineSettings
from precompute.models.text.columns import lossless, utf8_errors
from precompute.models.towers import (
    GATE_ITEMS,
    ROWS_PER_CALL,
    FeaturesInput,
    Signature,
    TowerEngines,
    TowerInput,
    TowersSpec,
    choose_engines,
    feature_reasons,
    feeds,
    open_tower,
    same_dim,
)

KEY = "key"
VECTOR = "vector"


@dataclass(frozen=True)
class Tower:
    """One tower's vectors: ids sorted (str), [ids, dim] float32, and its rows' fate."""

    ids: np.ndarray
    vectors: np.ndarray
    rows: int
    rejects: int
    rejects_path: str


def tag_feature_rejects(batch: pa.Table, inputs: list[TowerInput], duplicates: set[str]) -> pa.Table:
    """Add `reject_reason` (null for good rows) and the id as the jobs key it (null for bad rows)."""
    undecodable = utf8_errors(batch, ["id"])
    ids = lossless(batch.select(["id"]))["id"].to_pylist()
    features = feature_reasons(batch, inputs)
    reasons = []
    for bad, id_, feature in zip(undecodable, ids, features, strict=True):
        if id_ is None:
            bad = bad or "id is null"
        elif id_key(id_) in duplicates:
            bad = bad or f"id {id_key(id_)!r} is duplicated"
        reasons.append(bad or feature)
    keys = [None if r else id_key(i) for r, i in zip(reasons, ids, strict=True)]
    return batch.append_column(REASON, pa.array(reasons, pa.string())).append_column(
        KEY, pa.array(keys, pa.string())
    )


class TowerActor:
    """Holds one tower's engine (its node's, built from the gated graph); feature rows -> (key, vector)."""

    def __init__(
        self, graph: ray.ObjectRef, inputs: list[TowerInput], machine: EngineSettings, device: ConcreteDevice
    ) -> None:
        self.runner = open_tower(ray.get(graph), machine, device)
        self.inputs = inputs

    def __call__(self, batch: pa.Table) -> pa.Table:
        vectors = self.runner.infer(feeds(batch, self.inputs))
        flat = pa.array(vectors.ravel(), pa.float32())
        return pa.table({KEY: batch[KEY], VECTOR: pa.FixedSizeListArray.from_arrays(flat, vectors.shape[1])})


def read_features(features: FeaturesInput, inputs: list[TowerInput]) -> ray.data.Dataset:
    """The id and the tower's input columns, the id renamed to `id`."""
    dataset = read_input(features).select_columns([features.id, *(i.name for i in inputs)])
    return dataset.rename_columns({features.id: "id"}) if features.id != "id" else dataset


def head_rows(features: FeaturesInput, inputs: list[TowerInput], rows: int) -> pa.Table:
    """Up to `rows` valid rows from the head of the file: calibration and gate rows, read cheaply."""
    names = [features.id, *(i.name for i in inputs)]
    head = arrow_dataset(features).head(rows, columns=names)
    reasons = feature_reasons(head, inputs)
    return head.filter(pa.array([r is None for r in reasons]))


def tower_vectors(
    features: FeaturesInput,
    graph: bytes,
    inputs: list[TowerInput],
    machine: EngineSettings,
    device: ConcreteDevice,
    rejects_path: WorkPath,
    noun: str,
) -> Tower:
    """Vectors of every valid row of `features`, bad rows quarantined with their reason first."""
    source = arrow_dataset(features)
    rows = source.count_rows()
    tagged = read_features(features, inputs).map_batches(
        tag_feature_rejects,
        batch_format="pyarrow",
        fn_kwargs={"inputs": inputs, "duplicates": duplicate_ids(source, features.id)},
    )
    rejected = tagged.drop_columns([KEY])
    if features.id != "id":  # the rejects file names the id column as the input does
        rejected = rejected.rename_columns({"id": features.id})
    rejects = quarantine(rejected, rows, features.max_reject_ratio, rejects_path, noun)
    vectors = tagged.filter(expr=col(REASON).is_null()).map_batches(
        TowerActor,
        fn_constructor_kwargs={"graph": ray.put(graph), "inputs": inputs, "machine": machine, "device": device},
        batch_size=ROWS_PER_CALL,
        batch_format="pyarrow",
        **actor_pool(1, device == "cuda"),
    )
    tables = [t for t in ray.get(vectors.to_arrow_refs()) if t.num_rows]
    if not tables:
        return Tower(np.array([], str), np.zeros((0, 0), np.float32), rows, rejects, str(rejects_path))
    table = pa.concat_tables(tables).sort_by(KEY)
    column = table[VECTOR].combine_chunks()
    matrix = column.flatten().to_numpy().reshape(len(column), column.type.list_size)
    return Tower(np.asarray(table[KEY].to_pylist(), str), matrix, rows, rejects, str(rejects_path))


def aligned(tower: Tower, ids: pa.StringArray, dim: int) -> tuple[np.ndarray, int]:
    """Rows of `tower` in the order of `ids`, zeros where an id has none; (matrix, ids without)."""
    has, at = rows_of(tower.ids, np.asarray(ids.to_pylist(), str))
    matrix = np.zeros((len(ids), dim), np.float32)
    matrix[has] = tower.vectors[at[has]]
    return matrix, int((~has).sum())


def own_towers(spec: TowersSpec, item_ids: pa.StringArray, work_dir: WorkPath, machine: EngineSettings) -> OwnTowers:
    """The towers model of a run (item vectors in the order of `item_ids`), its report saying
    the engines chosen, rows read and rejected per features file, and items without features.
    Runs in the caller's Ray session: on GPUs where the cluster has them."""
    gpus = ray.cluster_resources().get("GPU", 0) > 0
    device: ConcreteDevice = "cuda" if gpus else "cpu"
    graphs = {"user": Path(spec.user).read_bytes(), "item": Path(spec.item).read_bytes()}
    signatures = {tower: Signature(graph) for tower, graph in graphs.items()}
    dim = same_dim(signatures["user"], signatures["item"])
    sample = spec.calibration_rows
    heads = {
        "user": head_rows(spec.users, signatures["user"].inputs, sample + spec.gate_users),
        "item": head_rows(spec.items, signatures["item"].inputs, sample + GATE_ITEMS),
    }
    split = {
        tower: (rows.slice(0, sample), rows.slice(sample) if rows.num_rows > sample else rows)
        for tower, rows in heads.items()
    }
    choose = ray.remote(num_gpus=1 if gpus else 0, num_cpus=0.5)(choose_engines)
    engines: TowerEngines = ray.get(
        choose.remote(spec, graphs, split["user"], split["item"], device, machine)
    )
    users = tower_vectors(
        spec.users,
        engines.user,
        signatures["user"].inputs,
        machine,
        device,
        work_dir / "user_features_rejects.parquet",
        "user features",
    )
    items = tower_vectors(
        spec.items,
        engines.item,
        signatures["item"].inputs,
        machine,
        device,
        work_dir / "item_features_rejects.parquet",
        "item features",
    )
    item_matrix, items_without = aligned(items, item_ids, dim)
    user_vectors = users.vectors if len(users.ids) else np.zeros((0, dim), np.float32)
    report = {
        **engines.report(),
        "user_rows": users.rows,
        "user_rejects": users.rejects,
        "user_rejects_path": users.rejects_path,
        "item_rows": items.rows,
        "item_rejects": items.rejects,
        "item_rejects_path": items.rejects_path,
        "items_without_features": items_without,
    }
    return OwnTowers(item_matrix, users.ids, user_vectors, report)
