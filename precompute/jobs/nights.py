"""Unchanged nights: a run whose inputs are exactly the published run's keeps what that run made.

Each run records in its folder what it was made from, as one digest (`inputs_digest`: the
input's files byte for byte, how they are read, the model and the settings), beside the figures
it recorded (`Night`, in night.json). The next run digests its own inputs before it reads a row;
when they equal the published run's (`same_night`), it copies what that run staged into its own
folder, its night.json included, and measures nothing again: the embeddings job skips
validation, the engine and inference (jobs/text/embed.py), the labels job also the head's labelling
(jobs/text/labels.py), the recommendations job validation, training and scoring (jobs/recs/state.py).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from precompute.jobs.work_dir import WorkPath, copy_file

NIGHT = "night.json"


def inputs_digest(files: str, *described: str | bytes | np.ndarray) -> str:
    """The input's `files` (their digest: models/datasets.py InputFiles.digest, computed once per
    job, as it reads every byte) and everything else a run is made from, `described` as text,
    bytes or arrays (settings as JSON, a model's hash, vectors), hashed together."""
    digest = hashlib.blake2b(digest_size=16)
    for part in (files, *described):
        data = part.encode() if isinstance(part, str) else part
        if isinstance(data, np.ndarray):
            data = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()


@dataclass(frozen=True)
class Night:
    """What a run was made from (`inputs`, a digest) and what it measured of it: what a rerun over
    the same inputs keeps instead of measuring again."""

    inputs: str
    figures: dict[str, Any]


@dataclass(frozen=True)
class Previous:
    """The published version a run may copy from."""

    version: str
    run_dir: WorkPath
    """Its run folder, holding what it staged and its night."""
    records: range
    """Record counts a copy of it holds well (the store says: stores/key_value/versions.py);
    past them a run writes every record."""


def record_night(folder: WorkPath, night: Night) -> None:
    (folder / NIGHT).write_text(json.dumps(asdict(night), indent=2))


def same_night(inputs: str, folder: WorkPath | None) -> Night | None:
    """The night recorded in `folder` when it was made from exactly `inputs`, else None (no
    folder, no record, a record of other inputs or in an older form)."""
    if folder is None or not (folder / NIGHT).is_file():
        return None
    recorded = json.loads((folder / NIGHT).read_text())
    if recorded.get("inputs") != inputs or "figures" not in recorded:
        return None
    return Night(recorded["inputs"], recorded["figures"])


def copy_files(source: WorkPath, target: WorkPath, names: Iterable[str]) -> None:
    """Each of `names` that `source` holds, copied into `target` (work_dir.copy_file: linked on
    local disk, server-side on object storage)."""
    target.mkdir()
    for name in names:
        if (file := source / name).is_file():
            copy_file(file.fs, file.path, (target / name).path)
