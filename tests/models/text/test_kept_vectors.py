"""Gate and reference vectors kept by text: a night whose gate texts moved by a few encodes those few."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from precompute.models import Engine, load_encoder
from precompute.models.engines import load as engine_module
from precompute.models.engines.gate import known_item_pair
from precompute.models.engines.load import MOVED_SHARE
from precompute.models.text.kept_vectors import KEPT, read, text_digest, vectors_of
from precompute.models.text.reference import TextSample, reference_texts


class Counting:
    """An encoder of texts as their lengths, that records what it was asked to encode."""

    def __init__(self) -> None:
        self.asked: list[list[str]] = []

    def __call__(self, texts: list[str]) -> np.ndarray:
        self.asked.append(texts)
        return np.array([[len(t), 1.0] for t in texts], dtype=np.float32)


def test_only_texts_not_held_are_encoded_and_every_text_gets_its_own_vector(tmp_path: Path) -> None:
    path, encode = tmp_path / "vectors.npz", Counting()
    assert vectors_of(path, ["a", "bb", "a"], encode).tolist() == [[1, 1], [2, 1], [1, 1]]
    assert vectors_of(path, ["ccc", "bb"], encode).tolist() == [[3, 1], [2, 1]]
    assert vectors_of(path, ["bb", "a", "ccc"], encode).tolist() == [[2, 1], [1, 1], [3, 1]]
    assert encode.asked == [["a", "bb"], ["ccc"]]


def test_the_file_keeps_the_latest_texts_first_and_at_most_kept(tmp_path: Path) -> None:
    path, encode = tmp_path / "vectors.npz", Counting()
    vectors_of(path, [f"old {i}" for i in range(KEPT)], encode)
    vectors_of(path, ["new"], encode)
    held = list(read(path))
    assert len(held) == KEPT and held[0] == text_digest("new") and text_digest(f"old {KEPT - 1}") not in held


def test_an_unreadable_file_is_encoded_again(tmp_path: Path) -> None:
    path, encode = tmp_path / "vectors.npz", Counting()
    path.write_bytes(b"not a zip")
    assert vectors_of(path, ["a"], encode).tolist() == [[1, 1]]
    assert encode.asked == [["a"]] and list(read(path)) == [text_digest("a")]


def test_a_failed_write_leaves_the_file_as_it_was_and_nothing_beside_it(tmp_path: Path) -> None:
    path = tmp_path / "vectors.npz"
    vectors_of(path, ["a"], Counting())
    with pytest.raises(ValueError):
        vectors_of(path, ["a", "b"], lambda texts: np.ones((len(texts), 3), np.float32))  # another width
    assert list(read(path)) == [text_digest("a")] and [p.name for p in tmp_path.iterdir()] == ["vectors.npz"]


@pytest.mark.parametrize("past_the_share", [False, True], ids=["left-out", "past-the-share"])
def test_gate_texts_that_moved_are_left_out_up_to_a_share_and_past_it_each_graph_encodes_them_alone(
    past_the_share: bool, encoder, settings: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bundled model's ladder on the demo corpus with some of its gate texts edited: up to
    MOVED_SHARE of them, the gate leaves them out and nothing is encoded, not even by the FP32
    reference; past it, every graph gated and the reference encode those texts' pairs alone."""
    texts = reference_texts(settings.reference, "gate", settings.policy.gate_texts)
    moved = int(MOVED_SHARE * len(texts)) + 1 if past_the_share else 1
    corpus = pq.read_table(settings.reference.path)
    chosen = pc.is_in(corpus["text"], pa.array(texts[:moved]))
    edited = pc.if_else(chosen, pc.binary_join_element_wise(corpus["text"], " (edited)", ""), corpus["text"])
    pq.write_table(corpus.set_column(corpus.schema.get_field_index("text"), "text", edited), tmp_path / "c.parquet")
    asked: list[int] = []

    def counted(runner, tokenizer, texts, batch_size, pool=None) -> np.ndarray:
        asked.append(len(texts))
        return real(runner, tokenizer, texts, batch_size, pool)

    real = engine_module.encode_texts
    monkeypatch.setattr(engine_module, "encode_texts", counted)
    with load_encoder(settings.replace(reference=TextSample(path=str(tmp_path / "c.parquet")))) as again:
        assert again.report.precision == encoder.report.precision
    gates = again.report.gates
    if past_the_share:
        # An edited text's known-item pair: its document moved, its query too where the cut did.
        kept = {part for text in texts for part in known_item_pair(text) or ()}
        edited = {part for text in texts[:moved] for part in known_item_pair(text + " (edited)") or ()}
        assert asked == [len(edited - kept)] * (len(gates) + 1), gates  # each graph, and the reference
        assert moved <= len(edited - kept) < 2 * moved
        assert {(g.texts, g.note) for g in gates} == {(len(texts), "")}
    else:
        note = f"1 of {len(texts)} drawn texts left out: new since the model's last gate"
        assert asked == [] and {(g.texts, g.note) for g in gates} == {(len(texts) - 1, note)}
