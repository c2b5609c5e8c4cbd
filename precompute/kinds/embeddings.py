"""Corpus embeddings: a text encoder's vectors of every row, in a Qdrant collection, served by search.

    compute:  embed the rows that moved into a new version (jobs/text/embed.py)
    validate: count, canaries, recall@10 against exact search, the search parameters tuned to
              min_recall (jobs/vectors/index_check.py; carried from the source on an unchanged night)
    serve:    POST /v1/search/<output> (and /v1/search for the first embeddings output)
"""

from __future__ import annotations

import zlib
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import Field

from precompute.jobs import work_dir
from precompute.jobs.inputs import CorpusInput
from precompute.kinds import Output, OutputKind, OutputSpec, RunContext, Target
from precompute.kinds.report import Computed
from precompute.kinds.text import engine_lines, engine_of, read_model
from precompute.lookup.served import Served
from precompute.lookup.serving import Serving
from precompute.models.datasets import DatasetInput, arrow_dataset
from precompute.models.settings import Engine, EnginePolicy
from precompute.models.source import BUNDLED, ModelSource, ModelSpec
from precompute.settings import Machine
from precompute.stores.vectors import open_vector_store
from precompute.stores.vectors.settings import Quantization
from precompute.stores.vectors.store import VectorStore

if TYPE_CHECKING:  # the jobs import Ray: the night's, not the service's
    from precompute.jobs.vectors.check_sample import Searches
    from precompute.jobs.vectors.index_check import Validation

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
    at the same hnsw_ef misses more (`precompute bench fidelity` measures both)."""
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


@dataclass(kw_only=True)
class EmbeddingsComputed(Computed):
    """What the embed job did (jobs/text/embed.py EmbedJobReport), as the run report shows it."""

    loaded: int
    """Points the version holds."""
    load: dict[str, Any]
    """How the version was loaded: a copy of the published one with the rows that moved, or whole."""
    unchanged_from: str | None


class Embeddings(OutputKind[VectorStore, EmbeddingsComputed]):
    name = "embeddings"
    spec = EmbeddingsSpec
    store_family = "qdrant"
    route = "search"

    def source(self, output: Output) -> ModelSource:
        return read_model(output, "model", "embed")

    def check(self, output: Output) -> None:
        spec: EmbeddingsSpec = output.spec
        output.check_input(spec.input, {"id": spec.input.id, "text": spec.input.text})
        if spec.queries is not None:
            output.check_input(spec.queries, {"text": spec.queries.text}, table="queries")

    def plan(self, output: Output, machine: Machine) -> list[str]:
        spec: EmbeddingsSpec = output.spec
        where = f"qdrant {machine.qdrant.type} collection {output.store!r}"
        return [
            f"  input   {spec.input.path} (id={spec.input.id}, text={spec.input.text})",
            *engine_lines(output, machine.engine),
            f"  store   {where}: a new version each night, {spec.keep_versions} kept for rollback",
        ]

    def versions(self, output: Output, machine: Machine) -> AbstractContextManager[VectorStore]:
        """One store through the night: the check searches the handle the load left open, and a
        copy's source stays open from the load to the check."""
        return open_vector_store(machine.qdrant, output.store)

    def compute(self, run: RunContext, output: Output, target: Target[VectorStore]) -> EmbeddingsComputed:
        from precompute.jobs.text.embed import run_embed_job

        spec: EmbeddingsSpec = output.spec
        engine = engine_of(output, run.machine.engine)
        job = run.machine.job
        embedded = run_embed_job(target.version, target.store, spec.input, job, engine, output.name, spec.quantization)
        rates = {stage: round(embedded.rows / embedded.seconds[stage], 1) for stage in ROW_STAGES if embedded.seconds.get(stage)}
        return EmbeddingsComputed(
            rows=embedded.rows,
            rejects=embedded.rejects,
            rejects_path=embedded.rejects_path,
            reused=embedded.reused,
            computed=embedded.computed,
            seconds=embedded.seconds,
            rates=rates,
            loaded=embedded.loaded,
            load=embedded.load,
            unchanged_from=embedded.unchanged_from,
            engine={k: embedded.engine[k] for k in ("backend", "device", "precision")},
            gate=embedded.engine["gates"],
        )

    def validate(
        self, run: RunContext, output: Output, target: Target[VectorStore], computed: EmbeddingsComputed
    ) -> Validation:
        """The version's index check, or on an unchanged night its source's carried over."""
        from precompute.jobs import progress
        from precompute.jobs.text.embed import STAGED
        from precompute.jobs.vectors.carried_check import carried_check, checked_under, keep_check
        from precompute.jobs.vectors.index_check import check_index

        spec: EmbeddingsSpec = output.spec
        store, version, qdrant = target.store, target.version, run.machine.qdrant
        engine = engine_of(output, run.machine.engine)
        staged = target.folder / STAGED
        source = store.current() if computed.load["mode"] == "copy" else None  # what it copies
        copy_of = None if source is None else run.run_dir(output.name, source) / STAGED
        with progress.stage(output.name, "check index"):
            texts = check_texts(spec, engine)
            limits = {"max_ef": qdrant.max_hnsw_ef, "exact": qdrant.exact_scan}
            conditions = checked_under(store, spec.min_recall, limits, CHECK_QUERIES, texts)
            validation = None
            if copy_of is not None and computed.unchanged_from == source:
                validation = carried_check(store, version, staged, (source, copy_of), computed.loaded, conditions)
            if validation is None:
                cache = work_dir.cache_dir(run.work_dir, output.name)
                start = None if source is None else store.searched_with(source)
                validation = check_index(
                    store, version, staged, CHECK_QUERIES, spec.min_recall, check_searches(engine, *texts),
                    **limits, cache=cache, start=start, copy_of=copy_of, count=computed.loaded,
                )
            keep_check(staged, validation, conditions)
        return validation

    def serve(self, serving: Serving, output: Output, machine: Machine) -> Served:
        from precompute.lookup.search_route import SearchOutput

        engine = engine_of(output, machine.engine)
        return SearchOutput(serving, output.name, open_vector_store(machine.qdrant, output.store), engine)
