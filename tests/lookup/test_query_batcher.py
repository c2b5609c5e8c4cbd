"""Micro-batched queries (lookup/query_batcher.py): a query's vector is the same alone and beside
any peers, bit for bit, so no user's answer depends on another user's query."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from precompute.demo_data import DEMO_CORPUS
from precompute.lookup.query_batcher import QueryBatcher
from precompute.models import Engine, load_encoder
from precompute.models.engines.load import peer_independent
from precompute.models.errors import InvalidInputError
from tests.waiting import CEILING_S

ROWS = 8


@pytest.fixture(scope="module")
def batcher(settings: Engine) -> Iterator[QueryBatcher]:
    engine = peer_independent(settings).replace(streams=1, batch_size=ROWS)
    batcher = QueryBatcher(load_encoder(engine), ROWS, wait_s=0.0)
    yield batcher
    batcher.close()


@pytest.fixture(scope="module")
def titles() -> list[str]:
    """Queries of several length buckets (titles and longer texts)."""
    table = pq.read_table(DEMO_CORPUS, columns=["title", "text"]).slice(0, 12)
    return table["title"].to_pylist() + [t[:300] for t in table["text"].to_pylist()]


def test_the_batch_engine_is_static_on_cpu(settings: Engine) -> None:
    """CPU INT8 is dynamic by default: batched queries take its static graph (graphs.STATIC)."""
    for precision in ("auto", "int8"):
        static = peer_independent(settings.replace(precision=precision))
        assert (static.machine.graph, static.policy.precision) == ("static", precision)
    assert peer_independent(settings.replace(precision="fp32")).machine.graph == "batch"


@pytest.mark.slow
def test_a_query_has_the_same_vector_alone_and_in_any_batch(batcher: QueryBatcher, titles: list[str]) -> None:
    """On CPUs the batcher's engine is MiniLM's static INT8 graph, which keeps the demo corpus's answers."""
    report = batcher.encoder.report
    if report.device == "cpu":
        assert (report.precision, report.gates[0].passed) == ("int8", True)
        assert json.loads((Path(report.engine_dir) / "key.json").read_text())["graph"] == "int8-static"
    ids = [batcher.encoder.tokenizer.ids(t) for t in titles]
    assert len({batcher.bucket(len(i)) for i in ids}) >= 2
    alone = [batcher.encode_query(t) for t in titles]  # wait_s = 0: each query is a batch of one
    for length in {batcher.bucket(len(i)) for i in ids}:
        same = [k for k, i in enumerate(ids) if batcher.bucket(len(i)) == length]
        for start in range(0, len(same), ROWS):
            peers = same[start : start + ROWS]
            together = batcher.embed([ids[k] for k in peers], length)
            for row, k in enumerate(peers):
                assert np.array_equal(together[row], alone[k]), titles[k]
            reversed_ = batcher.embed([ids[k] for k in reversed(peers)], length)
            assert np.array_equal(reversed_[::-1], together)


def test_concurrent_searches_share_batches_and_get_their_own_vectors(
    batcher: QueryBatcher, titles: list[str]
) -> None:
    titles = titles[:ROWS]  # one batch's worth: gathered as soon as all have arrived
    alone = {t: batcher.encode_query(t) for t in titles}
    batcher.wait_s = CEILING_S  # the first query waits for the others, however slowly they come
    calls = batcher.calls
    start = threading.Barrier(len(titles))

    def search(text: str) -> np.ndarray:
        start.wait()
        return batcher.encode_query(text)

    try:
        with ThreadPoolExecutor(len(titles)) as pool:
            together = dict(zip(titles, pool.map(search, titles), strict=True))
    finally:
        batcher.wait_s = 0.0
    assert batcher.calls - calls < len(titles)  # some calls embedded several queries
    for text in titles:
        assert np.array_equal(together[text], alone[text]), text


def test_a_bad_query_fails_alone(batcher: QueryBatcher) -> None:
    with pytest.raises(InvalidInputError):
        batcher.encode_query(b"\xff\xfe")
    assert batcher.encode_query("still serving").shape == (batcher.encoder.dim,)
