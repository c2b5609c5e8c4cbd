"""`precompute bench pipeline`: the embedding job's docs/s against the bare engine's, in one run.

The bare engine is `Encoder.encode` on the same texts in this process: the ceiling. The job
is the Ray Data path end to end (read, validate, tokenize, infer in the actor pool, stage
Parquet), timed from the start of its main pass to the last part written, on a fresh work
directory so every row is computed. Efficiency = job docs/s / bare docs/s.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

from precompute.bench.records import Figure, write_record
from precompute.demo_data import DEMO_CORPUS, demo_engine
from precompute.jobs.inputs import CorpusInput
from precompute.jobs.settings import JobSettings
from precompute.jobs.text.embed import run_embed_job
from precompute.jobs.work_dir import WorkPath
from precompute.models import load_encoder
from precompute.models.hardware import device_fingerprint
from precompute.stores.vectors import open_vector_store
from precompute.stores.vectors.settings import VectorStoreSettings


def main(corpus: str | None = None) -> dict[str, object]:
    source = CorpusInput(path=corpus or str(DEMO_CORPUS))
    engine, job = demo_engine(reference=source.sample()), JobSettings()
    texts = pq.read_table(source.path, columns=["text"])["text"].to_pylist()

    with load_encoder(engine) as encoder:
        encoder.encode(texts[:64])
        start = time.perf_counter()
        encoder.encode(texts)
        bare = len(texts) / (time.perf_counter() - start)

    with tempfile.TemporaryDirectory() as tmp:
        stores = VectorStoreSettings(type="edge", path=Path(tmp) / "qdrant")
        with open_vector_store(stores, "bench") as store:
            report = run_embed_job(
                "bench", store, source, job.model_copy(update={"work_dir": WorkPath.of(tmp)}), engine
            )
    job_rate = report.computed / report.seconds["embed"]
    result = {
        "bench": "pipeline",
        "machine": device_fingerprint("cpu"),
        "docs": len(texts),
        "engine": f"{report.engine['backend']}/{report.engine['device']}/{report.engine['precision']}",
        "bare_engine_docs_per_s": round(bare, 1),
        "job_docs_per_s": round(job_rate, 1),
        "efficiency": round(job_rate / bare, 2),
        "job_seconds": report.seconds,
    }
    print(f"bare engine  {bare:8.1f} docs/s  (Encoder.encode, same texts, same process)")
    print(f"Ray Data job {job_rate:8.1f} docs/s  (read -> validate -> actor pool -> staged Parquet)")
    print(f"efficiency   {result['efficiency']:8.2f}")
    print(f"machine {result['machine']}")
    print(json.dumps(result))
    demo = Path(source.path).parts[-2:] == DEMO_CORPUS.parts[-2:]
    write_record(
        "pipeline",
        result,
        dataset=f"demo corpus, {len(texts):,} Debian package descriptions" if demo else f"{source.path}, {len(texts):,} texts",
        ours=Figure(f"Ray Data embedding job, {result['engine']}", result["job_docs_per_s"], "docs/s"),
        baseline=Figure("bare engine, Encoder.encode in one process", result["bare_engine_docs_per_s"], "docs/s"),
        ratio=result["efficiency"],
    )
    return result
