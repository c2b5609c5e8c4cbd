"""Tiny random-initialised models of each supported architecture, built from a transformers config.

The catalogue of test models: each is a real Hugging Face folder (config, weights, the
bundled model's tokenizer files) a few hundred KB in size, built in a test's temporary folder.
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForSequenceClassification,
)

from precompute.models.source import TOKENIZER_FILES, bundled_encoder

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


def saved_by_sentence_transformers(folder: Path, pooling: str = "cls", half: bool = False) -> Path:
    """A tiny BERT saved by the installed sentence-transformers itself, with its own Pooling
    config form ("pooling_mode": "cls") and a Normalize module: a folder as users save them
    (`half`: with FP16 weights, as many are published)."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    transformer = Transformer(str(tiny_encoder(folder.with_name(f"{folder.name}-hf"), "bert")))
    modules = [transformer, Pooling(HIDDEN, pooling_mode=pooling), Normalize()]
    model = SentenceTransformer(modules=modules)
    (model.half() if half else model).save(str(folder))
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


TOWER_DIM = 16


class _UserTower(torch.nn.Module):
    """age [batch] and taste [batch, 8] (floats) -> [batch, TOWER_DIM]."""

    def __init__(self) -> None:
        super().__init__()
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(9, 32), torch.nn.ReLU(), torch.nn.Linear(32, TOWER_DIM)
        )

    def forward(self, age: torch.Tensor, taste: torch.Tensor) -> torch.Tensor:
        return self.mlp(torch.cat([age.unsqueeze(1) / 50, taste], dim=1))


class _ItemTower(torch.nn.Module):
    """category [batch] (an id into an embedding table) and price [batch] -> [batch, TOWER_DIM]."""

    def __init__(self) -> None:
        super().__init__()
        self.category = torch.nn.Embedding(10, 8)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(9, 32), torch.nn.ReLU(), torch.nn.Linear(32, TOWER_DIM)
        )

    def forward(self, category: torch.Tensor, price: torch.Tensor) -> torch.Tensor:
        return self.mlp(torch.cat([self.category(category), price.unsqueeze(1) / 100], dim=1))


def tiny_towers(folder: Path) -> tuple[Path, Path]:
    """(user.onnx, item.onnx): random-initialised towers over the features users_features() and
    items_features() write, exported as a user's own model would be (nn.Linear as Gemm)."""
    torch.manual_seed(0)
    folder.mkdir(parents=True, exist_ok=True)
    examples = {
        "user": (_UserTower(), (torch.ones(2), torch.ones(2, 8)), ["age", "taste"]),
        "item": (_ItemTower(), (torch.ones(2, dtype=torch.int64), torch.ones(2)), ["category", "price"]),
    }
    paths = []
    for name, (module, example, inputs) in examples.items():
        path = folder / f"{name}.onnx"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the legacy exporter announces its deprecation
            torch.onnx.export(
                module.eval(),
                example,
                str(path),
                input_names=inputs,
                output_names=["vector"],
                dynamic_axes={**{i: {0: "batch"} for i in inputs}, "vector": {0: "batch"}},
                opset_version=17,
                dynamo=False,
            )
        paths.append(path)
    return paths[0], paths[1]
