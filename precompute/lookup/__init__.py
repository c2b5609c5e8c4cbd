"""The lookup service: answers key lookups and vector queries from published versions."""
