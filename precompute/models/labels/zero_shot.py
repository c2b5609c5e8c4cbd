"""Zero-shot labels: a head made from the output's label names and descriptions, no labelled row.

Each label's text is the output's `prompt` with its description (its name where it has none),
embedded at FP32. A row's logit for a label is LOGIT_SCALE times its cosine to that text less the
label's mean cosine over CENTER_TEXTS of the corpus: a label whose text is near every row would
otherwise take them all (`precompute bench labels`: zero_shot_top1 against cosine to the bare
names). The scale is the temperature sentence encoders are trained at (sentence-transformers'
MultipleNegativesRankingLoss), so the softmax is the encoder's own odds among these labels and
`min_score` a probability on that scale; with several labels per row, a sigmoid per label: the
odds of a label against its typical row, given from 0.5 (nearer than its typical row) and at or
above `min_score`.

The logits are one affine map of the embedding, so the result is a head like a trained one
(head.py export_head), cached by model, labels, prompt and centering texts, and gated and served
the same way.
"""

from __future__ import annotations

import json

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from precompute.models.engines.load import load_encoder
from precompute.models.settings import Engine
from precompute.models.text.reference import TextSample, reference_texts

RECIPE = "zero-shot/prompt/centered/scale-20/v1"
LOGIT_SCALE = 20.0
"""sentence-transformers' MultipleNegativesRankingLoss scale (1 / temperature), which MiniLM and
MPNet were trained at."""
CENTER_TEXTS = 1000
"""Corpus texts (the calibration slot's) whose mean cosine to each label centres its logit."""
PROMPT = "This text is about {description}."


class LabelText(BaseModel):
    """A label and the sentence that says what it means."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    label: str = Field(min_length=1)
    description: str | None = Field(None, min_length=1)
    """What a text with this label is about; None: the label's name says it."""


class Taxonomy(BaseModel):
    """The labels a zero-shot head chooses among, and how each becomes a text."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    labels: tuple[LabelText, ...] = Field(min_length=2)
    prompt: str = PROMPT
    """A label's text: `{description}` (or `{label}`) filled in."""
    multi: bool = False

    @model_validator(mode="after")
    def _valid(self) -> Taxonomy:
        check_prompt(self.prompt)
        check_distinct([entry.label for entry in self.labels])
        return self

    def texts(self) -> list[str]:
        """Each label's text, in label order."""
        return [
            self.prompt.format(label=entry.label, description=entry.description or entry.label)
            for entry in self.labels
        ]

    def key(self) -> str:
        return json.dumps([self.model_dump(mode="json"), RECIPE], sort_keys=True)


def check_prompt(prompt: str) -> str:
    if "{description}" not in prompt and "{label}" not in prompt:
        raise ValueError("prompt must hold {description} or {label}")
    return prompt


def check_distinct(names: list[str]) -> None:
    if repeated := sorted({name for name in names if names.count(name) > 1}):
        raise ValueError(f"labels are named once each: {', '.join(map(repr, repeated))} repeat")


def zero_shot_weights(
    label_vectors: np.ndarray, corpus_vectors: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(weight, bias) of the head's affine map: LOGIT_SCALE * (cosine - the label's mean cosine
    over `corpus_vectors`). Both sides are normalised here, whatever the encoder's pooling."""
    labels = label_vectors / np.linalg.norm(label_vectors, axis=1, keepdims=True)
    corpus = corpus_vectors / np.linalg.norm(corpus_vectors, axis=1, keepdims=True)
    centre = (corpus @ labels.T).mean(axis=0)
    return (LOGIT_SCALE * labels).astype(np.float32), (-LOGIT_SCALE * centre).astype(np.float32)


def build_zero_shot(taxonomy: Taxonomy, corpus: TextSample, engine: Engine) -> tuple[np.ndarray, np.ndarray, dict]:
    """Embed the labels' texts and the centering texts at FP32: (weight, bias, training report)."""
    texts = reference_texts(corpus, "calibration", CENTER_TEXTS, at_least=1)
    with load_encoder(engine.replace(precision="fp32")) as encoder:
        weight, bias = zero_shot_weights(encoder.encode(taxonomy.texts()), encoder.encode(texts))
    training = {
        "chosen": "zero-shot",
        "encoder": "embeddings",
        "rows": 0,
        "test_rows": 0,
        "baseline": None,
        "candidates": [],
        "note": f"no labelled rows: label texts from the prompt {taxonomy.prompt!r}, centred on {len(texts)} corpus texts",
        "fine_tune": None,
    }
    return weight, bias, training
