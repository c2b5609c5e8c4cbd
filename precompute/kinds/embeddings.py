"""Corpus embeddings: a text encoder's vectors of every row, in a Qdrant collection, served by search.

    run:   embed (jobs/text/embed.py) -> check the version (count, canaries, recall@10: jobs/vectors/index_check.py)
           -> publish (pointer file or alias swap) -> collect old versions and their run folders
    serve: POST /v1/search/<output> (and /v1/search for the first embeddings output)
"""

from __future__ import annotations

import time
import zlib
from contextlib import AbstractContextManager
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import Field

from precompute.jobs.inputs import CorpusInput
from precompute.kinds import OutputKind, OutputSpec
from precompute.kinds.text import engine_lines, engine_of, read_model
from precompute.models.datasets import DatasetInput, arrow_dataset
from precompute.models.settings import EnginePolicy
from precompute.models.source import BUNDLED, ModelSource, ModelSpec
from precompute.stores.vectors import open_vector_store
from precompute.stores.vectors.settings import Quantization
from precompute.stores.vectors.store import VectorStore

if TYPE_CHECKING:
    from precompute.flows.steps import RunContext
    from precompute.jobs.vectors.check_sample import Searches
    from precompute.lookup.served import Served
    from precompute.models.settings import Engine
    from precompute.pipeline import Pipeline
    from precompute.service.app import Service
    from precompute.settings import Machine

ROW_STAGES = ("validate", "embed", "load")
"""Stages that pass over every row; rows/s of the others (engine build, publish) means nothing.
An unchanged night (jobs/nights.py) runs neither validate nor embed."""
CHECK_QUERIES = 200
"""Stored vectors searched for themselves (canaries) and for their exact top 10 (recall): at
0.99, 2,000 answers put the measured recall within about 0.005 of the true one."""


USER_QUERIES = 1000
"""The queries file's first rows the check searches: enough for recall to 0.003, cheap to embed."""


class QueriesInput(DatasetInput):
    """The searches users make, to tune the index on: an input with a text column."""

    text: str = "text"
    """The column of each query's text; the file's first 1,000 rows are read (USER_QUERIES)."""


class EmbeddingsSpec(OutputSpec):
    kind: Literal["embeddings"]
    input: CorpusInput
    model: ModelSpec = BUNDLED
    engine: EnginePolicy = Field(default_factory=EnginePolicy)
    min_recall: float = Field(0.99, gt=0, le=1)
    """The check raises the version's search parameters (hnsw_ef, oversampling, at last an
    exact scan) until its recall@10 against exact search reaches this (jobs/vectors/index_check.py)."""
    queries: QueriesInput | None = None
    """Searches users make: the index check measures recall@10 on them beside the input's own
    rows and their opening words, so the search parameters it records suit real queries
    (jobs/vectors/index_check.py)."""
    quantization: Quantization = "none"
    """int8: the version also keeps INT8 vectors that search walks, rescored in FP32
    (stores/vectors/settings.py); gated by min_recall like any precision."""


OPENING_WORDS = (4, 8, 16, 32)
"""The check's searches made from held-out texts: their opening words, one of these many by the
text's hash (a phrase to a sentence). By hash, not by place in the sample: a night that moves
one gate text leaves every other text's search as it was, which a copy's check keeps
(jobs/vectors/check_sample.py Searches.keys)."""


def opening_searches(texts: list[str]) -> list[str]:
    """Each text's opening words: OPENING_WORDS[its hash] of them."""
    return [" ".join(text.split()[: OPENING_WORDS[zlib.crc32(text.encode()) % len(OPENING_WORDS)]]) for text in texts]


def check_texts(output: EmbeddingsSpec, engine: Engine) -> tuple[list[str], list[str] | None]:
    """The texts of the index check's searches: the opening words of the gate's held-out texts,
    and the queries file's first USER_QUERIES texts where the pipeline file names one.

    A stored vector is the easiest query an index gets: it sits among the points the graph was
    built from. Searches are shorter than documents and land between them, where a graph walk
    at the same hnsw_ef misses more (README, "Search fidelity": recall@10 0.9995 for stored rows,
    0.9885 for 1,000 users' opening-words queries at hnsw_ef 64)."""
    from precompute.models.engines.load import gate_texts

    opening = opening_searches(gate_texts(engine).texts[:CHECK_QUERIES])
    if output.queries is None:
        return opening, None
    column = arrow_dataset(output.queries).head(USER_QUERIES, columns=[output.queries.text])
    return opening, [text for text in column[output.queries.text].to_pylist() if isinstance(text, str) and text.strip()]


def check_searches(engine: Engine, opening: list[str], users: list[str] | None) -> Searches:
    """The check_texts as the index check's Searches, embedded (when the check needs their vectors)
    by the engine that embedded the corpus: its gate already passed, so opening it is a cache hit."""
    from precompute.jobs.vectors.check_sample import Searches
    from precompute.models import load_encoder

    texts = opening + (users or [])

    def embed() -> np.ndarray:
        with load_encoder(engine) as encoder:
            return encoder.encode(texts)

    return Searches(len(opening), len(texts) - len(opening), texts, embed)


class Embeddings(OutputKind):
    name = "embeddings"
    spec = EmbeddingsSpec
    store_family = "qdrant"
    route = "search"

    def source(self, pipeline: Pipeline, name: str) -> ModelSource:
        return read_model(pipeline, name, "model", "embed")

    def check(self, pipeline: Pipeline, name: str) -> None:
        output = pipeline.outputs[name]
        pipeline.check_input(name, output.input, {"id": output.input.id, "text": output.input.text})
        if output.queries is not None:
            pipeline.check_input(name, output.queries, {"text": output.queries.text}, table="queries")

    def plan(self, pipeline: Pipeline, name: str, machine: Machine) -> list[str]:
        output = pipeline.outputs[name]
        where = f"qdrant {machine.qdrant.type} collection {pipeline.store(name)!r}"
        return [
            f"  input   {output.input.path} (id={output.input.id}, text={output.input.text})",
            *engine_lines(pipeline, name, machine.engine),
            f"  store   {where}: a new version each run, {output.keep_versions} kept for rollback",
        ]

    def versions(self, pipeline: Pipeline, name: str, machine: Machine) -> AbstractContextManager[VectorStore]:
        return open_vector_store(machine.qdrant, pipeline.store(name))

    def run(self, run: RunContext, name: str) -> dict[str, Any]:
        from precompute.jobs import progress, work_dir
        from precompute.jobs.text.embed import STAGED, run_embed_job
        from precompute.jobs.vectors.carried_check import carried_check, checked_under, keep_check
        from precompute.jobs.vectors.index_check import check_index
        from precompute.stores.versions import new_version

        output, machine = run.pipeline.outputs[name], run.machine
        store_name, engine = run.pipeline.store(name), engine_of(run.pipeline, name, machine.engine)

        # One store through the steps: the check searches the handle the load left open, and the
        # copy's source stays open from the load to the check.
        with open_vector_store(machine.qdrant, store_name) as store:

            def embed() -> Any:
                """Each attempt writes a version of its own: a retry never appends to a failed one's parts."""
                return run_embed_job(
                    new_version(), store, output.input, machine.job, engine, name, output.quantization
                )

            embedded = run.step("embed", embed)
            version, seconds = embedded.version, {}
            staged = work_dir.run_dir(run.work_dir, name, version) / STAGED

            def validate() -> Any:
                source = store.current() if embedded.load["mode"] == "copy" else None  # what it copies
                copy_of = None if source is None else work_dir.run_dir(run.work_dir, name, source) / STAGED
                texts = check_texts(output, engine)
                limits = {"max_ef": machine.qdrant.max_hnsw_ef, "exact": machine.qdrant.exact_scan}
                conditions = checked_under(store, output.min_recall, limits, CHECK_QUERIES, texts)
                validation = None
                if copy_of is not None and embedded.unchanged_from == source:
                    validation = carried_check(store, version, staged, (source, copy_of), embedded.loaded, conditions)
                if validation is None:
                    cache = work_dir.cache_dir(run.work_dir, name)
                    start = None if source is None else store.searched_with(source)
                    validation = check_index(
                        store, version, staged, CHECK_QUERIES, output.min_recall, check_searches(engine, *texts),
                        **limits, cache=cache, start=start, copy_of=copy_of, count=embedded.loaded,
                    )
                keep_check(staged, validation, conditions)
                return validation

            def publish() -> None:
                store.publish(version)

            def collect_garbage() -> list[str]:
                """Old versions go whole, with their run folders (the cache is the newest run's)."""
                deleted = store.gc(run.keep(name))
                kept = set(store.versions())
                work_dir.collect_runs(work_dir.runs(run.work_dir, name), store.current(), kept)
                return deleted

            start = time.perf_counter()
            with progress.stage(name, "check index"):
                validation = run.step("validate", validate, retry=False)
            seconds["validate_version"] = round(time.perf_counter() - start, 3)
            start = time.perf_counter()
            with progress.stage(name, "publish"):
                run.step("publish", publish)
            seconds["publish"] = round(time.perf_counter() - start, 3)
            deleted = run.step("collect_garbage", collect_garbage)
        rates = {
            stage: round(embedded.rows / embedded.seconds[stage], 1)
            for stage in ROW_STAGES
            if embedded.seconds.get(stage)
        }
        return {
            "kind": self.name,
            "version": version,
            "published": True,
            "rows": embedded.rows,
            "rejects": embedded.rejects,
            "rejects_path": embedded.rejects_path,
            "reused": embedded.reused,
            "computed": embedded.computed,
            "load": embedded.load,
            "unchanged_from": embedded.unchanged_from,
            "seconds": {**embedded.seconds, **seconds},
            "docs_per_s": rates,
            "rates": rates,
            "rate_unit": "rows/s",
            "engine": {k: embedded.engine[k] for k in ("backend", "device", "precision")},
            "gate": embedded.engine["gates"],
            "validation": asdict(validation),
            "deleted_versions": deleted,
        }

    def serve(self, service: Service, name: str) -> Served:
        from precompute.lookup.search import SearchOutput

        pipeline, machine = service.pipeline, service.machine
        engine = engine_of(pipeline, name, machine.engine)
        return SearchOutput(service, name, open_vector_store(machine.qdrant, pipeline.store(name)), engine)
