"""An input as users have it: a file, a folder, a glob or a hive-partitioned dataset, in Parquet,
CSV or JSON Lines, on local disk or object storage.

Every reader of an input (the pipeline's check, the jobs on Ray, the gate's texts) resolves it
here to one list of files on one filesystem, so they all read the same rows. Hive partition
folders (`region=eu/`) select files through `where`; they are not columns of the rows.
Credentials come from the environment and the usual config files, never from the pipeline file.
AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL names an S3-compatible server, as for the AWS SDKs (pyarrow
does not read them itself): where the pipeline file is read, it joins each s3:// path, so Ray's
workers, whose environment may lack it, read the same server.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Literal
from urllib.parse import unquote, urlencode

import fsspec.core
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.dataset as pads
import pyarrow.fs as pafs
from fsspec.implementations.arrow import ArrowFSWrapper
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict

from precompute.models.errors import ModelError
from precompute.models.location import Location

Format = Literal["parquet", "csv", "json"]
EXTENSIONS: dict[str, Format] = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".csv": "csv",
    ".json": "json",
    ".jsonl": "json",
    ".ndjson": "json",
}
"""A file's format by its extension, after a compression suffix pyarrow reads through."""
COMPRESSION = (".gz", ".bz2", ".zst", ".lz4")
GLOB = "*?["
PartitionValue = str | int | datetime.date


def _pairs(value: object) -> object:
    """A table of partition values as sorted (key, values) pairs: hashable, as engines are."""
    if isinstance(value, Mapping):
        return tuple(sorted((k, tuple(v) if isinstance(v, list | tuple) else (v,)) for k, v in value.items()))
    return value


Where = Annotated[tuple[tuple[str, tuple[PartitionValue, ...]], ...], BeforeValidator(_pairs)]


def with_endpoint(path: str) -> str:
    """An s3:// URI with the environment's endpoint, unless it names one itself."""
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if not path.startswith("s3://") or not endpoint or "endpoint_override=" in path:
        return path
    return path + ("&" if "?" in path else "?") + urlencode({"endpoint_override": endpoint})


class InputError(ModelError):
    """An input that cannot be read as named: the message names the path and what is wrong."""


class DatasetInput(BaseModel):
    """Where an input's rows are: the part every input table of the pipeline file shares."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    path: Annotated[Location, AfterValidator(with_endpoint)]
    """The input: a file, a folder of files, a glob (`exports/*.parquet`) or a hive-partitioned
    folder; a local path (relative to the pipeline file) or an object-store URI (s3://, gs://...)."""
    format: Format | None = None
    """The files' format: parquet, csv or json (JSON Lines); by default read from their extension."""
    where: Where = ()
    """Hive partitions to read, e.g. `{ region = "eu" }` (a list for several values): only
    files under `key=value` folders that match every key are read."""

    def id_columns(self) -> tuple[str, ...]:
        """Columns of ids: CSV says nothing of types, so these are read as strings there (an id
        `007` stays `007`, where inference would make it 7)."""
        return ()


@dataclass(frozen=True)
class Digests:
    """What an input's files hold, hashed (InputFiles.digests)."""

    whole: str
    """Equal exactly when a job would read the same rows: every file's name and bytes, and how
    they are read."""
    files: dict[str, str]
    """Each file's bytes and how they are read, by its path."""


@dataclass(frozen=True)
class InputFiles:
    """An input resolved: the files to read, on their filesystem, in one format."""

    files: tuple[str, ...]
    filesystem: pafs.FileSystem
    format: Format
    strings: tuple[str, ...] = ()
    """CSV columns read as strings, whatever they look like (DatasetInput.id_columns)."""

    def csv_options(self) -> pacsv.ConvertOptions:
        return pacsv.ConvertOptions(column_types=dict.fromkeys(self.strings, pa.string()))

    def arrow(self) -> pads.Dataset:
        """The files as one pyarrow dataset, for reads in the driver (schema, counts, samples),
        dictionary-encoded columns read as their values."""
        encoded = self.encoded()
        if (schema := plain_schema(encoded.schema)) == encoded.schema:
            return encoded
        return pads.dataset(list(self.files), schema=schema, filesystem=self.filesystem, format=self._format())

    def encoded(self) -> pads.Dataset:
        """The files as they are written (dictionary columns included)."""
        return pads.dataset(list(self.files), filesystem=self.filesystem, format=self._format())

    def digests(self) -> Digests:
        """The files' bytes hashed one file at a time, in chunks (memory does not grow with the
        input), and the input's whole digest made of them: a job keeps what it made of the same
        input, and a validation what it found in the same file (jobs/text/corpus_validation.py).
        SHA-256, which x86 (SHA-NI) and ARM cores run in hardware, faster there than blake2b,
        for every byte of the input, read every night (a 1M-row corpus: 175 MB)."""
        how = f"{self.format} {self.strings}"
        files = {}
        for file in sorted(self.files):
            digest = hashlib.sha256(how.encode())
            with self.filesystem.open_input_stream(file, compression=None) as stream:
                while chunk := stream.read(1 << 23):
                    digest.update(chunk)
            files[file] = digest.hexdigest()[:32]
        whole = hashlib.sha256(how.encode())
        for file, digest in files.items():
            whole.update(f"\x00{file}\x00{digest}".encode())
        return Digests(whole.hexdigest()[:32], files)

    def _format(self) -> str | pads.FileFormat:
        return pads.CsvFileFormat(convert_options=self.csv_options()) if self.format == "csv" else self.format


def plain_type(kind: pa.DataType) -> pa.DataType:
    """A dictionary type as its values' type, in lists too: a warehouse's dictionary-encoded
    strings are strings to every check and job."""
    if pa.types.is_dictionary(kind):
        return plain_type(kind.value_type)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        field = kind.value_field.with_type(plain_type(kind.value_type))
        return pa.list_(field) if pa.types.is_list(kind) else pa.large_list(field)
    return kind


def plain_schema(schema: pa.Schema) -> pa.Schema:
    return pa.schema([f.with_type(plain_type(f.type)) for f in schema], schema.metadata)


def decoded(batch: pa.Table) -> pa.Table:
    """A batch with its dictionary columns decoded (what plain_schema declares)."""
    return batch.cast(plain_schema(batch.schema))


def filesystem(path: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem a path or URI lives on and the path within it: pyarrow's own filesystems
    (local, s3, gs, hdfs, abfs), else fsspec's (whatever is installed) wrapped for pyarrow."""
    if "://" not in path:
        return pafs.LocalFileSystem(), os.path.abspath(path)
    try:
        return pafs.FileSystem.from_uri(path)
    except pa.ArrowInvalid:
        fs, inner = fsspec.core.url_to_fs(path)
        return pafs.PyFileSystem(pafs.FSSpecHandler(fs)), inner


def _listed(fs: pafs.FileSystem, path: str) -> tuple[str, list[str]]:
    """(the folder partitions are read below, the files) of a file, folder or glob; files and
    folders whose name starts with `_` or `.` (_SUCCESS, .crc, _temporary/) are left out."""
    if any(c in path for c in GLOB):
        base = path[: min(path.index(c) for c in GLOB if c in path)].rsplit("/", 1)[0]
        found = [f for f in ArrowFSWrapper(fs).glob(path) if fs.get_file_info(f).is_file]
        return base, [f for f in found if not _hidden(posixpath.relpath(f, base))]
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.File:
        return posixpath.dirname(path), [path]
    if info.type == pafs.FileType.Directory:
        found = fs.get_file_info(pafs.FileSelector(path, recursive=True))
        return path, sorted(f.path for f in found if f.is_file and not _hidden(posixpath.relpath(f.path, path)))
    return path, []


def _hidden(relative: str) -> bool:
    return any(part.startswith(("_", ".")) for part in relative.split("/"))


def partitions(relative: str) -> dict[str, str]:
    """The hive partition keys of a file's path below its dataset's folder (`region=eu/x`)."""
    folders = (part.partition("=") for part in relative.split("/")[:-1])
    return {key: unquote(value) for key, sep, value in folders if sep}


def _selected(source: DatasetInput, base: str, files: list[str]) -> list[str]:
    wanted = {key: {str(v) for v in values} for key, values in source.where}
    asked = ", ".join(f"{key} in ({', '.join(sorted(values))})" for key, values in wanted.items())
    keys = {key for f in files for key in partitions(posixpath.relpath(f, base))}
    if missing := sorted(set(wanted) - keys):
        raise InputError(
            f"{source.path}: where names {', '.join(missing)}, not a partition folder of it "
            f"(partitions: {', '.join(sorted(keys)) or 'none'})"
        )
    chosen = []
    for f in files:
        found = partitions(posixpath.relpath(f, base))
        if all(found.get(key) in values for key, values in wanted.items()):
            chosen.append(f)
    if not chosen:
        raise InputError(f"{source.path}: no partition has {asked}")
    return chosen


def format_of(file: str) -> Format | None:
    name = file.lower()
    for suffix in COMPRESSION:
        name = name.removesuffix(suffix)
    return EXTENSIONS.get(posixpath.splitext(name)[1])


def input_files(source: DatasetInput) -> InputFiles:
    """The input's files, its partition filter applied, and their one format; InputError if none
    are there or their formats cannot be told or differ."""
    try:
        fs, path = filesystem(source.path)
        base, files = _listed(fs, path)
    except (OSError, ValueError, ImportError, pa.ArrowException) as e:
        raise InputError(f"cannot list {source.path} ({e})") from None
    if not files:
        raise InputError(f"{source.path}: no such file, or no files in it")
    if source.where:
        files = _selected(source, base, files)
    kind = source.format or _one_format(source, files)
    return InputFiles(tuple(files), fs, kind, source.id_columns() if kind == "csv" else ())


def _one_format(source: DatasetInput, files: list[str]) -> Format:
    formats = {f: format_of(f) for f in files}
    if unknown := [f for f, found in formats.items() if found is None]:
        raise InputError(f"{source.path}: cannot tell the format of {unknown[0]}; set format = parquet, csv or json")
    if len(kinds := set(formats.values())) > 1:
        raise InputError(f"{source.path}: holds {' and '.join(sorted(map(str, kinds)))} files; name one with a glob")
    return kinds.pop()


def arrow_dataset(source: DatasetInput) -> pads.Dataset:
    """The input as a pyarrow dataset: InputError, naming the path, if it cannot be opened."""
    return files_dataset(input_files(source), source.path)


def files_dataset(files: InputFiles, path: str) -> pads.Dataset:
    """Files already listed (input_files) as a pyarrow dataset: InputError, naming `path`, if
    they cannot be opened. For a reader that needs both, without listing the input twice."""
    try:
        return files.arrow()
    except (OSError, pa.ArrowException) as e:
        raise InputError(f"cannot read {files.format} at {path} ({e})") from None


def integer_column(source: DatasetInput, column: str) -> bool:
    """Whether the input's `column` holds integers (or lists of them): ids a user wrote as
    integers are answered as JSON numbers, as they were given."""
    kind = arrow_dataset(source).schema.field(column).type
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        kind = kind.value_type
    return pa.types.is_integer(kind)
