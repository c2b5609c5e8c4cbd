"""The one command line: `precompute`. Subcommands delegate to the package that does the work."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from precompute.pipeline import Pipeline

# Prefect's temporary server otherwise tries to report telemetry, which fails offline.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
# ... and is given 20 s to start, too few on a loaded machine: the run failed before any work.
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")

app = typer.Typer(no_args_is_help=True, help=__doc__)
engine_app = typer.Typer(no_args_is_help=True, help="Build and inspect inference engines.")
bench_app = typer.Typer(
    no_args_is_help=True,
    help="Benchmarks: our path and the baseline a user would otherwise pick, in one run. Last line JSON.",
)
app.add_typer(engine_app, name="engine")
app.add_typer(bench_app, name="bench")

PipelineOption = Annotated[
    str | None,
    typer.Option(
        "--pipeline",
        help="The pipeline file; default: PRECOMPUTE_PIPELINE, else ./precompute.toml, else the demo's.",
    ),
]

VerboseOption = Annotated[
    bool,
    typer.Option("--verbose", help="Prefect's, Ray's and the jobs' logs on the terminal, not in a file."),
]


def checked_pipeline(path: str | None, inputs_and_models: bool = True) -> Pipeline:
    """The pipeline file, validated and (`inputs_and_models`: reading every input's schema and
    hashing every model folder) checked; a bad one is one line on stderr and exit code 2."""
    from precompute.pipeline import PipelineError, load_pipeline

    try:
        pipeline = load_pipeline(path)
        if inputs_and_models:
            pipeline.check()
    except PipelineError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    return pipeline


@app.command()
def demo(verbose: VerboseOption = False) -> None:
    """Run the nightly flow on the demo corpus, start the service, answer a few real queries."""
    from precompute.demo import main

    main(verbose=verbose)


@app.command()
def run(pipeline: PipelineOption = None, verbose: VerboseOption = False) -> None:
    """Run the nightly flow now: every output of the pipeline file, each validated and published.

    A progress line per stage, then a table; logs and tracebacks go to a file under the work
    directory. Exit code 2: the pipeline file or an input is refused before any job; 1: an output
    failed (one line each; the others are published)."""
    checked = checked_pipeline(pipeline)
    from precompute.terminal_run import print_summary, run_logged

    report, log = run_logged(checked, verbose)
    print_summary(report, log)


@app.command()
def check(pipeline: PipelineOption = None) -> None:
    """Validate the pipeline file and print the plan: outputs, models, engines, stores, versions."""
    from precompute.plan import plan

    print(plan(checked_pipeline(pipeline)))


@app.command()
def schema() -> None:
    """Print the pipeline file's JSON Schema (for editors: save it and point `#:schema` at it)."""
    from precompute.pipeline import schema as json_schema

    print(json_schema())


@app.command()
def schedule(
    pipeline: PipelineOption = None,
    cron: Annotated[
        str | None, typer.Option(help="When to run, in cron syntax (UTC); default: the file's [flow] cron.")
    ] = None,
) -> None:
    """Serve the nightly flow on a schedule until interrupted: needs a Prefect server (PREFECT_API_URL).

    Registers the deployment `nightly/nightly` with the schedule and runs each scheduled flow
    run in a subprocess; the schedule stays active across restarts of this command. One run
    at a time: a run due while another is running waits, so two runs never race to publish
    and collect each other's versions.
    """
    from prefect.deployments.runner import EntrypointType

    from precompute.flows.nightly import nightly

    checked = checked_pipeline(pipeline)
    nightly.serve(
        name="nightly",
        cron=cron or checked.flow.cron,
        parameters={"pipeline": str(checked.path)},
        global_limit=1,
        pause_on_shutdown=False,
        entrypoint_type=EntrypointType.MODULE_PATH,
    )


@app.command()
def status(
    pipeline: PipelineOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Per output: the version served, its age and count, and the versions a rollback can reach."""
    from precompute.outputs import as_json as to_json
    from precompute.outputs import render
    from precompute.outputs import status as read_status
    from precompute.stores.redis_settings import RedisSettings
    from precompute.stores.vector_settings import VectorStoreSettings

    # Which versions are served needs the file's outputs and stores, not its inputs and models.
    statuses = read_status(checked_pipeline(pipeline, False), VectorStoreSettings(), RedisSettings())
    print(json.dumps(to_json(statuses), indent=2) if as_json else render(statuses))


@app.command()
def rollback(
    output: Annotated[str, typer.Argument(help="The output's name in the pipeline file.")],
    to: Annotated[
        str | None, typer.Option(help="Version to serve; default: the one before the published one.")
    ] = None,
    pipeline: PipelineOption = None,
) -> None:
    """Serve an earlier version of one output, in one atomic switch; the others are untouched."""
    from precompute.outputs import rollback as roll_back
    from precompute.stores.errors import StoreError
    from precompute.stores.redis_settings import RedisSettings
    from precompute.stores.vector_settings import VectorStoreSettings

    checked = checked_pipeline(pipeline)
    if output not in checked.outputs:
        names = ", ".join(checked.outputs)
        raise typer.BadParameter(
            f"{output!r} is not an output of {checked.path} ({names})", param_hint="OUTPUT"
        )
    try:
        version = roll_back(checked, output, to, VectorStoreSettings(), RedisSettings())
    except StoreError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from e
    print(f"{output}: serving {version}")


@app.command()
def serve(pipeline: PipelineOption = None) -> None:
    """Serve every output of the pipeline file (PRECOMPUTE_SERVICE_* settings) until interrupted."""
    from precompute.lookup.server import serve as serve_forever
    from precompute.lookup.settings import ServiceSettings

    serve_forever(ServiceSettings(), checked_pipeline(pipeline))


@engine_app.command("build")
def engine_build() -> None:
    """Export, quantize, build and gate the encoder engine (PRECOMPUTE_ENGINE_* settings); print the report."""
    from precompute.models import load_encoder

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
    model: Annotated[
        str | None,
        typer.Option(help="A sentence-transformers folder; default: the bundled all-MiniLM-L6-v2."),
    ] = None,
) -> None:
    """Our best engine against sentence-transformers FP32 (PyTorch): docs/s, ratio, cosine to FP32."""
    from precompute.bench.embed import main

    main(docs, repeats, corpus, model)


@bench_app.command("search")
def bench_search(
    rate: Annotated[float, typer.Option(min=1, help="Requests per second, open loop.")] = 20,
    requests: Annotated[int, typer.Option(min=50, help="Timed requests after warm-up.")] = 400,
) -> None:
    """Search p50/p99 through the service at a fixed rate, against sentence-transformers + qdrant-client local."""
    from precompute.bench.search import main

    main(rate, requests)


@bench_app.command("pipeline")
def bench_pipeline(
    corpus: Annotated[
        str | None, typer.Option(help="Parquet with id and text; default: the demo corpus.")
    ] = None,
) -> None:
    """The Ray Data embedding job's docs/s against the bare engine's, in one run."""
    from precompute.bench.pipeline import main

    main(corpus)


@bench_app.command("vectors")
def bench_vectors(
    docs: Annotated[int, typer.Option(min=100, help="Demo documents to index.")] = 5000,
    queries: Annotated[int, typer.Option(min=10, help="Timed top-10 queries per backend.")] = 200,
    points: Annotated[
        int | None,
        typer.Option(
            min=100, help="Vectors to index, synthesized from the real ones; default: the documents."
        ),
    ] = None,
) -> None:
    """Qdrant edge, FP32 and INT8, against exact numpy search: load, HNSW build, p50/p99, recall@10, memory, disk."""
    from precompute.bench.vector_store import main

    main(docs, queries, points=points)


@bench_app.command("publish")
def bench_publish(
    records: Annotated[int, typer.Option(min=1000, help="Records written per side and repeat.")] = 100_000,
    repeats: Annotated[int, typer.Option(min=1, help="Repeats; medians are reported.")] = 3,
    reader_rate: Annotated[
        float,
        typer.Option(min=1, help="Reads per second of the published version during garbage collection."),
    ] = 1000.0,
    k: Annotated[int, typer.Option(min=1, max=100, help="Ranked pairs per record (6 bytes each).")] = 10,
) -> None:
    """Versioned Redis publish (records/s, bytes per record) against redis-py MSET of the same values,
    and the p99 of reads while the old version is collected."""
    from precompute.bench.publish import main

    main(records, k=k, repeats=repeats, reader_rate=reader_rate)


@bench_app.command("lookup")
def bench_lookup(
    rates: Annotated[
        list[float] | None, typer.Option("--rate", min=1, help="Requests per second (repeatable).")
    ] = None,
    seconds: Annotated[float, typer.Option(min=1, help="Seconds of load per rate and side.")] = 10.0,
) -> None:
    """Key-lookup p50/p99 through the service at fixed rates, against a bare redis-py GET."""
    from precompute.bench.lookup import main

    main(tuple(rates or (500.0, 1000.0)), seconds)


@bench_app.command("capacity")
def bench_capacity(
    rates: Annotated[
        list[float] | None, typer.Option("--rate", min=1, help="Requests per second, in order (repeatable).")
    ] = None,
    seconds: Annotated[float, typer.Option(min=1, help="Seconds of load per rate.")] = 5.0,
) -> None:
    """The service under 90% lookups and 10% searches, rate after rate, query cache off and on: the
    highest rate at which lookups' p99 <= 2 ms and searches' p99 <= 10 ms, and wrk's ceiling."""
    from precompute.bench.capacity import main

    main(tuple(rates or (25.0, 50.0, 100.0, 200.0, 400.0)), seconds)


@bench_app.command("query-engines")
def bench_query_engines(
    queries: Annotated[int, typer.Option(min=16, help="Distinct demo titles embedded.")] = 400,
) -> None:
    """Which engine embeds the service's queries: dynamic INT8 one query a call, or FP32 and
    static INT8 in fixed-shape batches (micro-batching); cost per query and bit-identity."""
    from precompute.bench.query_engines import main

    main(queries)


@bench_app.command("scale")
def bench_scale(
    rows: Annotated[
        str, typer.Option(help="Corpus sizes, comma-separated; about a tenth as many users each.")
    ] = "10000,100000,1000000",
    model: Annotated[
        str | None,
        typer.Option(
            help="A sentence-transformers folder; default: a random 2-layer 64-d BERT saved under the work dir."
        ),
    ] = None,
    work_dir: Annotated[
        str | None,
        typer.Option(
            help="Where inputs, stores and runs go; default: ~/.local/share/precompute/bench-scale."
        ),
    ] = None,
    rerun: Annotated[
        bool, typer.Option(help="Run the largest size again with 1% of its texts and users changed.")
    ] = True,
) -> None:
    """Every nightly stage at growing sizes: seconds, rows/s, growth exponents, peak memory, a 1% rerun."""
    from precompute.bench.scale import MIN_ROWS, main

    try:
        sizes = [int(n.replace("_", "")) for n in rows.split(",") if n.strip()]
    except ValueError:
        raise typer.BadParameter(
            f"{rows!r} is not a comma-separated list of row counts", param_hint="--rows"
        ) from None
    if not sizes or min(sizes) < MIN_ROWS:
        raise typer.BadParameter(
            f"{rows!r}: give one or more sizes of at least {MIN_ROWS} rows", param_hint="--rows"
        )
    main(sizes, model, work_dir, rerun)


@bench_app.command("recs")
def bench_recs(
    datasets: Annotated[
        str, typer.Option(help="Comma-separated: demo, ml-100k, ml-1m; the last one's top-k speed is timed.")
    ] = "demo,ml-100k,ml-1m",
    repeats: Annotated[int, typer.Option(min=1, help="Timed repeats; the median is reported.")] = 5,
) -> None:
    """Held-out HR@10 / NDCG@10 of the published model against item-kNN, content and most-popular on
    public data; GFLOP/s of the top-k step against a plain GEMM."""
    from precompute.bench.recs import main

    main(datasets, repeats)
