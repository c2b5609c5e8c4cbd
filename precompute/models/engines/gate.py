"""The accuracy gate: a quantized engine is used only if users could not tell it from FP32.

Encoders are gated on what search users feel: known-item pairs cut from the output's own
corpus (a held-out text's opening words as the query, the words after them as the document
that answers it), searched exactly among each other under the candidate and under FP32; the
candidate keeps `gate_min_recall_ratio` of FP32's recall@10 (the bar), and its mean cosine to
FP32 stays above a floor that only a collapsed engine crosses. Neighbour overlap, the worst
cosine and MRR@10 are reported, not gated: the tenth neighbour swapping with the eleventh moves
the overlap and no answer (`precompute bench fidelity` measured a graph at overlap 0.93 keeping
recall ratio 0.9945 of FP32 exact search). Classifiers are gated on the share of texts whose top
label is FP32's (they bring no labelled rows), label heads on their held-out accuracy under the
engine against FP32's (models/labels/labeler.py), recommendation towers on the overlap of
users' top items (what a user would see).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class GateResult:
    """One precision's agreement with the FP32 reference; `reason` says why it failed."""

    precision: str
    passed: bool
    reason: str
    mean_cosine: float | None = None
    min_cosine: float | None = None
    agreement: float | None = None
    """Classifiers and labelers: share of texts whose top label is FP32's."""
    recheck_margin: float | None = None
    """Labelers: texts whose top-2 probability margin is under this were labelled again at FP32
    (None: none were)."""
    rechecked: float | None = None
    """Labelers: the share of the gate's texts that were."""
    overlap: float | None = None
    """Towers: mean share of a user's top TOP_K items that are FP32's (gated). Encoders: of each
    known-item document's TOP_K nearest other documents (reported)."""
    recall: float | None = None
    """Encoders: recall@TOP_K of the known-item pairs' answers under this engine."""
    recall_fp32: float | None = None
    """The same under FP32: the bar's denominator."""
    recall_ratio: float | None = None
    """recall / recall_fp32: what the gate holds to `gate_min_recall_ratio`."""
    mrr_ratio: float | None = None
    """MRR@TOP_K under this engine over FP32's: where answers moved within the top 10."""
    pairs: int | None = None
    """Known-item pairs the recall rests on."""
    accuracy: float | None = None
    """Label heads: held-out accuracy of the published head under this engine."""
    accuracy_fp32: float | None = None
    """The same under FP32."""
    seconds: float | None = None
    """Towers: the best of three runs over the gate's rows, both towers; what `auto` compares."""
    texts_from: str = ""
    """The input the held-out texts were drawn from."""
    texts: int | None = None
    """How many held-out texts it rests on."""
    note: str = ""
    """Set when the figures rest on fewer texts than asked (a small input): read them with care."""
    cosine_histogram: list[int] | None = None
    """Texts per bin of COSINE_BINS (the first bin also holds everything below it): the run
    report draws it, since a mean can hide a tail of poor texts."""


def few_texts(texts: int, asked: int) -> str:
    """GateResult.note: what a reader of the report should know about a gate on a small input."""
    if texts >= asked:
        return ""
    return f"rests on {texts} held-out texts, {asked} asked: the input has few rows"


FEW_HELD_OUT = 100
"""Below this many held-out rows, a quality figure carries a note: its error is over +-0.05."""


def few_held_out(count: int, noun: str) -> str:
    """A note for a held-out rate (accuracy, hit-rate) measured on few rows: a binomial rate's
    standard error is at most 0.5 / sqrt(count), so on 20 rows it moves by +-0.11."""
    if count >= FEW_HELD_OUT:
        return ""
    return f"rests on {count} held-out {noun}: a rate on so few moves by up to +-{0.5 / max(count, 1) ** 0.5:.2f}"


TOP_K = 10
"""The list length whose recall and overlap are measured: the results a search page or a product page shows."""
TIE = 1e-4
"""Cosines closer than this are a tie for the neighbour overlap: FP32 engines differ by ~1e-6."""

COSINE_BINS = [round(0.9 + 0.005 * i, 3) for i in range(21)]
"""Bin edges from 0.90 to 1.00."""


def row_cosine(embeddings: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Cosine of each row with its reference row."""
    return np.sum(embeddings * reference, axis=1) / (
        np.linalg.norm(embeddings, axis=1) * np.linalg.norm(reference, axis=1)
    )


def neighbour_overlap(embeddings: np.ndarray, reference: np.ndarray) -> float:
    """Mean share of each row's TOP_K nearest other rows (cosine) that are the reference's. A
    neighbour counts when its reference cosine reaches the reference's K-th best less TIE: rows
    the reference ties (a random model's near-equal vectors) are not misses in either order."""
    k = min(TOP_K, len(embeddings) - 1)
    if k < 1:
        return 1.0

    def scores(vectors: np.ndarray) -> np.ndarray:
        unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
        cosine = unit @ unit.T
        np.fill_diagonal(cosine, -np.inf)
        return cosine

    ours, theirs = scores(embeddings), scores(reference)
    kth = -np.partition(-theirs, k - 1, axis=1)[:, k - 1 : k]
    top = np.argpartition(-ours, k - 1, axis=1)[:, :k]
    return float(np.mean(np.take_along_axis(theirs, top, axis=1) >= kth - TIE))


PAIR_MIN_WORDS = 4
"""A held-out text of fewer words gives no known-item pair: too short to split into a query and
an answer."""
QUERY_SHARE = 1 / 3
QUERY_MAX_WORDS = 24
"""A pair's query is the text's opening third, at most this many words: a typed query or a pasted
sentence, not half a page."""
MIN_PAIRS = 16
"""Fewer pairs cannot tell a recall ratio of 0.99 from 1: each pair moves it by over 0.06."""


@dataclass(frozen=True)
class KnownItems:
    """Known-item pairs from held-out texts: query i is answered by document i and no other."""

    queries: list[str]
    documents: list[str]

    def __len__(self) -> int:
        return len(self.queries)

    @property
    def texts(self) -> list[str]:
        """What an engine encodes for them: the queries, then the documents."""
        return self.queries + self.documents


def known_item_pair(text: str) -> tuple[str, str] | None:
    """(query, document): the text's opening words and the words after them; None for a short text.
    The document leaves the query's words out, as search answers rarely repeat the query whole."""
    words = text.split()
    if len(words) < PAIR_MIN_WORDS:
        return None
    cut = max(1, min(round(len(words) * QUERY_SHARE), QUERY_MAX_WORDS))
    return " ".join(words[:cut]), " ".join(words[cut:])


def known_items(texts: list[str]) -> KnownItems:
    """The pairs of `texts`, in order, each document once (a repeated one would be two answers)."""
    queries, documents, seen = [], [], set()
    for text in texts:
        if (pair := known_item_pair(text)) is not None and pair[1] not in seen:
            seen.add(pair[1])
            queries.append(pair[0])
            documents.append(pair[1])
    return KnownItems(queries, documents)


def known_item_recall(queries: np.ndarray, documents: np.ndarray) -> tuple[float, float]:
    """(recall@TOP_K, MRR@TOP_K) of exact cosine search where query i's answer is document i. A
    document within TIE of the answer does not push it down: ties are not an engine's fault (a
    random model's near-equal vectors, which FP32 engines order differently)."""
    if not len(queries):
        return 0.0, 0.0

    def unit(vectors: np.ndarray) -> np.ndarray:
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)

    scores = unit(queries) @ unit(documents).T
    answer = np.diagonal(scores)[:, None]
    rank = np.sum(scores > answer + TIE, axis=1)  # 0 = first; NaN scores compare False: fails below
    found = (rank < TOP_K) & np.isfinite(answer[:, 0])
    return float(found.mean()), float(np.where(found, 1.0 / (rank + 1), 0.0).mean())


def recall_gate(
    precision: str,
    outputs: np.ndarray,
    reference: np.ndarray,
    pairs: int,
    thresholds: tuple[float, float],
    texts_from: str = "",
) -> GateResult:
    """`outputs` and `reference`: the vectors of KnownItems.texts (`pairs` queries, then their
    documents) under the candidate and under FP32. Passes where the candidate's recall@TOP_K is at
    least `thresholds[1]` of FP32's and its mean cosine to FP32 reaches `thresholds[0]`."""
    floor, min_ratio = thresholds
    cosine = row_cosine(outputs, reference)
    mean, worst = float(cosine.mean()), float(cosine.min())
    recall, mrr = known_item_recall(outputs[:pairs], outputs[pairs:])
    recall_fp32, mrr_fp32 = known_item_recall(reference[:pairs], reference[pairs:])
    ratio = recall / recall_fp32 if recall_fp32 > 0 else float(recall_fp32 == recall)
    failures = []
    if not mean >= floor:  # `not >=` also fails NaN
        failures.append(f"mean cosine {mean:.4f} < {floor}")
    if min_ratio > 0 and pairs < MIN_PAIRS and precision != "fp32":  # FP32 is the reference's arithmetic
        failures.append(
            f"{pairs} held-out texts of {PAIR_MIN_WORDS}+ words make known-item pairs, {MIN_PAIRS} needed "
            "to measure recall (gate_min_recall_ratio = 0 gates on the cosine floor alone)"
        )
    elif not ratio >= min_ratio:
        failures.append(f"known-item recall@{TOP_K} ratio {ratio:.4f} < {min_ratio} ({recall:.4f} vs FP32 {recall_fp32:.4f})")
    return GateResult(
        precision,
        not failures,
        "; ".join(failures),
        mean_cosine=mean,
        min_cosine=worst,
        overlap=round(neighbour_overlap(outputs[pairs:], reference[pairs:]), 4),
        recall=round(recall, 4),
        recall_fp32=round(recall_fp32, 4),
        recall_ratio=round(ratio, 4),
        mrr_ratio=round(mrr / mrr_fp32, 4) if mrr_fp32 > 0 else None,
        pairs=pairs,
        texts_from=texts_from,
        cosine_histogram=np.histogram(np.clip(np.nan_to_num(cosine), COSINE_BINS[0], COSINE_BINS[-1]), COSINE_BINS)[
            0
        ].tolist(),
    )


def agreement_gate(
    precision: str, outputs: np.ndarray, reference: np.ndarray, threshold: float, texts_from: str = ""
) -> GateResult:
    """The top label of at least `threshold` of the texts must be FP32's."""
    agreement = float(np.mean(np.argmax(outputs, axis=1) == np.argmax(reference, axis=1)))
    passed = agreement >= threshold
    reason = "" if passed else f"top-label agreement {agreement:.4f} < {threshold}"
    return GateResult(precision, passed, reason, agreement=agreement, texts_from=texts_from)


def top_overlap(
    users: np.ndarray, items: np.ndarray, reference_users: np.ndarray, reference_items: np.ndarray
) -> float:
    """Mean share of each user's top TOP_K items (by dot product) that are also the reference's."""
    k = min(TOP_K, len(items))
    ours = np.argpartition(-(users @ items.T), k - 1, axis=1)[:, :k]
    theirs = np.argpartition(-(reference_users @ reference_items.T), k - 1, axis=1)[:, :k]
    return float(np.mean([len(np.intersect1d(a, b)) / k for a, b in zip(ours, theirs, strict=True)]))


def overlap_gate(precision: str, overlap: float, threshold: float, seconds: float) -> GateResult:
    """Users' top items under this precision must share at least `threshold` with FP32's."""
    passed = overlap >= threshold
    reason = "" if passed else f"top-{TOP_K} overlap {overlap:.4f} < {threshold}"
    return GateResult(precision, passed, reason, overlap=round(overlap, 4), seconds=round(seconds, 5))
