"""What a TPU needs from the config model: the embedding configuration
proto (`proto.build_proto`) and the infeed enqueue ops (`enqueue`), both
functions of a `TopologyConfig` (`estimator_spec.config.topology`),
and the public `EmbeddingConfig` that offers them as methods
(`embedding_config`)."""
