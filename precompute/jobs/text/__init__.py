"""Jobs over a text corpus: its rows validated file by file, the previous run's results reused
for unchanged rows, and the Ray Data jobs that embed (embeddings) and label (labels) the rest."""
