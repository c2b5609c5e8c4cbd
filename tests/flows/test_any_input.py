"""Property: any input a user could reasonably have either publishes or is refused in one line.

Hypothesis draws the three outputs' inputs over every accepted column type (ids, text, labels,
time, weights), every source form (a file, a folder, hive partitions with `where`, CSV, JSON
Lines) and the shapes that break naive code (one row, fewer items than k, a catalogue smaller
than every sample size, one interaction per user, every interaction on one item, a class with
one row). For each, `precompute check` and `precompute run` exit 0, or exit 1 or 2 with only
their one-line errors and no traceback; an output that failed has no version, one that ran has
exactly one. The quality gates are opened (min_lift 0.01, max_baseline_loss 1): the property is about
inputs, and a tiny random catalogue loses to most-popular. CI runs a fixed budget (the explicit
example, which must publish all three outputs, one drawn run and 25 checks);
PRECOMPUTE_PROPERTY_EXAMPLES=N runs N and 8N checks, drawn afresh (`--hypothesis-show-statistics` tallies the outcomes).
"""

from __future__ import annotations

import datetime
import decimal
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, Phase, event, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from precompute.cli.main import app
from precompute.demo_data import DEMO_CORPUS
from precompute.stores.key_value.settings import RedisSettings
from precompute.stores.key_value.store import KeyValueStore
from precompute.stores.vectors import open_vector_store
from precompute.stores.vectors.settings import VectorStoreSettings

pytestmark = pytest.mark.slow  # seconds to minutes each: left out of `pytest -m "not slow"`

WIDER = os.environ.get("PRECOMPUTE_PROPERTY_EXAMPLES")
RUNS = int(WIDER or 1)
CHECKS = max(25, RUNS * 8)
BUDGET = {"deadline": None, "database": None, "derandomize": WIDER is None, "suppress_health_check": list(HealthCheck)}
"""CI's examples are the same each time (derandomized); a wider run draws afresh. A run takes
about 40 s here, so failing examples are reported as drawn, not shrunk."""
TEXTS = pq.read_table(DEMO_CORPUS, columns=["text", "section"]).slice(0, 400).to_pylist()
START = datetime.datetime(2026, 11, 1, tzinfo=datetime.UTC)

ID_TYPES = ["int32", "int64", "string", "large_string", "dictionary", "binary"]
REFUSED_ID_TYPES = ["float64"]
"""Not an id: the check refuses it in one line (exit 2), and nothing runs."""
TEXT_TYPES = ["string", "large_string", "dictionary", "binary"]
LABEL_TYPES = ["string", "int64", "dictionary", "list<string>", "list<int64>"]
TIME_TYPES = ["timestamp[s]", "timestamp[ms, UTC]", "timestamp[ns, Europe/Paris]", "date32", "seconds", "millis", "iso"]
WEIGHT_TYPES = ["none", "int64", "float32", "bool", "decimal"]
SOURCES = ["file", "folder", "hive", "csv", "jsonl"]
SHAPES = ["varied", "one interaction per user", "one item for all"]


def column(values: list, kind: str) -> pa.Array:
    """`values` (ints, strings, lists of either) as the Arrow type a warehouse would write."""
    if kind in ("int32", "int64", "float64"):
        return pa.array(values, getattr(pa, kind)())
    if kind == "dictionary":
        return pa.array([None if v is None else str(v) for v in values]).dictionary_encode()
    if kind == "binary":
        return pa.array([None if v is None else str(v).encode() for v in values], pa.binary())
    if kind == "list<int64>":
        return pa.array(values, pa.list_(pa.int64()))
    if kind == "list<string>":
        return pa.array([[str(x) for x in v] for v in values], pa.list_(pa.string()))
    return pa.array([None if v is None else str(v) for v in values], getattr(pa, kind)())


def times(count: int, kind: str) -> pa.Array:
    moments = [START + datetime.timedelta(hours=i) for i in range(count)]
    if kind.startswith("timestamp"):
        unit, _, zone = kind[len("timestamp[") : -1].partition(", ")
        return pa.array(moments, pa.timestamp(unit, tz="UTC")).cast(pa.timestamp(unit, tz=zone or None))
    if kind == "date32":
        return pa.array([m.date() for m in moments], pa.date32())
    seconds = [int(m.timestamp()) for m in moments]
    if kind == "iso":
        return pa.array([m.isoformat() for m in moments])
    return pa.array([s * 1000 for s in seconds] if kind == "millis" else seconds, pa.int64())


def weights(count: int, kind: str) -> pa.Array:
    values = [1 + i % 3 for i in range(count)]
    if kind == "bool":
        return pa.array([v > 1 for v in values])
    if kind == "decimal":
        return pa.array([decimal.Decimal(v) / 2 for v in values], pa.decimal128(6, 2))
    return pa.array(values, getattr(pa, kind)())


@st.composite
def inputs(draw: st.DrawFn) -> dict:
    # Tiny shapes, and sizes the outputs can publish from, about equally often.
    return {
        "rows": draw(st.one_of(st.integers(1, 8), st.integers(30, 80))),
        "id": draw(st.one_of(st.sampled_from(ID_TYPES), st.sampled_from(REFUSED_ID_TYPES))),
        "text": draw(st.sampled_from(TEXT_TYPES)),
        "label": draw(st.sampled_from(LABEL_TYPES)),
        "classes": draw(st.one_of(st.just(1), st.integers(2, 4))),
        "user": draw(st.sampled_from(ID_TYPES)),
        "time": draw(st.sampled_from(TIME_TYPES)),
        "weight": draw(st.sampled_from(WEIGHT_TYPES)),
        "users": draw(st.one_of(st.integers(1, 3), st.integers(20, 40))),
        "shape": draw(st.one_of(st.just(SHAPES[0]), st.sampled_from(SHAPES[1:]))),
        "source": draw(st.sampled_from(SOURCES)),
        "k": draw(st.integers(1, 50)),
    }


def write(table: pa.Table, folder: Path, name: str, source: str) -> tuple[str, str]:
    """The table as `source` says, under folder/name; (its path for the pipeline file, extra keys)."""
    base = folder / name
    if source in ("csv", "jsonl"):
        plain = pa.table({c: _plain(table[c]) for c in table.column_names})
        if source == "csv":
            pcsv.write_csv(plain, f"{base}.csv")
        else:
            Path(f"{base}.jsonl").write_text(plain.to_pandas().to_json(orient="records", lines=True))
        return f"{base}.{source}", ""
    if source == "file":
        pq.write_table(table, f"{base}.parquet")
        return f"{base}.parquet", ""
    half = max(1, table.num_rows // 2)
    parts = [table.slice(0, half), table.slice(half)]
    for i, part in enumerate(parts):
        folder_of = base / (f"dt=2026-11-2{5 + i}" if source == "hive" else "")
        folder_of.mkdir(parents=True, exist_ok=True)
        pq.write_table(part, folder_of / f"part-{i}.parquet")
    if source == "hive":
        pq.write_table(table.slice(0, 1), _day(base, "2026-11-01"))  # not read: where leaves it out
        return str(base), ', where = { dt = ["2026-11-25", "2026-11-26"] }'
    return str(base), ""


def _day(base: Path, day: str) -> Path:
    (base / f"dt={day}").mkdir(parents=True, exist_ok=True)
    return base / f"dt={day}" / "part-0.parquet"


def _plain(values: pa.ChunkedArray) -> pa.Array:
    """What a CSV or JSON file can say: scalars as numbers or text, lists as the first element."""
    kind = values.type
    if pa.types.is_list(kind):
        return pa.array([v[0] if v else None for v in values.to_pylist()])
    if pa.types.is_dictionary(kind) or pa.types.is_binary(kind) or pa.types.is_large_string(kind):
        return values.cast(pa.string()) if not pa.types.is_binary(kind) else pa.array(
            [None if v is None else v.decode() for v in values.to_pylist()]
        )
    if pa.types.is_timestamp(kind) or pa.types.is_date(kind):
        return values.cast(pa.string())
    if pa.types.is_decimal(kind):
        return values.cast(pa.float64())
    return values


def pipeline_of(drawn: dict, folder: Path) -> Path:
    rows = TEXTS[: drawn["rows"]]
    ids = list(range(1, len(rows) + 1))
    classes = drawn["classes"]
    labels = [i % classes for i in range(len(rows))]
    if drawn["label"].startswith("list"):
        labels = [[label] for label in labels]
    corpus = pa.table(
        {
            "id": column(ids, drawn["id"]),
            "text": column([r["text"] for r in rows], drawn["text"]),
            "label": column(labels, drawn["label"]),
        }
    )
    users = list(range(1, drawn["users"] + 1))
    if drawn["shape"] == "one interaction per user":
        pairs = [(u, ids[u % len(ids)]) for u in users]
    elif drawn["shape"] == "one item for all":
        pairs = [(u, ids[0]) for u in users]
    else:
        # Each user takes items of one class, in order: something a model can learn.
        pairs = [(u, ids[(u % classes + classes * j) % len(ids)]) for u in users for j in range(4)]
    interactions = {
        "user_id": column([u for u, _ in pairs], drawn["user"]),
        "item_id": column([i for _, i in pairs], drawn["id"]),
        "timestamp": times(len(pairs), drawn["time"]),
    }
    if drawn["weight"] != "none":
        interactions["weight"] = weights(len(pairs), drawn["weight"])
    corpus_path, corpus_where = write(corpus, folder, "corpus", drawn["source"])
    interactions_path, interactions_where = write(pa.table(interactions), folder, "interactions", drawn["source"])
    path = folder / "precompute.toml"
    path.write_text(
        f"""
[outputs.embeddings]
kind = "embeddings"
input = {{ path = "{corpus_path}"{corpus_where} }}

[outputs.labels]
kind = "labels"
input = {{ path = "{corpus_path}", label = "label"{corpus_where} }}
train_texts = 400
fine_tune_seconds = 0
max_baseline_loss = 1.0

[outputs.recs]
kind = "recs"
input = {{ path = "{interactions_path}"{interactions_where} }}
items = "embeddings"
k = {drawn["k"]}
min_lift = 0.01
"""
    )
    return path


def one_line_errors(stderr: str) -> bool:
    lines = [line for line in stderr.splitlines() if line.strip()]
    return bool(lines) and "Traceback" not in stderr and all(line.startswith(("error: ", "report: ")) for line in lines)


@settings(max_examples=CHECKS, **BUDGET)
@given(drawn=inputs())
def test_any_input_is_checked_or_refused_in_one_line(drawn: dict) -> None:
    with tempfile.TemporaryDirectory() as folder:
        result = CliRunner().invoke(app, ["check", "--pipeline", str(pipeline_of(drawn, Path(folder)))])
    assert result.exit_code in (0, 2), result.output
    event(f"check exit {result.exit_code}: {result.stderr.split(':')[-1].strip()[:60]}")
    if result.exit_code == 2:
        assert one_line_errors(result.stderr), result.stderr


PUBLISHES = {
    "rows": 60,
    "id": "int64",
    "text": "dictionary",
    "label": "list<string>",
    "classes": 3,
    "user": "large_string",
    "time": "timestamp[ms, UTC]",
    "weight": "decimal",
    "users": 30,
    "shape": "varied",
    "source": "hive",
    "k": 10,
}
"""A warehouse-like input every output publishes from: hive partitions, integer ids, dictionary text."""


@settings(max_examples=RUNS, phases=[Phase.explicit, Phase.generate], **BUDGET)
@example(drawn=PUBLISHES)
@given(drawn=inputs())
def test_any_input_publishes_or_fails_in_one_line_without_a_partial_version(
    prefect_api: str, engine_cache: Path, redis_url: str, tmp_path_factory: pytest.TempPathFactory, drawn: dict
) -> None:
    """`precompute run` in its own process, as a user runs it: what it prints is what they see."""
    folder = tmp_path_factory.mktemp("any")
    env = {
        **os.environ,
        "PREFECT_API_URL": prefect_api,
        "PRECOMPUTE_REDIS_URL": redis_url,
        "PRECOMPUTE_REDIS_PREFIX": f"any{folder.name}",
        "PRECOMPUTE_JOB_WORK_DIR": str(folder / "work"),
        "PRECOMPUTE_QDRANT_PATH": str(folder / "qdrant"),
        "PRECOMPUTE_ENGINE_CACHE_DIR": str(engine_cache),
    }
    run = subprocess.run(
        [sys.executable, "-m", "precompute", "run", "--pipeline", str(pipeline_of(drawn, folder))],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode in (0, 1, 2), run.stderr
    assert run.returncode == 0 or drawn is not PUBLISHES, run.stderr
    event(f"shape: {drawn['shape']}, {drawn['rows']} rows, {drawn['users']} users")
    for line in run.stderr.splitlines() or ["published"]:
        if not line.startswith("report: "):
            event(f"run exit {run.returncode}: {line[:100]}")
    if run.returncode:
        assert one_line_errors(run.stderr), run.stderr
    failed = {line.split()[1] for line in run.stderr.splitlines() if line.startswith("error: ")}
    ran = run.returncode != 2
    with pytest.MonkeyPatch.context() as patch:
        for name in ("PRECOMPUTE_REDIS_URL", "PRECOMPUTE_REDIS_PREFIX", "PRECOMPUTE_QDRANT_PATH"):
            patch.setenv(name, env[name])
        with open_vector_store(VectorStoreSettings(), "embeddings") as store:
            assert len(store.versions()) == int(ran and "embeddings" not in failed), run.stderr
        with KeyValueStore(RedisSettings()) as store:
            for output in ("labels", "recs"):
                assert len(store.versions(output)) == int(ran and output not in failed), (output, run.stderr)
    # One Ray a night: the first job's serves the others, unless an output failed before them.
    starts = sum(log.read_text().count("Started a local Ray instance") for log in (folder / "work").glob("logs/*.log"))
    assert starts <= 1 + len(failed), run.stderr
