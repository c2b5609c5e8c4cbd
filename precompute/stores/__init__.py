"""Where precomputed outputs are published and read: versioned, switched atomically.

vectors.py is the contract (`VectorStore`, `Hit`, `open_vector_store`); the Qdrant
engines implement it in-process (qdrant_edge_store.py) and on a server
(qdrant_server_store.py), chosen by `VectorStoreSettings` (vector_settings.py).
"""

from precompute.stores.errors import StoreError, StoreUnavailableError, VersionNotFoundError
from precompute.stores.vectors import open_vector_store
from precompute.stores.vectors.settings import VectorStoreSettings
from precompute.stores.vectors.store import Hit, VectorStore

__all__ = [
    "Hit",
    "StoreError",
    "StoreUnavailableError",
    "VectorStore",
    "VectorStoreSettings",
    "VersionNotFoundError",
    "open_vector_store",
]
