"""Export the sentence encoder from PyTorch to ONNX, pooling and normalisation inside the graph.

With mean pooling and L2 normalisation in the graph, every backend returns the final
embedding, and nothing downstream can pool differently from the reference.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from transformers import AutoModel
from transformers.utils import logging as transformers_logging

from models.source import INPUT_NAMES, OUTPUT_NAME, model_dir

OPSET = 17


class SentenceEncoder(torch.nn.Module):
    """BERT, masked mean pooling over tokens, L2 normalisation: all-MiniLM-L6-v2 end to end."""

    def __init__(self) -> None:
        super().__init__()
        # Eager attention exports as MatMul/Softmax with an additive mask. The SDPA
        # export adds Where/IsNaN guards over every score (7% of CPU time, measured).
        self.bert = AutoModel.from_pretrained(model_dir(), attn_implementation="eager")

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, p=2.0, dim=1)


def load_reference() -> SentenceEncoder:
    """The FP32 PyTorch model every engine is checked against."""
    transformers_logging.disable_progress_bar()  # a per-load bar is noise in job logs
    return SentenceEncoder().eval()


def export_onnx(path: Path) -> Path:
    """Write the FP32 ONNX graph with dynamic batch and sequence axes."""
    model = load_reference()
    example = torch.ones((2, 8), dtype=torch.int64)
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        # The legacy (TorchScript) exporter needs no onnxscript; it announces its deprecation.
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (example, example),
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
