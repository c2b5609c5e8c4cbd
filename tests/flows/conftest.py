"""What the flow tests share: the small corpus's interactions, the three-output pipeline."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

THREE_OUTPUTS = """
[outputs.embeddings]
kind = "embeddings"
input = {{ path = "{corpus}", max_reject_ratio = 0.05 }}
store = "corpus"
engine = {{ gate_texts = 16, calibration_texts = 16 }}  # of the 20 the small corpus holds
queries = {{ path = "{corpus}", text = "title" }}  # the titles as users' searches

[outputs.labels]
kind = "labels"
input = {{ path = "{corpus}", label = "section", max_reject_ratio = 0.05 }}
train_texts = 400
fine_tune_seconds = 0
engine = {{ gate_texts = 16, calibration_texts = 16 }}

[outputs.recs]
kind = "recs"
input = {{ path = "{interactions}", max_reject_ratio = 0.05 }}
items = "embeddings"
k = 100  # past the 10 that fit Redis's listpack values: product pages show 20-50
"""
"""The demo's three outputs on the small corpus: format with corpus= and interactions= paths."""
CONTENT_RECS = THREE_OUTPUTS + 'model = "content"\n'
"""The same with content recs. Each test package has one maintainer, so a held-out package has no
training interaction and no collaborative model can find it (nor is it meant to: the quality
check refuses such a model); and content runs are incremental, where a collaborative model
retrained on moved interactions runs in full."""

LANGUAGES = """labels = [
    {{ label = "perl", description = "the Perl programming language and its modules" }},
    {{ label = "python", description = "the Python programming language and its modules" }},
    {{ label = "ocaml", description = "the OCaml programming language and its libraries" }},
    {{ label = "java", description = "the Java programming language and its libraries" }},
    {{ label = "golang", description = "the Go programming language and its packages" }},
    "documentation",
]
top = 1
engine = {{ gate_texts = 16, calibration_texts = 16 }}
"""
"""A labels output's taxonomy for the small corpus: five of its sections' languages, and one
label named alone (a table's lines, format-escaped like the pipelines around it)."""


def night_environment(
    monkeypatch: pytest.MonkeyPatch, pipeline: Path, folder: Path, redis_url: str, cache_dir: Path, prefix: str
) -> None:
    """The variables a night and the service read, as in production: the pipeline file, Redis
    (under its own key prefix), the work folder and Qdrant's in `folder`, the engine cache."""
    env = {
        "PRECOMPUTE_PIPELINE": str(pipeline),
        "PRECOMPUTE_REDIS_URL": redis_url,
        "PRECOMPUTE_REDIS_PREFIX": f"{prefix}{folder.name}",
        "PRECOMPUTE_JOB_WORK_DIR": str(folder / "work"),
        "PRECOMPUTE_QDRANT_PATH": str(folder / "qdrant"),
        "PRECOMPUTE_ENGINE_CACHE_DIR": str(cache_dir),
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)


@pytest.fixture(scope="module")
def interactions(small_corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Real relations of the test corpus: maintainers (users) x the packages they maintain."""
    corpus = pq.read_table(small_corpus).to_pylist()
    rows = [{"user_id": r["maintainer"], "item_id": r["id"]} for r in corpus if r["id"] not in (None, "dup")]
    path = tmp_path_factory.mktemp("interactions") / "interactions.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path
