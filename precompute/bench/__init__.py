"""Benchmarks: each times our path and the baseline a user would otherwise pick, in one run."""
