"""Texts in, embeddings out: tokenization, length buckets and concurrent batches over one runner."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from precompute.models.backends.base import Runner
from precompute.models.engines.gate import GateResult
from precompute.models.source import INPUT_NAMES
from precompute.models.text.tokenize import Batch, TextTokenizer


@dataclass(frozen=True)
class EngineReport:
    """Which engine serves, and why: the run report and `/readyz` show this."""

    backend: str
    device: str
    precision: str
    engine_dir: str
    cache_hit: bool
    model: str = ""
    """The model's folder and content hash."""
    gates: list[GateResult] = field(default_factory=list)
    """Every gate evaluated, failed precisions first: the record of each fallback."""


def encode_texts(
    runner: Runner,
    tokenizer: TextTokenizer,
    texts: Sequence[object],
    batch_size: int,
    pool: Executor | None = None,
) -> np.ndarray:
    """float32 [len(texts), dim] in input order; batches run on `pool` when one is given."""
    out = np.empty((len(texts), tokenizer.dim), dtype=np.float32)

    def run(batch: Batch) -> None:
        out[batch.rows] = runner.infer(batch.feeds)

    batches = tokenizer.batches(texts, batch_size)
    if pool is None:
        for batch in batches:
            run(batch)
    else:
        for done in [pool.submit(run, batch) for batch in batches]:
            done.result()
    return out


class Encoder:
    """A model's outputs in input order: sentence embeddings, or label probabilities of a classifier.

    On CPU, `streams` single-threaded batches run at once on one ONNX Runtime session, which
    runs faster than one session with every thread (`precompute bench embed`; docs/engines.md).
    """

    def __init__(
        self,
        runner: Runner,
        tokenizer: TextTokenizer,
        batch_size: int,
        streams: int,
        report: EngineReport,
    ) -> None:
        self.runner = runner
        self.source = tokenizer.source
        self.dim = tokenizer.dim
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.report = report
        self.streams = streams
        self._pool = ThreadPoolExecutor(streams, thread_name_prefix="encoder") if streams > 1 else None
        self._query_buffers = threading.local()

    def encode(self, texts: Sequence[object]) -> np.ndarray:
        """float32 [len(texts), dim]. Raises InvalidInputError naming the first bad row."""
        return encode_texts(self.runner, self.tokenizer, texts, self.batch_size, self._pool)

    def encode_query(self, text: object) -> np.ndarray:
        """float32 [dim] of one text: the service's path. No batch is formed and nothing is
        padded; the ids go into input buffers allocated once per calling thread, and the engine
        reads views of their first len(ids) columns. Threads run at once (an ONNX Runtime
        session is thread-safe; TensorRT's runner serialises itself), so a short query is
        never queued behind a long one on another search thread."""
        return self.encode_ids(self.tokenizer.ids(text))

    def encode_ids(self, ids: list[int]) -> np.ndarray:
        """float32 [dim] of one tokenized query (TextTokenizer.query_ids)."""
        buffers = self._query_buffers
        if not hasattr(buffers, "ids"):
            buffers.ids = np.zeros((1, self.tokenizer.max_seq_length), dtype=np.int64)
            buffers.mask = np.ones((1, self.tokenizer.max_seq_length), dtype=np.int64)
        buffers.ids[0, : len(ids)] = ids
        feeds = dict(zip(INPUT_NAMES, (buffers.ids, buffers.mask), strict=True))
        return self.runner.infer({name: array[:, : len(ids)] for name, array in feeds.items()})[0]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
        self.runner.close()

    def __enter__(self) -> Encoder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
