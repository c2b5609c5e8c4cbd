"""Search benchmarks: served search against FP32 exact search, latency through the service, query
engines, and the vector store."""
