"""Partitioned table and slot variables, and row access by global id.

A table of V rows is stored as `min(V, num_shards)` partition variables
`<name>/part_<i>` laid out by `sharding.ShardLayout` (`div` or `mod`); slot
variables `<name>/<suffix>/part_<i>` use the same layout. The partitions are
ordinary partitioned variables, so checkpoints hold one full tensor per
variable (rows in partition order: for `mod` that order is the TPU's, not
row order). Reads and writes go through one routing function, so gather and
scatter can never disagree about where a row lives.
"""
import contextlib
import re
from typing import (Any, Callable, ContextManager, List, Optional, Sequence,
                    Tuple)

import tensorflow as tf

from estimator_spec.config import sharding
from estimator_spec.engine import kernels


def device_scope(device: Any) -> ContextManager[Any]:
  """A device scope, or none when `device` is None (the caller's scope
  stays; `tf.device(None)` would clear it)."""
  return tf.compat.v1.device(device) if device else contextlib.nullcontext()


def partition_device_fn(
    shard_device_fn: Callable[[int], Any]) -> Callable[[Any], Any]:
  """Wraps `shard_device_fn(i) -> device` into a TF device function that
  places every op of partition i (`.../part_<i>/...`) on that device."""
  pattern = re.compile(r".*/part_(\d+)(/|$)")

  def device_fn(op: Any) -> Any:
    match = pattern.match(op.name)
    if match is None:
      return op.device
    return shard_device_fn(int(match.group(1)))

  return device_fn


def route(layout: sharding.ShardLayout, ids: Any) -> Tuple[Any, Any]:
  """(partition of each id (int32), local index of each id (int64)) of
  global `ids` in `layout`, by its routing rule (`ShardLayout.route`) in
  TensorFlow ops."""
  partition, local = layout.route(
      tf.cast(ids, tf.int64), where=tf.where,
      constant=lambda values: tf.constant(values, tf.int64),
      gather=tf.gather)
  return tf.cast(partition, tf.int32), local


class PartitionedRows:
  """One [V, D] float32 variable split into partitions, with routed access."""

  def __init__(self, name: str, layout: sharding.ShardLayout, dimension: int,
               initializer: Any,
               shard_device_fn: Optional[Callable[[int], Any]]) -> None:
    self.name = name
    self.layout = layout
    self.dimension = dimension
    partitioner = tf.compat.v1.fixed_size_partitioner(layout.num_partitions)
    scope = tf.compat.v1.VariableScope(reuse=None, name="")
    device = (partition_device_fn(shard_device_fn)
              if shard_device_fn is not None else None)
    with tf.compat.v1.variable_scope(scope, auxiliary_name_scope=False):
      with tf.compat.v1.device(device):
        variable = tf.compat.v1.get_variable(
            name,
            shape=(layout.vocabulary_size, dimension),
            dtype=tf.float32,
            initializer=initializer,
            partitioner=partitioner,
            trainable=False,
            use_resource=True,
            collections=[tf.compat.v1.GraphKeys.GLOBAL_VARIABLES])
    self.partitioned_variable = variable
    partitions = list(variable) if hasattr(variable,
                                           "_get_variable_list") else [variable]
    problem = partition_problem(partitions, layout, dimension)
    if problem:
      raise RuntimeError(f"Internal error: partitions of {name}: {problem}")
    self.partitions = partitions

  @classmethod
  def from_variables(cls, name: str, layout: sharding.ShardLayout,
                     dimension: int,
                     variables: Sequence[Any]) -> "PartitionedRows":
    """Rows stored in existing variables (one per partition of `layout`, in
    partition order; float32 [partition size, dimension] each) instead of
    new ones: reads and writes go to those variables.

    Raises:
      ValueError: naming `name`, when the variables do not fit the layout.
    """
    rows = cls.__new__(cls)
    rows.name = name
    rows.layout = layout
    rows.dimension = dimension
    partitions = list(variables)
    problem = partition_problem(partitions, layout, dimension)
    if problem:
      raise ValueError(f"{name}: {problem}")
    rows.partitioned_variable = (partitions[0] if len(partitions) == 1 else
                                 partitions)
    rows.partitions = partitions
    return rows

  def _route(self, ids: Any) -> Tuple[Any, Any]:
    """(partition of each id, local index of each id), by the layout's
    routing rule (`route`)."""
    return route(self.layout, ids)

  def gather(self, ids: Any, compiled: bool = False) -> Any:
    """Rows [len(ids), D] for distinct or repeated global `ids`; by the
    engine's compiled gather when `compiled` and it is available."""
    if len(self.partitions) == 1:
      return _gather(self.partitions[0], ids, self.dimension, compiled)
    partition, local = self._route(ids)
    n = len(self.partitions)
    positions = tf.dynamic_partition(
        tf.range(tf.shape(partition)[0]), partition, n)
    locals_ = tf.dynamic_partition(local, partition, n)
    pieces = [_gather(p, l, self.dimension, compiled)
              for p, l in zip(self.partitions, locals_)]
    rows = tf.dynamic_stitch(positions, pieces)
    rows.set_shape([None, self.dimension])
    return rows

  def split(self, ids: Any, values: Any) -> List[Tuple[Any, Any]]:
    """[(local ids, values)] per partition: the `ids` (global) and their
    `values` routed to the partitions holding them."""
    if len(self.partitions) == 1:
      return [(ids, values)]
    partition, local = self._route(ids)
    n = len(self.partitions)
    return list(zip(tf.dynamic_partition(local, partition, n),
                    tf.dynamic_partition(values, partition, n)))

  def scatter_update(self, ids: Any, rows: Any) -> Any:
    """Writes `rows` at distinct global `ids`; returns the grouped op."""
    if len(self.partitions) == 1:
      return self.partitions[0].scatter_update(
          tf.IndexedSlices(rows, ids)).op
    partition, local = self._route(ids)
    n = len(self.partitions)
    locals_ = tf.dynamic_partition(local, partition, n)
    row_parts = tf.dynamic_partition(rows, partition, n)
    return tf.group(*[
        p.scatter_update(tf.IndexedSlices(r, l))
        for p, l, r in zip(self.partitions, locals_, row_parts)
    ])

  def read_all(self) -> Any:
    """The whole table in row order [V, D] (for dense updates and export)."""
    if len(self.partitions) == 1:
      return self.partitions[0].read_value()
    return self.gather(tf.range(self.layout.vocabulary_size, dtype=tf.int64))

  def norm(self, compiled: bool = False) -> Any:
    """The L2 norm of the whole table, float32; by the engine's kernel
    (read in place: no copy of the table, no full-size temporary) when
    `compiled`, else by TF's ops."""
    if compiled:
      sums = kernels.squared_sums([p.handle for p in self.partitions])
      return tf.sqrt(tf.reduce_sum(sums))
    squares = [tf.reduce_sum(tf.square(tf.cast(p.read_value(), tf.float32)))
               for p in self.partitions]
    return tf.sqrt(tf.add_n(squares))

  def assign_all(self, full: Any) -> Any:
    """Writes a whole [V, D] table given in row order."""
    if len(self.partitions) == 1:
      return self.partitions[0].assign(full).op
    return self.scatter_update(
        tf.range(self.layout.vocabulary_size, dtype=tf.int64), full)


def _gather(variable: Any, ids: Any, dimension: int, compiled: bool) -> Any:
  """tf.gather of a partition's rows, or the engine's compiled gather (same
  values; rows fetched ahead) when `compiled` and it is available."""
  ops = kernels.ops_for([variable]) if compiled else None
  if ops is None:
    return tf.gather(variable, ids)
  rows = kernels.gather_rows(variable.handle, ids)
  rows.set_shape([None, dimension])
  return rows


class FillInitializer:
  """Every entry `value`, made by a Fill op when the variable is
  initialized (slots' initial values). A constant initializer (or a Fill of
  constants, which graph optimization folds into one) gives a Const op
  holding a full-size tensor that the session keeps alive after the
  assignment: twice the slot's memory for a large table. The value enters
  through a PlaceholderWithDefault, which is never folded. With `compiled`
  (the engine's kernels are loaded), the engine's Fill makes the buffer,
  its pages huge from the start."""

  def __init__(self, value: float, compiled: bool = False) -> None:
    self.value = float(value)
    self.compiled = compiled

  def __call__(self, shape: Any, dtype: Any = tf.float32,
               partition_info: Any = None) -> Any:
    del partition_info  # Every partition holds the same value.
    value = tf.compat.v1.placeholder_with_default(
        tf.constant(self.value, dtype), [])
    if self.compiled and tf.as_dtype(dtype) == tf.float32:
      # The same values in a buffer whose pages are huge from the start.
      return kernels.fill(shape, value)
    return tf.fill(shape, value)


class TruncatedNormalRows:
  """TensorFlow's truncated normal initializer (the columns' default,
  `tf.compat.v1.truncated_normal_initializer`) drawing through the
  engine's kernel: the same draws (the op seeds are taken as TF's takes
  them, at the same point of the graph) scaled and moved by the same two
  ops, so the same values, in a buffer whose pages are huge from the start
  (docs/performance.md, 'Table size')."""

  def __init__(self, initializer: Any) -> None:
    self.initializer = initializer

  def __call__(self, shape: Any, dtype: Any = None,
               partition_info: Any = None) -> Any:
    dtype = tf.as_dtype(dtype or self.initializer.dtype)
    if dtype != tf.float32:
      return self.initializer(shape, dtype, partition_info)
    with tf.compat.v1.name_scope(None, "truncated_normal") as name:
      shape_tensor = tf.convert_to_tensor(shape, name="shape")
      mean = tf.convert_to_tensor(self.initializer.mean, dtype, name="mean")
      stddev = tf.convert_to_tensor(self.initializer.stddev, dtype,
                                    name="stddev")
      seed, seed2 = tf.compat.v1.get_seed(self.initializer.seed)
      draws = kernels.truncated_normal(shape_tensor, seed or 0, seed2 or 0)
      return tf.math.add(draws * stddev, mean, name=name)


def table_initializer(initializer: Any, compiled: bool) -> Any:
  """The initializer a table's partitions are made with: with `compiled`
  (the engine's kernels are loaded), TF's truncated normal initializer
  (exactly that class) through the engine's kernel (`TruncatedNormalRows`);
  otherwise, and any other initializer, as given."""
  if compiled and (
      type(initializer) is tf.compat.v1.truncated_normal_initializer):
    return TruncatedNormalRows(initializer)
  return initializer


def partition_problem(partitions: Sequence[Any], layout: sharding.ShardLayout,
                      dimension: int) -> Optional[str]:
  """What keeps `partitions` (variables, in partition order) from storing
  `layout`'s rows of `dimension` floats, as a phrase ("partition 0 has
  shape ..."); None when they fit."""
  if len(partitions) != layout.num_partitions:
    return (f"{len(partitions)} variables for {layout.num_partitions} "
            "partitions")
  for i, (variable, size) in enumerate(zip(partitions, layout.sizes)):
    if not isinstance(variable, tf.Variable):
      return f"partition {i} is a {type(variable).__name__}, not a tf.Variable"
    if variable.dtype.base_dtype != tf.float32:
      return (f"partition {i} has dtype {variable.dtype.base_dtype.name}; "
              "it must be float32")
    if variable.shape != tf.TensorShape([size, dimension]):
      return (f"partition {i} has shape {variable.shape}; it must be "
              f"{[size, dimension]}")
  return None


def create_table(name: str, vocabulary_size: int, dimension: int,
                 initializer: Any, num_shards: int, strategy: str,
                 shard_device_fn: Optional[Callable[[int], Any]] = None,
                 compiled: bool = False) -> PartitionedRows:
  """A new table (or slot) of `vocabulary_size` x `dimension` in
  `num_shards` partitions laid out by `strategy`; with `compiled`, its
  initializer goes through the engine's kernels where one does
  (`table_initializer`): only in a graph that loads them (a training step's
  own partitions; a graph served without the library must not hold
  them)."""
  layout = sharding.ShardLayout(vocabulary_size, num_shards, strategy)
  return PartitionedRows(name, layout, dimension,
                         table_initializer(initializer, compiled),
                         shard_device_fn)
