"""The vector store (Qdrant): one collection per version, searched through an alias.

store.py is the contract and the facade that picks the implementation from settings: Qdrant's
engine in-process (edge.py) or a Qdrant server (server.py)."""
