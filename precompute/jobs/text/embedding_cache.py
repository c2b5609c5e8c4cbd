"""The `embedding` column of staged parts and of the embedding cache (jobs/text/content_cache.py):
a fixed-size list of float32, converted to and from [rows, dim] arrays."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

EMBEDDING = "embedding"


def embeddings_of(table: pa.Table) -> np.ndarray:
    """The `embedding` column as a float32 [rows, dim] array: the inverse of embeddings_column.
    A column of one chunk is viewed, not copied (Arrow's concatenation copies even one chunk:
    a pass over every vector of a memory-mapped table, jobs/recs/item_table.py)."""
    column = table[EMBEDDING]
    values = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    return values.flatten().to_numpy().reshape(table.num_rows, column.type.list_size)


def embeddings_column(vectors: np.ndarray) -> pa.FixedSizeListArray:
    return pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1), pa.float32()), vectors.shape[1])
