"""Label heads over an encoder: trained on a label column, chosen and calibrated on held-out rows,
or made zero-shot from declared labels; and the gated labeler that serves them (or a classifier folder)."""
