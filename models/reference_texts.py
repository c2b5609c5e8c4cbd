"""Held-out texts for the accuracy gate and calibration texts for static INT8, never overlapping.

Rows are assigned by a hash of their id, so the split is stable across runs and
independent of row order: the gate never scores an engine on texts that set its ranges.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Literal

import pyarrow.parquet as pq

from models.errors import ModelError

SPLIT_SLOT = {"gate": 0, "calibration": 1}


def split_slot(id_: object) -> int:
    """The row's slot of ten: 0 is the gate's, 1 calibration's, the rest free (training)."""
    return hashlib.sha256(str(id_).encode()).digest()[0] % 10


def reference_texts(path: Path, purpose: Literal["gate", "calibration"], count: int) -> list[str]:
    """The first `count` texts of the corpus whose id hashes into the purpose's slot (1 in 10)."""
    try:
        table = pq.read_table(path, columns=["id", "text"])
    except (OSError, KeyError) as e:
        raise ModelError(f"reference_corpus {path}: cannot read columns id, text ({e})") from e
    slot = SPLIT_SLOT[purpose]
    texts = [
        text
        for id_, text in zip(table["id"].to_pylist(), table["text"].to_pylist(), strict=True)
        if text and split_slot(id_) == slot
    ]
    if len(texts) < count:
        raise ModelError(
            f"reference_corpus {path}: {len(texts)} {purpose} texts, {count} needed "
            f"(set PRECOMPUTE_ENGINE_{'GATE' if purpose == 'gate' else 'CALIBRATION'}_TEXTS lower)"
        )
    return texts[:count]
