"""The one command line: `precompute`. Subcommands delegate to the package that does the work."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import TYPE_CHECKING, Annotated

import typer

from precompute.cli.bench import bench_app

if TYPE_CHECKING:
    from precompute.pipeline import Pipeline


app = typer.Typer(no_args_is_help=True, help=__doc__)
engine_app = typer.Typer(no_args_is_help=True, help="Build and inspect inference engines.")
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
    from precompute.kinds import PipelineError
    from precompute.pipeline import load_pipeline

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
    from precompute.cli.demo import main

    main(verbose=verbose)


@app.command()
def run(pipeline: PipelineOption = None, verbose: VerboseOption = False) -> None:
    """Run the nightly flow now: every output of the pipeline file, each validated and published.

    A progress line per stage, then a table; logs and tracebacks go to a file under the work
    directory. Exit code 2: the pipeline file or an input is refused before any job; 1: an output
    failed (one line each; the others are published)."""
    checked = checked_pipeline(pipeline)
    from precompute.flows.terminal import print_summary, run_logged

    report, log = run_logged(checked, verbose)
    print_summary(report, log)


@app.command()
def check(pipeline: PipelineOption = None) -> None:
    """Validate the pipeline file and print the plan: outputs, models, engines, stores, versions."""
    from precompute.cli.plan import plan
    from precompute.settings import Machine

    print(plan(checked_pipeline(pipeline), Machine.from_environment()))


@app.command()
def schema() -> None:
    """Print the pipeline file's JSON Schema (for editors: save it and point `#:schema` at it)."""
    from precompute.pipeline import schema as json_schema

    print(json_schema())


@app.command()
def inputs() -> None:
    """Print what an input may be: the Arrow types each column accepts, and the sources and
    formats a pipeline file may name."""
    from precompute.cli.inputs_table import markdown

    print(markdown())


@app.command()
def settings() -> None:
    """Print every setting in one table: this machine's (PRECOMPUTE_* variables) and each output's
    (the pipeline file's fields), with its environment variable and default."""
    from precompute.cli.settings_table import markdown

    print(markdown())


@app.command()
def docs() -> None:
    """Write the generated pages of docs/ (settings, inputs, the pipeline file's schema, the
    architecture) and the README's benchmarks table, from the code and bench/results/."""
    from precompute.cli.docs import write

    for path in write():
        print(f"wrote {path}")


@app.command()
def schedule(
    pipeline: PipelineOption = None,
    cron: Annotated[
        str | None, typer.Option(help="When to run, in cron syntax (UTC); default: the file's [flow] cron.")
    ] = None,
) -> None:
    """Serve the nightly flow on a schedule until stopped: needs a Prefect server (PREFECT_API_URL).

    One run at a time; runs read the pipeline file this command was given. SIGTERM stops it
    within 30 s, a run in progress stopped before it publishes. Exit code 2: a bad pipeline
    file, or no PREFECT_API_URL; 1: the Prefect API does not answer.
    """
    from precompute.flows.schedule import ScheduleError, serve

    checked = checked_pipeline(pipeline)
    try:
        serve(checked, cron)
    except ScheduleError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(e.exit_code) from None


@app.command()
def status(
    pipeline: PipelineOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Per output: the version served, its age and count, and the versions a rollback can reach."""
    from precompute.cli.status import as_json as to_json
    from precompute.cli.status import render
    from precompute.cli.status import status as read_status
    from precompute.settings import Machine

    # Which versions are served needs the file's outputs and stores, not its inputs and models.
    statuses = read_status(checked_pipeline(pipeline, False), Machine.from_environment())
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
    from precompute.cli.status import rollback as roll_back
    from precompute.settings import Machine
    from precompute.stores.errors import StoreError

    checked = checked_pipeline(pipeline)
    if output not in checked.outputs:
        names = ", ".join(checked.outputs)
        raise typer.BadParameter(
            f"{output!r} is not an output of {checked.path} ({names})", param_hint="OUTPUT"
        )
    try:
        version = roll_back(checked, output, to, Machine.from_environment())
    except StoreError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from e
    print(f"{output}: serving {version}")


@app.command()
def serve(pipeline: PipelineOption = None) -> None:
    """Serve every output of the pipeline file (PRECOMPUTE_SERVICE_* settings) until interrupted."""
    from precompute.lookup.settings import ServiceSettings
    from precompute.service.server import serve as serve_forever

    serve_forever(ServiceSettings(), checked_pipeline(pipeline))


@engine_app.command("build")
def engine_build(pipeline: PipelineOption = None) -> None:
    """Export, quantize, build and gate the engine of every output that runs a text model; print each report."""
    from precompute.kinds.text import engine_of
    from precompute.models import load_encoder
    from precompute.settings import Machine

    checked, machine = checked_pipeline(pipeline), Machine.from_environment()
    for name, output in checked.declared.items():
        if output.source is not None:
            with load_encoder(engine_of(output, machine.engine)) as encoder:
                print(json.dumps({"output": name, **asdict(encoder.report)}, indent=2))
