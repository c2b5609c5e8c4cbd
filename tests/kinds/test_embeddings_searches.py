"""The index check's searches made of held-out texts (precompute/kinds/embeddings.py): a text's
search is its own, whatever else the night's sample holds, so a copy's check keeps it."""

from __future__ import annotations

import pyarrow.parquet as pq

from precompute.demo_data import DEMO_CORPUS
from precompute.kinds.embeddings import OPENING_WORDS, opening_searches


def test_a_texts_search_does_not_move_when_the_texts_before_it_do() -> None:
    texts = [t for t in pq.read_table(DEMO_CORPUS, columns=["text"])["text"].to_pylist()[:200] if t.strip()]
    searches = opening_searches(texts)
    assert opening_searches(texts[1:]) == searches[1:]
    assert opening_searches([*texts[:50], "an edited text", *texts[51:]])[51:] == searches[51:]
    lengths = {len(search.split()) for search, text in zip(searches, texts, strict=True) if len(text.split()) > 32}
    assert lengths == set(OPENING_WORDS)
