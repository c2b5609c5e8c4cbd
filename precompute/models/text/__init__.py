"""Texts into model inputs and vectors: the tokenizer, text columns, length-bucketed encoding, the
held-out and calibration texts, and model outputs kept by text."""
