"""Restoring engine tables from checkpoints of other runs.

A table's checkpoint tensor holds its rows in the order of the partitions
that wrote it: row order for `div` (any number of partitions) and for one
partition; for `mod` over n partitions, rows r with r % n == 0 first, then
r % n == 1, ... (as a TPU with n hosts writes it). Plain restoring into a
different `mod` layout would silently permute rows.

`LayoutAwareSaver` is the saver the estimator gives its Scaffold: saving is
a plain `Saver`'s; restoring checks every engine variable against the
checkpoint and, when the checkpoint was written with another partition
count (another TPU topology, TF's CPU path, or a plain evaluation job), reads
the tensor, re-lays its rows out for this run and assigns it. Slot
variables missing from a checkpoint (one written by TF's CPU path, where
the tables were dense variables of the user's optimizer) start from their
initial values, and the restore says so.

Every checkpoint the saver writes records the `partition_strategy` its
tables were laid out with (the string tensor `LAYOUT_TENSOR`), so a restore
knows how a table stored in several partitions is ordered. Checkpoints
without it (TF's own, or older ones) are taken to use this run's strategy.
"""
import re

import numpy as np
import tensorflow as tf

from estimator_spec.config import sharding


LAYOUT_TENSOR = "estimator_spec/partition_strategy"


def recorded_strategy(reader):
  """The partition strategy a checkpoint records ('div'/'mod'), or None."""
  if not reader.has_tensor(LAYOUT_TENSOR):
    return None
  value = reader.get_tensor(LAYOUT_TENSOR)
  value = value.decode("utf-8") if isinstance(value, bytes) else str(value)
  if value not in sharding.STRATEGIES:
    raise ValueError(
        f"Checkpoint tensor {LAYOUT_TENSOR!r} holds {value!r}, not a "
        f"partition strategy {sharding.STRATEGIES}.")
  return value


# One slice in a checkpoint reader's debug listing (TF 2.15's format): b'\x00',
# the tensor name, b'\x00\x01', ..., ' (DT_<type>) [<slice dims>]'.
_SLICE_LINE = re.compile(
    rb"\x00([^\x00]+)\x00\x01.*? \(DT_[A-Z0-9_]+\) \[([0-9,]*)\]\n", re.S)


def stored_slice_shapes(reader):
  """{tensor name: [shape of each stored slice, in stored order]} for the
  tensors of a `tf.compat.v1.train.NewCheckpointReader`'s checkpoint that
  were saved as partitions (slices of one tensor)."""
  result = {}
  for match in _SLICE_LINE.finditer(reader.debug_string()):
    name = match.group(1).decode("utf-8", "replace")
    dims = match.group(2).decode()
    result.setdefault(name, []).append(
        tuple(int(d) for d in dims.split(",")) if dims else ())
  return result


def stored_partitions(reader):
  """{tensor name: number of partitions it was saved in} (1 when saved
  whole), from a `tf.compat.v1.train.NewCheckpointReader`."""
  result = {name: 1 for name in reader.get_variable_to_shape_map()}
  result.update((name, len(shapes))
                for name, shapes in stored_slice_shapes(reader).items())
  return result


class _EngineVariable:
  """One engine table or slot: its partitions, layout and restore ops."""

  def __init__(self, rows, is_slot):
    self.name = rows.name
    self.is_slot = is_slot
    self.layout = rows.layout
    self.partitions = rows.partitions
    self.initializer = tf.group(*[p.initializer for p in rows.partitions])
    self.placeholders = []
    self.assigns = []
    with tf.control_dependencies(None), tf.name_scope("embedding_restore"):
      for partition in self.partitions:
        value = tf.compat.v1.placeholder(tf.float32, partition.shape)
        self.placeholders.append(value)
        self.assigns.append(partition.assign(value, read_value=False))


class LayoutAwareSaver(tf.compat.v1.train.Saver):
  """A `Saver` whose `restore` re-lays out engine tables (see module doc).

  Args:
    engine: the `HostEmbeddingEngine` of the graph.
    allow_missing_slots: initialize slots the checkpoint lacks (training).
    record_layout: add the variable `LAYOUT_TENSOR` holding the engine's
      partition strategy, so that checkpoints record it (training; graphs
      that only restore, such as evaluation or serving, need not).
    **kwargs: for `tf.compat.v1.train.Saver`.
  """

  def __init__(self, engine, allow_missing_slots, record_layout, **kwargs):
    self._variables = []
    engine_ids = set()
    tables = engine.tables or {}
    for name, rows in tables.items():
      entries = [(rows, False)] + [
          (slot, True) for slot in engine.slots[name].values()
      ]
      for variable_rows, is_slot in entries:
        self._variables.append(_EngineVariable(variable_rows, is_slot))
        engine_ids.update(id(p) for p in variable_rows.partitions)
    self._allow_missing_slots = allow_missing_slots
    self._strategy = engine.model.partition_strategy
    self._marker = None
    if self._variables and record_layout:
      with tf.control_dependencies(None):
        self._marker = tf.compat.v1.Variable(
            self._strategy, name=LAYOUT_TENSOR, trainable=False,
            collections=[tf.compat.v1.GraphKeys.GLOBAL_VARIABLES])
      engine_ids.add(id(self._marker))
    others = [
        v for v in tf.compat.v1.global_variables() if id(v) not in engine_ids
    ] + tf.compat.v1.get_collection(
        tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS)
    other_kwargs = {k: v for k, v in kwargs.items() if k in (
        "sharded", "save_relative_paths")}
    # Built now (a var_list saver cannot defer); model_fn has created every
    # variable by the time the estimator builds this saver.
    self._others = tf.compat.v1.train.Saver(
        var_list=others, **other_kwargs) if others else None
    super().__init__(**kwargs)

  def restore(self, sess, save_path):
    if save_path is None:
      return super().restore(sess, save_path)
    reader = tf.compat.v1.train.NewCheckpointReader(save_path)
    stored = stored_partitions(reader)
    written_strategy = recorded_strategy(reader)
    plan = []
    for entry in self._variables:
      count = stored.get(entry.name)
      if count is None:
        if not (entry.is_slot and self._allow_missing_slots):
          raise tf.errors.NotFoundError(
              None, None,
              f"Checkpoint {save_path} has no tensor {entry.name!r} "
              f"(embedding {'slot' if entry.is_slot else 'table'}); it was "
              "written for another model or embedding_config_spec.")
        plan.append(("init", entry, None))
      else:
        written = sharding.ShardLayout(entry.layout.vocabulary_size, count,
                                       written_strategy or self._strategy)
        if _row_order_differs(written, entry.layout):
          plan.append(("convert", entry, written))
    if not plan and (self._marker is None or
                     written_strategy == self._strategy):
      return super().restore(sess, save_path)
    if self._others is not None:
      self._others.restore(sess, save_path)
    if self._marker is not None:
      sess.run(self._marker.initializer)
    planned = {id(entry) for _, entry, _ in plan}
    for entry in self._variables:
      if id(entry) not in planned:
        _assign_rows(sess, entry, reader.get_tensor(entry.name), entry.layout)
    for action, entry, written in plan:
      if action == "init":
        tf.compat.v1.logging.warning(
            "Checkpoint %s has no %s (a checkpoint of TF's CPU path, whose "
            "optimizer had no such slot); it starts from its initial "
            "value.", save_path, entry.name)
        sess.run(entry.initializer)
      else:
        tf.compat.v1.logging.info(
            "Restoring %s from %d partitions (%s layout) into %d (%s).",
            entry.name, written.num_partitions, written.strategy,
            entry.layout.num_partitions, entry.layout.strategy)
        stored_rows = reader.get_tensor(entry.name)
        rows = written.join(np.split(stored_rows,
                                     np.cumsum(written.sizes)[:-1]))
        _assign_rows(sess, entry, np.concatenate(entry.layout.split(rows)),
                     entry.layout)
    return None


def _row_order_differs(written, layout):
  """Whether a tensor stored in `written`'s partition order must be
  re-laid out for `layout`. `div` tensors restore into any `div`
  partitioning through TF's own slices (rows stay in row order)."""
  if written.strategy == layout.strategy == "div":
    return False
  if written.num_partitions == layout.num_partitions == 1:
    return False
  return (written.num_partitions != layout.num_partitions or
          written.strategy != layout.strategy)


def _assign_rows(sess, entry, stored, layout):
  """Assigns a tensor already in this run's stored (partition) order."""
  feed = {}
  for placeholder, offset, size in zip(entry.placeholders, layout.offsets,
                                       layout.sizes):
    feed[placeholder] = stored[offset:offset + size]
  sess.run(entry.assigns, feed)
