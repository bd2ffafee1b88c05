"""Embedding tables and slots in checkpoints.

* `tables`: the one reader/writer of table partitions: opening a
  checkpoint, finding each table and its slots, reading rows partition by
  partition in row order or in another `ShardLayout`, writing a checkpoint
  in a layout.
* `bundle_index`: the slices each tensor was saved in, read from the
  checkpoint's `.index` file.
* `restore`: `LayoutAwareSaver`, restoring into a run of another layout.
* `convert`: `convert_checkpoint`, re-laying out a checkpoint offline.
* `mid_level`: the names TF2's `tf.tpu.experimental.embedding` tracks
  tables and slots under, and the writer of
  `estimator_spec.interop.export_mid_level_checkpoint` (the tables and
  slots in row order, under the keys of TF2's object graph, which the
  interop layer passes in).
* `tf_cpu`: `convert_for_tf_cpu`, our checkpoint as TF's
  `TPUEstimator(use_tpu=False)` restores it (its model optimizer's slots
  for the tables added at their initial values).
* `rows`: `read_rows`, a table's (or slot's) rows by id in any layout.
* `progress`: the command line's progress bar.

`read_rows` is also available here (loaded on first use).
"""
from typing import Callable


def __getattr__(name: str) -> Callable[..., object]:
  if name == "read_rows":
    from estimator_spec.checkpoints import rows
    return rows.read_rows
  raise AttributeError(
      f"module 'estimator_spec.checkpoints' has no attribute {name!r}")
