"""Label heads over an encoder: trained on a label column, chosen and calibrated on held-out rows;
few-shot from a handful of rows a label, chosen by cross-validation; or made zero-shot from
declared labels; and the gated labeler that serves them (or a classifier folder)."""
