"""Ray Data jobs, one per precomputed output."""
