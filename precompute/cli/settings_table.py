"""Every setting in one table, generated from the classes that declare them: `precompute settings`.

Two kinds of setting, each declared once with one default:
- this machine's (precompute/settings.py): a PRECOMPUTE_<GROUP>_<FIELD> variable each;
- each output's, in the pipeline file (its kind's spec, precompute/kinds/): a field of
  `outputs.<name>`, which PRECOMPUTE_OUTPUTS__<NAME>__<FIELD> overrides; an output's `engine`
  table also takes its defaults from PRECOMPUTE_ENGINE_<FIELD>.
The table is docs/settings.md, which `precompute docs` writes; a test checks it is this one.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, get_type_hints

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings

from precompute.jobs.work_dir import WorkPath
from precompute.kinds import registry
from precompute.models.settings import EnginePolicy
from precompute.pipeline import FlowSpec
from precompute.settings import Machine


@dataclass(frozen=True)
class Row:
    setting: str
    variable: str
    kinds: str
    default: str
    what: str


def default_of(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value: Any = field.default_factory()  # type: ignore[call-arg]
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if isinstance(value, BaseModel):
        value = value.model_dump(exclude_defaults=True, mode="json") or "(each field's default)"
    if isinstance(value, Path | WorkPath):
        value = str(value).replace(str(Path.home()), "~")
    return "none" if value is None else json.dumps(value) if not isinstance(value, str) else value


def first_sentence(field: FieldInfo) -> str:
    """The docstring's first sentence: up to a full stop before a capital letter."""
    text = " ".join((field.description or "").split())
    match = re.search(r"\.\s(?=[A-Z])", text)
    return text if match is None else text[: match.start() + 1]


def model_of(field: FieldInfo) -> type[BaseModel] | None:
    """The pydantic model a field holds (optionally), whose fields are settings of their own."""
    annotation = field.annotation
    for candidate in (annotation, *getattr(annotation, "__args__", ())):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def machine_rows() -> list[Row]:
    """The machine's groups, then each output kind's own, by the kind's name."""
    hints = get_type_hints(Machine)
    groups: list[tuple[str, type[BaseSettings], str]] = [
        (group.name, hints[group.name], "") for group in fields(Machine) if group.name != "kinds"
    ]
    groups += [(kind.name, kind.settings, kind.name) for kind in registry().values() if kind.settings is not None]
    rows = []
    for group, settings, kind in groups:
        prefix = settings.model_config.get("env_prefix", "")
        for name, field in settings.model_fields.items():
            rows.append(Row(f"{group}.{name}", f"{prefix}{name.upper()}", kind, default_of(field), first_sentence(field)))
    return rows


def spec_rows(spec: type[BaseModel], path: str, variable: str, kind: str) -> list[Row]:
    rows = []
    for name, field in spec.model_fields.items():
        if name == "kind":
            continue
        nested = model_of(field)
        if nested is EnginePolicy:
            continue  # its fields are listed once, with their machine-wide variables
        if nested is not None:
            rows += spec_rows(nested, f"{path}.{name}", f"{variable}__{name.upper()}", kind)
        else:
            rows.append(Row(f"{path}.{name}", f"{variable}__{name.upper()}", kind, default_of(field), first_sentence(field)))
    return rows


def pipeline_rows() -> list[Row]:
    rows = spec_rows(FlowSpec, "flow", "PRECOMPUTE_FLOW", "")
    merged: dict[tuple[str, str, str], Row] = {}
    for kind in registry().values():
        for row in spec_rows(kind.spec, "outputs.<name>", "PRECOMPUTE_OUTPUTS__<NAME>", kind.name):
            key = (row.setting, row.default, row.what)
            seen = merged.get(key)
            merged[key] = row if seen is None else Row(*key[:1], row.variable, f"{seen.kinds}, {row.kinds}", *key[1:])
    engine_kinds = ", ".join(k.name for k in registry().values() if "engine" in k.spec.model_fields)
    for name, field in EnginePolicy.model_fields.items():
        variable = f"PRECOMPUTE_ENGINE_{name.upper()} (every output), PRECOMPUTE_OUTPUTS__<NAME>__ENGINE__{name.upper()}"
        rows.append(Row(f"outputs.<name>.engine.{name}", variable, engine_kinds, default_of(field), first_sentence(field)))
    return rows + list(merged.values())


def markdown() -> str:
    """The table: machine settings first, then the pipeline file's."""
    head = "| setting | environment variable | kinds | default | what |\n| --- | --- | --- | --- | --- |"
    lines = [
        f"| `{r.setting}` | `{r.variable}` | {r.kinds} | `{r.default}` | {r.what} |".replace("``", "")
        for r in [*machine_rows(), *pipeline_rows()]
    ]
    return "\n".join([head, *lines])
