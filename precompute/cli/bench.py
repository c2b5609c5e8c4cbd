"""`precompute bench ...`: each benchmark times our path and the baseline a user would otherwise pick."""

from __future__ import annotations

from typing import Annotated

import typer

bench_app = typer.Typer(
    no_args_is_help=True,
    help="Benchmarks: our path and the baseline a user would otherwise pick, in one run. Last line JSON;"
    " each writes a record into bench/results/ (or $PRECOMPUTE_BENCH_RESULTS).",
)


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
    """Our best engine against sentence-transformers (FP32 on a CPU, FP16 on a GPU) and the ONNX
    Runtime FP32 graph: docs/s, ratios, and the engine's gate against FP32."""
    from precompute.bench.embed import main

    main(docs, repeats, corpus, model)


@bench_app.command("search")
def bench_search(
    rate: Annotated[float, typer.Option(min=1, help="Requests per second, open loop.")] = 20,
    requests: Annotated[int, typer.Option(min=50, help="Timed requests after warm-up.")] = 400,
) -> None:
    """Search p50/p99 through the service at a fixed rate, against sentence-transformers + qdrant-client local."""
    from precompute.bench.search.latency import main

    main(rate, requests)


@bench_app.command("fidelity")
def bench_fidelity(
    documents: Annotated[int, typer.Option(min=1000, help="Documents of the retrieval set (20 Newsgroups).")] = 10_000,
    queries: Annotated[int, typer.Option(min=100, help="Queries with a known answer, asked through the service.")] = 5_000,
) -> None:
    """Served search against the same model in FP32 with exact search on a public known-item set:
    top-10 overlap, recall@10 of the known answer, and latency by query length."""
    from precompute.bench.search.fidelity import main

    main(documents, queries)


@bench_app.command("quantize")
def bench_quantize(
    model: Annotated[str | None, typer.Option(help="A sentence-transformers folder; default: the bundled model.")] = None,
) -> None:
    """Each CPU INT8 graph against the FP32 graph in one run: known-item recall and MRR on a public
    set, documents per second in batches, single-query latency."""
    from precompute.bench.search.quantize import main

    main(model)


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
    from precompute.bench.search.vector_store import main

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
    from precompute.bench.search.query_engines import main

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
    from precompute.bench.scale.main import MIN_ROWS, main

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
        str,
        typer.Option(help="Comma-separated: demo, ml-100k, ml-1m, shop (generated orders); the last one's top-k speed is timed."),
    ] = "demo,ml-100k,ml-1m,shop",
    repeats: Annotated[int, typer.Option(min=1, help="Timed repeats; the median is reported.")] = 5,
) -> None:
    """Held-out HR@10 / NDCG@10 of the published model against item-kNN, content and most-popular on
    public data, and basket recall@10 and new-item NDCG@10 against personal top-frequency on a
    shop's orders; GFLOP/s of the top-k step against a plain GEMM."""
    from precompute.bench.recs.main import main

    main(datasets, repeats)


@bench_app.command("topk")
def bench_topk(
    items: Annotated[int, typer.Option(min=1_000, help="Synthetic items; a tenth as many users are searched.")] = 1_000_000,
    repeats: Annotated[int, typer.Option(min=1, help="Timed repeats; the median is reported.")] = 3,
    prior_weight: Annotated[
        float | None, typer.Option(min=0, help="The popularity prior's weight (default: the recs' default; bench scale ranks by 10).")
    ] = None,
) -> None:
    """The recommendations' index search (jobs/recs/topk/item_lists.py) against faiss's IVF search, and
    list by list with faiss.knn."""
    from precompute.bench.recs.topk import main

    main(items, repeats, prior_weight)


@bench_app.command("labels")
def bench_labels(
    datasets: Annotated[str, typer.Option(help="Comma-separated: demo, rotten-tomatoes, newsgroups; the first one's figures close the JSON line.")] = "demo,rotten-tomatoes,newsgroups",
    taxonomy_only: Annotated[
        bool, typer.Option("--taxonomy-only", help="The zero-shot and 8-shot columns alone, on sets with a taxonomy (no served run).")
    ] = False,
) -> None:
    """Top-1 of the served labels against TF-IDF + LinearSVC and logistic regression on FP32
    embeddings, on the same split of public labelled texts; each head candidate's training time;
    on sets with a taxonomy, zero-shot labels from a sentence per label against the nearest bare
    label name, and the few-shot head from 8 rows a label against logistic regression on them."""
    from precompute.bench.labels import main

    main(datasets, taxonomy_only)


@bench_app.command("report")
def bench_report(
    summary: Annotated[
        bool, typer.Option("--summary", help="Print the README's summary table instead of writing the page.")
    ] = False,
) -> None:
    """docs/benchmarks.md from the records in bench/results/ (or $PRECOMPUTE_BENCH_RESULTS): the
    newest record of each bench on each machine class."""
    from precompute.bench.records import results_dir
    from precompute.bench.report import page_path, render
    from precompute.bench.report import summary as summary_table

    if summary:
        print(summary_table(results_dir()))
        return
    page = page_path()
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(render(results_dir()))
    print(f"wrote {page}")
