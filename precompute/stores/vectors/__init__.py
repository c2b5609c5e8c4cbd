"""The vector store (Qdrant): one collection per version, searched through an alias.

store.py is the contract; `open_vector_store` below picks the implementation from settings: Qdrant's
engine in-process (edge.py) or a Qdrant server (server.py)."""

from __future__ import annotations

from precompute.stores.vectors.settings import VectorStoreSettings
from precompute.stores.vectors.store import VectorStore


def open_vector_store(settings: VectorStoreSettings, name: str) -> VectorStore:
    """The collection `name` in the store `settings.type` names (the alias readers query on a
    server, a directory on edge; each version is stored apart); each engine is imported only
    when chosen."""
    if settings.type == "edge":
        from precompute.stores.vectors.edge import QdrantEdgeStore

        return QdrantEdgeStore(settings, name)
    from precompute.stores.vectors.server import QdrantServerStore

    return QdrantServerStore(settings, name)
