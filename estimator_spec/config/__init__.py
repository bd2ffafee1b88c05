"""The config model: plain data that every other layer reads.

* `spec`: `EmbeddingConfigSpec`, `TableConfig`, `FeatureConfig`, the user's
  description, validated when constructed;
* `optimizers`: one class per embedding optimizer: its hyper-parameters,
  proto message, slots and their names elsewhere, and TF2 mid-level
  counterpart (its row update rule lives with the engine's executors);
* `model`: `EmbeddingModel`, the tables and features derived from a spec,
  with the facts computed once (names, order, learning rates, clipping);
* `sharding`: `ShardLayout`, where each row of a table lives (`div`/`mod`);
* `topology`: `TopologyConfig`, the model placed on a batch size, a
  topology (hosts, cores) and a mode: what the engine and the TPU layer take
  (the public `estimator_spec.EmbeddingConfig` adds the TPU layer's proto
  and infeed, `estimator_spec.tpu.embedding_config`);
* `modes`: TRAIN, EVAL, PREDICT;
* `report`: `describe`, the printable summary of a config.
"""
