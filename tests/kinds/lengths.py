"""A test-only output kind, installed as a plug-in (a `precompute.kinds` entry point): each corpus
row's text length, in a unit its own settings group names (PRECOMPUTE_LENGTHS_UNIT), kept in Redis,
served by id. It is the smallest kind the contract admits: a spec, a settings group and its hooks;
the framework runs its nights (versions, checks, publish, collection) and serves its routes."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import ray
from pydantic_settings import BaseSettings, SettingsConfigDict

from precompute.jobs.inputs import CorpusInput
from precompute.jobs.ray_session import ray_session
from precompute.kinds import Output, OutputSpec, QualityError, RunContext, Target
from precompute.kinds.keyed import KeyedKind, VersionVocabulary, store_line, writer
from precompute.kinds.report import Computed
from precompute.lookup.keys import KeyFormat, LabelsBatchGet
from precompute.models.datasets import arrow_dataset, integer_column
from precompute.settings import Machine
from precompute.stores.key_value.records import encode_ranked
from precompute.stores.key_value.versions import OutputVersions

SAMPLES = 3


class LengthsSettings(BaseSettings):
    """How this machine counts lengths; env PRECOMPUTE_LENGTHS_<NAME>."""

    model_config = SettingsConfigDict(env_prefix="PRECOMPUTE_LENGTHS_", frozen=True, use_attribute_docstrings=True)

    unit: Literal["characters", "bytes"] = "characters"
    """What a length counts: characters, or the text's UTF-8 bytes."""


class LengthsSpec(OutputSpec):
    kind: Literal["lengths"]
    input: CorpusInput
    after: tuple[str, ...] = ()
    """Outputs a night publishes before this one (its `needs`)."""
    hold_s: float = 0
    """Seconds a night holds its written version before it is checked, in a Ray session as the
    built-in kinds' jobs run: a test stops it midway."""
    longest: int | None = None
    """The check refuses a version holding a text longer than this (a quality bar a test trips)."""


class Held:
    """An actor, as the built-in kinds' engines run in, that holds its batch."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        time.sleep(self.seconds)
        return batch


@dataclass(kw_only=True)
class LengthsComputed(Computed):
    longest: float
    """The longest text's length: the run report shows it, the check reads it."""


class Lengths(KeyedKind[LengthsComputed]):
    name = "lengths"
    spec = LengthsSpec
    settings = LengthsSettings
    route = "lengths"
    format = KeyFormat("lengths", "lengths", '{"unit":%s,"value":%s}', LabelsBatchGet, "text lengths", "row")

    def needs(self, output: Output) -> list[str]:
        return list(output.spec.after)

    def check(self, output: Output) -> None:
        source = output.spec.input
        output.check_input(source, {"id": source.id, "text": source.text})

    def plan(self, output: Output, machine: Machine) -> list[str]:
        unit = machine.group(LengthsSettings).unit
        return [f"  input   {output.spec.input.path}, lengths in {unit}", store_line(output, machine)]

    def compute(self, run: RunContext, output: Output, target: Target[OutputVersions]) -> LengthsComputed:
        spec: LengthsSpec = output.spec
        unit = run.machine.group(LengthsSettings).unit
        table = arrow_dataset(spec.input).to_table(columns=[spec.input.id, spec.input.text])
        ids = [str(i) for i in table[spec.input.id].to_pylist()]
        texts = table[spec.input.text].to_pylist()
        lengths = np.array([[len(t if unit == "characters" else t.encode())] for t in texts], np.float32)
        values = encode_ranked(np.zeros(lengths.shape, np.int64), lengths)
        vocabulary = VersionVocabulary.of(pa.array([unit]), integer_column(spec.input, spec.input.id))
        version = writer(target, vocabulary)
        version.create(len(ids))
        version.store.write(version.output, version.version, ids, values)
        if spec.hold_s:
            with ray_session(None):
                print(f"holding {target.version} for {spec.hold_s:g} s", flush=True)
                ray.data.range(1).map_batches(
                    Held, fn_constructor_kwargs={"seconds": spec.hold_s}, concurrency=1, num_cpus=0.5
                ).materialize()
        samples = dict(list(zip(ids, values, strict=True))[:SAMPLES])
        return LengthsComputed(rows=len(ids), computed=len(ids), samples=samples, longest=float(lengths.max(initial=0)))

    def validate(
        self, run: RunContext, output: Output, target: Target[OutputVersions], computed: LengthsComputed
    ) -> Any:
        longest = output.spec.longest
        if longest is not None and computed.longest > longest:
            raise QualityError(f"a text of {computed.longest:g} is longer than longest={longest}")
        return super().validate(run, output, target, computed)

    def max_k(self, output: Output) -> int:
        return 1
