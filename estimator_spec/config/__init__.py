"""The config model: plain data that every other layer reads.

* `spec`: `EmbeddingConfigSpec`, `TableConfig`, `FeatureConfig`, the user's
  description, validated when constructed;
* `optimizers`: one class per embedding optimizer, each holding that
  optimizer's whole behaviour (arguments, proto message, slots and their
  names elsewhere, row update rule, TF2 mid-level counterpart);
* `model`: `EmbeddingModel`, the tables and features derived from a spec,
  with the facts computed once (names, order, learning rates, clipping);
* `sharding`: `ShardLayout`, where each row of a table lives (`div`/`mod`);
* `embedding_config`: `EmbeddingConfig`, the model placed on a batch size, a
  topology (hosts, cores) and a mode: what the engine and the TPU layer take;
* `modes`: TRAIN, EVAL, PREDICT;
* `report`: `describe`, the printable summary of a config.
"""
