"""Our vector-store types as qdrant-edge-py's requests and answers (stores/vectors/edge.py)."""

from __future__ import annotations

import numpy as np
import qdrant_edge as qe

from precompute.stores.vectors.store import ID_KEY, Filter, Hit, SearchParams

FIELD_SCHEMAS = {
    bool: qe.PayloadSchemaType.Bool,
    # Lookup only: filters match values exactly. A range index makes the HNSW build add links per
    # block of values, which grew superlinearly (docs/search.md).
    int: qe.IntegerIndexParams(lookup=True, range=False),
    str: qe.PayloadSchemaType.Keyword,
}


def edge_filter(filter: Filter | None) -> qe.Filter | None:
    if not filter:
        return None
    return qe.Filter(
        must=[
            qe.FieldCondition(key=key, match=qe.MatchValue(np.bool_(v) if isinstance(v, bool) else v))
            for key, v in filter.items()
        ]
    )


def edge_quantization(quantization: str) -> qe.ScalarQuantizationConfig | None:
    if quantization == "none":
        return None
    return qe.ScalarQuantizationConfig(type=qe.ScalarType.Int8, quantile=0.99, always_ram=True)


def edge_params(params: SearchParams) -> qe.SearchParams:
    """Rescoring is always asked for: a shard without quantization ignores it."""
    return qe.SearchParams(
        hnsw_ef=params.hnsw_ef,
        exact=params.exact,
        quantization=qe.QuantizationSearchParams(rescore=True, oversampling=params.oversampling),
    )


def to_hit(point: qe.ScoredPoint) -> Hit:
    payload = point.payload or {}
    return Hit(str(payload.pop(ID_KEY, point.id)), point.score, payload)
