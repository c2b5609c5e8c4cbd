"""The pipeline file: the shipped one is the demo; each mistake is one line naming file, output and field."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from precompute.cli.main import app
from precompute.demo_data import DEMO_CORPUS, DEMO_INTERACTIONS
from precompute.kinds import PipelineError
from precompute.pipeline import load_pipeline, schema
from tests.models.tiny import tiny_encoder, tiny_towers

CORPUS = f'input = {{ path = "{DEMO_CORPUS}" }}'


def write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "precompute.toml"
    path.write_text(body)
    return path


def test_the_shipped_file_is_the_demo() -> None:
    pipeline = load_pipeline()
    pipeline.check()
    assert list(pipeline.outputs) == ["embeddings", "labels", "recs", "related"]
    assert [pipeline.default(kind) for kind in ("embeddings", "labels", "recs", "related")] == list(pipeline.outputs)
    assert pipeline.declared["embeddings"].store == "corpus"
    assert pipeline.declared["embeddings"].source.dim == 384
    assert pipeline.outputs["labels"].input.sample().path == str(DEMO_CORPUS)
    assert "outputs" in json.loads(schema())["properties"]


def test_an_environment_variable_overrides_one_field(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRECOMPUTE_OUTPUTS__EMBEDDINGS__KEEP_VERSIONS", "7")
    pipeline = load_pipeline()
    assert pipeline.outputs["embeddings"].keep_versions == 7
    assert pipeline.outputs["embeddings"].input.path == str(DEMO_CORPUS)  # the rest as in the file


def test_vector_quantization_is_set_per_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    body = f'[outputs.a]\nkind = "embeddings"\n{CORPUS}\nquantization = "int8"\n'
    path = write(tmp_path, body + f'[outputs.b]\nkind = "embeddings"\n{CORPUS}\n')
    pipeline = load_pipeline(path)
    assert (pipeline.outputs["a"].quantization, pipeline.outputs["b"].quantization) == ("int8", "none")
    monkeypatch.setenv("PRECOMPUTE_OUTPUTS__B__QUANTIZATION", "int8")
    assert load_pipeline(path).outputs["b"].quantization == "int8"
    monkeypatch.setenv("PRECOMPUTE_OUTPUTS__B__QUANTIZATION", "int4")
    with pytest.raises(PipelineError, match=r"outputs\.b\.quantization: Input should be 'none' or 'int8'"):
        load_pipeline(path)


@pytest.mark.parametrize(
    ("body", "where", "message"),
    [
        (f'[outputs.docs]\nkind = "embeddings"\n{CORPUS}\nkeep = 3', "outputs.docs.keep", "unknown key"),
        (
            f'[outputs.docs]\nkind = "embeddings"\n{CORPUS}\nmodel = {{ path = "no/such/folder" }}',
            "outputs.docs.model",
            "does not exist",
        ),
        (
            f'[outputs.docs]\nkind = "embeddings"\ninput = {{ path = "{DEMO_CORPUS}", text = "body" }}',
            "outputs.docs.input.text",
            "column 'body' is not in",
        ),
        (
            f'[outputs.docs]\nkind = "embeddings"\n{CORPUS}\nqueries = {{ path = "{DEMO_CORPUS}", text = "query" }}',
            "outputs.docs.queries.text",
            "column 'query' is not in",
        ),
        (
            f'[outputs.a]\nkind = "embeddings"\n{CORPUS}\n[outputs.b]\nkind = "embeddings"\n{CORPUS}\nstore = "a"',
            "outputs.b.store",
            "qdrant store 'a' is written by output 'a' too",
        ),
        (
            '[outputs.docs]\nkind = "embeddings"\ninput = { path = "missing.parquet" }',
            "outputs.docs.input.path",
            "missing.parquet: no such file, or no files in it",
        ),
        (
            f'[outputs.tags]\nkind = "labels"\n{CORPUS}',
            "outputs.tags",
            "set input.label (the label column a head learns from), labels (zero-shot) or classifier",
        ),
        (
            f'[outputs.tags]\nkind = "labels"\n{CORPUS}\nlabels = ["a", "b"]\nclassifier = {{ path = "x" }}',
            "outputs.tags",
            "a classifier labels by itself: set classifier or labels, not both",
        ),
        (
            f'[outputs.tags]\nkind = "labels"\ninput = {{ path = "{DEMO_CORPUS}", label = "section" }}\nlabels = ["a", "b"]\nmulti_label = true',
            "outputs.tags",
            "with input.label, a list column gives several labels per row: drop multi_label",
        ),
        (
            f'[outputs.tags]\nkind = "labels"\n{CORPUS}\nlabels = ["games", "net"]\nprompt = "About this."',
            "outputs.tags.prompt",
            "prompt must hold {description} or {label}",
        ),
        (
            f'[outputs.tags]\nkind = "labels"\n{CORPUS}\nlabels = ["games", {{ label = "games", description = "play" }}]',
            "outputs.tags.labels",
            "labels are named once each: 'games' repeat",
        ),
        (
            '[outputs.recs]\nkind = "recs"\ninput = { path = "x.parquet" }\nitems = "docs"',
            "outputs.recs.items",
            "no output named 'docs'",
        ),
    ],
)
def test_each_mistake_is_one_line_naming_file_output_and_field(
    body: str, where: str, message: str, tmp_path: Path
) -> None:
    path = write(tmp_path, body)
    with pytest.raises(PipelineError) as raised:
        load_pipeline(path).check()
    line = str(raised.value)
    assert line.startswith(f"{path}: {where}") and message in line and "\n" not in line


@pytest.mark.parametrize(
    ("data", "field", "message"),
    [
        ("not a Parquet file", "input.path", "cannot read parquet at"),
        (
            pa.table({"id": pa.array([], pa.string()), "text": pa.array([], pa.string())}),
            "input.path",
            "holds no rows",
        ),
        (
            pa.table({"id": ["a"], "text": [1]}),
            "input.text",
            "column 'text' of {path} is int64, not strings or UTF-8 bytes",
        ),
        (pa.table({"id": [1.5], "text": ["a"]}), "input.id", "column 'id' of {path} is double, not strings"),
    ],
)
def test_an_input_no_job_could_read_is_refused_before_any_job(
    data: str | pa.Table, field: str, message: str, tmp_path: Path
) -> None:
    data_path = tmp_path / "corpus.parquet"
    if isinstance(data, str):
        data_path.write_text(data)
    else:
        pq.write_table(data, data_path)
    path = write(tmp_path, '[outputs.docs]\nkind = "embeddings"\ninput = { path = "corpus.parquet" }')
    with pytest.raises(PipelineError) as raised:
        load_pipeline(path).check()
    line = str(raised.value)
    assert line.startswith(f"{path}: outputs.docs.{field}: ") and message.format(path=data_path) in line
    assert "\n" not in line


def test_an_unsupported_architecture_is_named(tmp_path: Path) -> None:
    folder = tiny_encoder(tmp_path / "model", "bert", pooling="mean")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "gpt2"}))
    path = write(tmp_path, f'[outputs.docs]\nkind = "embeddings"\n{CORPUS}\nmodel = {{ path = "model" }}')
    with pytest.raises(PipelineError, match=r"outputs\.docs\.model: .*architecture 'gpt2' is not supported"):
        load_pipeline(path).check()


def test_check_prints_the_plan_and_refuses_a_bad_file_with_exit_code_2(tmp_path: Path) -> None:
    runner = CliRunner()
    tiny_encoder(tmp_path / "model", "distilbert", pooling="cls")
    good = write(
        tmp_path,
        f'[outputs.docs]\nkind = "embeddings"\n{CORPUS}\nmodel = {{ path = "model" }}\nstore = "docs_v1"',
    )
    result = runner.invoke(app, ["check", "--pipeline", str(good)])
    assert result.exit_code == 0, result.output
    assert "docs (embeddings, default route)" in result.output
    assert "(distilbert, 32-d, cls pooling, normalised" in result.output
    assert "collection 'docs_v1'" in result.output

    bad = write(tmp_path, f'[outputs.docs]\nkind = "embeddings"\n{CORPUS}\nkeep = 1')
    result = runner.invoke(app, ["check", "--pipeline", str(bad)])
    assert result.exit_code == 2
    assert result.output.strip() == f"error: {bad}: outputs.docs.keep: unknown key"


def towers_pipeline(tmp_path: Path, towers: str, model: str = "towers") -> Path:
    """A recs output over the demo's interactions with towers in tmp_path (relative paths)."""
    user, item = tiny_towers(tmp_path)
    assert (user.name, item.name) == ("user.onnx", "item.onnx")
    pq.write_table(
        pa.table({"user_id": ["u"], "age": [30.0], "taste": [[0.1] * 8]}), tmp_path / "users.parquet"
    )
    pq.write_table(pa.table({"item_id": ["i"], "category": [1], "price": [9.5]}), tmp_path / "items.parquet")
    return write(
        tmp_path,
        f'[outputs.embeddings]\nkind = "embeddings"\n{CORPUS}\n'
        f'[outputs.recs]\nkind = "recs"\ninput = {{ path = "{DEMO_INTERACTIONS}" }}\nitems = "embeddings"\n'
        f'model = "{model}"\ntowers = {towers}\n',
    )


TOWERS = (
    '{ user = "user.onnx", item = "item.onnx", users = { path = "users.parquet", id = "user_id" }, '
    'items = { path = "items.parquet", id = "item_id" } }'
)


def test_a_users_own_towers_are_read_relative_to_the_file_and_checked(tmp_path: Path) -> None:
    pipeline = load_pipeline(towers_pipeline(tmp_path, TOWERS))
    pipeline.check()
    towers = pipeline.outputs["recs"].towers
    assert towers is not None
    assert (towers.user, towers.users.path) == (str(tmp_path / "user.onnx"), str(tmp_path / "users.parquet"))
    assert pipeline.outputs["recs"].input.user == "user_id"  # column names stay names
    assert pipeline.outputs["recs"].recs().model == "towers"


@pytest.mark.parametrize(
    ("towers", "model", "where", "message"),
    [
        (TOWERS, "auto", "outputs.recs", 'model = "towers" and the towers table go together'),
        (
            TOWERS.replace('id = "user_id"', 'id = "uid"'),
            "towers",
            "outputs.recs.towers.users",
            "column 'uid'",
        ),
        (
            TOWERS.replace("users.parquet", "items.parquet"),
            "towers",
            "outputs.recs.towers.users",
            "column 'user_id'",
        ),
        (
            TOWERS.replace('user = "user.onnx"', 'user = "users.parquet"'),
            "towers",
            "outputs.recs.towers.user",
            "users.parquet: not a graph",
        ),
        (
            TOWERS.replace('user = "user.onnx"', 'user = "none.onnx"'),
            "towers",
            "outputs.recs.towers.user",
            "cannot read",
        ),
    ],
)
def test_towers_that_could_not_run_are_refused_in_one_line(
    towers: str, model: str, where: str, message: str, tmp_path: Path
) -> None:
    path = towers_pipeline(tmp_path, towers, model)
    with pytest.raises(PipelineError) as raised:
        load_pipeline(path).check()
    line = str(raised.value)
    assert line.startswith(f"{path}: {where}") and message in line and "\n" not in line


def test_a_feature_column_of_the_wrong_type_is_named(tmp_path: Path) -> None:
    path = towers_pipeline(tmp_path, TOWERS)
    pq.write_table(
        pa.table({"user_id": ["u"], "age": ["old"], "taste": [[0.1] * 8]}), tmp_path / "users.parquet"
    )
    with pytest.raises(
        PipelineError, match=r"outputs\.recs\.towers\.users: column 'age' of .* is string, not numbers"
    ):
        load_pipeline(path).check()


@pytest.mark.parametrize("command", ["check", "run", "serve", "schedule", "status", "rollback recs"])
def test_every_command_refuses_a_bad_file_in_one_line_with_exit_code_2(command: str, tmp_path: Path) -> None:
    bad = write(tmp_path, f'[outputs.docs]\nkind = "embeddings"\n{CORPUS}\nkeep = 1')
    result = CliRunner().invoke(app, [*command.split(), "--pipeline", str(bad)])
    assert result.exit_code == 2
    assert result.output.strip() == f"error: {bad}: outputs.docs.keep: unknown key"


@pytest.mark.parametrize(
    ("file", "environment", "message"),
    [
        (None, {"PRECOMPUTE_OUTPUTS__RECS__K": "abc"}, "outputs.recs.k: Input should be a valid integer"),
        (None, {"PRECOMPUTE_OUTPUTS__RECS__K": "101"}, "outputs.recs.k: Input should be less than or equal to 100"),
        ("k = 101", {}, "outputs.recs.k: Input should be less than or equal to 100"),
        ("k = 0", {}, "outputs.recs.k: Input should be greater than or equal to 1"),
        (None, {"PRECOMPUTE_OUTPUTS__EMBEDDINGS__KIND": "vectors"}, "outputs.embeddings.kind: 'vectors', not one of"),
    ],
)
def test_a_bad_value_from_the_file_or_the_environment_is_one_line_with_exit_code_2(
    file: str | None, environment: dict[str, str], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(
        tmp_path,
        f'[outputs.embeddings]\nkind = "embeddings"\n{CORPUS}\n'
        f'[outputs.recs]\nkind = "recs"\ninput = {{ path = "{DEMO_INTERACTIONS}" }}\nitems = "embeddings"\n'
        f"{file or ''}\n",
    )
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    result = CliRunner().invoke(app, ["check", "--pipeline", str(path)])
    assert result.exit_code == 2
    (line,) = result.output.strip().splitlines()
    assert line.startswith(f"error: {path}: {message}"), line
