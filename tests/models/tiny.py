"""Tiny random-initialised models of each supported architecture, built from a transformers config.

The catalogue of test models: each is a real Hugging Face folder (config, weights, the
bundled model's tokenizer files) a few hundred KB in size, built in a test's temporary folder.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForSequenceClassification,
)

from models.source import TOKENIZER_FILES, bundled_encoder

HIDDEN = 32
ARCHITECTURES = ("bert", "distilbert", "mpnet", "xlm-roberta")
LABELS = ("games", "net", "python", "utils")


def _config(architecture: str, **extra: object) -> AutoConfig:
    vocab = json.loads((bundled_encoder().folder / "config.json").read_text())["vocab_size"]
    sizes = (
        {"dim": HIDDEN, "hidden_dim": 2 * HIDDEN, "n_layers": 2, "n_heads": 2}
        if architecture == "distilbert"
        else {
            "hidden_size": HIDDEN,
            "intermediate_size": 2 * HIDDEN,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
        }
    )
    # The bundled tokenizer pads with id 0: the padding index of the position embeddings too.
    return AutoConfig.for_model(architecture, vocab_size=vocab, pad_token_id=0, **sizes, **extra)


def _save(model: torch.nn.Module, folder: Path) -> Path:
    model.save_pretrained(folder)
    for name in TOKENIZER_FILES:
        if (bundled_encoder().folder / name).is_file():
            shutil.copy(bundled_encoder().folder / name, folder / name)
    return folder


def tiny_encoder(folder: Path, architecture: str, pooling: str | None = None, normalize: bool = True) -> Path:
    """A plain Hugging Face folder; with `pooling`, a sentence-transformers folder stating it."""
    torch.manual_seed(0)
    _save(AutoModel.from_config(_config(architecture)), folder)
    if pooling is not None:
        modules = [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        ]
        if normalize:
            modules.append(
                {
                    "idx": 2,
                    "name": "2",
                    "path": "2_Normalize",
                    "type": "sentence_transformers.models.Normalize",
                }
            )
            (folder / "2_Normalize").mkdir()
        (folder / "modules.json").write_text(json.dumps(modules))
        (folder / "1_Pooling").mkdir()
        (folder / "1_Pooling" / "config.json").write_text(
            json.dumps(
                {
                    "word_embedding_dimension": HIDDEN,
                    "pooling_mode_cls_token": pooling == "cls",
                    "pooling_mode_mean_tokens": pooling == "mean",
                    "pooling_mode_max_tokens": pooling == "max",
                }
            )
        )
        (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 128}))
    return folder


def tiny_classifier(folder: Path, multi_label: bool = False) -> Path:
    torch.manual_seed(0)
    config = _config(
        "bert",
        num_labels=len(LABELS),
        id2label=dict(enumerate(LABELS)),
        label2id={label: i for i, label in enumerate(LABELS)},
        problem_type="multi_label_classification" if multi_label else "single_label_classification",
    )
    return _save(AutoModelForSequenceClassification.from_config(config), folder)
