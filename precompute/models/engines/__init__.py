"""A model's engines: exported to ONNX, quantized, built for a backend, cached, and gated against
FP32 up one precision ladder."""
