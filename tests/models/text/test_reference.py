"""Gate and calibration texts on inputs of every size (models/text/reference.py): a large input
gives each purpose its own slot's texts, a small one lends both its free slots, half each, and
the engine's gate then says how few texts it rests on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from precompute.demo_data import DEMO_CORPUS
from precompute.models import Engine, load_encoder
from precompute.models.errors import ModelError
from precompute.models.text.reference import (
    FALLBACK_SLOTS,
    SPLIT_SLOT,
    TextSample,
    reference_texts,
    split_slot,
)


def corpus(tmp_path: Path, rows: int) -> TextSample:
    """`rows` demo texts under ids of their own (the demo file is ordered by slot), each distinct."""
    texts = pq.read_table(DEMO_CORPUS, columns=["text"])["text"].to_pylist()[:rows]
    table = pa.table({"id": [f"row-{i}" for i in range(rows)], "text": [f"{t} ({i})" for i, t in enumerate(texts)]})
    pq.write_table(table, tmp_path / "small.parquet")
    return TextSample(path=str(tmp_path / "small.parquet"))


def slots_of(sample: TextSample, texts: list[str]) -> set[int]:
    table = pq.read_table(sample.path).to_pylist()
    return {split_slot(row["id"]) for row in table if row["text"] in texts}


def test_a_large_input_gives_each_purpose_its_own_slot(tmp_path: Path) -> None:
    sample = corpus(tmp_path, 5000)
    gate, calibration = reference_texts(sample, "gate", 256), reference_texts(sample, "calibration", 128)
    assert (len(gate), len(calibration)) == (256, 128)
    assert slots_of(sample, gate) == {SPLIT_SLOT["gate"]} and slots_of(sample, calibration) == {SPLIT_SLOT["calibration"]}


def test_a_small_input_lends_its_free_slots_half_each_never_the_same_text(tmp_path: Path) -> None:
    sample = corpus(tmp_path, 300)
    gate, calibration = reference_texts(sample, "gate", 256), reference_texts(sample, "calibration", 128)
    assert 100 < len(gate) < 256 and 100 < len(calibration) <= 128
    assert not set(gate) & set(calibration)
    assert slots_of(sample, gate) <= {SPLIT_SLOT["gate"], *FALLBACK_SLOTS["gate"]}
    assert slots_of(sample, calibration) <= {SPLIT_SLOT["calibration"], *FALLBACK_SLOTS["calibration"]}


def test_an_input_of_one_row_gates_and_calibrates_on_it(tmp_path: Path) -> None:
    sample = corpus(tmp_path, 1)
    only = pq.read_table(sample.path)["text"].to_pylist()
    assert reference_texts(sample, "gate", 256) == reference_texts(sample, "calibration", 128) == only


def test_an_input_without_a_text_is_refused_by_name(tmp_path: Path) -> None:
    pq.write_table(pa.table({"id": ["a"], "text": ["  "]}), tmp_path / "blank.parquet")
    with pytest.raises(ModelError, match=r"blank.parquet: 0 gate texts, at least 1 needed"):
        reference_texts(TextSample(path=str(tmp_path / "blank.parquet")), "gate", 256)


@pytest.mark.slow
def test_the_gate_on_a_300_row_input_passes_at_the_default_sizes_and_says_it_rests_on_few_texts(
    settings: Engine, bundled_cache: dict[str, Path], tmp_path: Path
) -> None:
    sample = corpus(tmp_path, 300)
    engine = settings.replace(reference=sample, gate_texts=256, calibration_texts=128)
    with load_encoder(engine) as encoder:
        gate = encoder.report.gates[-1]
    assert gate.passed and gate.texts == len(reference_texts(sample, "gate", 256)) < 256
    assert gate.note == f"rests on {gate.texts} held-out texts, 256 asked: the input has few rows"


READ_BYTES = """
import gc, os, sys
from precompute.models.text.reference import TextSample, reference_texts
def read() -> int:
    return int(open("/proc/self/io").read().split("rchar: ")[1].split()[0])
before = read()
texts = reference_texts(TextSample(path=sys.argv[1]), "gate", 64)
gc.collect()
print(len(texts), (read() - before) / os.path.getsize(sys.argv[1]))
"""


def test_the_gate_texts_of_a_large_file_are_read_from_its_first_row_group_alone(tmp_path: Path) -> None:
    """Every engine process takes its gate texts here: reading must stop where they are found,
    not in a scanner that reads on when dropped (it read 5 of these 8 row groups, and most of a
    1M-row corpus, whose memory the process kept). Bytes read by a process of its own (rchar)."""
    rows = 64_000  # 8 row groups of 8,000; the 64 texts of one slot in ten are in the first
    table = pa.table({"id": [f"row-{i}" for i in range(rows)], "text": [os.urandom(150).hex() for _ in range(rows)]})
    pq.write_table(table, tmp_path / "large.parquet", row_group_size=8_000)
    result = subprocess.run(
        [sys.executable, "-c", READ_BYTES, str(tmp_path / "large.parquet")], capture_output=True, text=True, check=True
    )
    texts, share = result.stdout.split()
    assert int(texts) == 64 and float(share) < 0.25  # one row group is 1/8 of the file
