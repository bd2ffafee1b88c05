"""Restoring engine tables from checkpoints of other runs.

A table's checkpoint tensor holds its rows in the order of the partitions
that wrote it: row order for `div` (any number of partitions) and for one
partition; for `mod` over n partitions, rows r with r % n == 0 first, then
r % n == 1, ... (as a TPU with n hosts writes it). Plain restoring into a
different `mod` layout would silently permute rows.

`LayoutAwareSaver` is the saver the estimator gives its Scaffold: saving is
a plain `Saver`'s; restoring checks every engine variable against the
checkpoint and, when the checkpoint was written with another partition
count (another TPU topology, TF's CPU path, or a plain evaluation job),
assigns this run's partitions one at a time, each from the rows it needs
(`tables.Checkpoint.partition`: memory is one partition plus about two
blocks of rows, not the whole table; the variable takes the fed
partition's buffer). Slot
variables missing from a checkpoint (one written by TF's CPU path, where
the tables were dense variables of the user's optimizer) start from their
initial values, and the restore says so.

Every checkpoint the saver writes records the `partition_strategy` its
tables were laid out with (the string tensor `LAYOUT_TENSOR`), so a restore
knows how a table stored in several partitions is ordered. Checkpoints
without it (TF's own, or older ones) are taken to use this run's strategy.
"""
from typing import Any, Mapping, Optional

import tensorflow as tf

from estimator_spec.checkpoints import tables
from estimator_spec.config import sharding
from estimator_spec.engine import engine as engine_lib
from estimator_spec.engine import storage
from estimator_spec.tensor_types import Op, Tensor, Variable
# Public here too: the estimator's tests and tools know them from this module.
from estimator_spec.checkpoints.tables import LAYOUT_TENSOR
from estimator_spec.checkpoints.tables import recorded_strategy
from estimator_spec.checkpoints.tables import stored_partitions


class _EngineVariable:
  """One engine table or slot: its partitions, layout and restore ops."""

  def __init__(self, rows: storage.PartitionedRows, is_slot: bool) -> None:
    self.name = rows.name
    self.is_slot = is_slot
    self.layout = rows.layout
    self.partitions = rows.partitions
    self.initializer: Op = tf.group(*[p.initializer for p in rows.partitions])
    self.placeholders: list[Tensor] = []
    self.assigns: list[Op] = []
    with tf.control_dependencies(None), tf.name_scope("embedding_restore"):
      for partition in self.partitions:
        value = tf.compat.v1.placeholder(tf.float32, partition.shape)
        self.placeholders.append(value)
        self.assigns.append(partition.assign(value, read_value=False))


class LayoutAwareSaver(tf.compat.v1.train.Saver):  # type: ignore[misc]  # TF is untyped
  """A `Saver` whose `restore` re-lays out engine tables (see module doc).

  Args:
    engine: the `HostEmbeddingEngine` of the graph.
    allow_missing_slots: initialize slots the checkpoint lacks (training).
    record_layout: add the variable `LAYOUT_TENSOR` holding the engine's
      partition strategy, so that checkpoints record it (training; graphs
      that only restore, such as evaluation or serving, need not).
    record: optional {checkpoint tensor name: string} more facts of the
      run's layout to record in every checkpoint (string variables holding
      this run's values; a checkpoint without them restores with these
      values: a cluster's ps assignment).
    **kwargs: for `tf.compat.v1.train.Saver`.
  """

  def __init__(self, engine: engine_lib.HostEmbeddingEngine,
               allow_missing_slots: bool, record_layout: bool,
               record: Optional[Mapping[str, str]] = None,
               **kwargs: Any) -> None:
    self._variables: list[_EngineVariable] = []
    engine_ids: set[int] = set()
    for name in engine.created_tables():
      entries = [(engine.table_rows(name), False)] + [
          (slot, True) for slot in engine.slot_rows(name).values()
      ]
      for variable_rows, is_slot in entries:
        self._variables.append(_EngineVariable(variable_rows, is_slot))
        engine_ids.update(id(p) for p in variable_rows.partitions)
    self._allow_missing_slots = allow_missing_slots
    self._strategy = engine.model.partition_strategy
    self._marker: Optional[Variable] = None
    if self._variables and record_layout:
      with tf.control_dependencies(None):
        self._marker = tf.compat.v1.Variable(
            self._strategy, name=LAYOUT_TENSOR, trainable=False,
            collections=[tf.compat.v1.GraphKeys.GLOBAL_VARIABLES])
      engine_ids.add(id(self._marker))
    self._records: list[Variable] = []
    for name, value in sorted((record or {}).items()):
      with tf.control_dependencies(None):
        variable = tf.compat.v1.Variable(
            value, name=name, trainable=False,
            collections=[tf.compat.v1.GraphKeys.GLOBAL_VARIABLES])
      self._records.append(variable)
      engine_ids.add(id(variable))
    others = [
        v for v in tf.compat.v1.global_variables() if id(v) not in engine_ids
    ] + tf.compat.v1.get_collection(
        tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS)
    other_kwargs = {k: v for k, v in kwargs.items() if k in (
        "sharded", "save_relative_paths")}
    # Built now (a var_list saver cannot defer); model_fn has created every
    # variable by the time the estimator builds this saver.
    self._others: Optional[tf.compat.v1.train.Saver] = tf.compat.v1.train.Saver(
        var_list=others, **other_kwargs) if others else None
    super().__init__(**kwargs)

  def restore(self, sess: tf.compat.v1.Session,
              save_path: Optional[str]) -> None:
    if save_path is None:
      super().restore(sess, save_path)
      return
    with tables.Checkpoint(save_path) as checkpoint:
      self._restore(sess, save_path, checkpoint)

  def _restore(self, sess: tf.compat.v1.Session, save_path: str,
               checkpoint: tables.Checkpoint) -> None:
    written_strategy = checkpoint.strategy
    # (variable, the layout its tensor was written in; None when the
    # checkpoint lacks it: it starts from its initial value)
    plan: list[tuple[_EngineVariable, Optional[sharding.ShardLayout]]] = []
    for entry in self._variables:
      if not checkpoint.has_tensor(entry.name):
        if not (entry.is_slot and self._allow_missing_slots):
          raise tf.errors.NotFoundError(
              None, None,
              f"Checkpoint {save_path} has no tensor {entry.name!r} "
              f"(embedding {'slot' if entry.is_slot else 'table'}); it was "
              "written for another model or embedding_config_spec.")
        plan.append((entry, None))
      else:
        written = sharding.ShardLayout(entry.layout.vocabulary_size,
                                       checkpoint.partition_count(entry.name),
                                       written_strategy or self._strategy)
        if _row_order_differs(written, entry.layout):
          plan.append((entry, written))
    recorded = all(checkpoint.has_tensor(v.op.name) for v in self._records)
    if not plan and recorded and (
        self._marker is None or written_strategy == self._strategy):
      super().restore(sess, save_path)
      return
    if self._others is not None:
      self._others.restore(sess, save_path)
    for variable in ([self._marker] if self._marker is not None else []) + (
        self._records):
      sess.run(variable.initializer)
    planned = {id(entry) for entry, _ in plan}
    for entry in self._variables:
      if id(entry) not in planned:  # stored in this run's order
        _assign_partitions(sess, checkpoint, entry, entry.layout)
    for entry, stored in plan:
      if stored is None:
        tf.compat.v1.logging.warning(
            "Checkpoint %s has no %s (a checkpoint of TF's CPU path, whose "
            "optimizer had no such slot); it starts from its initial "
            "value.", save_path, entry.name)
        sess.run(entry.initializer)
      else:
        tf.compat.v1.logging.info(
            "Restoring %s from %d partitions (%s layout) into %d (%s).",
            entry.name, stored.num_partitions, stored.strategy,
            entry.layout.num_partitions, entry.layout.strategy)
        _assign_partitions(sess, checkpoint, entry, stored)


def _row_order_differs(written: sharding.ShardLayout,
                       layout: sharding.ShardLayout) -> bool:
  """Whether a tensor stored in `written`'s partition order must be
  re-laid out for `layout`. `div` tensors restore into any `div`
  partitioning through TF's own slices (rows stay in row order)."""
  if written.strategy == layout.strategy == "div":
    return False
  if written.num_partitions == layout.num_partitions == 1:
    return False
  return (written.num_partitions != layout.num_partitions or
          written.strategy != layout.strategy)


def _assign_partitions(sess: tf.compat.v1.Session,
                       checkpoint: tables.Checkpoint, entry: _EngineVariable,
                       written: sharding.ShardLayout) -> None:
  """Assigns an engine variable from its tensor, stored in `written`'s
  partition order, one partition at a time (reading only its rows)."""
  for index, (placeholder, assign) in enumerate(
      zip(entry.placeholders, entry.assigns)):
    rows = checkpoint.partition(entry.name, written, entry.layout, index)
    sess.run(assign, {placeholder: rows})
    del rows
