"""`precompute bench scale`: every nightly stage at growing sizes, and how each is read from a run."""
