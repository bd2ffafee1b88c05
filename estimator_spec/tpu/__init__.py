"""What a TPU needs from the config model: the embedding configuration
proto (`proto.EmbeddingConfig`) and the infeed enqueue ops (`enqueue`)."""
