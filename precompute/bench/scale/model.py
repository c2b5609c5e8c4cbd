"""The small encoder `precompute bench scale` runs by default: a random 2-layer BERT, 64-d.

The bench measures how each stage grows with the number of rows, not what a model is worth,
so the encoder only has to be real (a BERT with the bundled model's tokenizer, exported,
quantized and gated like any other) and small enough that a million rows embed in minutes
on a couple of CPU cores. It is saved once as a sentence-transformers folder (mean pooling,
normalised) and given to the outputs through the pipeline file like a user's own model.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from transformers import BertConfig, BertModel

from precompute.models.source import TOKENIZER_FILES, bundled_encoder

HIDDEN = 64
LAYERS = 2
MAX_TOKENS = 128
WORD_SCALE = 50.0


def small_encoder(folder: Path) -> Path:
    """Save the encoder under `folder` unless it is already there; returns the folder."""
    if (folder / "modules.json").is_file():
        return folder
    bundled = bundled_encoder().folder
    vocab = json.loads((bundled / "config.json").read_text())["vocab_size"]
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=vocab,
        hidden_size=HIDDEN,
        intermediate_size=4 * HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=2,
        pad_token_id=0,  # the bundled tokenizer pads with 0, the position embeddings' padding index too
    )
    model = BertModel(config)
    with torch.no_grad():
        # At the default init the position embeddings outweigh the words and every text's vector
        # is within cosine 0.98 of every other's: HNSW cannot tell them apart (the canaries of the
        # flow's validation went missing at 10,000 rows). Words 50x louder spread the vectors as a
        # trained encoder's are (cosines between texts 0.34 on average, 0.01-0.61 for 98% of pairs).
        model.embeddings.word_embeddings.weight.mul_(WORD_SCALE)
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    for name in TOKENIZER_FILES:
        if (bundled / name).is_file():
            shutil.copy(bundled / name, partial / name)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (partial / "1_Pooling").mkdir()
    (partial / "2_Normalize").mkdir()
    (partial / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": HIDDEN, "pooling_mode_mean_tokens": True})
    )
    (partial / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": MAX_TOKENS}))
    (partial / "modules.json").write_text(json.dumps(modules))
    partial.rename(folder)  # whole or not at all: a killed save is redone, never half-read
    return folder
