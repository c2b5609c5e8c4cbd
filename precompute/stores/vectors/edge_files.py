"""Copying an edge shard's folder for a new version: shared by hard link where no write changes it.

Upserts over a built segment's points, deletes and `optimize()` write that segment's id
tracker and its payload storage's bitmask and tracker, never its vectors, INT8 codes, graph or
payload pages (seen on qdrant-edge-py 0.9.0: every file of a source compared byte for byte
after its copy's writes, which tests/stores/vectors/test_store.py does for each release).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

SHARED = {"matrix.dat", "quantized.data", "links_compressed.bin"}
"""Files of a built (HNSW) segment that no later write changes: its vectors, their INT8 codes and
its graph. An appendable segment keeps its vectors in chunk files under other names."""


def copy_shard(source: Path, target: Path, skipped: tuple[str, ...]) -> None:
    """A shard's folder copied for a new version but for the `skipped` names, sharing what it can."""
    shutil.copytree(source, target, ignore=shutil.ignore_patterns(*skipped), copy_function=share_or_copy)


def share_or_copy(source: str, target: str) -> None:
    """copytree's copy function for a version's copy: a hard link for what the copy never writes
    (the `SHARED` files and a built segment's payload pages), a copy for the rest.

    So a copy's bulk costs a link, and deleting either version frees only its own files: a
    night's copy and the deletion of the night before grow with the segments, not with the
    vectors (`bench scale`, stages qdrant_load and gc). Which files a copy writes is
    qdrant-edge's behaviour, not a documented contract, hence the test (module docstring).
    A file system without hard links gets copies.
    """
    path = Path(source)
    payload_page = (
        path.parent.name == "payload_storage"
        and path.name.startswith("page_")
        and (path.parent.parent / "vector_storage" / "matrix.dat").exists()
    )
    if path.name in SHARED or payload_page:
        try:
            os.link(source, target)
            return
        except OSError:
            pass
    shutil.copy2(source, target)
