"""Corpus embeddings as a Ray Data job: read -> validate -> reuse or embed -> stage -> load a version.

    rejects pass:  read -> tag_rejects -> rows with a reason -> rejects.parquet (fail fast on ratio)
    main pass:     read -> tag_rejects -> good rows -> EmbedActor pool -> StagingSink (Parquet parts)
    driver:        parts -> vector store version (bulk load, index, count) -> promote as cache

The same code runs on a laptop's local Ray and on a cluster given its address; staged
parts are written in parallel, the version is loaded by one process, which the in-process
Qdrant engine requires.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import ray
from ray.data.block import Block, BlockAccessor
from ray.data.datasource import Datasink, WriteResult

from jobs import embedding_cache
from jobs.embedding_cache import EMBEDDING, KEY
from jobs.ray_session import actor_pool, ray_session
from jobs.settings import JobSettings
from jobs.validate import validated_corpus
from models import EngineSettings, load_encoder
from precompute.pipeline import CorpusInput
from stores.vectors import VectorStore

COMPUTED = "computed"
NOT_PAYLOAD = {"text", KEY, EMBEDDING, COMPUTED, "id"}
LOAD_BATCH = 256


@dataclass(frozen=True)
class EmbedJobReport:
    version: str
    rows: int
    rejects: int
    rejects_path: str
    reused: int
    computed: int
    loaded: int
    seconds: dict[str, float]
    engine: dict[str, Any]


class EmbedActor:
    """One engine per actor; rows whose content key is cached skip inference entirely."""

    def __init__(self, engine: EngineSettings, cache_dir: Path) -> None:
        self.encoder = load_encoder(engine)
        self.model_hash = engine.model.hash
        self.cache = embedding_cache.load(cache_dir)

    def __call__(self, batch: pa.Table) -> pa.Table:
        texts = batch["text"].to_pylist()
        keys = embedding_cache.content_keys(self.model_hash, texts)
        missing = [i for i, key in enumerate(keys) if key not in self.cache]
        vectors = np.empty((len(keys), self.encoder.dim), dtype=np.float32)
        for i, key in enumerate(keys):
            if key in self.cache:
                vectors[i] = self.cache[key]
        if missing:
            vectors[missing] = self.encoder.encode([texts[i] for i in missing])
        computed = np.zeros(len(keys), dtype=bool)
        computed[missing] = True
        return (
            batch.drop_columns(["text"])
            .append_column(KEY, pa.array(keys, pa.binary(16)))
            .append_column(EMBEDDING, embedding_cache.embeddings_column(vectors))
            .append_column(COMPUTED, pa.array(computed))
        )


class StagingSink(Datasink[dict[str, int]]):
    """Writes each block as a Parquet part; the parts become the version and the next cache."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.rows = self.computed = 0

    def on_write_start(self, schema: pa.Schema | None = None) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)

    def write(self, blocks: Iterable[Block], ctx: Any) -> dict[str, int]:
        rows = computed = 0
        for block in blocks:
            table = BlockAccessor.for_block(block).to_arrow()
            if table.num_rows:
                pq.write_table(table, self.run_dir / f"part-{uuid.uuid4().hex}.parquet")
                rows += table.num_rows
                computed += int(pc.sum(table[COMPUTED]).as_py() or 0)
        return {"rows": rows, "computed": computed}

    def on_write_complete(self, write_result: WriteResult[dict[str, int]]) -> None:
        self.rows = sum(r["rows"] for r in write_result.write_returns)
        self.computed = sum(r["computed"] for r in write_result.write_returns)


def version_meta(engine: EngineSettings) -> dict[str, Any]:
    """What a version records of its model: a reader embeds queries with the same one."""
    return {"model": engine.model.model_dump(mode="json"), "reference": engine.reference.model_dump()}


def payload_kind(kind: pa.DataType) -> str:
    """A payload field's type as a search filter sees it: str, int and bool are matched exactly."""
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return "str"
    if pa.types.is_integer(kind):
        return "int"
    return "bool" if pa.types.is_boolean(kind) else str(kind)


def load_version(store: VectorStore, version: str, run_dir: Path, meta: dict[str, Any]) -> int:
    """Bulk-load staged parts into a new, unpublished version; index it; return its count."""
    parts = pads.dataset(run_dir, format="parquet")
    payload_columns = [c for c in parts.schema.names if c not in NOT_PAYLOAD]
    payload = {c: payload_kind(parts.schema.field(c).type) for c in payload_columns}
    store.create_version(version, parts.schema.field(EMBEDDING).type.list_size, {**meta, "payload": payload})
    for batch in parts.to_batches(batch_size=LOAD_BATCH):
        table = pa.Table.from_batches([batch])
        ids = [str(i) for i in table["id"].to_pylist()]
        store.upsert(
            version, ids, embedding_cache.embeddings_of(table), table.select(payload_columns).to_pylist()
        )
    store.finalize(version)
    return store.count(version)


@ray.remote
def prepare_engine(engine: EngineSettings) -> dict[str, Any]:
    """Build (or find cached) and gate the engine once, before the actors fan out."""
    with load_encoder(engine) as encoder:
        return asdict(encoder.report)


def run_embed_job(
    version: str,
    store: VectorStore,
    corpus: CorpusInput,
    settings: JobSettings,
    engine: EngineSettings,
    output: str = "embeddings",
) -> EmbedJobReport:
    """Embed the corpus into a new, unpublished store version; publishing is the caller's step.

    Staged parts go to `runs/<output>/<version>`; the previous run's are the cache (`cache/<output>`).
    """
    run_dir = settings.work_dir / "runs" / output / version
    cache_dir = settings.work_dir / "cache" / output
    seconds: dict[str, float] = {}
    with ray_session(settings.ray_address):
        gpus = ray.cluster_resources().get("GPU", 0) > 0 and engine.device != "cpu"
        # The engine is built and gated while the rows are validated: on a cold cache that
        # takes minutes, and it reads no row of the corpus.
        prepared = prepare_engine.options(num_gpus=1 if gpus else 0).remote(engine)
        start = time.perf_counter()
        rejects_path = run_dir / "rejects.parquet"
        good, rows, rejects = validated_corpus(corpus, rejects_path)
        seconds["validate"] = time.perf_counter() - start

        start = time.perf_counter()
        engine_report = ray.get(prepared)
        seconds["engine"] = time.perf_counter() - start

        start = time.perf_counter()
        sink = StagingSink(run_dir / "embeddings")
        good.map_batches(
            EmbedActor,
            fn_constructor_kwargs={"engine": engine, "cache_dir": cache_dir},
            batch_size=settings.rows_per_batch,
            batch_format="pyarrow",
            **actor_pool(settings.actors, gpus),
        ).write_datasink(sink)
        seconds["embed"] = time.perf_counter() - start

    start = time.perf_counter()
    loaded = load_version(store, version, sink.run_dir, version_meta(engine))
    seconds["load"] = time.perf_counter() - start
    embedding_cache.promote(cache_dir, sink.run_dir)
    return EmbedJobReport(
        version=version,
        rows=rows,
        rejects=rejects,
        rejects_path=str(rejects_path),
        reused=sink.rows - sink.computed,
        computed=sink.computed,
        loaded=loaded,
        seconds={stage: round(value, 2) for stage, value in seconds.items()},
        engine=engine_report,
    )
