"""Output kinds: what an output of the pipeline file is, from its table to its answers.

An output's `kind` names an `OutputKind`, and everything that depends on the kind goes through
that one object: the flow, `precompute check`, `status`, `rollback`, the run report and the
lookup service call the contract below and never ask which kind they hold. A kind is one
module; the built-in ones are embeddings (Qdrant, search), labels and recs (Redis, key
lookups).

Another kind is a class in a package of its own, declared in that package's metadata under the
`precompute.kinds` entry point group, `name = "module:Class"`:

    [project.entry-points."precompute.kinds"]
    lengths = "my_package.lengths:Lengths"

The contract, in the order a night uses it:
- `spec`: the pydantic class of the output's table (its `kind` a Literal of the kind's name).
- `source`: the model folder it reads, if any (checked and hashed before any job).
- `check`: what its table cannot show (inputs readable, columns of the right type), before any job.
- `needs`: outputs that must publish earlier in the same run (recs: the embeddings of its items).
- `run`: the night's work for one output: job, checks, publish, garbage collection, through
  `RunContext.step` (flows/steps.py), which retries transient failures; returns the output's
  block of the run report. Fields the report page and the run metrics read: version, rows,
  rejects, reused, computed, seconds (per stage), rates and rate_unit (per stage), gate (each
  precision tried), validation.
- `versions`: the output's versions in its store (stores/versions.py Versioned): `status` and
  `rollback`.
- `plan`: its lines in `precompute check`.
- `serve`: its routes in the lookup service (lookup/served.py Served), under /v1/<route>/<output>,
  and /v1/<route> for the first output of the kind in the file.
"""

from __future__ import annotations

import functools
import importlib
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import AbstractContextManager
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from precompute.models.source import ModelSource

if TYPE_CHECKING:
    from precompute.flows.steps import RunContext
    from precompute.lookup.served import Served
    from precompute.pipeline import Pipeline
    from precompute.service.app import Service
    from precompute.settings import Machine
    from precompute.stores.versions import Versioned

NAME = r"^[a-z][a-z0-9_]{0,47}$"
"""An output's name, and its `store`: key parts, directory and collection names, URL parts."""
ENTRY_POINTS = "precompute.kinds"
BUILT_IN = {
    "embeddings": "precompute.kinds.embeddings:Embeddings",
    "labels": "precompute.kinds.labels:Labels",
    "recs": "precompute.kinds.recs:Recs",
}
"""In the order a night runs them: recs recommend from the embeddings of the same night."""


class QualityError(Exception):
    """A new version is worse than its baseline on held-out data; the current version stays."""


class OutputSpec(BaseModel):
    """The fields every output's table has; a kind's spec adds its own."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    kind: str
    store: str | None = Field(None, pattern=NAME)
    """Where the output lives in its store (a Qdrant collection, a Redis key part); default: its name."""
    keep_versions: int = Field(2, ge=0)
    """Versions kept for rollback besides the published one; older ones are deleted whole. Each
    costs its full size in its store (Redis memory, Qdrant disk)."""


class OutputKind(ABC):
    """One kind of output: see the module's docstring for when each method is called."""

    name: ClassVar[str]
    """The pipeline file's `kind`."""
    spec: ClassVar[type[OutputSpec]]
    store_family: ClassVar[str]
    """The store its `store` names a place in: two outputs of one family may not share a place."""
    route: ClassVar[str]
    """The service's path segment: /v1/<route>/<output>."""

    def source(self, pipeline: Pipeline, name: str) -> ModelSource | None:
        """The model the output runs, read from its folder (raising pipeline.error); None: no model."""
        return None

    def needs(self, spec: Any) -> list[str]:
        """Outputs that must be published earlier in the same run."""
        return []

    @abstractmethod
    def check(self, pipeline: Pipeline, name: str) -> None:
        """Raise pipeline.error(...) on the first thing a run of this output would trip on."""

    @abstractmethod
    def plan(self, pipeline: Pipeline, name: str, machine: Machine) -> list[str]:
        """What a run will read, build and write, a line each (`precompute check`)."""

    @abstractmethod
    def versions(self, pipeline: Pipeline, name: str, machine: Machine) -> AbstractContextManager[Versioned]:
        """The output's versions in its store, open for the block."""

    @abstractmethod
    def run(self, run: RunContext, name: str) -> dict[str, Any]:
        """Compute, check and publish a new version of the output; its block of the run report."""

    @abstractmethod
    def serve(self, service: Service, name: str) -> Served:
        """The output as the lookup service answers it."""


class KindError(Exception):
    """A kind that cannot be loaded, or two kinds by one name."""


def load(target: str) -> OutputKind:
    module, _, attribute = target.partition(":")
    try:
        kind = getattr(importlib.import_module(module), attribute)()
    except (ImportError, AttributeError) as e:
        raise KindError(f"output kind {target!r} cannot be loaded ({e})") from e
    if not isinstance(kind, OutputKind):
        raise KindError(f"{target} is not an OutputKind")
    return kind


@functools.cache
def registry() -> dict[str, OutputKind]:
    """Every output kind by name: the built-in ones, then those installed packages declare."""
    kinds = {name: load(target) for name, target in BUILT_IN.items()}
    for point in entry_points(group=ENTRY_POINTS):
        if point.name in kinds:
            raise KindError(f"output kind {point.name!r} ({point.value}) is declared twice")
        kinds[point.name] = load(point.value)
    for name, kind in kinds.items():
        if kind.name != name:
            raise KindError(f"output kind {name!r} calls itself {kind.name!r}")
    return kinds


def kinds() -> Iterator[OutputKind]:
    """The kinds in the order a night runs their outputs."""
    return iter(registry().values())
