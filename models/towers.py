"""A two-tower model the user brings: a user tower and an item tower, each an ONNX file from
numeric features to a vector; the score of (user, item) is the dot product of their vectors.

Features: each input of a tower's graph is read from the features Parquet's column of the same
name, [batch] from a column of numbers, [batch, width] from a list column of `width` numbers, as
the input's element type (float for dense features, integers for ids into an embedding table).

Engines, as for the text encoders: a quantized graph is used only after it passes a gate
against FP32, here the overlap of gate users' top GATE_K items (the brief's gate for
recommendations). INT8 is static, calibrated on feature rows, with explicit Q/DQ (what
TensorRT takes; ONNX Runtime's CPU fuses it into integer kernels): dynamic INT8 would leave
Gemm, the op torch exports nn.Linear as, in float. Of the precisions that pass, `auto` takes
the fastest on the gate's rows: dynamic or not, INT8 is not always faster for a small network,
where converting activations costs as much as the matmul saves.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import onnxruntime as ort
import pyarrow as pa
import pyarrow.compute as pc
from precompute.models.backends.base import ConcreteDevice
from precompute.models.engine_cache import EngineCache
from precompute.models.errors import ModelError
from pydantic import BaseModel, ConfigDict, Field

GATE_K = 10
LADDERS: dict[ConcreteDevice, tuple[str, ...]] = {"cpu": ("int8", "fp32"), "cuda": ("int8", "fp16", "fp32")}
ELEMENT_TYPES = {
    "tensor(float)": np.float32,
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
}
CALIBRATION_BATCH = 256


class FeaturesInput(BaseModel):
    """A features Parquet (path or URI): an id column and the columns the tower's inputs name."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str
    id: str = "id"
    max_reject_ratio: float = Field(0.01, ge=0, le=1)
    """The job fails when more than this share of feature rows is rejected (null, NaN, wrong width)."""


class TowersSpec(BaseModel):
    """The pipeline file's `towers` of a recs output whose model is "towers"."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    user: str
    """ONNX file: the user tower, user features -> [batch, dim]."""
    item: str
    """ONNX file: the item tower, item features -> [batch, dim] (the same dim)."""
    users: FeaturesInput
    items: FeaturesInput
    precision: Literal["auto", "int8", "fp16", "fp32"] = "auto"
    """Where the ladder starts (int8, then fp16 on GPUs, then fp32); auto: the fastest that passes."""
    gate_overlap: float = Field(0.9, gt=0, le=1)
    """A quantized pair is used only if gate users' top-10 items share this share with FP32's."""
    calibration_rows: int = Field(512, ge=16)
    """Feature rows of each tower that set static INT8's activation ranges."""
    gate_users: int = Field(1000, ge=16)
    """Users (after the calibration rows) whose top items the gate compares, against at most
    GATE_ITEMS items."""


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


def providers(device: ConcreteDevice) -> list[str]:
    return ["CUDAExecutionProvider", "CPUExecutionProvider"] if device == "cuda" else ["CPUExecutionProvider"]


class TowerSession:
    """One tower's ONNX Runtime session: valid feature rows -> [rows, dim] float32."""

    def __init__(self, graph: bytes, device: ConcreteDevice = "cpu", threads: int = 0) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        try:
            self.session = ort.InferenceSession(graph, options, providers=providers(device))
        except Exception as e:  # ONNX Runtime raises its own types for unreadable graphs
            raise ModelError(f"not a graph ONNX Runtime can run ({e})") from None
        self.inputs = tower_inputs(self.session)
        self.dim = output_dim(self.session)

    def __call__(self, batch: pa.Table) -> np.ndarray:
        return np.asarray(self.session.run(None, feeds(batch, self.inputs))[0], np.float32)


def same_dim(user: TowerSession, item: TowerSession) -> int:
    if user.dim != item.dim:
        raise ModelError(
            f"the user tower returns {user.dim} dims and the item tower {item.dim}: a dot product needs one"
        )
    return user.dim


def digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def calibration_feeds(rows: pa.Table, inputs: list[TowerInput]) -> Iterator[dict[str, np.ndarray]]:
    for start in range(0, rows.num_rows, CALIBRATION_BATCH):
        yield feeds(rows.slice(start, CALIBRATION_BATCH), inputs)


def quantized(fp32: bytes, precision: str, calibration: pa.Table, cache_dir: Path) -> bytes:
    """The graph of `precision` derived from the FP32 tower, cached by the graph's and the
    calibration rows' digests."""
    if precision == "fp32":
        return fp32
    import onnx

    rows = digest(str(calibration.to_pylist()).encode())
    key = {"tower": digest(fp32), "precision": precision, "rows": rows, "onnxruntime": ort.__version__}

    def build(directory: Path) -> None:
        out = directory / "model.onnx"
        if precision == "fp16":
            from onnxruntime.transformers.float16 import convert_float_to_float16

            onnx.save(convert_float_to_float16(onnx.load_from_string(fp32), keep_io_types=True), out)
            return
        from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
        from onnxruntime.quantization.shape_inference import quant_pre_process

        class Reader(CalibrationDataReader):
            def __init__(self) -> None:
                self.feeds = calibration_feeds(calibration, TowerSession(fp32).inputs)

            def get_next(self) -> dict[str, np.ndarray] | None:
                return next(self.feeds, None)

        source, prepared = directory / "fp32.onnx", directory / "prepared.onnx"
        source.write_bytes(fp32)
        quant_pre_process(source, prepared, skip_symbolic_shape=True)
        quantize_static(
            prepared,
            out,
            Reader(),
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            activation_type=QuantType.QInt8,
            weight_type=QuantType.QInt8,
            op_types_to_quantize=["MatMul", "Gemm"],
            extra_options={"ActivationSymmetric": True, "WeightSymmetric": True},
        )
        source.unlink()
        prepared.unlink()

    return (
        EngineCache(cache_dir).get_or_build(f"tower-{precision}", key, build).path / "model.onnx"
    ).read_bytes()


def top_overlap(
    users: np.ndarray, items: np.ndarray, reference_users: np.ndarray, reference_items: np.ndarray
) -> float:
    """Mean share of each user's top GATE_K items (by dot product) that are also FP32's."""
    k = min(GATE_K, len(items))
    ours = np.argpartition(-(users @ items.T), k - 1, axis=1)[:, :k]
    theirs = np.argpartition(-(reference_users @ reference_items.T), k - 1, axis=1)[:, :k]
    return float(np.mean([len(np.intersect1d(a, b)) / k for a, b in zip(ours, theirs, strict=True)]))


@dataclass(frozen=True)
class TowerGate:
    precision: str
    passed: bool
    overlap: float
    seconds: float
    """Both towers over the gate's rows: what `auto` compares."""


@dataclass(frozen=True)
class TowerEngines:
    """The chosen graphs of both towers and how they were chosen."""

    precision: str
    user: bytes
    item: bytes
    device: ConcreteDevice
    gates: list[TowerGate] = field(default_factory=list)

    def report(self) -> dict[str, object]:
        return {"precision": self.precision, "device": self.device, "gates": [asdict(g) for g in self.gates]}


def timed(session: TowerSession, rows: pa.Table) -> tuple[np.ndarray, float]:
    """Vectors of `rows` and the best of three runs' seconds (after one warm-up)."""
    vectors = session(rows)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        session(rows)
        best = min(best, time.perf_counter() - start)
    return vectors, best


def choose_engines(
    spec: TowersSpec,
    graphs: dict[str, bytes],
    user_rows: tuple[pa.Table, pa.Table],
    item_rows: tuple[pa.Table, pa.Table],
    device: ConcreteDevice,
    cache_dir: Path,
) -> TowerEngines:
    """Gate each precision of the ladder (from spec.precision) against FP32, both towers
    together, on (calibration rows, gate rows) of each; auto takes the fastest that passes,
    a set precision the first that passes from it up."""
    ladder = LADDERS[device]
    if spec.precision != "auto":
        if spec.precision not in ladder:
            raise ModelError(
                f"precision {spec.precision!r} is not available on {device}: one of {', '.join(ladder)}"
            )
        ladder = ladder[ladder.index(spec.precision) :]
    rows = {"user": user_rows, "item": item_rows}
    reference: dict[str, np.ndarray] = {}
    gates, chosen_graphs = [], {}
    for precision in ("fp32", *(p for p in ladder if p != "fp32")):  # the reference first
        built = {tower: quantized(graphs[tower], precision, rows[tower][0], cache_dir) for tower in graphs}
        vectors, seconds = {}, 0.0
        for tower, graph in built.items():
            vectors[tower], took = timed(TowerSession(graph, device), rows[tower][1])
            seconds += took
        reference = reference or vectors
        overlap = top_overlap(vectors["user"], vectors["item"], reference["user"], reference["item"])
        gates.append(TowerGate(precision, overlap >= spec.gate_overlap, round(overlap, 4), round(seconds, 5)))
        chosen_graphs[precision] = built
    passing = [g for precision in ladder for g in gates if g.precision == precision and g.passed]
    chosen = min(passing, key=lambda g: g.seconds) if spec.precision == "auto" else passing[0]
    graphs_of = chosen_graphs[chosen.precision]
    return TowerEngines(chosen.precision, graphs_of["user"], graphs_of["item"], device, gates)
