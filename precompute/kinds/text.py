"""What the kinds that run a text model share: its folder read once, its engine, its lines in the plan."""

from __future__ import annotations

from typing import Literal

from precompute.kinds import Output
from precompute.models.engines.cache import EngineCache
from precompute.models.engines.runtime import resolve_backend, resolve_device, rung_backend, text_ladder
from precompute.models.errors import ModelError
from precompute.models.settings import Engine, EngineSettings
from precompute.models.source import ModelSource, ModelSpec


def read_model(output: Output, field: str, task: Literal["embed", "classify"]) -> ModelSource:
    """The output's `field` (a ModelSpec) read as an encoder or a classifier; one line if it cannot be."""
    spec: ModelSpec = getattr(output.spec, field)
    try:
        return spec.encoder() if task == "embed" else spec.classifier()
    except ModelError as e:
        raise output.error(field, str(e)) from None


def engine_of(output: Output, machine: EngineSettings) -> Engine:
    """The output's engine: its model and policy, gated and calibrated on its own input's texts."""
    if output.source is None:
        raise TypeError(f"output {output.name!r} runs no text model")
    return Engine(model=output.source, reference=output.spec.input.sample(), policy=output.spec.engine, machine=machine)


def engine_lines(output: Output, machine: EngineSettings) -> list[str]:
    """The model, the engine's ladder (and which precisions the cache already holds), and the gate."""
    engine = engine_of(output, machine)
    source = engine.model
    what = (
        f"{source.dim}-d, {source.pooling} pooling{', normalised' if source.normalize else ''}"
        if source.task == "embed"
        else f"classifier, {source.dim} labels, {'sigmoid' if source.multi_label else 'softmax'}"
    )
    device = resolve_device(machine)
    backend = resolve_backend(machine, device)
    ladder = text_ladder(engine.policy.precision, device, backend.name)
    built = {
        (key["backend"], key["precision"])
        for key in EngineCache(machine.cache_dir).keys()
        if key.get("model") == source.hash and "backend" in key and "precision" in key
    }
    state = ", ".join(
        f"{p} {'reused' if (rung_backend(backend, device, p).name, p) in built else 'built on first run'}"
        for p in ladder
    )
    policy = engine.policy
    return [
        f"  model   {source.folder} ({source.architecture}, {what}, {source.max_seq_length} tokens, hash {source.hash})",
        f"  engine  {backend.name}/{device}, ladder {' > '.join(ladder)}: {state}",
        f"  gate    {gate_bar(engine, output.spec.kind)}, on {policy.gate_texts} held-out texts (and "
        f"{policy.calibration_texts} calibration texts) from {engine.reference.path}",
    ]


def gate_bar(engine: Engine, kind: str) -> str:
    """What a quantized rung must keep, in words (models/engines/gate.py, models/labels/labeler.py)."""
    policy = engine.policy
    if engine.model.task == "classify":
        return f"top-label agreement >= {policy.gate_agreement} with FP32"
    if kind == "labels":
        return f"the head's held-out accuracy >= {policy.gate_min_accuracy_ratio} of FP32's"
    return f"known-item recall@10 >= {policy.gate_min_recall_ratio} of FP32's, mean cosine >= {policy.gate_mean_cosine}"
