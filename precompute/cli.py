"""The one command line: `precompute`. Subcommands delegate to the package that does the work."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from typing import Annotated

import typer

# Prefect's temporary server otherwise tries to report telemetry, which fails offline.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

app = typer.Typer(no_args_is_help=True, help=__doc__)
engine_app = typer.Typer(no_args_is_help=True, help="Build and inspect inference engines.")
bench_app = typer.Typer(
    no_args_is_help=True,
    help="Benchmarks: our path and the baseline a user would otherwise pick, in one run. Last line JSON.",
)
app.add_typer(engine_app, name="engine")
app.add_typer(bench_app, name="bench")


@app.command()
def demo() -> None:
    """Run the nightly flow on the demo corpus, start the service, answer a few real queries."""
    from precompute.demo import main

    main()


@app.command()
def run(
    corpus: Annotated[
        str | None, typer.Option(help="Corpus Parquet path or URI; default: the demo corpus.")
    ] = None,
) -> None:
    """Run the nightly flow now: embed, validate, publish, GC; print the run report."""
    from flows.nightly import nightly

    nightly(corpus=corpus)


@app.command()
def serve() -> None:
    """Serve lookups (PRECOMPUTE_SERVICE_* settings) until interrupted."""
    from lookup.server import serve as serve_forever
    from lookup.settings import ServiceSettings

    serve_forever(ServiceSettings())


@engine_app.command("build")
def engine_build() -> None:
    """Export, quantize, build and gate the encoder engine (PRECOMPUTE_ENGINE_* settings); print the report."""
    from models import load_encoder

    with load_encoder() as encoder:
        print(json.dumps(asdict(encoder.report), indent=2))


@bench_app.command("embed")
def bench_embed(
    docs: Annotated[int, typer.Option(min=16, help="Texts from the corpus, in file order.")] = 800,
    repeats: Annotated[
        int, typer.Option(min=3, help="Timed repeats after warm-up; the median is reported.")
    ] = 3,
    corpus: Annotated[
        str | None, typer.Option(help="Parquet with a `text` column; default: the demo corpus.")
    ] = None,
) -> None:
    """Our best engine against sentence-transformers FP32 (PyTorch): docs/s, ratio, cosine to FP32."""
    from bench.embed import main

    main(docs, repeats, corpus)


@bench_app.command("search")
def bench_search(
    rate: Annotated[float, typer.Option(min=1, help="Requests per second, open loop.")] = 20,
    requests: Annotated[int, typer.Option(min=50, help="Timed requests after warm-up.")] = 400,
) -> None:
    """Search p50/p99 through the service at a fixed rate, against sentence-transformers + qdrant-client local."""
    from bench.search import main

    main(rate, requests)


@bench_app.command("pipeline")
def bench_pipeline(
    corpus: Annotated[
        str | None, typer.Option(help="Parquet with id and text; default: the demo corpus.")
    ] = None,
) -> None:
    """The Ray Data embedding job's docs/s against the bare engine's, in one run."""
    from bench.pipeline import main

    main(corpus)


@bench_app.command("vectors")
def bench_vectors(
    docs: Annotated[int, typer.Option(min=100, help="Demo documents to index.")] = 5000,
    queries: Annotated[int, typer.Option(min=10, help="Timed top-10 queries per backend.")] = 200,
) -> None:
    """The in-process Qdrant engine against qdrant-client's local mode: load time, p50/p99, recall@10."""
    from bench.vector_store import main

    main(docs, queries)
