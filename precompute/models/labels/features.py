"""Sparse TF-IDF features of a text, beside its embedding, for a label head.

Words and their pairs catch the names and jargon a class is known by; character n-grams within
words catch their spellings and parts (lib…-perl, …-doc); a sentence encoder sees both only
through its subword pieces. scikit-learn's vectorizers make them; a fitted vocabulary and its
inverse document frequencies are kept as JSON and NumPy files, not pickles, so a cached head
opens under any scikit-learn release and never runs code from the cache.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from sklearn.feature_extraction.text import TfidfVectorizer

VECTORIZERS = {
    "words": {"analyzer": "word", "ngram_range": (1, 2)},
    "chars": {"analyzer": "char_wb", "ngram_range": (2, 5)},
}
"""Each family's analyzer; every one is sublinear in term frequency and drops terms of one row."""
MAX_FEATURES = 1 << 17
"""Per family, the most frequent terms: the head's text weights stay tens of MB at any corpus size."""
VOCABULARY_FILE = "tfidf_{}.json"
IDF_FILE = "tfidf_{}_idf.npy"


def vectorizer(family: str, vocabulary: dict[str, int] | None = None) -> TfidfVectorizer:
    return TfidfVectorizer(
        **VECTORIZERS[family],
        sublinear_tf=True,
        min_df=2,
        max_features=MAX_FEATURES,
        dtype=np.float32,
        vocabulary=vocabulary,
    )


class TextFeatures:
    """The fitted vectorizers of every family: texts -> one sparse row each, families side by side."""

    def __init__(self, vectorizers: dict[str, TfidfVectorizer]) -> None:
        self.vectorizers = vectorizers

    @classmethod
    def fit(cls, texts: list[str]) -> TextFeatures:
        return cls({family: vectorizer(family).fit(texts) for family in VECTORIZERS})

    @property
    def width(self) -> int:
        return sum(len(v.vocabulary_) for v in self.vectorizers.values())

    def transform(self, texts: list[str]) -> sp.csr_matrix:
        return sp.hstack([v.transform(texts) for v in self.vectorizers.values()], format="csr")

    def save(self, directory: Path) -> None:
        for family, fitted in self.vectorizers.items():
            vocabulary = {term: int(index) for term, index in fitted.vocabulary_.items()}
            (directory / VOCABULARY_FILE.format(family)).write_text(json.dumps(vocabulary))
            np.save(directory / IDF_FILE.format(family), fitted.idf_.astype(np.float32))

    @classmethod
    def load(cls, directory: Path) -> TextFeatures:
        vectorizers = {}
        for family in VECTORIZERS:
            vocabulary = json.loads((directory / VOCABULARY_FILE.format(family)).read_text())
            vectorizers[family] = vectorizer(family, vocabulary)
            vectorizers[family].idf_ = np.load(directory / IDF_FILE.format(family))
        return cls(vectorizers)
