"""A test-only output kind, installed as a plug-in (a `precompute.kinds` entry point): each corpus
row's text length in characters, kept in Redis, served by id. It is the smallest kind the
contract admits: its table, checks, plan, a night's run, its versions and its routes."""

from __future__ import annotations

import time
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pyarrow as pa
import ray

from precompute.jobs.inputs import CorpusInput
from precompute.jobs.ray_session import ray_session
from precompute.kinds import OutputKind, OutputSpec
from precompute.kinds.keyed import (
    VersionVocabulary,
    collect_garbage,
    key_value_versions,
    publish_new_version,
    store_line,
)
from precompute.lookup.keys import LabelsBatchGet, Output
from precompute.models.datasets import arrow_dataset, integer_column
from precompute.stores.key_value.records import encode_ranked

if TYPE_CHECKING:
    from precompute.flows.steps import RunContext
    from precompute.lookup.served import Served
    from precompute.pipeline import Pipeline
    from precompute.service.app import Service
    from precompute.settings import Machine
    from precompute.stores.key_value.versions import NewVersion
    from precompute.stores.versions import Versioned

FORMAT = Output("lengths", "lengths", '{"unit":%s,"value":%s}', LabelsBatchGet, "text lengths", "row")
SAMPLES = 3


class LengthsSpec(OutputSpec):
    kind: Literal["lengths"]
    input: CorpusInput
    hold_s: float = 0
    """Seconds a run holds its written version before publishing it, in a Ray session as the
    built-in kinds' jobs run: a test stops it midway."""


class Held:
    """An actor, as the built-in kinds' engines run in, that holds its batch."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        time.sleep(self.seconds)
        return batch


class Counted:
    def __init__(self, rows: int, samples: dict[str, bytes]) -> None:
        self.rows, self.samples = rows, samples


class Lengths(OutputKind):
    name = "lengths"
    spec = LengthsSpec
    store_family = "redis"
    route = "lengths"

    def check(self, pipeline: Pipeline, name: str) -> None:
        spec = pipeline.outputs[name].input
        pipeline.check_input(name, spec, {"id": spec.id, "text": spec.text})

    def plan(self, pipeline: Pipeline, name: str, machine: Machine) -> list[str]:
        return [f"  input   {pipeline.outputs[name].input.path}", store_line(pipeline, name, machine)]

    def versions(self, pipeline: Pipeline, name: str, machine: Machine) -> AbstractContextManager[Versioned]:
        return key_value_versions(pipeline, name, machine)

    def run(self, run: RunContext, name: str) -> dict[str, Any]:
        output = run.pipeline.outputs[name]
        spec = output.input
        start = time.perf_counter()

        def count(new: NewVersion, folder: Path) -> Counted:
            table = arrow_dataset(spec).to_table(columns=[spec.id, spec.text])
            ids = [str(i) for i in table[spec.id].to_pylist()]
            lengths = np.array([[len(t)] for t in table[spec.text].to_pylist()], np.float32)
            values = encode_ranked(np.zeros(lengths.shape, np.int64), lengths)
            new.create(len(ids))
            new.store.write(new.output, new.version, ids, values)
            if output.hold_s:
                with ray_session(None):
                    print(f"holding {new.version} for {output.hold_s:g} s", flush=True)
                    ray.data.range(1).map_batches(
                        Held, fn_constructor_kwargs={"seconds": output.hold_s}, concurrency=1, num_cpus=0.5
                    ).materialize()
            return Counted(len(ids), dict(list(zip(ids, values, strict=True))[:SAMPLES]))

        counted, version = run.step(
            "count", lambda: publish_new_version(run, name, VersionVocabulary.of(pa.array(["characters"]), integer_column(spec, spec.id)), count)
        )
        deleted = run.step("collect_garbage", lambda: collect_garbage(run, name))
        seconds = round(time.perf_counter() - start, 2)
        return {
            "kind": self.name,
            "version": version,
            "published": True,
            "rows": counted.rows,
            "rejects": 0,
            "reused": 0,
            "computed": counted.rows,
            "seconds": {"count": seconds},
            "rates": {"count": round(counted.rows / max(seconds, 1e-3), 1)},
            "rate_unit": "rows/s",
            "deleted_versions": deleted,
        }

    def serve(self, service: Service, name: str) -> Served:
        return service.keys.serve(name, service.pipeline.store(name), FORMAT, max_k=1)
