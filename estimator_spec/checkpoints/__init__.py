"""Embedding tables and slots in checkpoints: restoring them into a run of
another layout (`restore`), converting a checkpoint offline (`convert`)."""
