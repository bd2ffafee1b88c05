"""New tables and slots through the engine's kernels (initialize.cc):
the same values as TensorFlow's ops, huge pages from the start, and a
table's buffer shared with a reader until the next update writes it
(docs/performance.md, 'Table size')."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import estimator_spec as es
import tpu_embedding_columns as tec
from estimator_spec.engine import engine as engine_lib
from estimator_spec.engine import kernels
from estimator_spec.engine import storage

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tables(graph_seed, op_seed, shards, strategy, use_kernels):
  """(table partitions, slot partitions, a later variable's value, the
  graph's op types) made by `storage.create_table` in a fresh graph."""
  graph = tf.Graph()
  with graph.as_default():
    if graph_seed is not None:
      tf.compat.v1.set_random_seed(graph_seed)
    initializer = tf.compat.v1.truncated_normal_initializer(
        mean=0.25, stddev=0.3, seed=op_seed)
    if not use_kernels:
      # As the table is made without the kernels: TF's own ops.
      table = storage.PartitionedRows(
          "t", storage.sharding.ShardLayout(1001, shards, strategy), 8,
          initializer, None)
      slot_initializer = _TfFill(0.1)
    else:
      table = storage.create_table("t", 1001, 8, initializer, shards,
                                   strategy, compiled=True)
      slot_initializer = storage.FillInitializer(0.1, compiled=True)
    slot = storage.PartitionedRows(
        "t/slot", table.layout, 8, slot_initializer, None)
    # A variable made after the table: its op seed follows the graph's
    # op count, which the kernels' path must keep.
    later = tf.compat.v1.get_variable(
        "later", shape=(5,),
        initializer=tf.compat.v1.truncated_normal_initializer())
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      values = session.run([table.partitions, slot.partitions, later])
    return values + [{op.type for op in graph.get_operations()}]


class _TfFill:
  """A slot initializer of TF's Fill alone (the value through a
  PlaceholderWithDefault, as `storage.FillInitializer` takes it)."""

  def __init__(self, value):
    self.value = value

  def __call__(self, shape, dtype=tf.float32, partition_info=None):
    del partition_info
    value = tf.compat.v1.placeholder_with_default(
        tf.constant(self.value, dtype), [])
    return tf.fill(shape, value)


@pytest.mark.parametrize("graph_seed,op_seed,shards,strategy", [
    (3, None, 1, "div"), (3, None, 3, "mod"), (5, 9, 4, "div"),
    (None, 7, 2, "mod")])
def test_the_kernels_make_tf_s_values(graph_seed, op_seed, shards, strategy):
  assert kernels.row_updates() is not None
  tf_tables, tf_slots, tf_later, tf_ops = _tables(
      graph_seed, op_seed, shards, strategy, use_kernels=False)
  ours, our_slots, our_later, our_ops = _tables(
      graph_seed, op_seed, shards, strategy, use_kernels=True)
  assert {"HostEmbeddingTruncatedNormal", "HostEmbeddingFill"} <= our_ops
  assert not {"HostEmbeddingTruncatedNormal", "HostEmbeddingFill"} & tf_ops
  assert len(ours) == shards
  for mine, theirs in zip(ours + our_slots, tf_tables + tf_slots):
    np.testing.assert_array_equal(mine, theirs)
  assert all((slot == np.float32(0.1)).all() for slot in our_slots)
  # Truncated at two standard deviations around the mean.
  assert np.abs(np.concatenate(ours) - 0.25).max() <= 0.6 + 1e-6
  if graph_seed is not None:
    np.testing.assert_array_equal(our_later, tf_later)


def test_other_initializers_and_graphs_without_the_kernels_keep_tf_s_ops():
  initializer = tf.compat.v1.random_uniform_initializer(seed=1)
  assert storage.table_initializer(initializer, compiled=True) is initializer

  class Subclass(tf.compat.v1.truncated_normal_initializer):
    pass

  subclass = Subclass()
  assert storage.table_initializer(subclass, compiled=True) is subclass
  default = tf.compat.v1.truncated_normal_initializer()
  assert isinstance(storage.table_initializer(default, compiled=True),
                    storage.TruncatedNormalRows)
  assert storage.table_initializer(default, compiled=False) is default


@pytest.mark.parametrize("mode,compiled", [
    (tf.estimator.ModeKeys.TRAIN, True), (tf.estimator.ModeKeys.EVAL, False),
    (tf.estimator.ModeKeys.PREDICT, False)])
def test_only_a_training_graph_initializes_through_the_kernels(mode,
                                                                compiled):
  """Evaluation and serving graphs (a SavedModel runs in TensorFlow alone)
  hold none of the kernels' ops; a training graph's tables and slots are
  made by them."""
  column = tec.embedding_column(
      tf.feature_column.categorical_column_with_identity("f", 50), 4)
  spec = es.EmbeddingConfigSpec(
      feature_columns=[column],
      optimization_parameters=es.AdagradParameters(0.1))
  config = es.EmbeddingConfig(spec, batch_size=2, mode=mode)
  with tf.Graph().as_default() as graph:
    engine_lib.HostEmbeddingEngine(config).create_variables()
    types = {op.type for op in graph.get_operations()}
  made = {"HostEmbeddingTruncatedNormal", "HostEmbeddingFill"} & types
  assert made == ({"HostEmbeddingTruncatedNormal", "HostEmbeddingFill"}
                  if compiled else set())
  assert ("TruncatedNormal" in types) == (not compiled)


def test_bad_shapes_are_refused():
  ops = kernels.row_updates()
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"shape must be a vector of two sizes"):
    ops.host_embedding_fill(tf.constant([2, 3, 4]), tf.constant(1.0))
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"shape must not be negative; got \[-1, 3\]"):
    ops.host_embedding_truncated_normal(tf.constant([-1, 3]))
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"value must be a scalar"):
    ops.host_embedding_fill(tf.constant([2, 3]), tf.constant([1.0]))


def test_a_read_keeps_its_values_when_the_update_writes_the_table():
  """A whole read (as a checkpoint's save makes) shares the table's buffer;
  an update in the same step writes a copy, so the read holds the values
  before the update and the table those after."""
  graph = tf.Graph()
  with graph.as_default():
    table = tf.compat.v1.get_variable(
        "table", initializer=tf.ones([4, 2]), use_resource=True)
    accumulator = tf.compat.v1.get_variable(
        "acc", initializer=tf.fill([4, 2], 0.1), use_resource=True)
    read = table.read_value()
    with tf.control_dependencies([read]):
      update = kernels.row_update(
          "adagrad", table.handle, [accumulator.handle],
          indices=tf.constant([1], tf.int64), grad=tf.ones([1, 2]),
          lr=1.0, grad_lo=0.0, grad_hi=0.0, factor=1.0, weight_lo=0.0,
          weight_hi=0.0, clip_gradients=False, decay=False,
          clip_weights=False)
    with tf.control_dependencies([update]):
      doubled = read * 2.0
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      before = session.run(doubled)
      after = session.run(table)
  np.testing.assert_array_equal(before, np.full([4, 2], 2.0))
  assert (after[1] < 1.0).all() and (after[[0, 2, 3]] == 1.0).all()


def test_a_large_new_table_is_backed_by_huge_pages_from_the_start():
  """A table of >= 4 MiB made by the kernels grows the process's
  AnonHugePages as it is filled (where transparent huge pages are not
  turned off), before any kernel reads it."""
  code = """
      import tensorflow as tf
      from estimator_spec.engine import kernels
      def huge_kb():
        with open("/proc/self/smaps_rollup") as f:
          return sum(int(line.split()[1]) for line in f
                     if line.startswith("AnonHugePages:"))
      before = huge_kb()
      rows = kernels.row_updates().host_embedding_truncated_normal(
          tf.constant([200_000, 16]), seed=1, seed2=2)
      print("grew", huge_kb() - before, "shape", rows.shape)
  """
  result = subprocess.run(
      [sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT,
      env=dict(os.environ, PYTHONPATH=ROOT, **{kernels.ENV: "1"}),
      capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 0, result.stderr
  assert "shape (200000, 16)" in result.stdout
  grew = int(result.stdout.split("grew")[1].split()[0])
  with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
    enabled = f.read()
  if "[never]" in enabled:
    assert grew == 0
  else:
    assert grew >= 2048, (grew, enabled)
