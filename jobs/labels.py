"""Content labels as a Ray Data job: read -> validate -> LabelActor pool -> the caller's sink.

    rejects pass: read -> tag_rejects -> rows with a reason -> rejects.parquet (fail fast on ratio)
    main pass:    good rows -> LabelActor pool (gated encoder + head, top labels) -> values -> sink

The labeler is trained, built and gated once in a Ray task before the actors fan out, as
in jobs/embed.py. A value is the item's top labels as `stores.records` pairs; the label
names are the version's vocabulary.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import ray
from ray.data.datasource import Datasink

from jobs.ray_session import actor_pool, ray_session
from jobs.settings import JobSettings
from jobs.validate import validated_corpus
from models import EngineSettings
from models.labels import LabelerReport, LabelSettings, load_labeler, open_labeler
from precompute.pipeline import CorpusInput
from stores.records import encode_ranked

SAMPLES = 5


@dataclass(frozen=True)
class LabelsJobReport:
    rows: int
    rejects: int
    rejects_path: str
    items: int
    seconds: dict[str, float]
    labeler: dict[str, Any]
    """Engine, label gates (each precision tried, with its agreement) and head accuracy."""
    vocabulary: list[str]
    """Label names by index: a value's indices point here, so a publish stores it with the version."""
    samples: dict[str, bytes]
    """A few item_id -> value as written, for the read-back checks of a publish."""


class LabelActor:
    """One labeler per actor, the one prepare_labeler gated: (id, text) rows in, (id, value) rows out."""

    def __init__(self, labels: LabelSettings, engine: EngineSettings, report: LabelerReport) -> None:
        self.labeler = open_labeler(labels, engine, report)

    def __call__(self, batch: pa.Table) -> pa.Table:
        indices, scores = self.labeler.label(batch["text"].to_pylist())
        ids = pa.array([str(i) for i in batch["id"].to_pylist()], pa.string())
        return pa.table({"id": ids, "value": pa.array(encode_ranked(indices, scores), pa.binary())})


@ray.remote
def prepare_labeler(labels: LabelSettings, engine: EngineSettings) -> tuple[LabelerReport, list[str]]:
    """Train the head (on a cache miss), build the engine and gate the labeler once; (report, vocabulary)."""
    with load_labeler(labels, engine) as labeler:
        return labeler.report, labeler.labels


def run_labels_job(
    corpus: CorpusInput,
    settings: JobSettings,
    labels: LabelSettings,
    engine: EngineSettings,
    sink: Datasink,
    work_dir: Path,
    before_write: Callable[[int], None] | None = None,
) -> LabelsJobReport:
    """Top labels of every valid corpus row, written through `sink`.

    before_write: called with the number of records once validation counted them, for a
    store that sizes a version up front (create_version(rows=)).
    """
    rejects_path = work_dir / "rejects.parquet"
    seconds: dict[str, float] = {}
    with ray_session(settings.ray_address):
        gpus = ray.cluster_resources().get("GPU", 0) > 0 and engine.device != "cpu"
        prepared = prepare_labeler.options(num_gpus=1 if gpus else 0).remote(labels, engine)  # as in embed.py
        start = time.perf_counter()
        good, rows, rejects = validated_corpus(corpus, rejects_path)
        seconds["validate"] = time.perf_counter() - start

        start = time.perf_counter()
        report, vocabulary = ray.get(prepared)
        seconds["engine"] = time.perf_counter() - start

        start = time.perf_counter()
        values = (
            good.select_columns(["id", "text"])
            .map_batches(
                LabelActor,
                fn_constructor_kwargs={"labels": labels, "engine": engine, "report": report},
                batch_size=settings.rows_per_batch,
                batch_format="pyarrow",
                **actor_pool(settings.actors, gpus),
            )
            .materialize()
        )
        seconds["label"] = time.perf_counter() - start
        samples = {row["id"]: row["value"] for row in values.take(SAMPLES)}

        start = time.perf_counter()
        if before_write:
            before_write(rows - rejects)
        values.write_datasink(sink)
        seconds["write"] = time.perf_counter() - start
    return LabelsJobReport(
        rows=rows,
        rejects=rejects,
        rejects_path=str(rejects_path),
        items=rows - rejects,
        seconds={stage: round(value, 2) for stage, value in seconds.items()},
        labeler=asdict(report),
        vocabulary=vocabulary,
        samples=samples,
    )
