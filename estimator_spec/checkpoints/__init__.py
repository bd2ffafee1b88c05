"""Embedding tables and slots in checkpoints.

* `tables`: the one reader/writer of table partitions: opening a
  checkpoint, finding each table and its slots, reading rows partition by
  partition in row order or in another `ShardLayout`, writing a checkpoint
  in a layout.
* `bundle_index`: the slices each tensor was saved in, read from the
  checkpoint's `.index` file.
* `restore`: `LayoutAwareSaver`, restoring into a run of another layout.
* `convert`: `convert_checkpoint`, re-laying out a checkpoint offline.
* `mid_level`: `export_mid_level_checkpoint`, the tables and slots for
  TF2's `tf.tpu.experimental.embedding`.
* `tf_cpu`: `convert_for_tf_cpu`, our checkpoint as TF's
  `TPUEstimator(use_tpu=False)` restores it (its model optimizer's slots
  for the tables added at their initial values).
* `progress`: the command line's progress bar.
"""
