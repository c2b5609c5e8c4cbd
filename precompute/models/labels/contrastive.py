"""The encoder fine-tuned contrastively on pairs: the few-shot head's fourth candidate (few_shot.py).

The SetFit recipe (Tunstall et al., "Efficient Few-Shot Learning Without Prompts", 2022): pairs
of texts that share a label are pulled together and pairs that share none pushed apart (the
squared error between their cosine and 1 or 0), so eight rows a label make hundreds of training
examples. The label texts (the prompt with each label's description) join the rows as one more
member of their label: the anchors that keep the label's meaning in the encoder.

Batches of BATCH pairs, half of each kind, sampled with a seeded generator, AdamW at SetFit's
step, for at most PAIRS_PER_TEXT pairs a text or `seconds`, whichever ends first, on the engine's
device (a GPU where there is one). Texts are cut to MAX_TOKENS while training: a pair step costs
in proportion to its length, and a label shows in a text's opening as well as its whole.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import numpy as np

from precompute.models.engines.cache import EngineCache
from precompute.models.labels.finetune import REPORT_FILE, save_encoder
from precompute.models.source import ModelSource, read_encoder

RECIPE = "contrastive/cosine-mse/adamw-2e-5/batch-16/v1"
BATCH = 16
"""Pairs per step (SetFit's default batch)."""
PAIRS_PER_TEXT = 40
"""SetFit's 20 iterations: 20 pairs of each kind a text."""
MAX_TOKENS = 64


def pairs(members: np.ndarray, count: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`count` pairs of distinct texts (left, right, whether they share a label), alternately
    sharing one and sharing none; a kind no two texts make is left out. `members`: [texts,
    labels] booleans."""
    overlap = members.astype(np.int64) @ members.T.astype(np.int64) > 0
    shared = overlap & ~np.eye(len(members), dtype=bool)
    kinds = [(shared, np.flatnonzero(shared.any(axis=1)), True), (~overlap, np.flatnonzero((~overlap).any(axis=1)), False)]
    left, right, same = [], [], []
    for i in range(count):
        matrix, rows, kind = kinds[i % 2]
        if len(rows):
            first = rng.choice(rows)
            left.append(first)
            right.append(rng.choice(np.flatnonzero(matrix[first])))
            same.append(kind)
    return np.array(left, np.int64), np.array(right, np.int64), np.array(same, bool)


class PairTrainer:
    """An encoder in training, and the texts it trains on."""

    def __init__(self, source: ModelSource, device: str) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer

        torch.manual_seed(0)
        self.source, self.device = source, device
        self.tokenizer = AutoTokenizer.from_pretrained(source.folder)
        self.model = AutoModel.from_pretrained(source.folder, dtype=torch.float32).to(device)

    def vectors(self, texts: list[str], tokens: int) -> object:
        """Pooled, unit vectors (a torch tensor) of `texts` cut to `tokens`: the encoder's own
        pooling, as exported."""
        import torch

        from precompute.models.engines.export import pool

        encoded = self.tokenizer(
            texts, padding=True, truncation=True, max_length=tokens, return_tensors="pt"
        ).to(self.device)
        pooled = pool(self.model(**encoded).last_hidden_state, encoded["attention_mask"], self.source.pooling)
        return torch.nn.functional.normalize(pooled, dim=-1)

    def train(self, texts: list[str], members: np.ndarray, seconds: float) -> dict[str, object]:
        """Fine-tune on pairs of `texts` for at most `seconds`: what training did."""
        import torch

        self.model.train()
        optimizer = torch.optim.AdamW(self.model.parameters(), lr=2e-5, weight_decay=0.01)
        rng = np.random.default_rng(0)
        start, steps = time.perf_counter(), 0
        every = pairs(members, PAIRS_PER_TEXT * len(texts), rng)
        tokens = min(MAX_TOKENS, self.source.max_seq_length)
        for first in range(0, len(every[0]), BATCH):
            if time.perf_counter() - start >= seconds:
                break
            left, right, same = (part[first : first + BATCH] for part in every)
            cosine = (self.vectors([texts[i] for i in left], tokens) * self.vectors([texts[i] for i in right], tokens)).sum(dim=-1)
            loss = torch.nn.functional.mse_loss(cosine, torch.from_numpy(same.astype(np.float32)).to(self.device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            steps += 1
        self.model.eval()
        return {
            "device": self.device,
            "texts": len(texts),
            "steps": steps,
            "pairs": min(steps * BATCH, len(every[0])),
            "seconds": round(time.perf_counter() - start, 1),
        }

    def encode(self, texts: list[str], batch: int = 64) -> np.ndarray:
        """FP32 unit vectors of `texts` (as long as the encoder serves them) from the encoder as trained so far."""
        import torch

        with torch.inference_mode():
            parts = [self.vectors(texts[i : i + batch], self.source.max_seq_length).cpu().numpy() for i in range(0, len(texts), batch)]
        return np.concatenate(parts) if parts else np.zeros((0, self.source.dim), np.float32)


def contrastive_tuned(
    source: ModelSource, texts: list[str], members: np.ndarray, seconds: float, device: str, cache: EngineCache
) -> tuple[ModelSource, dict[str, object]]:
    """(the encoder fine-tuned on pairs of `texts`, what its training did), cached by base model,
    texts and labels, recipe and budget: an unchanged night reuses it."""
    digest = hashlib.sha256()
    for text, row in zip(texts, members, strict=True):
        digest.update(f"{text}\x00{np.flatnonzero(row).tolist()}\x00".encode())
    key = {"model": source.hash, "rows": digest.hexdigest()[:16], "recipe": RECIPE, "seconds": str(seconds)}

    def build(directory: Path) -> None:
        trainer = PairTrainer(source, device)
        save_encoder(trainer.model, source, directory, trainer.train(texts, members, seconds))

    entry = cache.get_or_build("label-encoder", key, build)
    tuned = read_encoder(entry.path, source.pooling, source.normalize, source.max_seq_length)
    return tuned, json.loads((entry.path / REPORT_FILE).read_text())
