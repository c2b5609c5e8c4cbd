"""Held-out texts for the accuracy gate and calibration texts for static INT8, never overlapping.

Rows are assigned by a hash of their id, so the split is stable across runs and
independent of row order: the gate never scores an engine on texts that set its ranges.
"""

from __future__ import annotations

import hashlib
from typing import Literal

import pyarrow as pa
import pyarrow.dataset as pads
from pydantic import BaseModel, ConfigDict

from models.errors import ModelError
from models.text_columns import decodable_rows

SPLIT_SLOT = {"gate": 0, "calibration": 1}


class TextSample(BaseModel):
    """A Parquet input's texts, by the names of its id and text columns."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    """Local path or object-store URI."""
    id: str = "id"
    text: str = "text"


def split_slot(id_: object) -> int:
    """The row's slot of ten: 0 is the gate's, 1 calibration's, the rest free (training)."""
    return hashlib.sha256(str(id_).encode()).digest()[0] % 10


def reference_texts(sample: TextSample, purpose: Literal["gate", "calibration"], count: int) -> list[str]:
    """The first `count` texts of the input whose id hashes into the purpose's slot (1 in 10)."""
    try:
        table = pads.dataset(sample.path, format="parquet").to_table(columns=[sample.id, sample.text])
    except (OSError, pa.ArrowException) as e:
        raise ModelError(
            f"reference texts {sample.path}: cannot read columns {sample.id}, {sample.text} ({e})"
        ) from e
    slot = SPLIT_SLOT[purpose]
    texts = [
        text
        for row in decodable_rows(table)  # a row of invalid UTF-8 is the job's to quarantine
        if isinstance(text := row[sample.text], str) and text.strip() and split_slot(row[sample.id]) == slot
    ]
    if len(texts) < count:
        raise ModelError(
            f"reference texts {sample.path}: {len(texts)} {purpose} texts, {count} needed "
            f"(set PRECOMPUTE_ENGINE_{'GATE' if purpose == 'gate' else 'CALIBRATION'}_TEXTS lower)"
        )
    return texts[:count]
