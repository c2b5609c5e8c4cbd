"""Content labels as a Ray Data job: read -> validate -> reuse or label -> stage -> the caller's sink.

    rejects pass: read -> tag_rejects -> rows with a reason -> rejects.parquet (fail fast on ratio)
    main pass:    good rows -> content keys -> the previous run's staged rows where (id, key)
                  match (jobs/text/content_cache.py), the LabelActor pool's for the rest (the
                  driver's, when they are few: JobSettings.driver_rows) -> values
                  -> StagingSink (the next run's cache; the kept rows' parts copied by tasks
                  beside it) and the caller's sink: a copy of the published version with the
                  rows labelled again, where the kept rows are its values and a copy holds them

The head is chosen first (the caller's, or load_head's); the labeler is built and gated once
in a Ray task while the rows are validated and compared with the cache, as in jobs/text/embed.py,
before the actors fan out. A value is the item's top labels as `stores.records` pairs; the label
names are the version's vocabulary. A row's content key hashes (labeler identity, text),
so a new encoder, head, classifier or vocabulary computes every row again. A night whose
corpus, engine and task are exactly the published run's copies that version whole instead
(jobs/nights.py).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import ray
from ray.actor import ActorHandle

from precompute.jobs import progress
from precompute.jobs.inputs import CorpusInput
from precompute.jobs.nights import NIGHT, Night, Previous, copy_files, inputs_digest, record_night, same_night
from precompute.jobs.ray_session import map_inference, ray_session, waited
from precompute.jobs.settings import JobSettings
from precompute.jobs.staging import COMPUTED, StagingSink, committed_dataset, copy_committed, read_committed
from precompute.jobs.text.content_cache import KEY, Reuse, reuse_previous, with_content_keys
from precompute.jobs.text.corpus_validation import validated_corpus, validation_entry
from precompute.jobs.validate import REJECTS
from precompute.jobs.work_dir import WorkPath
from precompute.models import Engine
from precompute.models.datasets import input_files
from precompute.models.engines.load import ENGINE_LOG
from precompute.models.errors import ModelError
from precompute.models.labels.head import LabelTask, load_head
from precompute.models.labels.labeler import Labeler, LabelerReport, chosen_head, load_labeler, open_labeler
from precompute.stores.key_value.records import encode_ranked
from precompute.stores.key_value.sink import KeyValueSink
from precompute.stores.key_value.versions import CopyPlan

SAMPLES = 5
VALUE = "value"
CORRECTION = "correction"
"""A row's corrected label (null: none): a payload column, so a correction made, changed or
removed labels that row again (content_cache.py compares payloads), and the label served."""
AGREES = "model_agrees"
"""Whether the model's own top label is a corrected row's correction (null: no correction)."""
STAGED = "labels"
"""The folder of a run's committed (content_key, id, value) parts."""


@dataclass(frozen=True)
class LabelsJobReport:
    rows: int
    rejects: int
    rejects_path: str
    items: int
    reused: int
    """Items whose value came from the previous run's cache: no inference."""
    computed: int
    written: int
    """Values written to the version; the others came with a copy of the published one."""
    seconds: dict[str, float]
    labeler: dict[str, Any]
    """Engine, label gates (each precision tried, with its agreement) and head accuracy."""
    vocabulary: list[str]
    """Label names by index: a value's indices point here, so a publish stores it with the version."""
    samples: dict[str, bytes]
    """A few item_id -> value as written, for the read-back checks of a publish."""
    unchanged_from: str | None = None
    """The published version copied whole: this run's inputs were its run's (jobs/nights.py)."""
    corrections: dict[str, int] | None = None
    """With corrections: the corpus rows they label (`rows`) and how many of those the model
    labels the same by itself (`model_agrees`)."""


def labeler_identity(labels: LabelTask, engine: Engine, head_dir: Path | None, vocabulary: list[str]) -> str:
    """Everything a value depends on besides the text: the encoder's (or classifier's) hash; the
    trained head's cache entry, named by its key (model, training rows, column, recipe); the
    vocabulary the indices point into; and how many labels a value holds, at what least score.

    Not the precision the gate will choose, nor its near-tie margin: like an embedding (whose
    identity is the model's hash), a label from any precision that passed the gate agrees with
    FP32's as closely as the gate demands, and a nightly re-gate on a slightly changed corpus may
    choose another margin without making yesterday's labels wrong. So the identity is known
    before the labeler is built, and the cache is compared while it is (run_labels_job)."""
    identity = {
        "model": engine.model.hash,
        "head": head_dir.name if head_dir else "",
        "vocabulary": vocabulary,
        "top": labels.policy.top,
        "min_score": labels.policy.min_score,
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


def chosen_vocabulary(labels: LabelTask, engine: Engine, head_dir: Path | None) -> tuple[Path | None, list[str]]:
    """(the head the labeler takes, its label names): the caller's head, else the one load_head
    finds or trains here; a classifier has none, and its own names."""
    if engine.model.task == "classify":
        return None, list(engine.model.labels)
    head = load_head(labels, engine) if head_dir is None else chosen_head(head_dir, engine)
    return head.directory, head.labels


def id_and_text(batch: pa.Table, corrected: dict[str, str]) -> pa.Table:
    """A labeler reads the text alone: the corpus's other columns stay out of the cache's
    comparison; a row's correction goes beside it, where the output has corrections."""
    rows = batch.select(["id", "text"])
    if not corrected:
        return rows
    return rows.append_column(CORRECTION, pa.array([corrected.get(str(i)) for i in rows["id"].to_pylist()], pa.string()))


def corrected_values(
    labeler: Labeler, values: list[bytes], indices: np.ndarray, given: np.ndarray, corrections: list[str | None]
) -> tuple[list[bytes], list[bool | None]]:
    """Each corrected row's value replaced by its correction at score 1; and whether the model
    gave that label itself (as its top label; with several labels per row, as any of them)."""
    index = {name: i for i, name in enumerate(labeler.labels)}
    several = labeler.head is not None and labeler.head.multi
    agrees: list[bool | None] = []
    for row, correction in enumerate(corrections):
        if correction is None:
            agrees.append(None)
            continue
        own = indices[row][given[row]]
        agrees.append(bool(index[correction] in own) if several else bool(len(own) and own[0] == index[correction]))
        values[row] = encode_ranked(np.array([[index[correction]]]), np.ones((1, 1), np.float32))[0]
    return values, agrees


class LabelActor:
    """One labeler per actor, the one prepare_labeler gated: (id, text, key) rows in, (id, key,
    value, computed) out. (The rows the cache holds never reach it: jobs/text/content_cache.py.)"""

    def __init__(
        self,
        labels: LabelTask,
        engine: Engine,
        report: LabelerReport,
        counter: ActorHandle | None = None,
    ) -> None:
        self.labeler = open_labeler(labels, engine, report)
        self.counter = counter

    def __call__(self, batch: pa.Table) -> pa.Table:
        texts = batch["text"].to_pylist()
        corrected = CORRECTION in batch.column_names
        values: list[bytes] = []
        agrees: list[bool | None] = []
        if texts:  # else a block the cache emptied
            indices, scores, given = self.labeler.label(texts)
            values = encode_ranked(indices, scores, given)
            if corrected:
                values, agrees = corrected_values(self.labeler, values, indices, given, batch[CORRECTION].to_pylist())
        columns = {CORRECTION: batch[CORRECTION], AGREES: pa.array(agrees, pa.bool_())} if corrected else {}
        progress.add(self.counter, batch.num_rows)
        return pa.table(
            {
                "id": batch["id"],  # its own type: the next run compares its rows' ids with these
                KEY: batch[KEY],
                VALUE: pa.array(values, pa.binary()),
                COMPUTED: pa.array(np.ones(batch.num_rows, bool)),
                **columns,
            }
        )

    def close(self) -> None:
        self.labeler.close()


@ray.remote(max_calls=1)
def prepare_labeler(
    labels: LabelTask, engine: Engine, head_dir: Path | None, lines: ActorHandle | None = None
) -> LabelerReport:
    """Build the engine and gate the labeler of the chosen head once, its ladder's lines
    forwarded to the driver's `lines`. Its worker exits after it, as prepare_engine's
    (jobs/text/embed.py)."""
    with progress.forwarded(lines, ENGINE_LOG), load_labeler(labels, engine, head_dir) as labeler:
        assert labeler.report is not None  # load_labeler gated it
        return labeler.report


def run_labels_job(
    corpus: CorpusInput,
    settings: JobSettings,
    labels: LabelTask,
    engine: Engine,
    sink: KeyValueSink,
    work_dir: WorkPath,
    before_write: Callable[[int, CopyPlan | None], None] | None = None,
    cache_dir: WorkPath | None = None,
    output: str = "labels",
    previous: Previous | None = None,
    head_dir: Path | None = None,
) -> LabelsJobReport:
    """Top labels of every valid corpus row, written through `sink`.

    work_dir: this run's folder: rejects, and the staged parts (under `labels/`) that the
    caller promotes as the next run's cache once it published the version.
    before_write: called with the number of records once validation counted them, for a
    store that sizes a version up front (create_version(rows=)), and the version to copy, if any.
    cache_dir: the cache whose unchanged rows are reused; None labels every row.
    output: the output's name, for the progress lines (jobs/progress.py).
    previous: the published version. A copy of it, where one holds this run's items, starts the
    new version, and only the rows labelled again are written (copy_plan); when this run's corpus, engine
    and task are exactly its run's (jobs/nights.py), it is copied whole and nothing is
    validated, built or labelled.
    head_dir: the head the caller chose for `labels` (load_head), which the labeler then takes;
    None: the one load_head finds, or trains, in this process.
    """
    rejects_path = work_dir / REJECTS
    start = time.perf_counter()
    files = input_files(corpus).digests()
    described = (corpus.model_dump_json(), engine.model_dump_json(), labels.model_dump_json())
    inputs = inputs_digest(files.whole, *described)
    night = same_night(inputs, None if previous is None else previous.run_dir)
    seconds = {"digest": time.perf_counter() - start}
    if night is not None and previous is not None and night.figures["items"] in previous.records:
        return unchanged_night(night, previous, work_dir, before_write, seconds)
    validation = validation_entry(settings.work_dir, files, corpus)
    head_dir, vocabulary = chosen_vocabulary(labels, engine, head_dir)
    if unknown := sorted({label for _, label in labels.corrections} - set(vocabulary)):
        raise ModelError(
            f"corrections hold labels the head does not know: {', '.join(map(repr, unknown[:5]))} "
            f"(it knows {len(vocabulary)}: a label column's names, or the declared labels)"
        )
    with ray_session(settings.ray_address), progress.relayed(output, "engine") as lines:
        gpus = ray.cluster_resources().get("GPU", 0) > 0 and engine.machine.device != "cpu"
        prepared = prepare_labeler.options(num_gpus=1 if gpus else 0).remote(labels, engine, head_dir, lines)  # as embed.py
        start = time.perf_counter()
        with progress.stage(output, "validate"):
            good, rows, rejects = validated_corpus(corpus, rejects_path, validation, settings.driver_rows > 0)
        seconds["validate"] = time.perf_counter() - start

        start = time.perf_counter()
        identity = labeler_identity(labels, engine, head_dir, vocabulary)
        corrected = labels.corrected()
        keyed = good.then(partial(id_and_text, corrected=corrected)).then(partial(with_content_keys, identity=identity))
        with progress.stage(output, "label", rows - rejects, counted="actors") as counter:
            values, payload = ([VALUE, AGREES], [CORRECTION]) if corrected else ([VALUE], [])
            reuse = reuse_previous(keyed, cache_dir, values, payload, work_dir / STAGED)
            progress.add(counter, reuse.count)
            report, seconds["engine"] = waited(prepared)  # built while the cache was compared
            staging = StagingSink(work_dir / STAGED, reuse.kept)
            computed = None
            if reuse.fresh is not None:
                kwargs = {"labels": labels, "engine": engine, "report": report, "counter": counter}
                fresh = rows - rejects - reuse.count
                computed = map_inference(reuse.fresh, LabelActor, kwargs, fresh, settings, gpus).materialize()
        seconds["label"] = time.perf_counter() - start - seconds["engine"]

        start = time.perf_counter()
        with progress.stage(output, "write"):
            if computed is None:
                staging.commit([])
            else:
                computed.write_datasink(staging)
            copy = copy_plan(previous, reuse, rows - rejects)
            if copy is None and reuse.kept:  # every value, the kept ones in the staged parts alone
                written, count = read_committed(work_dir / STAGED), rows - rejects
            else:  # the labelled rows: every row where nothing was kept
                written, count = computed, staging.computed
            if before_write:
                before_write(rows - rejects, copy)
            if written is not None and count:
                sink.routed(written.select_columns(["id", VALUE]), count).write_datasink(sink)
        seconds["write"] = time.perf_counter() - start
    sampled = committed_dataset(work_dir / STAGED).head(SAMPLES, columns=["id", VALUE]).to_pylist()
    corrections = corrections_kept(work_dir / STAGED) if corrected else None
    figures = {
        "rows": rows,
        "rejects": rejects,
        "items": rows - rejects,
        "labeler": asdict(report),
        "vocabulary": vocabulary,
        "corrections": corrections,
    }
    record_night(work_dir, Night(inputs, figures))
    return LabelsJobReport(
        rows=rows,
        rejects=rejects,
        rejects_path=str(rejects_path),
        items=rows - rejects,
        reused=staging.rows - staging.computed,
        computed=staging.computed,
        written=count,
        seconds={stage: round(value, 3) for stage, value in seconds.items()},
        labeler=asdict(report),
        vocabulary=vocabulary,
        samples={str(row["id"]): row[VALUE] for row in sampled},
        corrections=corrections,
    )


def corrections_kept(staged: WorkPath) -> dict[str, int]:
    """How many staged rows hold a correction, and how many of those the model agrees with."""
    agrees = committed_dataset(staged).to_table(columns=[AGREES])[AGREES]
    return {"rows": len(agrees) - agrees.null_count, "model_agrees": int(pc.sum(agrees).as_py() or 0)}


def copy_plan(previous: Previous | None, reuse: Reuse, items: int) -> CopyPlan | None:
    """A copy of the published version, less the ids this run lacks, where the rows this run
    kept from the cache are that version's values (the cache is its run's staged parts), a copy
    of it holds `items` well and at most half the rows were labelled again (a new labeler
    labels them all): then only the labelled rows are written. Else None: every value is."""
    if previous is None or reuse.source is None or items not in previous.records:
        return None
    if reuse.source != previous.run_dir / STAGED or items - reuse.count > items // 2:
        return None
    return CopyPlan(previous.version, reuse.gone)


def unchanged_night(
    night: Night,
    previous: Previous,
    work_dir: WorkPath,
    before_write: Callable[[int, CopyPlan | None], None] | None,
    seconds: dict[str, float],
) -> LabelsJobReport:
    """The published version copied whole, with its run's staged values, quarantine and figures."""
    start = time.perf_counter()
    copy_committed(previous.run_dir / STAGED, work_dir / STAGED)
    copy_files(previous.run_dir, work_dir, [REJECTS, NIGHT])
    items = night.figures["items"]
    if before_write:
        before_write(items, CopyPlan(previous.version, []))
    sampled = committed_dataset(work_dir / STAGED).head(SAMPLES, columns=["id", VALUE]).to_pylist()
    seconds["copy"] = time.perf_counter() - start
    return LabelsJobReport(
        rows=night.figures["rows"],
        rejects=night.figures["rejects"],
        rejects_path=str(work_dir / REJECTS),
        items=items,
        reused=items,
        computed=0,
        written=0,
        seconds={stage: round(value, 3) for stage, value in seconds.items()},
        labeler=night.figures["labeler"],
        vocabulary=night.figures["vocabulary"],
        samples={str(row["id"]): row[VALUE] for row in sampled},
        unchanged_from=previous.version,
        corrections=night.figures.get("corrections"),
    )
