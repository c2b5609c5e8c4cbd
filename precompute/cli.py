"""The one command line: `precompute`. Subcommands delegate to the package that does the work."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Annotated

import typer

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
    """Build the gated engine, embed the demo corpus and answer a few real queries."""
    from precompute.demo import main

    main()


@engine_app.command("build")
def engine_build() -> None:
    """Export, quantize, build and gate the encoder engine (PRECOMPUTE_ENGINE_* settings); print the report."""
    from models import load_encoder

    with load_encoder() as encoder:
        print(json.dumps(asdict(encoder.report), indent=2))


@bench_app.command("embed")
def bench_embed(
    docs: Annotated[int, typer.Option(min=16, help="Texts from the corpus, in file order.")] = 800,
    repeats: Annotated[int, typer.Option(min=3, help="Timed repeats after warm-up; the median is reported.")] = 3,
    corpus: Annotated[str | None, typer.Option(help="Parquet with a `text` column; default: the demo corpus.")] = None,
) -> None:
    """Our best engine against sentence-transformers FP32 (PyTorch): docs/s, ratio, cosine to FP32."""
    from bench.embed import main

    main(docs, repeats, corpus)
