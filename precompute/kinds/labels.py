"""Content labels: each row's top labels, from a head trained on a label column or a classifier folder.

    run:   train the head on a cache miss (models/labels/head.py), refused if it loses to its
           TF-IDF baseline -> gate the labeler (models/labels/labeler.py) -> label (jobs/text/labels.py) into
           a new Redis version -> publish (count, sample reads, pointer flip) -> collect old
           versions; the run's values become the next run's cache
    serve: GET /v1/labels/<output>/{id}, POST /v1/labels/<output>:batchGet (and /v1/labels/...)
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa
from pydantic import Field, model_validator

from precompute.jobs.inputs import CorpusInput
from precompute.kinds import OutputKind, OutputSpec, QualityError
from precompute.kinds.keyed import (
    VersionVocabulary,
    collect_garbage,
    key_value_versions,
    publish_new_version,
    published_run,
    store_line,
)
from precompute.kinds.text import engine_lines, engine_of, read_model
from precompute.models.datasets import integer_column
from precompute.models.labels.head import LabelPolicy, LabelTask
from precompute.models.settings import EnginePolicy
from precompute.models.source import BUNDLED, ModelSource, ModelSpec

if TYPE_CHECKING:
    from precompute.flows.steps import RunContext
    from precompute.lookup.served import Served
    from precompute.pipeline import Pipeline
    from precompute.service.app import Service
    from precompute.settings import Machine
    from precompute.stores.versions import Versioned


class LabelsSpec(OutputSpec, LabelPolicy):
    kind: Literal["labels"]
    input: CorpusInput
    model: ModelSpec | None = None
    """The encoder under a head trained on `input.label` (default: the bundled encoder)."""
    classifier: ModelSpec | None = None
    """A sequence-classifier folder that labels by itself; excludes `model` and `input.label`."""
    engine: EnginePolicy = Field(default_factory=EnginePolicy)

    @model_validator(mode="after")
    def _one_model(self) -> LabelsSpec:
        if self.classifier is not None and self.model is not None:
            raise ValueError("set model (an encoder under a trained head) or classifier, not both")
        if self.classifier is None and self.input.label is None:
            raise ValueError("a trained head needs input.label (the label column), or set classifier")
        return self

    def task(self) -> LabelTask:
        column = None if self.classifier is not None else self.input.label
        policy = LabelPolicy.model_validate(self.model_dump(include=set(LabelPolicy.model_fields)))
        return LabelTask(corpus=self.input.sample(), column=column, policy=policy)


class Labels(OutputKind):
    name = "labels"
    spec = LabelsSpec
    store_family = "redis"
    route = "labels"

    def source(self, pipeline: Pipeline, name: str) -> ModelSource:
        output: LabelsSpec = pipeline.outputs[name]
        if output.classifier is not None:
            return read_model(pipeline, name, "classifier", "classify")
        if output.model is None:
            return BUNDLED.encoder()
        return read_model(pipeline, name, "model", "embed")

    def check(self, pipeline: Pipeline, name: str) -> None:
        output: LabelsSpec = pipeline.outputs[name]
        columns = {"id": output.input.id, "text": output.input.text}
        if output.classifier is None and output.input.label is not None:
            columns["label"] = output.input.label
        pipeline.check_input(name, output.input, columns)

    def plan(self, pipeline: Pipeline, name: str, machine: Machine) -> list[str]:
        spec = pipeline.outputs[name].input
        return [
            f"  input   {spec.path} (id={spec.id}, text={spec.text}, label={spec.label})",
            *engine_lines(pipeline, name, machine.engine),
            store_line(pipeline, name, machine),
        ]

    def versions(self, pipeline: Pipeline, name: str, machine: Machine) -> AbstractContextManager[Versioned]:
        return key_value_versions(pipeline, name, machine)

    def run(self, run: RunContext, name: str) -> dict[str, Any]:
        from precompute.jobs import progress, work_dir
        from precompute.jobs.text.content_cache import promote
        from precompute.jobs.text.labels import STAGED, run_labels_job
        from precompute.models.labels.head import load_head
        from precompute.models.labels.training import loses_to_baseline

        output: LabelsSpec = run.pipeline.outputs[name]
        machine, task = run.machine, output.task()
        engine = engine_of(run.pipeline, name, machine.engine)

        def label() -> tuple[Any, str]:
            """Label the corpus into a new version and publish it, unless its head loses to the
            TF-IDF baseline; its staged values then become the cache of the next run (never
            before: a failed run must not replace it)."""
            head_dir = None
            if output.classifier is not None:
                vocabulary = list(engine.model.labels)
            else:
                with progress.stage(name, "train head"):  # minutes on a cache miss (fine-tuning)
                    head = load_head(task, engine)
                if refusal := loses_to_baseline(head.training, output.max_baseline_loss):
                    raise QualityError(refusal)
                vocabulary, head_dir = head.labels, head.directory
            cache = work_dir.cache_dir(run.work_dir, name)
            source = output.input
            trained = output.classifier is None and source.label is not None  # else a classifier's names
            integer_labels = trained and integer_column(source, source.label)
            labelled, version = publish_new_version(
                run,
                name,
                VersionVocabulary.of(pa.array(vocabulary, pa.string()), integer_column(source, source.id), integer_labels),
                lambda new, folder: run_labels_job(
                    output.input,
                    machine.job,
                    task,
                    engine,
                    new.sink(),
                    folder,
                    before_write=new.create,
                    cache_dir=cache,
                    output=name,
                    previous=published_run(run, name, new),
                    head_dir=head_dir,
                ),
            )
            promote(cache, work_dir.run_dir(run.work_dir, name, version) / STAGED)
            return labelled, version

        labelled, version = run.step("label", label)
        deleted = run.step("collect_garbage", lambda: collect_garbage(run, name))
        labeler = labelled.labeler
        accuracy = labeler["held_out_accuracy"]
        seconds = labelled.seconds.get("label")  # none on an unchanged night
        rates = {"label": round(labelled.items / seconds, 1)} if seconds else {}
        return {
            "kind": self.name,
            "version": version,
            "published": True,
            "rows": labelled.rows,
            "rejects": labelled.rejects,
            "rejects_path": labelled.rejects_path,
            "items": labelled.items,
            "reused": labelled.reused,
            "computed": labelled.computed,
            "written": labelled.written,
            "labels": len(labelled.vocabulary),
            "seconds": labelled.seconds,
            "docs_per_s": rates.get("label"),
            "rates": rates,
            "unchanged_from": labelled.unchanged_from,
            "rate_unit": "rows/s",
            "engine": {k: labeler["engine"][k] for k in ("backend", "device", "precision")},
            "gate": labeler["gates"],
            "gate_texts_from": labeler["engine"]["gates"][-1]["texts_from"] if labeler["engine"]["gates"] else "",
            "head_held_out_accuracy": None if accuracy is None else round(accuracy, 4),
            "head_training": labeler["training"],
            "deleted_versions": deleted,
        }

    def serve(self, service: Service, name: str) -> Served:
        from precompute.lookup.keys import LABELS

        return service.keys.serve(name, service.pipeline.store(name), LABELS)
