"""precompute: run models ahead of time in large batches, serve the results as lookups."""
