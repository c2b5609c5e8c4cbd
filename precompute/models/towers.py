"""A two-tower model the user brings: a user tower and an item tower, each an ONNX file from
numeric features to a vector; the score of (user, item) is the dot product of their vectors.

Features: each input of a tower's graph is read from the features Parquet's column of the same
name, [batch] from a column of numbers, [batch, width] from a list column of `width` numbers, as
the input's element type (float for dense features, integers for ids into an embedding table).

Engines, as for the text encoders: the same precision ladder and backends (models/engines/runtime.py),
and a quantized graph is used only after it passes a gate against FP32, here the overlap of gate
users' top items (models/engines/gate.py overlap_gate, the brief's gate for recommendations). INT8 is
static, calibrated on feature rows, with explicit Q/DQ (models/engines/quantize.py int8_qdq_features:
what TensorRT takes; ONNX Runtime's CPU fuses it into integer kernels). Of the precisions that
pass, `auto` takes the fastest on the gate's rows: INT8 is not always faster for a small
network, where converting activations costs as much as the matmul saves.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, ConfigDict, Field, field_validator

from precompute.models.backends.base import BuildSpec, ConcreteDevice, Feeds, Runner
from precompute.models.datasets import DatasetInput
from precompute.models.engines.cache import EngineCache
from precompute.models.engines.climb import Rung, climb
from precompute.models.engines.gate import GateResult, overlap_gate, top_overlap
from precompute.models.engines.runtime import (
    BF16,
    graph_digest,
    open_graph,
    precision_ladder,
    resolve_graph_backend,
)
from precompute.models.errors import ModelError
from precompute.models.location import Location
from precompute.models.settings import EngineSettings, Precision

ELEMENT_TYPES = {
    "tensor(float)": np.float32,
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
}
CALIBRATION_BATCH = 256


class FeaturesInput(DatasetInput):
    """Features (a file, folder, glob or partitioned dataset): an id column and the columns the
    tower's inputs name."""

    id: str = "id"
    """The column of the user's (or item's) id."""
    max_reject_ratio: float = Field(0.01, ge=0, le=1)
    """The job fails when more than this share of feature rows is rejected (null, NaN, wrong width)."""

    def id_columns(self) -> tuple[str, ...]:
        return (self.id,)


class GatedTowers(BaseModel):
    """How a pair of tower graphs gets its engines: the precision ladder and its gate."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    precision: Precision = "auto"
    """Where the ladder starts (int8, then fp16 on GPUs, then fp32); auto: the fastest that passes.
    Not bf16: the towers are ONNX graphs, and only PyTorch runs BF16 on a CPU."""
    gate_overlap: float = Field(0.9, gt=0, le=1)
    """A quantized pair is used only if gate users' top-10 items share this share with FP32's."""
    calibration_rows: int = Field(512, ge=16)
    """Input rows of each tower (feature rows; the sequence model's: users' histories, items)
    that set static INT8's activation ranges."""
    gate_users: int = Field(1000, ge=16)
    """Users (after the calibration rows) whose top items the gate compares, against at most
    GATE_ITEMS items."""


    @field_validator("precision")
    @classmethod
    def _a_graphs_precision(cls, precision: Precision) -> Precision:
        if precision == BF16:
            raise ValueError("bf16 runs only in PyTorch; a tower graph takes auto, int8, fp16 or fp32")
        return precision


class TowersSpec(GatedTowers):
    """The pipeline file's `towers` of a recs output whose model is "towers"."""

    user: Location
    """ONNX file: the user tower, user features -> [batch, dim]."""
    item: Location
    """ONNX file: the item tower, item features -> [batch, dim] (the same dim)."""
    users: FeaturesInput
    items: FeaturesInput


GATE_ITEMS = 20_000


@dataclass(frozen=True)
class TowerInput:
    name: str
    dtype: type
    width: int | None
    """None: one number a row ([batch]); else a list of `width` numbers ([batch, width])."""


def tower_inputs(session: ort.InferenceSession) -> list[TowerInput]:
    inputs = []
    for arg in session.get_inputs():
        if arg.type not in ELEMENT_TYPES:
            raise ModelError(
                f"input {arg.name!r} is {arg.type}: a tower's inputs are float, double or int tensors"
            )
        if len(arg.shape) == 1:
            inputs.append(TowerInput(arg.name, ELEMENT_TYPES[arg.type], None))
        elif len(arg.shape) == 2 and isinstance(arg.shape[1], int):
            inputs.append(TowerInput(arg.name, ELEMENT_TYPES[arg.type], arg.shape[1]))
        else:
            raise ModelError(
                f"input {arg.name!r} has shape {arg.shape}: a tower takes [batch] or [batch, width] (fixed width)"
            )
    return inputs


def output_dim(session: ort.InferenceSession) -> int:
    shape = session.get_outputs()[0].shape
    if len(shape) != 2 or not isinstance(shape[1], int):
        raise ModelError(f"the first output has shape {shape}: a tower returns [batch, dim] (fixed dim)")
    return shape[1]


def column_problem(kind: pa.DataType, input_: TowerInput) -> str | None:
    """Why a column of type `kind` cannot feed `input_` (None: it can)."""
    integer = np.issubdtype(input_.dtype, np.integer)
    if input_.width is not None:
        if not (pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)):
            return f"is {kind}, not a list of {input_.width} numbers"
        kind = kind.value_type
    number = pa.types.is_integer(kind) or (pa.types.is_floating(kind) and not integer)
    return None if number else f"is {kind}, not {'integers' if integer else 'numbers'}"


def feature_reasons(batch: pa.Table, inputs: list[TowerInput]) -> list[str | None]:
    """Per row, why its features cannot be fed (the first problem found), or None."""
    reasons: list[str | None] = [None] * batch.num_rows
    for input_ in inputs:
        column = batch[input_.name].combine_chunks()
        for row in np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False)):
            reasons[row] = reasons[row] or f"{input_.name} is null"
        values, rows = column, np.arange(len(column))
        if input_.width is not None:
            lengths = pc.fill_null(pc.list_value_length(column), input_.width).to_numpy()
            for row in np.flatnonzero(lengths != input_.width):
                reasons[row] = reasons[row] or f"{input_.name} has {lengths[row]} values, not {input_.width}"
            values, rows = pc.list_flatten(column), pc.list_parent_indices(column).to_numpy()
        for row in np.unique(rows[values.is_null().to_numpy(zero_copy_only=False)]):
            reasons[row] = reasons[row] or f"{input_.name} holds a null"
        if pa.types.is_floating(values.type):
            finite = pc.fill_null(pc.is_finite(values), True).to_numpy(zero_copy_only=False)
            for row in np.unique(rows[~finite]):
                reasons[row] = reasons[row] or f"{input_.name} is not finite (NaN or infinite)"
    return reasons


def feeds(batch: pa.Table, inputs: list[TowerInput]) -> dict[str, np.ndarray]:
    """Valid rows (feature_reasons all None) as the tower's input arrays."""
    arrays = {}
    for input_ in inputs:
        column = batch[input_.name].combine_chunks()
        if input_.width is None:
            arrays[input_.name] = column.to_numpy(zero_copy_only=False).astype(input_.dtype)
        else:
            flat = pc.list_flatten(column).to_numpy(zero_copy_only=False)
            arrays[input_.name] = flat.astype(input_.dtype).reshape(len(column), input_.width)
    return arrays


class Signature:
    """A tower graph's inputs and output width, read by opening it (a graph ONNX Runtime cannot
    open is refused here, before any job): what `precompute check` and the job feed it by."""

    def __init__(self, graph: bytes) -> None:
        try:
            session = ort.InferenceSession(graph, providers=["CPUExecutionProvider"])
        except Exception as e:  # ONNX Runtime raises its own types for unreadable graphs
            raise ModelError(f"not a graph ONNX Runtime can run ({e})") from None
        self.inputs = tower_inputs(session)
        self.dim = output_dim(session)


def same_dim(user: Signature, item: Signature) -> int:
    if user.dim != item.dim:
        raise ModelError(
            f"the user tower returns {user.dim} dims and the item tower {item.dim}: a dot product needs one"
        )
    return user.dim


ROWS_PER_CALL = 4096
"""Feature rows per engine call: the batch size a tower's engine is built for."""


def open_tower(graph: bytes, machine: EngineSettings, device: ConcreteDevice) -> Runner:
    """The engine of a tower graph at its precision, through the backends every engine uses."""
    return open_graph(graph, machine, device, BuildSpec(ROWS_PER_CALL))


def vectors_of(runner: Runner, rows: pa.Table, inputs: list[TowerInput]) -> np.ndarray:
    """[rows, dim] float32 of valid feature rows (feature_reasons all None), a call per ROWS_PER_CALL."""
    parts = [
        runner.infer(feeds(rows.slice(start, ROWS_PER_CALL), inputs))
        for start in range(0, rows.num_rows, ROWS_PER_CALL)
    ]
    return np.concatenate(parts) if parts else np.zeros((0, 0), np.float32)


def calibration_feeds(rows: pa.Table, inputs: list[TowerInput]) -> Iterator[Feeds]:
    for start in range(0, rows.num_rows, CALIBRATION_BATCH):
        yield feeds(rows.slice(start, CALIBRATION_BATCH), inputs)


def quantized(fp32: bytes, precision: str, calibration: pa.Table, cache_dir: Path) -> bytes:
    """The graph of `precision` derived from the FP32 tower, cached by the graph's and the
    calibration rows' digests."""
    if precision == "fp32":
        return fp32

    from precompute.models.engines.quantize import fp16, int8_qdq_features  # onnxruntime's quantization tools

    rows = graph_digest(str(calibration.to_pylist()).encode())
    key = {"tower": graph_digest(fp32), "precision": precision, "rows": rows, "onnxruntime": ort.__version__}

    def build(directory: Path) -> None:
        source, out = directory / "fp32.onnx", directory / "model.onnx"
        source.write_bytes(fp32)
        if precision == "fp16":
            fp16(source, out, (), None)
        else:
            inputs = Signature(fp32).inputs
            int8_qdq_features(source, out, calibration_feeds(calibration, inputs))
        source.unlink()

    return (
        EngineCache(cache_dir).get_or_build(f"tower-{precision}", key, build).path / "model.onnx"
    ).read_bytes()


@dataclass(frozen=True)
class TowerEngines:
    """The chosen graphs of both towers and how they were chosen."""

    precision: str
    user: bytes
    item: bytes
    device: ConcreteDevice
    gates: list[GateResult] = field(default_factory=list)

    def report(self) -> dict[str, object]:
        return {
            "precision": self.precision,
            "device": self.device,
            "gates": [{k: v for k, v in asdict(g).items() if v is not None} for g in self.gates],
        }


def timed(runner: Runner, rows: pa.Table, inputs: list[TowerInput]) -> tuple[np.ndarray, float]:
    """Vectors of `rows` and the best of three runs' seconds (after one warm-up)."""
    vectors = vectors_of(runner, rows, inputs)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        vectors_of(runner, rows, inputs)
        best = min(best, time.perf_counter() - start)
    return vectors, best


def choose_engines(
    spec: GatedTowers,
    graphs: dict[str, bytes],
    user_rows: tuple[pa.Table, pa.Table],
    item_rows: tuple[pa.Table, pa.Table],
    device: ConcreteDevice,
    machine: EngineSettings,
) -> TowerEngines:
    """The precision climb (models/engines/climb.py) over the ladder from spec.precision, both
    towers gated together against FP32 on (calibration rows, gate rows) of each: auto takes the
    fastest that passes on the gate's rows, a set precision the first that passes from it up."""
    ladder = precision_ladder(spec.precision, device, resolve_graph_backend(machine, device).name)
    rows = {"user": user_rows, "item": item_rows}
    inputs = {tower: Signature(graph).inputs for tower, graph in graphs.items()}

    @functools.cache
    def scored(precision: str) -> tuple[dict[str, bytes], dict[str, np.ndarray], float]:
        """The precision's graphs, their vectors of the gate rows, and the best seconds of both towers."""
        built = {tower: quantized(graphs[tower], precision, rows[tower][0], machine.cache_dir) for tower in graphs}
        vectors, seconds = {}, 0.0
        for tower, graph in built.items():
            with open_tower(graph, machine, device) as runner:
                vectors[tower], took = timed(runner, rows[tower][1], inputs[tower])
            seconds += took
        return built, vectors, seconds

    def rung(precision: str) -> Rung[tuple[str, dict[str, bytes]]]:
        def tried() -> tuple[GateResult, tuple[str, dict[str, bytes]] | None]:
            reference = scored("fp32")[1]
            built, vectors, seconds = scored(precision)
            overlap = top_overlap(vectors["user"], vectors["item"], reference["user"], reference["item"])
            gate = overlap_gate(precision, overlap, spec.gate_overlap, seconds)
            return gate, (precision, built) if gate.passed else None

        return Rung(precision, tried)

    climbed = climb((rung(precision) for precision in ladder), "fastest" if spec.precision == "auto" else "first")
    precision, chosen = climbed.engine
    return TowerEngines(precision, chosen["user"], chosen["item"], device, climbed.gates)
