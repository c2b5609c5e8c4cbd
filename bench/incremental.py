"""`python -m bench.incremental`: what a rerun costs against a first run, embeddings and labels, in one run.

On the demo corpus (or `corpus`), in a fresh work directory: a first run (every row computed:
the baseline), a rerun of the same corpus, and a run on a copy with 1% of the texts changed.
Each run reads the previous one's committed parts as its cache, joined to the rows inside the
dataset. Prints computed and reused rows and the seconds of each job's main pass and whole job.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from jobs.content_cache import promote
from jobs.embed import run_embed_job
from jobs.labels import run_labels_job
from jobs.ray_session import ray_session
from jobs.settings import JobSettings
from models import EngineSettings
from models.hardware import device_fingerprint
from models.labels import LabelSettings
from models.settings import DEMO_CORPUS
from precompute.pipeline import CorpusInput
from stores.key_value import KeyValueStore
from stores.redis_server import redis_server
from stores.redis_settings import RedisSettings
from stores.vector_settings import VectorStoreSettings
from stores.vectors import open_vector_store

CHANGED_SHARE = 0.01


def changed_copy(source: str, path: Path) -> int:
    """A copy of `source` with every 1/CHANGED_SHARE-th text changed; returns how many."""
    rows = pq.read_table(source).to_pylist()
    step = round(1 / CHANGED_SHARE)
    for row in rows[::step]:
        row["text"] += " Now with a changed description."
    pq.write_table(pa.Table.from_pylist(rows), path)
    return len(rows[::step])


def main(corpus: str | None = None) -> dict[str, object]:
    engine, labels = EngineSettings(), LabelSettings()
    source = CorpusInput(path=corpus or str(DEMO_CORPUS))
    results: dict[str, list[dict[str, object]]] = {"embeddings": [], "labels": []}
    with tempfile.TemporaryDirectory() as tmp, redis_server(Path(tmp) / "redis") as url:
        work = Path(tmp)
        job = JobSettings(work_dir=work)
        changed = changed_copy(source.path, work / "changed.parquet")
        runs = [
            ("first", source),
            ("rerun", source),
            (f"{changed} changed", source.model_copy(update={"path": str(work / "changed.parquet")})),
        ]
        redis = RedisSettings(url=url)
        with (
            ray_session(job.ray_address),
            open_vector_store(VectorStoreSettings(type="edge", path=work / "qdrant")) as vectors,
            KeyValueStore(redis) as store,
        ):
            for n, (name, corpus_input) in enumerate(runs):
                start = time.perf_counter()
                embedded = run_embed_job(f"v{n}", vectors, corpus_input, job, engine)
                results["embeddings"].append(
                    {
                        "run": name,
                        "computed": embedded.computed,
                        "reused": embedded.reused,
                        "main_pass_s": embedded.seconds["embed"],
                        "job_s": round(time.perf_counter() - start, 2),
                    }
                )
                version = f"20261125T00000{n}Z-bench"
                start = time.perf_counter()
                labelled = run_labels_job(
                    corpus_input,
                    job,
                    labels,
                    engine,
                    store.sink("labels", version),
                    work / "runs" / "labels" / version,
                    before_write=lambda rows, version=version: store.create_version("labels", version, rows),
                    cache_dir=work / "cache" / "labels",
                )
                store.publish("labels", version, labelled.samples)
                promote(work / "cache" / "labels", Path(labelled.staged))
                results["labels"].append(
                    {
                        "run": name,
                        "computed": labelled.computed,
                        "reused": labelled.reused,
                        "main_pass_s": labelled.seconds["label"],
                        "job_s": round(time.perf_counter() - start, 2),
                    }
                )
    result = {
        "bench": "incremental",
        "machine": device_fingerprint("cpu"),
        "docs": len(pq.read_table(source.path, columns=["id"])),
        **results,
    }
    for output, rows in results.items():
        first = rows[0]["main_pass_s"]
        for row in rows:
            print(
                f"{output:10} {row['run']:12} computed {row['computed']:5} reused {row['reused']:5}  "
                f"main pass {row['main_pass_s']:7.2f} s ({first / row['main_pass_s']:5.1f}x faster than first)  "
                f"job {row['job_s']:7.2f} s"
            )
    print(f"machine {result['machine']}")
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]) and None)
