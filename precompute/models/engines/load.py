"""Pick, build, gate and open a model's engine: the one entry point jobs and the service call.

For each precision on the ladder (fastest first), the precision's ONNX graph and the
backend's engine come from the cache (built on a miss), and the engine is gated against
the FP32 reference on held-out texts. The first precision that passes serves; each one
that fails is recorded with its reason in the report.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import numpy as np
import onnxruntime as ort

from precompute.models.backends import BuildSpec, ConcreteDevice, Runner
from precompute.models.engines.cache import EngineCache
from precompute.models.engines.climb import Rung, climb
from precompute.models.engines.gate import (
    GateResult,
    agreement_gate,
    few_texts,
    known_item_pair,
    known_items,
    recall_gate,
)
from precompute.models.engines.graphs import CALIBRATED, FUSABLE, FUSED, MIXED_SHARES, ONNX_VARIANTS, STATIC
from precompute.models.engines.runtime import BF16, resolve_backend, resolve_device, rung_backend, text_ladder
from precompute.models.hardware import device_fingerprint, int8_saturates
from precompute.models.settings import Engine
from precompute.models.text.encoder import Encoder, EngineReport, encode_texts
from precompute.models.text.kept_vectors import read, text_digest, vectors_of
from precompute.models.text.reference import reference_texts, texts_digest
from precompute.models.text.tokenize import TextTokenizer

ENGINE_LOG = "precompute.engine"
LOG = logging.getLogger(ENGINE_LOG)
"""A line per step of the ladder (a graph built, a rung gated): jobs relay them as progress
lines (jobs/progress.py relayed), since a cold ladder takes minutes before the first row."""
GATE_VECTORS = "gate-vectors.npz"
"""An engine's outputs of the gate texts (and the label gate's calibration texts), in its cache
entry, by text."""
REFERENCE_VECTORS = "vectors.npz"
"""The FP32 reference outputs, in the model's `reference` entry."""
MOVED_SHARE = 0.1
"""A gate leaves out its sample's texts that no earlier gate of the model scored while they are at
most this share of it (gate_texts)."""


def peer_independent(engine: Engine) -> Engine:
    """`engine` as an engine whose output for one row never depends on the other rows of its
    batch, as micro-batched queries need: CPU INT8 is dynamic by default (activation scales per
    batch: a query's vector moved by up to 0.03 per component beside other queries), so on CPUs
    its rung runs the static graph (ranges calibrated once: graphs.STATIC); BF16 and FP32 are
    static already, and every GPU rung is (Q/DQ, FP16, FP32)."""
    if resolve_device(engine.machine) != "cpu" or engine.policy.precision in (BF16, "fp32"):
        return engine
    return engine.replace(graph="static")


def rungs(engine: Engine, device: ConcreteDevice, backend: str) -> tuple[str, ...]:
    """The precisions load_encoder tries: the text ladder, less BF16 for the query graph unless
    asked for. One short text per call pays the eager PyTorch module's per-op dispatch, under the
    GIL, on every query, which ONNX Runtime's graphs do not; batches amortise it (`precompute
    bench fidelity` times queries by length through the service)."""
    ladder = text_ladder(engine.policy.precision, device, backend)
    if engine.machine.graph == "query" and engine.policy.precision != BF16:
        return tuple(precision for precision in ladder if precision != BF16)
    return ladder


def load_encoder(engine: Engine) -> Encoder:
    """The fastest engine of `engine.model` for this machine that passes the accuracy gate: the
    precision climb (climb.py) over each precision's graphs, the first that passes serving."""
    device = resolve_device(engine.machine)
    backend = resolve_backend(engine.machine, device)
    backend.check_available(device)
    machine = engine.machine
    cpus = len(os.sched_getaffinity(0))
    batch_size = machine.batch_size or (16 if device == "cpu" else 256)
    source = engine.model
    build = _Builder(engine, device, backend, BuildSpec(batch_size, source.max_seq_length))
    tokenizer = TextTokenizer(source)
    ladder = rungs(engine, device, backend.name)
    model = f"{source.folder} ({source.architecture}, {source.task}, {source.hash})"

    def rung(precision: str, variant: str) -> Rung[Encoder]:
        runner_cls = build.backend(precision)
        # ONNX Runtime on a CPU: a single-threaded stream per core; PyTorch: one over every core.
        streams = machine.streams or (cpus if device == "cpu" and runner_cls.name != "torch" else 1)
        threads = machine.threads or max(1, cpus // streams)
        mixed = variant in MIXED_SHARES  # its gate names the share, its report "int8-mixed"

        def tried() -> tuple[GateResult | None, Encoder | None]:
            engine_dir, hit = build.engine(precision, variant)
            open_runner = partial(runner_cls.open, engine_dir, device, threads, source, precision)
            result, runner = None, None
            if (runner_cls.name, precision) != ("torch", "fp32"):  # the reference needs no gate
                result, runner = build.gate(engine_dir, variant if mixed else precision, open_runner, tokenizer)
                if not result.passed:
                    if runner is not None:
                        runner.close()
                    return result, None
            served = "int8-mixed" if mixed else precision
            report = EngineReport(runner_cls.name, device, served, str(engine_dir), hit, model)
            return result, Encoder(runner or open_runner(), tokenizer, batch_size, streams, report)

        return Rung(variant if mixed else precision, tried)

    climbed = climb(
        rung(precision, variant)
        for precision in ladder
        for variant in build.variants(precision, mixed=BF16 not in ladder)
    )
    encoder = climbed.engine
    encoder.report = replace(encoder.report, gates=climbed.gates)
    return encoder


class _Builder:
    """Cache lookups and builds for one (engine, device, backend): graphs, engines, gates."""

    def __init__(
        self, engine: Engine, device: ConcreteDevice, runner_cls: type[Runner], spec: BuildSpec
    ) -> None:
        self.config = engine
        self.device = device
        self.runner_cls = runner_cls
        self.spec = spec
        self.cache = EngineCache(engine.machine.cache_dir)
        self.model = engine.model.hash
        self._gate_texts: GateTexts | None = None

    def onnx(self, variant: str) -> Path:
        """The FP32 export, or a quantized graph derived from it."""
        if variant == "fp32":
            from precompute.models.engines.export import export_onnx  # torch is imported only to export

            key = {"model": self.model}
            source = self.config.model

            def export(directory: Path) -> None:
                LOG.info("exporting %s to ONNX (FP32)", source.folder.name)
                export_onnx(source, directory / "model.onnx")

            return self.cache.get_or_build("export", key, export).path / "model.onnx"
        fp32 = self.onnx("fp32")
        key = {"model": self.model, "variant": variant, "quantizer": f"onnxruntime {ort.__version__}", **self.weights(variant)}
        calibration: list[str] = []
        if variant in CALIBRATED:  # its ranges (or ranking) come from the output's own texts
            calibration = reference_texts(self.config.reference, "calibration", self.config.policy.calibration_texts)
            key["calibration"] = texts_digest(calibration)

        def quantize(directory: Path) -> None:
            from precompute.models.engines.quantize import (
                QUANTIZERS,  # onnxruntime's quantization tools: slow to import, needed on a miss only
            )

            LOG.info("quantizing %s%s", variant, f" ({len(calibration)} calibration texts)" if calibration else "")
            QUANTIZERS[variant](fp32, directory / "model.onnx", calibration, self.config.model)

        return self.cache.get_or_build(f"onnx-{variant}", key, quantize).path / "model.onnx"

    def weights(self, variant: str) -> dict[str, str]:
        """The key part of a CPU INT8 graph built for CPUs without VNNI (7-bit weights:
        hardware.int8_saturates), and of the engines built from it."""
        return {"weights": "7-bit"} if self.device == "cpu" and variant.startswith("int8") and int8_saturates() else {}

    def variants(self, precision: str, mixed: bool) -> list[str]:
        """The graphs to gate for this precision, in order: its own (fused for single queries
        where it can be; static for batched ones), then, if `mixed`, its mixed graphs. A ladder with BF16 goes without
        them: where the CPU multiplies BF16 in hardware, BF16 is both nearer FP32 and faster in
        batches than any of them (`precompute bench embed --model`, docs/engines.md)."""
        variant, graph = ONNX_VARIANTS[(self.device, precision)], self.config.machine.graph
        if graph == "static" and variant in STATIC:
            return [STATIC[variant]]  # a mixed graph is dynamic: its INT8 part moves with the batch
        fusable = self.config.model.task == "embed" and self.config.model.architecture in FUSABLE
        first = FUSED[variant] if graph == "query" and variant in FUSED and fusable else variant
        return [first, *(MIXED_SHARES if mixed and variant == "int8-dynamic" else ())]

    def backend(self, precision: str) -> type[Runner]:
        """The machine's backend, or PyTorch where it runs the rung (runtime.rung_backend)."""
        return rung_backend(self.runner_cls, self.device, precision)

    def engine(self, precision: str, variant: str) -> tuple[Path, bool]:
        """The backend's engine for this precision's graph: (its cache entry, whether it was a hit)."""
        runner_cls = self.backend(precision)
        key = {
            "model": self.model,
            "precision": precision,
            "graph": variant,
            "backend": runner_cls.name,
            "runtime": runner_cls.runtime_version(),
            "device": device_fingerprint(self.device),
            "max_batch": str(self.spec.max_batch),
            **self.weights(variant),
        }

        def build(directory: Path) -> None:
            if runner_cls.engine_file:
                runner_cls.build(self.onnx(variant), directory / runner_cls.engine_file, self.spec)

        entry = self.cache.get_or_build(f"{runner_cls.name}-{precision}", key, build)
        return entry.path, entry.hit

    def gate(
        self, engine_dir: Path, precision: str, open_runner: Callable[[], Runner], tokenizer: TextTokenizer
    ) -> tuple[GateResult, Runner | None]:
        """Score the engine on held-out texts: a classifier on their top labels, an encoder on
        the known-item pairs cut from them (gate.py). Its outputs are kept beside the engine by
        text (text_vectors), and the engine is opened only to encode texts it has not seen
        (and returned, to serve if it passes): on a night whose gate texts moved by at most
        MOVED_SHARE (gate_texts), a graph that fails costs no session."""
        asked = self.gate_texts()
        opened: list[Runner] = []

        def encode(missing: list[str]) -> np.ndarray:
            opened.append(open_runner())
            return encode_texts(opened[0], tokenizer, missing, self.spec.max_batch)

        policy, texts_from = self.config.policy, self.config.reference.path
        if self.config.model.task == "classify":
            outputs = vectors_of(engine_dir / GATE_VECTORS, asked.texts, encode)
            reference = reference_embeddings(self.config, asked.texts)
            result = agreement_gate(precision, outputs, reference, policy.gate_agreement, texts_from)
        else:
            pairs = known_items(asked.texts)
            outputs = vectors_of(engine_dir / GATE_VECTORS, pairs.texts, encode)
            reference = reference_embeddings(self.config, pairs.texts)
            bar = (policy.gate_mean_cosine, policy.gate_min_recall_ratio)
            result = recall_gate(precision, outputs, reference, len(pairs), bar, texts_from)
        runner = opened[0] if opened else None
        result = replace(result, texts=len(asked.texts), note=asked.note(policy.gate_texts))
        LOG.info("%s", gate_line(result))
        return result, runner

    def gate_texts(self) -> GateTexts:
        if self._gate_texts is None:
            self._gate_texts = gate_texts(self.config)
        return self._gate_texts


@dataclass(frozen=True)
class GateTexts:
    texts: list[str]
    drawn: int
    """The input's sample they come from (reference_texts): fewer than asked on a small input,
    more than `texts` where some were left out as new."""

    def note(self, asked: int) -> str:
        """GateResult.note: on a small input, or where new texts were left out."""
        notes = [few_texts(len(self.texts), asked) if self.drawn < asked else ""]
        if left_out := self.drawn - len(self.texts):
            notes.append(f"{left_out} of {self.drawn} drawn texts left out: new since the model's last gate")
        return "; ".join(note for note in notes if note)


def gate_texts(engine: Engine) -> GateTexts:
    """The input's sample of held-out texts (reference_texts), less those no earlier gate of the
    model scored (no FP32 reference kept: reference_embeddings) while they are at most
    MOVED_SHARE of it; past the share, all of them, and the new ones join the kept ones.

    An engine's agreement with FP32 does not move with a few of the corpus's texts, and a gate
    that asks a new text encodes it on every graph of the ladder (a session each) and on the
    PyTorch reference: a night that edits a few texts would pay a session per graph for them.
    Left out, a gate on an unchanged engine reads every output it needs from the files its
    earlier gates kept."""
    drawn = reference_texts(engine.reference, "gate", engine.policy.gate_texts)
    held = read(reference_file(engine))
    scored = [text for text in drawn if all(text_digest(part) in held for part in gated_parts(engine, text))]
    texts = scored if len(drawn) - len(scored) <= MOVED_SHARE * len(drawn) else drawn
    return GateTexts(texts, len(drawn))


def gated_parts(engine: Engine, text: str) -> tuple[str, ...]:
    """What a gate encodes of a held-out text: an encoder's gate its known-item pair (none for a
    short text), a classifier's the text."""
    if engine.model.task == "classify":
        return (text,)
    return known_item_pair(text) or ()


def gate_line(gate: GateResult) -> str:
    """The ladder's line for a gated rung, as a user watching the build reads it."""
    if gate.recall_ratio is not None:
        figure = f"gate recall ratio {gate.recall_ratio:.4f} ({gate.pairs} known-item pairs)"
    elif gate.accuracy is not None and gate.accuracy_fp32:
        figure = f"gate held-out accuracy ratio {gate.accuracy / gate.accuracy_fp32:.4f}"
    elif gate.agreement is not None:
        figure = f"gate top-label agreement {gate.agreement:.4f}"
    else:
        figure = "gated"
    return f"{gate.precision} {figure} — {'passed' if gate.passed else 'failed: ' + gate.reason}"


def reference_file(engine: Engine) -> Path:
    """The model's FP32 reference outputs kept by text; the entry is only the model's folder, and
    the file grows by text after the entry exists."""
    cache = EngineCache(engine.machine.cache_dir)
    entry = cache.get_or_build("reference", {"model": engine.model.hash}, lambda directory: None)
    return entry.path / REFERENCE_VECTORS


def reference_embeddings(engine: Engine, texts: list[str]) -> np.ndarray:
    """FP32 PyTorch outputs of `texts`, kept per model by text (text_vectors): every gate (cosine
    or agreement here, label agreement in labels.py) scores against the same reference, and a
    night whose gate texts moved by a few computes only those."""

    def encode(missing: list[str]) -> np.ndarray:
        from precompute.models.backends.torch import TorchRunner  # torch: on a miss only

        with TorchRunner(engine.model, "cpu", len(os.sched_getaffinity(0))) as reference:
            return encode_texts(reference, TextTokenizer(engine.model), missing, 32)

    return vectors_of(reference_file(engine), texts, encode)
