"""Export a model from PyTorch to ONNX, with everything after the transformer inside the graph.

An encoder's pooling and normalisation, a classifier's softmax or sigmoid: with them in the
graph, every backend returns the final output, and nothing downstream can pool or squash
differently from the reference.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from transformers import AutoModel, AutoModelForSequenceClassification
from transformers.utils import logging as transformers_logging

from precompute.models.source import INPUT_NAMES, OUTPUT_NAME, ModelSource

OPSET = 17


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """Token vectors [B, L, D] to one vector per text [B, D], padding excluded (as sentence-transformers)."""
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
    if pooling == "cls":
        return hidden[:, 0]
    if pooling == "max":
        return (hidden + (1.0 - mask) * -1e9).max(dim=1).values
    return (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)


class SentenceEncoder(torch.nn.Module):
    """Transformer, pooling, optional L2 normalisation: a sentence encoder end to end."""

    def __init__(self, source: ModelSource, attention: str) -> None:
        super().__init__()
        self.transformer = AutoModel.from_pretrained(source.folder, attn_implementation=attention, dtype=torch.float32)
        self.pooling, self.normalize = source.pooling, source.normalize

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.transformer(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        pooled = pool(hidden, attention_mask, self.pooling)
        return torch.nn.functional.normalize(pooled, p=2.0, dim=1) if self.normalize else pooled


class TextClassifier(torch.nn.Module):
    """A sequence classifier's logits turned into probabilities: softmax, or sigmoid per label."""

    def __init__(self, source: ModelSource, attention: str) -> None:
        super().__init__()
        self.classifier = AutoModelForSequenceClassification.from_pretrained(
            source.folder, attn_implementation=attention, dtype=torch.float32
        )
        self.multi_label = source.multi_label

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        logits = self.classifier(input_ids=input_ids, attention_mask=attention_mask).logits
        return torch.sigmoid(logits) if self.multi_label else torch.softmax(logits, dim=-1)


def load_reference(source: ModelSource, attention: str = "eager") -> torch.nn.Module:
    """The FP32 PyTorch model every engine of `source` is checked against: FP32 also where the
    folder holds FP16 weights (transformers would load them as saved), so the export is FP32 too.

    Eager attention (the default) exports as MatMul/Softmax with an additive mask; the SDPA export
    adds Where/IsNaN guards over every score, which cost CPU time (docs/engines.md). On a GPU, PyTorch itself runs SDPA's fused kernels."""
    transformers_logging.disable_progress_bar()  # a per-load bar is noise in job logs
    module = SentenceEncoder(source, attention) if source.task == "embed" else TextClassifier(source, attention)
    return module.eval()


def export_onnx(source: ModelSource, path: Path) -> Path:
    """Write the FP32 ONNX graph with dynamic batch and sequence axes."""
    model = load_reference(source)
    example = torch.full((2, 8), 5, dtype=torch.int64)
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        # The legacy (TorchScript) exporter needs no onnxscript; it announces its deprecation.
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (example, torch.ones_like(example)),
            str(path),
            input_names=list(INPUT_NAMES),
            output_names=[OUTPUT_NAME],
            dynamic_axes={
                "input_ids": {0: "batch", 1: "sequence"},
                "attention_mask": {0: "batch", 1: "sequence"},
                OUTPUT_NAME: {0: "batch"},
            },
            opset_version=OPSET,
            dynamo=False,
        )
    return path
