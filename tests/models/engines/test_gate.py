"""The accuracy gate: thresholds, and fallback to the next precision up."""

from __future__ import annotations

import collections
import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import onnx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from onnx import numpy_helper

from precompute.demo_data import DEMO_CORPUS
from precompute.models import Engine, load_encoder
from precompute.models.engines import load, runtime
from precompute.models.engines.gate import (
    MIN_PAIRS,
    QUERY_MAX_WORDS,
    known_item_pair,
    known_item_recall,
    known_items,
    recall_gate,
)
from precompute.models.engines.graphs import MIXED_SHARES
from precompute.models.engines.quantize import QUANTIZERS, int8_dynamic
from precompute.models.source import ModelSource
from precompute.models.text.reference import TextSample


def pairs_at(queries: np.ndarray, documents: np.ndarray) -> np.ndarray:
    """KnownItems.texts' vectors: the queries, then their documents."""
    return np.concatenate([queries, documents])


def orthonormal(n: int, dim: int, seed: int = 0) -> np.ndarray:
    return np.linalg.qr(np.random.default_rng(seed).standard_normal((dim, n)))[0].T


def test_a_pair_is_a_texts_opening_third_and_the_words_after_it() -> None:
    words = [f"w{i}" for i in range(12)]
    assert known_item_pair(" ".join(words)) == (" ".join(words[:4]), " ".join(words[4:]))
    assert known_item_pair("three short  words") is None
    long = " ".join(f"w{i}" for i in range(300))
    query, document = known_item_pair(long)
    assert len(query.split()) == QUERY_MAX_WORDS and len(document.split()) == 300 - QUERY_MAX_WORDS
    items = known_items(["a b c d e f", "too short", "a b c d e f", "g h i j k l"])
    assert (items.queries, items.documents) == (["a b", "g h"], ["c d e f", "i j k l"])
    assert items.texts == ["a b", "g h", "c d e f", "i j k l"]


def test_known_item_recall_and_mrr_count_the_answers_rank() -> None:
    """Query i's answer is document i, of 12: query 1's ranks 3rd, query 2's last (behind ten
    documents tied above it), every other one's first."""
    documents = np.eye(12)
    queries = np.eye(12)
    queries[1, [5, 6, 1]] = [1.0, 0.9, 0.8]
    queries[2] = 1.0 - documents[2]
    recall, mrr = known_item_recall(queries, documents)
    assert recall == pytest.approx(11 / 12) and mrr == pytest.approx((10 + 1 / 3 + 0) / 12)


def test_moved_neighbours_that_keep_every_answer_pass() -> None:
    """What users feel is whether the answer comes back: vectors moved enough to reorder
    documents' neighbours (overlap well under 0.98) that keep every query's answer pass."""
    rng = np.random.default_rng(0)
    centre = rng.standard_normal(64)
    documents = centre + 0.05 * np.linalg.norm(centre) * rng.standard_normal((40, 64))
    queries = documents + 0.02 * np.linalg.norm(centre) * rng.standard_normal((40, 64))
    reference = pairs_at(queries, documents)
    moved = reference + 0.01 * np.linalg.norm(reference, axis=1, keepdims=True) * rng.standard_normal(reference.shape)
    result = recall_gate("int8", moved, reference, 40, (0.95, 0.99))
    assert result.passed and result.overlap < 0.9 and result.recall_ratio == 1.0 and result.recall == 1.0


def test_answers_moved_within_the_top_10_pass_and_answers_lost_fail() -> None:
    """32 pairs on orthogonal axes. A candidate whose queries 0-3 rank their answer second keeps
    recall (MRR shows the move); one whose queries 0-7 find other documents first loses them."""
    documents = orthonormal(32, 48)
    reference = pairs_at(documents, documents)
    second = reference.copy()
    second[:4] = documents[:4] + 1.5 * documents[[1, 2, 3, 4]]  # query i nearer document i+1
    result = recall_gate("int8", second, reference, 32, (0.5, 0.99))
    assert result.passed and (result.recall_fp32, result.recall) == (1.0, 1.0)
    assert result.mrr_ratio == pytest.approx((28 + 4 / 2) / 32, abs=1e-4)
    lost = reference.copy()
    for i in range(8):  # query i nearer 11 other documents than its own
        lost[i] = 0.1 * documents[i] + documents[[j for j in range(32) if j != i][i : i + 11]].sum(axis=0)
    result = recall_gate("int8", lost, reference, 32, (0.5, 0.99))
    assert not result.passed and result.recall_ratio == pytest.approx(24 / 32)
    assert result.reason == "known-item recall@10 ratio 0.7500 < 0.99 (0.7500 vs FP32 1.0000)"


def test_a_collapsed_engine_fails_on_the_cosine_floor_and_nan_fails_everything() -> None:
    documents = orthonormal(20, 32)
    reference = pairs_at(documents, documents)
    collapsed = reference + 3.0 * np.ones(32)  # every vector pulled towards one direction
    result = recall_gate("int8", collapsed, reference, 20, (0.95, 0.0))
    assert not result.passed and result.reason.startswith("mean cosine")
    broken = reference.copy()
    broken[3] = np.nan
    result = recall_gate("int8", broken, reference, 20, (0.95, 0.99))
    assert not result.passed and "mean cosine nan < 0.95" in result.reason and "ratio" in result.reason


def test_too_few_pairs_fail_unless_the_ratio_is_off() -> None:
    documents = orthonormal(8, 16)
    reference = pairs_at(documents, documents)
    result = recall_gate("int8", reference, reference, 8, (0.95, 0.99))
    assert not result.passed and "8 held-out texts" in result.reason and f"{MIN_PAIRS} needed" in result.reason
    assert recall_gate("int8", reference, reference, 8, (0.95, 0.0)).passed
    assert recall_gate("fp32", reference, reference, 8, (0.95, 0.99)).passed  # FP32 is never refused for it


def degraded_int8(fp32: Path, out: Path, calibration: list[str], source: ModelSource) -> None:
    """A broken quantizer: seeded noise of half a weight's spread on every MatMul weight."""
    model = onnx.load(fp32)
    rng = np.random.default_rng(0)
    for init in model.graph.initializer:
        weight = numpy_helper.to_array(init)
        if weight.ndim == 2 and weight.shape[0] == 384:
            noisy = weight + rng.normal(0, 0.5 * weight.std(), weight.shape).astype(weight.dtype)
            init.CopyFrom(numpy_helper.from_array(noisy, init.name))
    noisy_path = out.with_suffix(".noisy.onnx")
    onnx.save(model, noisy_path)
    int8_dynamic(noisy_path, out, calibration, source)
    noisy_path.unlink()


@pytest.mark.slow
@pytest.mark.usefixtures("cpu_without_bf16")  # a ladder with BF16 has no mixed graphs
def test_degraded_int8_falls_back_to_a_mixed_graph_of_its_most_sensitive_matmuls_in_float(
    settings: Engine, bundled_cache: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The all-INT8 graph fails; the first mixed graph that passes serves, and it kept in float
    the MatMuls its sensitivity ranking put first."""
    for entry in bundled_cache.values():  # reuse the FP32 export and reference, not the INT8 entry
        shutil.copytree(entry, tmp_path / entry.name)
    monkeypatch.setitem(QUANTIZERS, "int8-dynamic", degraded_int8)

    with load_encoder(settings.replace(cache_dir=tmp_path)) as mixed:
        report = mixed.report
    assert report.precision == "int8-mixed"
    failed, *tried = report.gates
    assert (failed.precision, failed.passed) == ("int8", False) and failed.mean_cosine < 0.95
    assert failed.reason.startswith("mean cosine")
    assert [g.precision for g in tried] == list(MIXED_SHARES)[: len(tried)]
    assert tried[-1].passed and not any(g.passed for g in tried[:-1])
    (record,) = tmp_path.glob(f"onnx-{tried[-1].precision}-*/float_matmuls.json")
    kept = json.loads(record.read_text())
    assert kept["float"] == list(kept["sensitivity"])[: len(kept["float"])]
    assert len(kept["float"]) == math.ceil(MIXED_SHARES[tried[-1].precision] * len(kept["sensitivity"]))
    graph = onnx.load(Path(report.engine_dir) / "model.onnx", load_external_data=False)
    assert set(kept["float"]) <= {node.name for node in graph.graph.node if node.op_type == "MatMul"}


@pytest.mark.slow
@pytest.mark.parametrize("native_bf16", [False, True], ids=["to-fp32", "to-bf16"])
def test_an_engine_degraded_at_every_int8_graph_falls_back_to_the_next_rung(
    settings: Engine,
    bundled_cache: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    native_bf16: bool,
) -> None:
    """FP32, or BF16 on PyTorch where the CPU multiplies it in hardware (here made to say so)."""
    for entry in bundled_cache.values():
        shutil.copytree(entry, tmp_path / entry.name)
    for variant in ("int8-dynamic", *MIXED_SHARES):
        monkeypatch.setitem(QUANTIZERS, variant, degraded_int8)
    monkeypatch.setattr(runtime, "native_bf16", lambda: native_bf16)

    with load_encoder(settings.replace(cache_dir=tmp_path)) as fallback:
        report = fallback.report
    *failed, passed = report.gates
    # A ladder with BF16 has no mixed graphs: BF16 is nearer FP32 and faster than each (Builder.variants).
    assert [g.precision for g in failed] == ["int8", *(() if native_bf16 else MIXED_SHARES)]
    assert not any(g.passed for g in failed) and failed[0].mean_cosine < 0.95
    if native_bf16:
        assert (report.backend, report.precision, passed.precision) == ("torch", "bf16", "bf16")
        assert passed.passed
        assert passed.min_cosine > 0.999 and passed.recall_ratio >= 0.99
    else:
        assert (report.backend, report.precision, passed.precision) == ("onnxruntime", "fp32", "fp32")
        assert passed.passed
        assert passed.min_cosine > 0.9999 and passed.recall_ratio == 1.0 and passed.overlap == 1.0


def test_minilms_int8_graph_keeps_the_demo_corpus_answers_and_serves(encoder) -> None:
    """On the demo corpus's held-out texts MiniLM's all-INT8 graph moves about one neighbour in
    ten (the old overlap bar, 0.98, refused it) and keeps every answer FP32 finds: it serves."""
    [int8] = encoder.report.gates
    assert (int8.precision, int8.passed, encoder.report.precision) == ("int8", True, "int8")
    assert int8.recall_ratio >= 0.99 and int8.pairs == int8.texts and int8.overlap < 0.95


NEAR_DUPLICATE = (
    "the {w} service was checked during the night shift by the operations team on call, who read the logs of "
    "every node in the cluster and wrote a report for the morning meeting of the platform group about what they had "
    "found there; the {w} service answers again after the restart of the main cluster nodes, and the latency of its "
    "requests is back to what the dashboards showed before the incident began late in the evening; nobody had to "
    "page the database team, the queues drained within minutes, and the backlog of jobs that had waited on the "
    "cluster was run again in order. "
    + "The next steps are to review the alert thresholds, to write down how the restart was done so that the next "
    "person on call can repeat it without help, to check the disks of the storage nodes, and to plan a test of the "
    "failover path before the end of the month, when traffic is highest and the cost of another outage would be "
    "much larger for every customer who depends on the platform for their daily work. " * 3
)
"""A report whose copies differ in one word, named twice: in the query's opening words and in its answer."""


def near_duplicates(path: Path) -> Path:
    """1,000 copies of NEAR_DUPLICATE, each naming its own word of the demo corpus."""
    texts = pq.read_table(DEMO_CORPUS, columns=["text"])["text"].to_pylist()
    counts = collections.Counter(word for text in texts for word in re.findall(r"\b[a-z]{5,10}\b", text))
    words = [word for word, _ in counts.most_common(1300)][300:]
    rows = [{"id": f"t{i}", "text": NEAR_DUPLICATE.format(w=word)} for i, word in enumerate(words)]
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


@pytest.mark.slow
@pytest.mark.usefixtures("cpu_without_bf16")
def test_a_corpus_whose_answers_int8_loses_is_refused_int8_with_the_reason(
    settings: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Near-duplicate reports, told apart by one word: MiniLM's all-INT8 graph keeps a mean
    cosine over 0.99 to FP32 and still loses answers FP32 finds; the gate refuses it, saying
    so, and what serves keeps them. Without mixed graphs on the ladder, FP32 serves."""
    reports = near_duplicates(tmp_path / "reports.parquet")
    engine = settings.replace(reference=TextSample(path=str(reports)), gate_texts=256)
    with load_encoder(engine) as encoder:
        report = encoder.report
    int8, *_, served = report.gates
    assert (int8.precision, int8.passed, int8.pairs) == ("int8", False, 256)
    assert int8.mean_cosine > 0.99 and int8.recall < 0.99 * int8.recall_fp32
    assert int8.reason == (
        f"known-item recall@10 ratio {int8.recall_ratio:.4f} < 0.99 ({int8.recall:.4f} vs FP32 {int8.recall_fp32:.4f})"
    )
    assert served.passed and served.recall_ratio >= 0.99 and served is not int8

    monkeypatch.setattr(load, "MIXED_SHARES", {})
    with load_encoder(engine) as encoder:
        report = encoder.report
    assert [(g.precision, g.passed) for g in report.gates] == [("int8", False), ("fp32", True)]
    assert report.precision == "fp32" and report.gates[0].reason == int8.reason
