"""Content labels: each row's top labels, from a head trained on a label column (few-shot from a
handful of rows a label, the declared labels its prior), a zero-shot head made from the declared
labels' names and descriptions, or a classifier folder; corrections override and train.

    compute:   train the head on a cache miss (models/labels/head.py; zero_shot.py), refused if it
               loses to its TF-IDF baseline -> gate the labeler (models/labels/labeler.py) -> label the rows that
               moved (jobs/text/labels.py) into a new Redis version
    validate:  the version's record count and sample values read back
    published: the night's values become the next night's cache
    serve:     GET /v1/labels/<output>/{id}, POST /v1/labels/<output>:batchGet (and /v1/labels/...)
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow as pa
from pydantic import Field, field_validator, model_validator

from precompute.jobs import progress, work_dir
from precompute.jobs.inputs import CorpusInput, CorrectionsInput
from precompute.kinds import Output, OutputSpec, QualityError, RunContext, Target
from precompute.kinds.keyed import KeyedKind, VersionVocabulary, published_run, store_line, writer
from precompute.kinds.report import Computed
from precompute.kinds.text import engine_lines, engine_of, read_model
from precompute.lookup.keys import LABELS
from precompute.models.datasets import InputError, integer_column
from precompute.models.labels.head import LabelPolicy, LabelTask
from precompute.models.labels.zero_shot import PROMPT, LabelText, Taxonomy, check_distinct, check_prompt
from precompute.models.settings import EnginePolicy
from precompute.models.source import BUNDLED, ModelSource, ModelSpec
from precompute.settings import Machine
from precompute.stores.key_value.versions import OutputVersions


class LabelsSpec(OutputSpec, LabelPolicy):
    kind: Literal["labels"]
    input: CorpusInput
    model: ModelSpec | None = None
    """The encoder under the head, trained on `input.label` or zero-shot (default: the bundled encoder)."""
    classifier: ModelSpec | None = None
    """A sequence-classifier folder that labels by itself; excludes `model` and `input.label`."""
    labels: list[str | LabelText] | None = Field(None, min_length=2)
    """The labels a row may get, each a name or `{ label = "...", description = "..." }`. Alone:
    zero-shot, rows labelled by the encoder's similarity to each label's `prompt`. Beside
    `input.label` with a few rows per label: the few-shot head's prior and anchors (the
    zero-shot head is one of its candidates); every labelled row's label must be one of them."""
    prompt: str = PROMPT
    """Zero-shot: a label's text, `{description}` (its name where it has none) or `{label}` filled in."""
    multi_label: bool = False
    """Zero-shot: a row may get several labels, each at or above `min_score` on its own (with
    `input.label`, a list column says so)."""
    corrections: CorrectionsInput | None = None
    """Labels a person corrected, `{ path = "...", id = "id", label = "label" }`: each corrected row
    serves its label (score 1) on every night while its row is in the file, and trains the
    head as a labelled row (a zero-shot output's corrections, once two labels have two rows
    each, train a few-shot head); the report counts how many the model agrees with."""
    engine: EnginePolicy = Field(default_factory=EnginePolicy)

    @field_validator("labels")
    @classmethod
    def _label_texts(cls, labels: list[str | LabelText] | None) -> list[LabelText] | None:
        """Each label as a LabelText (a bare name has no description), named once."""
        if labels is None:
            return None
        texts = [LabelText(label=e) if isinstance(e, str) else e for e in labels]
        check_distinct([e.label for e in texts])
        return texts

    prompt_fills_a_label = field_validator("prompt")(check_prompt)

    @model_validator(mode="after")
    def _one_model(self) -> LabelsSpec:
        if self.classifier is not None and self.model is not None:
            raise ValueError("set model (an encoder under a trained head) or classifier, not both")
        given = {"input.label": self.input.label is not None, "labels": self.labels is not None}
        if self.classifier is not None and any(given.values()):
            both = " and ".join(name for name, is_set in given.items() if is_set)
            raise ValueError(f"a classifier labels by itself: set classifier or {both}, not both")
        if self.classifier is None and not any(given.values()):
            raise ValueError(
                "set input.label (the label column a head learns from), labels (zero-shot) or classifier"
            )
        if self.labels is None and (self.multi_label or self.prompt != PROMPT):
            raise ValueError("prompt and multi_label are for zero-shot labels: set labels")
        if self.classifier is not None and self.corrections is not None:
            raise ValueError("corrections train and override a head: a classifier has none (set input.label or labels)")
        if self.input.label is not None and self.multi_label:
            raise ValueError("with input.label, a list column gives several labels per row: drop multi_label")
        return self

    def task(self) -> LabelTask:
        policy = LabelPolicy.model_validate(self.model_dump(include=set(LabelPolicy.model_fields)))
        taxonomy = None
        if self.labels is not None:
            taxonomy = Taxonomy(labels=tuple(self.labels), prompt=self.prompt, multi=self.multi_label)
        corrections = () if self.corrections is None else self.corrections.read()
        return LabelTask(
            corpus=self.input.sample(), column=self.input.label, taxonomy=taxonomy, policy=policy, corrections=corrections
        )


@dataclass(kw_only=True)
class LabelsComputed(Computed):
    """What the labels job did (jobs/text/labels.py LabelsJobReport), as the run report shows it."""

    items: int
    written: int
    """Values written to the version; the others came with a copy of the published one."""
    labels: int
    """Label names in the version's vocabulary."""
    unchanged_from: str | None
    gate_texts_from: str
    head_held_out_accuracy: float | None
    head_training: dict[str, Any] | None
    corrections: dict[str, int] | None = None
    """With corrections: the corpus rows they label, and how many of them the model agrees with."""


class Labels(KeyedKind[LabelsComputed]):
    name = "labels"
    spec = LabelsSpec
    route = "labels"
    format = LABELS

    def source(self, output: Output) -> ModelSource:
        spec: LabelsSpec = output.spec
        if spec.classifier is not None:
            return read_model(output, "classifier", "classify")
        if spec.model is None:
            return BUNDLED.encoder()
        return read_model(output, "model", "embed")

    def check(self, output: Output) -> None:
        source = output.spec.input
        columns = {"id": source.id, "text": source.text}
        if output.spec.classifier is None and source.label is not None:
            columns["label"] = source.label
        output.check_input(source, columns)
        spec: LabelsSpec = output.spec
        if spec.corrections is not None:
            corrections = spec.corrections
            output.check_input(corrections, {"id": corrections.id, "label": corrections.label}, table="corrections")
            try:
                pairs = corrections.read()
            except InputError as e:
                raise output.error("corrections", str(e)) from None
            declared = {entry.label for entry in spec.labels or []}
            if declared and (unknown := sorted({label for _, label in pairs} - declared)):
                raise output.error(
                    "corrections.label", f"{', '.join(map(repr, unknown[:5]))} not among the output's labels"
                )

    def plan(self, output: Output, machine: Machine) -> list[str]:
        spec: LabelsSpec = output.spec
        source = spec.input
        zero_shot = [] if spec.labels is None else [f"  labels  {len(spec.labels)}, zero-shot: {spec.prompt!r}"]
        return [
            f"  input   {source.path} (id={source.id}, text={source.text}, label={source.label})",
            *zero_shot,
            *engine_lines(output, machine.engine),
            store_line(output, machine),
        ]

    def compute(self, run: RunContext, output: Output, target: Target[OutputVersions]) -> LabelsComputed:
        """Label the corpus into the new version, unless its head loses to the TF-IDF baseline."""
        from precompute.jobs.text.labels import run_labels_job  # Ray: the night's, not the service's
        from precompute.models.labels.head import load_head
        from precompute.models.labels.training import loses_to_baseline

        spec: LabelsSpec = output.spec
        machine, task = run.machine, spec.task()
        engine = engine_of(output, machine.engine)
        seconds: dict[str, float] = {}
        head_dir = None
        if spec.classifier is not None:
            vocabulary = list(engine.model.labels)
        else:
            start = time.perf_counter()
            with progress.stage(output.name, "train head"):  # minutes on a cache miss (fine-tuning)
                head = load_head(task, engine)
            seconds["train head"] = round(time.perf_counter() - start, 3)
            if refusal := loses_to_baseline(head.training, spec.max_baseline_loss):
                raise QualityError(refusal)
            vocabulary, head_dir = head.labels, head.directory
        source = spec.input
        trained = spec.classifier is None and source.label is not None  # else a classifier's names
        integer_labels = trained and integer_column(source, source.label)
        version = writer(
            target,
            VersionVocabulary.of(pa.array(vocabulary, pa.string()), integer_column(source, source.id), integer_labels),
        )
        labelled = run_labels_job(
            source,
            machine.job,
            task,
            engine,
            version.sink(),
            target.folder,
            before_write=version.create,
            cache_dir=work_dir.cache_dir(run.work_dir, output.name),
            output=output.name,
            previous=published_run(run, output, target),
            head_dir=head_dir,
        )
        labeler = labelled.labeler
        accuracy = labeler["held_out_accuracy"]
        label_seconds = labelled.seconds.get("label")  # none on an unchanged night
        return LabelsComputed(
            rows=labelled.rows,
            rejects=labelled.rejects,
            rejects_path=labelled.rejects_path,
            reused=labelled.reused,
            computed=labelled.computed,
            seconds=seconds | labelled.seconds,
            rates={"label": round(labelled.items / label_seconds, 1)} if label_seconds else {},
            samples=labelled.samples,
            items=labelled.items,
            written=labelled.written,
            labels=len(labelled.vocabulary),
            unchanged_from=labelled.unchanged_from,
            engine={k: labeler["engine"][k] for k in ("backend", "device", "precision")},
            gate=labeler["gates"],
            gate_texts_from=labeler["engine"]["gates"][-1]["texts_from"] if labeler["engine"]["gates"] else "",
            head_held_out_accuracy=None if accuracy is None else round(accuracy, 4),
            head_training=labeler["training"],
            corrections=labelled.corrections,
        )

    def published(self, run: RunContext, output: Output, target: Target[OutputVersions], computed: LabelsComputed) -> None:
        """The night's staged values become the next night's cache: never before the publish, so
        that a failed night leaves the cache as it was."""
        from precompute.jobs.text.content_cache import promote
        from precompute.jobs.text.labels import STAGED

        promote(work_dir.cache_dir(run.work_dir, output.name), target.folder / STAGED)
