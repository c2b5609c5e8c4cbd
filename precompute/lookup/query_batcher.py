"""Micro-batching: queries that arrive together are embedded in one engine call.

A search thread hands its query's token ids to the batcher and waits. The batcher's thread
takes the first query waiting, gives others up to `wait_s` to join (at most `rows`), and runs
them as one call per length bucket. Every call of a bucket has one fixed shape, `rows` rows
(unused ones are a single [CLS]-like token) by the bucket's tokens, so a query's vector
depends on its own tokens only: the same alone and beside any peers. Engines run one code
path per shape (bit-identical alone and in a batch of the same shape, not when the shapes
differ: `precompute bench query-engines`). The engine must also be static: dynamic INT8 takes
its activation scales from the whole batch (models.engine.peer_independent).

On CPU, batching does not pay: a batched query costs more than one query on the dynamic INT8
graph the service runs (`precompute bench query-engines`); on a
GPU a call of 8 rows takes about as long as a call of 1. Hence ServiceSettings.query_batch =
"auto": on for GPUs only.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future

import numpy as np

from precompute.models.source import INPUT_NAMES
from precompute.models.text.encoder import Encoder

BUCKET_TOKENS = 16
"""A query's ids are padded to the next multiple of this: few shapes, little padding."""

Waiting = tuple[list[int], "Future[np.ndarray]"]
"""A query's token ids and the future its search thread waits on."""


class QueryBatcher:
    """Embeds queries in fixed-shape batches on its own thread; `encode_query` blocks its caller."""

    def __init__(self, encoder: Encoder, rows: int, wait_s: float) -> None:
        self.encoder = encoder
        self.tokenizer = encoder.tokenizer
        self.report = encoder.report
        self.rows = rows
        self.wait_s = wait_s
        self.calls = 0
        """Engine calls so far: queries per call is the batching achieved."""
        self._queue: queue.SimpleQueue[Waiting | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="query-batcher", daemon=True)
        self._thread.start()

    def encode_query(self, text: object) -> np.ndarray:
        """float32 [dim]. Raises InvalidInputError (a bad text) here, on the caller's thread."""
        return self.encode_ids(self.tokenizer.ids(text))

    def encode_ids(self, ids: list[int]) -> np.ndarray:
        """float32 [dim] of one tokenized query, embedded in the next batch."""
        done: Future[np.ndarray] = Future()
        self._queue.put((ids, done))
        return done.result()

    def bucket(self, length: int) -> int:
        return min(-(-length // BUCKET_TOKENS) * BUCKET_TOKENS, self.encoder.tokenizer.max_seq_length)

    def embed(self, queries: list[list[int]], length: int) -> np.ndarray:
        """float32 [len(queries), dim]: one call of shape [rows, length]."""
        ids = np.full((self.rows, length), self.encoder.tokenizer.pad_id, dtype=np.int64)
        mask = np.zeros((self.rows, length), dtype=np.int64)
        mask[:, 0] = 1  # an unused row holds one token: an all-masked row would divide by zero
        for row, query in enumerate(queries):
            ids[row, : len(query)] = query
            mask[row, : len(query)] = 1
        self.calls += 1
        return self.encoder.runner.infer(dict(zip(INPUT_NAMES, (ids, mask), strict=True)))[: len(queries)]

    def _gather(self, first: Waiting) -> list[Waiting]:
        """The first query and those arriving within wait_s of it, up to `rows` of them."""
        waiting = [first]
        deadline = time.monotonic() + self.wait_s
        while len(waiting) < self.rows and (left := deadline - time.monotonic()) > 0:
            try:
                item = self._queue.get(timeout=left)
            except queue.Empty:
                break
            if item is None:  # closing: answer what has been gathered first
                self._queue.put(None)
                break
            waiting.append(item)
        return waiting

    def _serve(self) -> None:
        while (first := self._queue.get()) is not None:
            buckets: dict[int, list[Waiting]] = {}
            for item in self._gather(first):
                buckets.setdefault(self.bucket(len(item[0])), []).append(item)
            for length, items in buckets.items():
                try:
                    vectors = self.embed([ids for ids, _ in items], length)
                except Exception as exc:  # the waiting searches raise it, each on its own thread
                    for _, done in items:
                        done.set_exception(exc)
                    continue
                for (_, done), vector in zip(items, vectors, strict=True):
                    done.set_result(vector)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()
        self.encoder.close()
