"""Corpus embeddings as a Ray Data job: read -> validate -> reuse or embed -> stage -> load a version.

    rejects pass:  read -> tag_rejects -> rows with a reason -> rejects.parquet (fail fast on ratio)
    main pass:     read -> tag_rejects -> good rows -> content keys -> (id, key, payload) to the
                   driver (read by Ray tasks: GoodRows.blocks), compared with the previous run's
                   (jobs/text/content_cache.py), while prepare_engine builds and gates the engine -> the
                   EmbedActor pool encodes the rows that moved (the driver, when they are few:
                   JobSettings.driver_rows) -> StagingSink (Parquet parts, committed by a manifest)
    kept rows:     the previous run's parts less the rows that moved (copied as they are where
                   none moved), one Ray task a part, committed in the same manifest
    driver:        committed parts -> vector store version (a copy of the published one with the
                   rows that moved, else a bulk load: jobs/vectors/load.py; index, count) -> promote as cache

The same code runs on a laptop's local Ray and on a cluster given its address; staged
parts are written in parallel, the version is loaded by one process, which the in-process
Qdrant engine requires.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa
import ray
from ray.actor import ActorHandle

from precompute.jobs import progress, work_dir
from precompute.jobs.inputs import CorpusInput
from precompute.jobs.nights import NIGHT, Night, copy_files, inputs_digest, record_night, same_night
from precompute.jobs.ray_session import map_inference, ray_session, waited
from precompute.jobs.settings import JobSettings
from precompute.jobs.staging import COMPUTED, StagingSink, copy_committed
from precompute.jobs.text.content_cache import promote, reuse_previous, uncached, with_content_keys
from precompute.jobs.text.corpus_validation import (
    Validation,
    payload_columns,
    validated_corpus,
    validation_entry,
)
from precompute.jobs.text.embedding_cache import EMBEDDING, embeddings_column, embeddings_of
from precompute.jobs.validate import REJECTS
from precompute.jobs.vectors.index_check import next_graph
from precompute.jobs.vectors.load import load_version
from precompute.models import Engine, load_encoder
from precompute.models.datasets import input_files
from precompute.models.engines.load import ENGINE_LOG
from precompute.stores.vectors.settings import Quantization
from precompute.stores.vectors.store import GRAPH_KEY, VectorStore

STAGED = "embeddings"
"""The folder of a run's committed (id, content key, embedding, payload) parts."""


@dataclass(frozen=True)
class EmbedJobReport:
    version: str
    rows: int
    rejects: int
    rejects_path: str
    reused: int
    computed: int
    loaded: int
    load: dict[str, Any]
    """How the version was loaded: mode (whole or copy), reason, points written and deleted."""
    unchanged_from: str | None
    """The published version whose corpus and settings this run's are, byte for byte: its staged
    rows, quarantine and figures were copied, and nothing was validated or embedded."""
    seconds: dict[str, float]
    engine: dict[str, Any]


class EmbedActor:
    """One engine per actor; it encodes only the rows the cache left without a vector."""

    def __init__(self, engine: Engine, counter: ActorHandle | None = None) -> None:
        self.encoder = load_encoder(engine)
        self.counter = counter

    def __call__(self, batch: pa.Table) -> pa.Table:
        missing = uncached(batch, EMBEDDING)
        vectors = np.empty((batch.num_rows, self.encoder.dim), dtype=np.float32)
        if not missing.all():
            vectors[~missing] = embeddings_of(batch.filter(pa.array(~missing)))
        if missing.any():
            texts = batch["text"].to_pylist()
            vectors[missing] = self.encoder.encode([t for t, m in zip(texts, missing, strict=True) if m])
        progress.add(self.counter, batch.num_rows)
        return (
            batch.drop_columns([c for c in ("text", EMBEDDING) if c in batch.column_names])
            .append_column(EMBEDDING, embeddings_column(vectors))
            .append_column(COMPUTED, pa.array(missing))
        )

    def close(self) -> None:
        self.encoder.close()


def version_meta(engine: Engine) -> dict[str, Any]:
    """What a version records of its model: a reader embeds queries with the same one."""
    return {"model": engine.model.model_dump(mode="json"), "reference": engine.reference.model_dump(mode="json")}


@ray.remote(max_calls=1)
def prepare_engine(engine: Engine, lines: ActorHandle | None = None) -> dict[str, Any]:
    """Build (or find cached) and gate the engine once, before the actors fan out, its ladder's
    lines forwarded to the driver's `lines`. Its worker exits after it (`max_calls=1`): reused,
    it carried the engine's and PyTorch's pages into the read and write tasks that ran in it next."""
    with progress.forwarded(lines, ENGINE_LOG), load_encoder(engine) as encoder:
        return asdict(encoder.report)


def run_embed_job(
    version: str,
    store: VectorStore,
    corpus: CorpusInput,
    settings: JobSettings,
    engine: Engine,
    output: str = "embeddings",
    quantization: Quantization = "none",
) -> EmbedJobReport:
    """Embed the corpus into a new, unpublished store version; publishing is the caller's step.

    Staged parts go to `runs/<output>/<version>`; the previous run's are the cache (`cache/<output>`),
    joined to the rows inside the dataset: no process holds it whole.
    """
    run = work_dir.run_dir(settings.work_dir, output, version)
    cache = work_dir.cache_dir(settings.work_dir, output)
    current = store.current()
    published = None if current is None else work_dir.run_dir(settings.work_dir, output, current)
    start = time.perf_counter()
    files = input_files(corpus).digests()
    inputs = inputs_digest(files.whole, corpus.model_dump_json(), engine.model_dump_json())
    unchanged = same_night(inputs, published)
    seconds = {"digest": time.perf_counter() - start}
    if unchanged is None:
        validation = validation_entry(settings.work_dir, files, corpus)
        night, computed, embedded = embed_corpus(
            run, cache, corpus, settings, engine, output, inputs, validation
        )
        record_night(run, night)
        seconds.update(embedded)
    else:
        assert published is not None  # same_night read it
        night, start = unchanged, time.perf_counter()
        copy_committed(published / STAGED, run / STAGED)
        copy_files(published, run, [REJECTS, NIGHT])
        computed, seconds["copy"] = 0, time.perf_counter() - start
    rows, rejects = night.figures["rows"], night.figures["rejects"]

    start = time.perf_counter()
    with progress.stage(output, "load"):
        meta = {**version_meta(engine), GRAPH_KEY: asdict(next_graph(cache))}
        source = None if published is None else (current, published / STAGED)
        loaded = load_version(store, version, run / STAGED, meta, quantization, source, unchanged is not None)
    seconds["load"] = time.perf_counter() - start
    promote(cache, run / STAGED)
    return EmbedJobReport(
        version=version,
        rows=rows,
        rejects=rejects,
        rejects_path=str(run / REJECTS),
        reused=rows - rejects - computed,
        computed=computed,
        loaded=loaded.count,
        load={k: v for k, v in asdict(loaded).items() if k != "count"},
        unchanged_from=None if unchanged is None else current,
        seconds={stage: round(value, 3) for stage, value in seconds.items()},
        engine=night.figures["engine"],
    )


def embed_corpus(
    run: work_dir.WorkPath,
    cache: work_dir.WorkPath,
    corpus: CorpusInput,
    settings: JobSettings,
    engine: Engine,
    output: str,
    inputs: str,
    validation: Validation,
) -> tuple[Night, int, dict[str, float]]:
    """Validate the corpus (or take its `validation`: jobs/text/corpus_validation.py), then embed the rows the
    cache lacks into `run`'s staged parts: (the night, with its rows, rejects and engine report;
    rows computed; seconds by stage)."""
    seconds: dict[str, float] = {}
    with ray_session(settings.ray_address), progress.relayed(output, "engine") as lines:
        gpus = ray.cluster_resources().get("GPU", 0) > 0 and engine.machine.device != "cpu"
        # The engine is built and gated while the rows are validated and compared with the
        # cache: on a cold engine cache that takes minutes, and it reads no row of the corpus.
        prepared = prepare_engine.options(num_gpus=1 if gpus else 0).remote(engine, lines)
        start = time.perf_counter()
        with progress.stage(output, "validate"):
            good, rows, rejects = validated_corpus(corpus, run / REJECTS, validation, settings.driver_rows > 0)
        seconds["validate"] = time.perf_counter() - start

        start = time.perf_counter()
        keyed = good.then(partial(with_content_keys, identity=engine.model.hash))
        with progress.stage(output, "embed", rows - rejects, counted="actors") as counter:
            reuse = reuse_previous(keyed, cache, [EMBEDDING], payload_columns(corpus), run / STAGED)
            progress.add(counter, reuse.count)
            engine_report, seconds["engine"] = waited(prepared)  # built while the cache was compared
            sink = StagingSink(run / STAGED, reuse.kept)
            if reuse.fresh is None:
                sink.commit([])
            else:
                kwargs = {"engine": engine, "counter": counter}
                fresh = rows - rejects - reuse.count
                map_inference(reuse.fresh, EmbedActor, kwargs, fresh, settings, gpus).write_datasink(sink)
        seconds["embed"] = time.perf_counter() - start - seconds["engine"]
    night = Night(inputs, {"rows": rows, "rejects": rejects, "engine": engine_report})
    return night, sink.computed, seconds
