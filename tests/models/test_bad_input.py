"""Bad texts fail with an error naming the row, before any backend sees them."""

from __future__ import annotations

import numpy as np
import pytest

from precompute.models import Encoder, InvalidInputError


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        ("", "row 1: text is empty"),
        ("  \n\t", "row 1: text is empty"),
        (b"caf\xe9 au lait", "row 1: text is not valid UTF-8 (byte 3)"),
        (b"\xff\xfe".decode("utf-8", "surrogateescape"), "row 1: text is not valid UTF-8 (character 0)"),
        (None, "row 1: text must be str, got NoneType"),
        (42, "row 1: text must be str, got int"),
    ],
)
def test_bad_text_names_its_row(encoder: Encoder, bad: object, reason: str) -> None:
    with pytest.raises(InvalidInputError) as raised:
        encoder.encode(["a good text", bad, "another good text"])
    assert str(raised.value) == reason and raised.value.row == 1


def test_valid_utf8_bytes_are_decoded(encoder: Encoder) -> None:
    as_bytes, as_str = encoder.encode(["café au lait".encode(), "café au lait"])
    assert np.allclose(as_bytes, as_str)


def test_100kb_text_is_truncated_to_256_tokens(encoder: Encoder) -> None:
    words = [f"word{i % 997}" for i in range(20_000)]
    huge = " ".join(words)
    assert len(huge.encode()) > 100_000
    tokens = encoder.tokenizer.batches([huge], 1).__next__().attention_mask.sum()
    assert tokens == 256
    # Truncation keeps the head: a text cut well past 256 tokens embeds the same.
    head = " ".join(words[:1_000])
    got_huge, got_head = encoder.encode([huge, head])
    assert float(got_huge @ got_head) > 0.99999


def test_empty_input_gives_empty_output(encoder: Encoder) -> None:
    assert encoder.encode([]).shape == (0, 384)
