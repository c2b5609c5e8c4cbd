"""Texts to length-bucketed token batches, with input checks that name the bad row.

Texts are sorted by token count and cut into batches, each padded only to its own
longest text: the engine computes almost no padding, whatever the length mix.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from precompute.models.errors import InvalidInputError, ModelError
from precompute.models.source import INPUT_NAMES, ModelSource


@dataclass(frozen=True)
class Batch:
    """One inference call: `rows` are the texts' positions in the caller's input."""

    rows: np.ndarray
    input_ids: np.ndarray
    attention_mask: np.ndarray

    @property
    def feeds(self) -> dict[str, np.ndarray]:
        """The batch as a text graph's inputs (models/source.py INPUT_NAMES)."""
        return dict(zip(INPUT_NAMES, (self.input_ids, self.attention_mask), strict=True))


def check_text(row: int, text: object) -> str:
    """Return the text as str, or raise naming the row: no backend ever sees bad input.

    bytes are decoded as strict UTF-8; a str must be encodable as UTF-8 (a lone surrogate,
    left by decoding invalid bytes with 'surrogateescape', is not); empty text is refused
    because its embedding would be the padding's. Overlong texts are truncated, not refused.
    """
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InvalidInputError(row, f"text is not valid UTF-8 (byte {e.start})") from e
    if not isinstance(text, str):
        raise InvalidInputError(row, f"text must be str, got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidInputError(row, f"text is not valid UTF-8 (character {e.start})") from e
    if not text.strip():
        raise InvalidInputError(row, "text is empty")
    return text


def load_tokenizer(folder: Path) -> Tokenizer:
    """tokenizer.json where the folder has one; else the fast tokenizer transformers builds
    from the folder's vocabulary files (offline: they are all in the folder)."""
    if (folder / "tokenizer.json").is_file():
        return Tokenizer.from_file(str(folder / "tokenizer.json"))
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(folder, use_fast=True).backend_tokenizer
    except (OSError, ValueError, AttributeError) as e:
        raise ModelError(f"model folder {folder}: no usable tokenizer ({e})") from e


class TextTokenizer:
    """The model's fast (Rust) tokenizer, truncating at the model's `max_seq_length` tokens."""

    def __init__(self, source: ModelSource) -> None:
        self._tokenizer = load_tokenizer(source.folder)
        # A shipped tokenizer.json may bake in truncation and padding (128 for MiniLM): override both.
        self._tokenizer.enable_truncation(source.max_seq_length)
        self._tokenizer.no_padding()
        self.source = source
        self.dim = source.dim
        self.max_seq_length = source.max_seq_length
        self.pad_id = source.pad_id

    def ids(self, text: object) -> list[int]:
        """Token ids of one text (checked as row 0): the single-query path, no batch to form."""
        return self.query_ids(text, None)[0]

    def query_ids(self, text: object, max_tokens: int | None) -> tuple[list[int], bool]:
        """(ids, cut) of one query, cut to `max_tokens` (None: the model's window) with its closing
        special token kept: `cut` says whether the text had more tokens than it got."""
        encoding = self._tokenizer.encode_batch_fast([check_text(0, text)])[0]
        ids, cut = encoding.ids, bool(encoding.overflowing)
        if max_tokens is not None and len(ids) > max_tokens:
            ids, cut = ids[: max_tokens - 1] + ids[-1:], True
        return ids, cut

    def batches(self, texts: Sequence[object], batch_size: int) -> Iterator[Batch]:
        """Check every text first (so a bad row fails before any work), then bucket by length."""
        checked = [check_text(row, text) for row, text in enumerate(texts)]
        encodings = self._tokenizer.encode_batch_fast(checked)
        lengths = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(encodings))
        order = np.argsort(lengths, kind="stable")
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            width = int(lengths[rows[-1]])
            input_ids = np.full((len(rows), width), self.pad_id, dtype=np.int64)
            attention_mask = np.zeros((len(rows), width), dtype=np.int64)
            for i, row in enumerate(rows):
                ids = encodings[row].ids
                input_ids[i, : len(ids)] = ids
                attention_mask[i, : len(ids)] = 1
            yield Batch(rows, input_ids, attention_mask)
