"""The one precision climb: candidate engines in ladder order, each gated against FP32, one picked.

Every engine of the product goes through it: a text model's graphs (load.py), the labeler's
precisions with and without their near ties rechecked (labels/labeler.py), and a pair of tower
graphs (towers.py). A rung is tried by opening (or building) its engine and gating it; the pick
rule says which passing rung serves:

    first    the first rung that passes, in ladder order (fastest first): later rungs are never
             built; what a ladder whose order is its speed wants
    fastest  every rung tried, the passing one with the least `seconds` on the gate's rows: what a
             ladder whose speeds are not known in advance wants (a small network's INT8 can be
             slower than its FP32)

A rung whose gate is None is the reference itself (FP32 in PyTorch): it passes without a gate.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

from precompute.models.engines.gate import GateResult
from precompute.models.errors import GateFailedError

Pick = Literal["first", "fastest"]
E = TypeVar("E")


@dataclass(frozen=True)
class Rung(Generic[E]):
    """One candidate: `tried()` opens it and gates it, returning (its gate, the engine where it
    passed; None where it failed)."""

    name: str
    tried: Callable[[], tuple[GateResult | None, E | None]]


@dataclass(frozen=True)
class Climbed(Generic[E]):
    engine: E
    rung: str
    """The name of the rung that serves."""
    gates: list[GateResult]
    """Every gate tried, in ladder order."""


def climb(rungs: Iterable[Rung[E]], pick: Pick = "first", close: Callable[[E], None] = lambda engine: None) -> Climbed[E]:
    """The engine the pick rule chooses among the rungs that pass; every other opened engine
    closed. GateFailedError, naming each rung's reason, where none passes."""
    gates: list[GateResult] = []
    passed: list[tuple[Rung[E], GateResult | None, E]] = []
    for rung in rungs:
        gate, engine = rung.tried()
        if gate is not None:
            gates.append(gate)
        if engine is None:
            continue
        if pick == "first":
            return Climbed(engine, rung.name, gates)
        passed.append((rung, gate, engine))
    if not passed:
        failures = "; ".join(f"{g.precision}: {g.reason}" for g in gates)
        raise GateFailedError(f"no precision passed the accuracy gate ({failures})")
    chosen = min(passed, key=lambda tried: float("inf") if tried[1] is None else tried[1].seconds or 0.0)
    for rung, _, engine in passed:
        if rung is not chosen[0]:
            close(engine)
    return Climbed(chosen[2], chosen[0].name, gates)
