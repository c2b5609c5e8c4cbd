"""The key-value store (Redis): versioned records of key lookups, written by jobs, read by the service.

It owns the key layout (settings.py), a version's life (versions.py: created, written, checked,
published, dropped; overlays over a base), the records' binary format (records.py), the Ray
Datasink (sink.py) and the service's async reader (reader.py)."""
