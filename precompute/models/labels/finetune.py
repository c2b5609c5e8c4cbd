"""The encoder fine-tuned on the labelled rows: a label head's third kind of candidate.

Plain classification fine-tuning: the encoder's pooled (and normalised) vector, a linear layer,
cross-entropy (a sigmoid per label for a list column), AdamW at a small step for the encoder and
a larger one for the layer, batches of BATCH rows in a seeded order, for at most EPOCHS passes or
`seconds`, whichever ends first (on the GPU when the engine's device is one). Only the training
rows of the held-out split train it, so the candidates it feeds are compared on rows it never saw.

The result is a Hugging Face folder like the one it came from (the layer is dropped: the heads
of label_training.py are fit on its embeddings), cached by (base model, digest of the training
rows and labels, recipe, budget): an unchanged night reuses it. It runs as any encoder does,
exported to ONNX and through the precision ladder and its gates (models/engines/load.py).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path

import numpy as np

from precompute.models.engines.cache import EngineCache
from precompute.models.labels.training import Labelled
from precompute.models.source import TOKENIZER_FILES, ModelSource, read_encoder

RECIPE = "classification/adamw-5e-5-2e-3/batch-32/v1"
BATCH = 32
EPOCHS = 1
LOGIT_SCALE = 20.0
"""Normalised vectors give cosines in [-1, 1]: scaled, the softmax can be confident."""
REPORT_FILE = "fine_tune.json"


def fine_tuned(
    source: ModelSource, labelled: Labelled, rows: np.ndarray, seconds: float, device: str, cache: EngineCache
) -> tuple[ModelSource, dict[str, object]]:
    """(the encoder fine-tuned on `rows` of `labelled`, what its training did), from the cache when
    these rows were seen before."""
    digest = hashlib.sha256()
    for i in rows:
        digest.update(f"{labelled.texts[i]}\x00{labelled.targets[i].tolist()}\x00".encode())
    key = {"model": source.hash, "rows": digest.hexdigest()[:16], "recipe": RECIPE, "seconds": str(seconds)}
    entry = cache.get_or_build(
        "label-encoder", key, lambda directory: train(source, labelled, rows, seconds, device, directory)
    )
    tuned = read_encoder(entry.path, source.pooling, source.normalize, source.max_seq_length)
    return tuned, json.loads((entry.path / REPORT_FILE).read_text())


def train(
    source: ModelSource, labelled: Labelled, rows: np.ndarray, seconds: float, device: str, directory: Path
) -> None:
    import torch
    from transformers import AutoModel, AutoTokenizer

    from precompute.models.engines.export import pool  # the exported graph's own pooling

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(source.folder)
    model = AutoModel.from_pretrained(source.folder, dtype=torch.float32).to(device).train()
    layer = torch.nn.Linear(source.dim, len(labelled.names)).to(device)
    optimizer = torch.optim.AdamW(
        [{"params": model.parameters(), "lr": 5e-5}, {"params": layer.parameters(), "lr": 2e-3}], weight_decay=0.01
    )
    targets = torch.from_numpy(labelled.targets[rows]).to(device)
    scale = LOGIT_SCALE if source.normalize else 1.0
    order = np.random.default_rng(0).permutation(np.tile(np.arange(len(rows)), EPOCHS))
    start, steps = time.perf_counter(), 0
    for first in range(0, len(order) - BATCH + 1, BATCH):
        if time.perf_counter() - start > seconds:
            break
        batch = order[first : first + BATCH]
        encoded = tokenizer(
            [labelled.texts[rows[i]] for i in batch],
            padding=True,
            truncation=True,
            max_length=source.max_seq_length,
            return_tensors="pt",
        ).to(device)
        vectors = pool(model(**encoded).last_hidden_state, encoded["attention_mask"], source.pooling)
        if source.normalize:
            vectors = torch.nn.functional.normalize(vectors, dim=-1)
        logits = scale * layer(vectors)
        truth = targets[batch]
        if labelled.multi:
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, truth.float())
        else:
            loss = torch.nn.functional.cross_entropy(logits, truth)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        steps += 1
    report = {
        "device": device,
        "rows": len(rows),
        "steps": steps,
        "epochs": round(steps * BATCH / max(len(rows), 1), 2),
        "seconds": round(time.perf_counter() - start, 1),
    }
    save_encoder(model, source, directory, report)


def save_encoder(model: object, source: ModelSource, directory: Path, report: dict[str, object]) -> None:
    """A Hugging Face folder like `source`'s (its tokenizer files copied), and what training did."""
    model.save_pretrained(directory)
    for name in TOKENIZER_FILES:
        if (source.folder / name).is_file():
            shutil.copy(source.folder / name, directory / name)
    (directory / REPORT_FILE).write_text(json.dumps(report))
