"""The work directory: its layout, the paths in it on local disk or object storage, and the
clean-up that keeps it the size of what the stores hold.

    <work_dir>/runs/<output>/<version>/   a run's rejects and staged parts (jobs/staging.py)
    <work_dir>/cache/<output>/CURRENT     the run whose parts the next run reads (jobs/text/content_cache.py)
    <work_dir>/cache/<output>/items/      an embeddings output's versions sorted by id (jobs/recs/item_table.py)
    <work_dir>/cache/<output>/interactions/  a recs input's files validated (jobs/recs/history/interaction_files.py)
    <work_dir>/validated/<key>/           a corpus's validation, for any job reading the same files, and
    <work_dir>/validated/files/<key>/     each file's (jobs/text/corpus_validation.py)
    <work_dir>/reports/<run>.json|.html   run reports; metrics/ beside them

On a cluster without a shared filesystem the work directory is an object-store URI (s3://,
gs://...): inference actors on any node write the staged parts the driver publishes and the
next run reads. Logs and the one-run lock stay on the machine that runs the command.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import mmap
import os
import posixpath
import shutil
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from precompute.models.datasets import filesystem, with_endpoint

LOCAL_STATE = Path.home() / ".local" / "share" / "precompute"


@dataclass(frozen=True)
class WorkPath:
    """A file or folder of the work directory on its filesystem.

    The filesystem is pyarrow's, the one the inputs, Ray Data and Parquet use (with the S3
    endpoint of the environment it was made in, so actors elsewhere reach the same server);
    universal-pathlib would bring s3fs, a second S3 client with its own configuration. Object
    stores have no rename: a file is written aside and moved (a server-side copy there, atomic
    like a rename), so readers never see half a file."""

    fs: pafs.FileSystem = field(compare=False)
    """Not compared: pyarrow's filesystems are unhashable, and settings are hashed."""
    path: str
    scheme: str = ""
    """The URI scheme ("s3") for messages; empty on local disk."""

    @classmethod
    def of(cls, location: str | Path | WorkPath) -> WorkPath:
        """A local path or an object-store URI (AWS_ENDPOINT_URL(_S3) names an S3-compatible server)."""
        if isinstance(location, WorkPath):
            return location
        text = str(location)
        fs, path = filesystem(with_endpoint(text))
        return cls(fs, path, text.split("://", 1)[0] if "://" in text else "")

    def __truediv__(self, name: str) -> WorkPath:
        """`name` below this folder: a relative path with `..` resolved; an absolute one as itself."""
        return WorkPath(self.fs, posixpath.normpath(posixpath.join(self.path, name)), self.scheme)

    def __str__(self) -> str:
        return f"{self.scheme}://{self.path}" if self.scheme else self.path

    def as_uri(self) -> str:
        return str(self) if self.scheme else Path(self.path).as_uri()

    @property
    def name(self) -> str:
        return posixpath.basename(self.path)

    @property
    def parent(self) -> WorkPath:
        return WorkPath(self.fs, posixpath.dirname(self.path), self.scheme)

    @property
    def local(self) -> Path | None:
        """The path on local disk; None on object storage."""
        return None if self.scheme else Path(self.path)

    def _type(self) -> pafs.FileType:
        return self.fs.get_file_info(self.path).type

    def exists(self) -> bool:
        return self._type() != pafs.FileType.NotFound

    def is_file(self) -> bool:
        return self._type() == pafs.FileType.File

    def is_dir(self) -> bool:
        return self._type() == pafs.FileType.Directory

    def mkdir(self) -> None:
        """This folder and its parents (on object storage: nothing to make)."""
        if not self.scheme:
            self.fs.create_dir(self.path, recursive=True)

    def _listed(self) -> list[pafs.FileInfo]:
        return self.fs.get_file_info(pafs.FileSelector(self.path, allow_not_found=True))

    def iterdir(self) -> list[WorkPath]:
        return [WorkPath(self.fs, f.path, self.scheme) for f in self._listed()]

    def folders(self) -> list[WorkPath]:
        """The folders in this one, typed by the one listing: no request per entry on object storage."""
        return [
            WorkPath(self.fs, f.path, self.scheme)
            for f in self._listed()
            if f.type == pafs.FileType.Directory
        ]

    def glob(self, pattern: str) -> list[WorkPath]:
        """Entries of this folder whose names match `pattern`."""
        return [p for p in self.iterdir() if fnmatch.fnmatch(p.name, pattern)]

    def read_bytes(self) -> bytes:
        with self.fs.open_input_stream(self.path) as f:
            return f.read()

    def read_text(self) -> str:
        return self.read_bytes().decode()

    @contextmanager
    def replaced(self) -> Iterator[WorkPath]:
        """A file to write aside, which replaces this one whole when the block ends without an
        error: readers see the old content or the new, never part of it."""
        self.parent.mkdir()
        tmp = self.parent / f".{self.name}.{uuid.uuid4().hex}.tmp"
        try:
            yield tmp
            self.fs.move(tmp.path, self.path)
        finally:
            tmp.unlink()

    @contextmanager
    def writer(self) -> Iterator[pa.NativeFile]:
        """A stream that replaces this file whole when the block ends (replaced): a large
        array is written as it is serialized, not first copied into a buffer of its size."""
        with self.replaced() as tmp, self.fs.open_output_stream(tmp.path) as f:
            yield f

    def write_bytes(self, data: bytes) -> None:
        with self.writer() as f:
            f.write(data)

    def write_text(self, text: str) -> None:
        self.write_bytes(text.encode())

    def unlink(self) -> None:
        if self.exists():
            self.fs.delete_file(self.path)

    def rmtree(self) -> None:
        if self.exists():
            self.fs.delete_dir(self.path)

    def machine_dir(self) -> Path:
        """A folder on the local machine for what must stay local (logs, the run lock): the work
        directory itself on local disk, else one named after its URI."""
        if self.local is not None:
            return self.local
        return LOCAL_STATE / "remote" / hashlib.sha256(str(self).encode()).hexdigest()[:16]


def copy_file(fs: pafs.FileSystem, source: str, target: str) -> None:
    """`source` copied to `target` on `fs`: on local disk a hard link (its cost does not
    grow with the file, where a copy writes every byte) renamed over `target`, server-side on
    object storage. For files never written in place once made, as the runs' state files,
    staged parts and kept indexes are (WorkPath.writer writes aside and renames, a part gets a
    fresh name, GC unlinks): a write in place would change every link's content."""
    if not isinstance(fs, pafs.LocalFileSystem):
        fs.copy_file(source, target)
        return
    aside = f"{target}.{uuid.uuid4().hex}.tmp"
    try:
        try:
            os.link(source, aside)
        except OSError:  # another device, or a filesystem without links
            shutil.copyfile(source, aside)
        os.replace(aside, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(aside)


MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22 if sys.platform.startswith("linux") else None)
"""madvise's page read-in (Linux 5.14; Python names it from 3.13): MAP_POPULATE on a private
writable mapping would copy every page, as a write does."""


def read_ipc(file: WorkPath) -> pa.Table:
    """An Arrow IPC file, memory-mapped on local disk (its rows are not copied), read whole
    elsewhere (mapped_ipc)."""
    return mapped_ipc(file)[0]


def mapped_ipc(file: WorkPath) -> tuple[pa.Table, np.ndarray | None]:
    """An Arrow IPC file's table and, on local disk, its bytes as a writable array: mapped
    copy-on-write, so that a column patched through them (`patchable`) copies only the pages it
    writes, private to this process (cheaper than copying the column whole first when few rows
    move). Its pages are read in at once, several times faster than faulting them in page by
    page as they are copied out. Elsewhere read whole."""
    if file.local is None:
        return pa.ipc.open_file(file.fs.open_input_file(file.path)).read_all(), None
    with open(file.local, "rb") as opened:
        mapped = mmap.mmap(opened.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    if MADV_POPULATE_READ is not None:
        with contextlib.suppress(OSError):  # an older kernel: pages fault in as they are read
            mapped.madvise(MADV_POPULATE_READ)
    return pa.ipc.open_file(pa.py_buffer(mapped)).read_all(), np.frombuffer(mapped, np.uint8)


def patchable(values: np.ndarray, mapped: np.ndarray | None) -> np.ndarray:
    """`values`, a view of a column of a table that mapped_ipc read with the bytes `mapped`, as
    a writable array: the same bytes where they lie there in one piece, else a copy."""
    offset = -1 if mapped is None else values.ctypes.data - mapped.ctypes.data
    if mapped is None or not 0 <= offset <= mapped.nbytes - values.nbytes or not values.flags.c_contiguous:
        return values.copy()
    return mapped[offset : offset + values.nbytes].view(values.dtype).reshape(values.shape)


def write_ipc(file: WorkPath, table: pa.Table) -> None:
    """`table` as an Arrow IPC file, replacing `file` whole (WorkPath.writer)."""
    with file.writer() as out, pa.ipc.new_file(out, table.schema) as writer:
        writer.write_table(table)


def runs(work_dir: WorkPath, output: str) -> WorkPath:
    return work_dir / "runs" / output


def run_dir(work_dir: WorkPath, output: str, version: str) -> WorkPath:
    return runs(work_dir, output) / version


def cache_dir(work_dir: WorkPath, output: str) -> WorkPath:
    return work_dir / "cache" / output


def collect_runs(runs: WorkPath, current: str | None, kept: set[str]) -> None:
    """Delete the run folders (staged parts, rejects) of versions the store no longer holds,
    and of runs killed before they made one; newer folders are runs in progress."""
    if current is None:
        return
    for run in runs.folders():
        if run.name < current and run.name not in kept:
            run.rmtree()
