"""Recommendations: interactions validated, the models trained and blended, every user's top k
ranked into a new version, and the held-out check against the baselines."""
