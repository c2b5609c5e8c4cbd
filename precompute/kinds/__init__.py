"""Output kinds: what an output of the pipeline file is, and the hooks its kind supplies to a night.

An output's `kind` names an `OutputKind`. The framework owns every output's night
(flows/lifecycle.py), the same for every kind:

    plan -> new version -> compute -> check -> publish -> collect -> report

and calls the kind's hooks at each step; the flow, `precompute check`, `status`, `rollback`, the
run report and the lookup service call the contract below and never ask which kind they hold.
A kind is one module; the built-in ones are embeddings (Qdrant, search), labels and recs (Redis,
key lookups).

Another kind is a class in a package of its own, declared in that package's metadata under the
`precompute.kinds` entry point group, `name = "module:Class"`:

    [project.entry-points."precompute.kinds"]
    lengths = "my_package.lengths:Lengths"

The contract, in the order a night uses it (each hook receives the `Output` it serves):
- `spec`: the pydantic class of the output's table (its `kind` a Literal of the kind's name).
- `settings`: the kind's own machine settings group, if any: a pydantic-settings class whose
  env_prefix is PRECOMPUTE_<GROUP>_, read once per process (`Machine.group`), listed by
  `precompute settings`.
- `source`: the model folder it reads, if any (checked and hashed before any job).
- `check`: what its table cannot show (inputs readable, columns of the right type), before any job.
- `needs`: outputs that must publish earlier in the same night (recs: the embeddings of its
  items); the night runs outputs in this order, skips one whose needed output did not publish,
  and `check` refuses a cycle or a missing output.
- `plan`: its lines in `precompute check`.
- `versions`: the output's versions in its store, open for a block (stores/versions.py
  Versioned): the night writes, checks, publishes and collects through it; `status` and
  `rollback` read it.
- `compute`: the night's work into a new version (`Target`: its name, the open store, its run
  folder); returns a typed `Computed` (kinds/report.py). The framework drops the version if
  anything fails before its publish.
- `validate`: checks of the written version before it is published (recall, held-out quality,
  values read back); raises to refuse it, returns what the report shows of the check.
- `published`: after the switch, what the next night builds on (a cache promoted); optional.
- `serve`: its routes in the lookup service (lookup/served.py Served), under /v1/<route>/<output>,
  and /v1/<route> for the first output of the kind in the file.
"""

from __future__ import annotations

import functools
import importlib
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field
from pydantic_settings import BaseSettings

from precompute.jobs.inputs import COLUMN_TYPES
from precompute.jobs.work_dir import WorkPath, run_dir
from precompute.kinds.report import Computed, OutputReport
from precompute.lookup.served import Served
from precompute.lookup.serving import Serving
from precompute.models.datasets import DatasetInput, InputError, arrow_dataset
from precompute.models.source import ModelSource
from precompute.settings import Machine
from precompute.stores.versions import Versioned

NAME = r"^[a-z][a-z0-9_]{0,47}$"
"""An output's name, and its `store`: key parts, directory and collection names, URL parts."""
ENTRY_POINTS = "precompute.kinds"
BUILT_IN = {
    "embeddings": "precompute.kinds.embeddings:Embeddings",
    "labels": "precompute.kinds.labels:Labels",
    "recs": "precompute.kinds.recs:Recs",
    "related": "precompute.kinds.related:Related",
}


class PipelineError(Exception):
    """The pipeline file is wrong; the message is one line naming the file, output and field."""


class QualityError(Exception):
    """A new version is worse than its baseline on held-out data; the current version stays."""


class KindError(Exception):
    """A kind that cannot be loaded, or two kinds by one name."""


class OutputSpec(BaseModel):
    """The fields every output's table has; a kind's spec adds its own."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    kind: str
    store: str | None = Field(None, pattern=NAME)
    """Where the output lives in its store (a Qdrant collection, a Redis key part); default: its name."""
    keep_versions: int = Field(2, ge=0)
    """Versions kept for rollback besides the published one; older ones are deleted whole. Each
    costs its full size in its store (Redis memory, Qdrant disk)."""


class Output:
    """One output of the pipeline file as its kind's hooks see it: its name and table, its place
    in its store, its model, the other outputs of the file, and errors that name the field."""

    def __init__(self, name: str, spec: OutputSpec, file: Path, declared: Mapping[str, Output]) -> None:
        self.name = name
        self.spec: Any = spec
        """The output's table, validated as its kind's spec."""
        self.file = file
        """The pipeline file it was declared in."""
        self._declared = declared

    @property
    def kind(self) -> OutputKind:
        return registry()[self.spec.kind]

    @property
    def store(self) -> str:
        """The output's place in its store: a Qdrant collection or a Redis key part."""
        return self.spec.store or self.name

    @functools.cached_property
    def source(self) -> ModelSource | None:
        """The model the output runs, read from its folder (one PipelineError if it cannot be)."""
        return self.kind.source(self)

    def other(self, name: str) -> Output | None:
        """Another output of the same file, by name (None if there is none)."""
        return self._declared.get(name)

    def error(self, field: str, message: str) -> PipelineError:
        return PipelineError(f"{self.file}: outputs.{self.name}.{field}: {message}")

    def check_input(
        self,
        source: DatasetInput,
        columns: dict[str, str],
        optional: dict[str, str] | None = None,
        table: str = "input",
    ) -> None:
        """The input is readable, holds rows, and has each column (by its field in the output's
        `table`, `input` by default) with a type COLUMN_TYPES accepts for that field; each
        `optional` one that it has, too."""
        path = source.path
        try:
            dataset = arrow_dataset(source)
            rows = dataset.count_rows()
        except InputError as e:
            raise self.error(f"{table}.path", str(e)) from None
        except (OSError, pa.ArrowException) as e:
            raise self.error(f"{table}.path", f"cannot read {path} ({e})") from None
        if rows == 0:
            raise self.error(f"{table}.path", f"{path} holds no rows")
        schema = dataset.schema
        present = {name: column for name, column in (optional or {}).items() if column in schema.names}
        for name, column in (present | columns).items():
            if column not in schema.names:
                raise self.error(
                    f"{table}.{name}", f"column {column!r} is not in {path} (it has {', '.join(schema.names)})"
                )
            accepts, expected = COLUMN_TYPES[name]
            if not accepts(kind := schema.field(column).type):
                raise self.error(f"{table}.{name}", f"column {column!r} of {path} is {kind}, not {expected}")


S = TypeVar("S", bound=Versioned)
C = TypeVar("C", bound=Computed)


@dataclass(frozen=True)
class Target(Generic[S]):
    """The version a night writes: its name, the output's store (open for the night), and the
    version's run folder (rejects, staged parts, what the next night reuses)."""

    version: str
    store: S
    folder: WorkPath


@dataclass
class RunContext:
    """One run of the flow as the hooks see it: this machine's settings, every output of the
    file, and the reports of those published so far."""

    machine: Machine
    outputs: Mapping[str, Output]
    keep_versions: int | None = None
    """The flow's override of every output's keep_versions."""
    reports: dict[str, OutputReport] = field(default_factory=dict)

    @property
    def work_dir(self) -> WorkPath:
        return self.machine.job.work_dir

    def keep(self, output: Output) -> int:
        return output.spec.keep_versions if self.keep_versions is None else self.keep_versions

    def run_dir(self, name: str, version: str) -> WorkPath:
        """An output's version's run folder: its rejects, staged parts and night record."""
        return run_dir(self.work_dir, name, version)

    def published(self, name: str) -> OutputReport:
        """The report of an output this night published; SkippedError if it did not."""
        report = self.reports.get(name)
        if report is None or not report.published:
            raise SkippedError(f"output {name!r}, which it needs, was not published in this run")
        return report


class SkippedError(Exception):
    """An output that could not start because one it needs was not published."""


class OutputKind(ABC, Generic[S, C]):
    """One kind of output: see the module's docstring for when each hook is called."""

    name: ClassVar[str]
    """The pipeline file's `kind`."""
    spec: ClassVar[type[OutputSpec]]
    settings: ClassVar[type[BaseSettings] | None] = None
    """The kind's own settings group (env_prefix PRECOMPUTE_<GROUP>_), read by Machine.group."""
    store_family: ClassVar[str]
    """The store its `store` names a place in: two outputs of one family may not share a place."""
    route: ClassVar[str]
    """The service's path segment: /v1/<route>/<output>."""

    def source(self, output: Output) -> ModelSource | None:
        """The model the output runs, read from its folder (raising output.error); None: no model."""
        return None

    def needs(self, output: Output) -> list[str]:
        """Outputs that must be published earlier in the same night."""
        return []

    @abstractmethod
    def check(self, output: Output) -> None:
        """Raise output.error(...) on the first thing a night of this output would trip on."""

    @abstractmethod
    def plan(self, output: Output, machine: Machine) -> list[str]:
        """What a night will read, build and write, a line each (`precompute check`)."""

    @abstractmethod
    def versions(self, output: Output, machine: Machine) -> AbstractContextManager[S]:
        """The output's versions in its store, open for the block."""

    @abstractmethod
    def compute(self, run: RunContext, output: Output, target: Target[S]) -> C:
        """Write the night's new version (not yet published); what it read, computed and reused."""

    @abstractmethod
    def validate(self, run: RunContext, output: Output, target: Target[S], computed: C) -> Any:
        """Check the written version before its publish: raise to refuse it (QualityError, a
        store's validation error); return what the report shows of the check (a dataclass, or None)."""

    def published(self, run: RunContext, output: Output, target: Target[S], computed: C) -> None:
        """After the switch: what the next night builds on (nothing by default)."""

    @abstractmethod
    def serve(self, serving: Serving, output: Output, machine: Machine) -> Served:
        """The output as the lookup service answers it, built on what every output shares."""


def load(target: str) -> OutputKind:
    module, _, attribute = target.partition(":")
    try:
        kind = getattr(importlib.import_module(module), attribute)()
    except (ImportError, AttributeError) as e:
        raise KindError(f"output kind {target!r} cannot be loaded ({e})") from e
    if not isinstance(kind, OutputKind):
        raise KindError(f"{target} is not an OutputKind")
    return kind


def check_group(kind: OutputKind) -> None:
    """A kind's settings group reads PRECOMPUTE_<GROUP>_* variables of its own."""
    if kind.settings is None:
        return
    prefix = kind.settings.model_config.get("env_prefix") or ""
    built_in = Machine.prefixes()
    if re.fullmatch(r"PRECOMPUTE_[A-Z][A-Z0-9]*_", prefix) is None or prefix in built_in:
        raise KindError(
            f"output kind {kind.name!r}: its settings' env_prefix {prefix!r} must be PRECOMPUTE_<GROUP>_, "
            f"a group other than the machine's own ({', '.join(sorted(built_in))})"
        )


@functools.cache
def registry() -> dict[str, OutputKind]:
    """Every output kind by name: the built-in ones, then those installed packages declare."""
    kinds = {name: load(target) for name, target in BUILT_IN.items()}
    for point in entry_points(group=ENTRY_POINTS):
        if point.name in kinds:
            raise KindError(f"output kind {point.name!r} ({point.value}) is declared twice")
        kinds[point.name] = load(point.value)
    prefixes: dict[str, str] = {}
    for name, kind in kinds.items():
        if kind.name != name:
            raise KindError(f"output kind {name!r} calls itself {kind.name!r}")
        check_group(kind)
        if kind.settings is not None:
            prefix = kind.settings.model_config["env_prefix"]
            if prefix in prefixes:
                raise KindError(f"output kinds {prefixes[prefix]!r} and {name!r} both read {prefix}*")
            prefixes[prefix] = name
    return kinds
