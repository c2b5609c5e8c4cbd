"""The sequence recommender trained on the night's histories (alone or data-parallel on the Ray
cluster) and served as two towers."""
