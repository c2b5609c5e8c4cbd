"""Recommendation benchmarks: held-out quality on public data, the top-k's index search, and the
sequence model's training on a GPU."""
