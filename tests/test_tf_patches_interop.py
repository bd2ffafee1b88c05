"""The patches of TensorFlow that run TPU-replicated code as one replica
(`estimator_spec.tf_patches.replica_context`, called by
`interop.single_replica`).

For each of the four patched attributes: TF 2.15 still has it, in the
shape the patch relies on (a test here fails if TF changes that), the patch
installs what it says, and the original comes back when the block ends,
also when it ends with an error.
"""
import inspect
import sys

import pytest
import tensorflow as tf

from tensorflow.python.tpu import tpu_function
from tensorflow.python.tpu import tpu_optimizer
from tensorflow.python.tpu.ops import tpu_ops

from estimator_spec.tf_patches import replica_context

v1 = tf.compat.v1


def _op_types(graph):
  return {op.type for op in graph.get_operations()}


def _apply_one_gradient(optimizer):
  """Builds `optimizer.apply_gradients` on one variable's gradient in a new
  graph; returns the graph."""
  graph = tf.Graph()
  with graph.as_default():
    var = v1.get_variable("w", initializer=[1.0, 2.0], use_resource=True)
    optimizer.apply_gradients([(tf.constant([0.5, 0.5]), var)])
  return graph


def _cross_shard(reduction=v1.losses.Reduction.MEAN):
  return v1.tpu.CrossShardOptimizer(
      v1.train.GradientDescentOptimizer(0.1), reduction=reduction)


def _current():
  api = sys.modules[replica_context.API_MODULE]
  return (tpu_optimizer.tpu_ops, tpu_ops.cross_replica_sum,
          tpu_optimizer.CrossShardOptimizer.apply_gradients,
          api.cross_replica_sum)


# --- what TF 2.15 does without the patches -----------------------------------


def test_tf_sums_gradients_with_a_cross_replica_sum_op_read_through_tpu_ops():
  assert tpu_optimizer.tpu_ops is tpu_ops
  names = tpu_optimizer.CrossShardOptimizer.apply_gradients.__code__.co_names
  assert "tpu_ops" in names and "cross_replica_sum" in names
  assert "CrossReplicaSum" in _op_types(_apply_one_gradient(_cross_shard()))


def test_tf_cross_replica_sum_has_the_signature_the_stand_in_takes():
  assert list(inspect.signature(tpu_ops.cross_replica_sum).parameters) == [
      "x", "group_assignment", "name"]
  graph = tf.Graph()
  with graph.as_default():
    tpu_ops.cross_replica_sum(tf.constant([1.0]))
  assert "CrossReplicaSum" in _op_types(graph)


def test_tf_apply_gradients_and_reduction_are_what_the_refusal_wraps():
  method = tpu_optimizer.CrossShardOptimizer.apply_gradients
  assert list(inspect.signature(method).parameters) == [
      "self", "grads_and_vars", "global_step", "name"]
  assert _cross_shard(v1.losses.Reduction.SUM)._reduction == (
      v1.losses.Reduction.SUM)
  assert _cross_shard()._reduction == v1.losses.Reduction.MEAN


def test_tf_api_module_binds_cross_replica_sum_a_second_time():
  api = sys.modules.get(replica_context.API_MODULE)
  assert api is v1.tpu
  assert api.cross_replica_sum is tpu_ops.cross_replica_sum


def test_tf_shard_context_sets_the_replica_count_compute_gradients_reads():
  assert tpu_function.get_tpu_context().number_of_shards is None
  with tpu_function.tpu_shard_context(1):
    assert tpu_function.get_tpu_context().number_of_shards == 1
  assert tpu_function.get_tpu_context().number_of_shards is None


# --- the patches ---------------------------------------------------------------


def test_tpu_ops_in_the_optimizer_is_the_stand_in_and_sums_as_identity():
  original = tpu_optimizer.tpu_ops
  with replica_context.one_replica():
    stand_in = tpu_optimizer.tpu_ops
    assert isinstance(stand_in, replica_context.SingleReplicaOps)
    assert stand_in.all_to_all is tpu_ops.all_to_all  # the rest is TF's
    graph = _apply_one_gradient(_cross_shard())
  assert tpu_optimizer.tpu_ops is original
  assert "CrossReplicaSum" not in _op_types(graph)
  assert "Identity" in _op_types(graph)


def test_tpu_ops_cross_replica_sum_is_an_identity_inside_the_block():
  original = tpu_ops.cross_replica_sum
  graph = tf.Graph()
  with replica_context.one_replica(), graph.as_default():
    assert tpu_ops.cross_replica_sum is not original
    out = tpu_ops.cross_replica_sum(tf.constant([3.0]), [[0]], name="sum")
  assert tpu_ops.cross_replica_sum is original
  assert out.op.type == "Identity" and out.op.name == "sum"
  assert "CrossReplicaSum" not in _op_types(graph)


def test_a_group_naming_other_replicas_is_refused():
  with replica_context.one_replica(), tf.Graph().as_default():
    with pytest.raises(ValueError, match=r"replicas other than replica 0"):
      tpu_ops.cross_replica_sum(tf.constant([3.0]), [[0, 1]])


def test_apply_gradients_is_wrapped_only_when_sum_is_refused():
  original = tpu_optimizer.CrossShardOptimizer.apply_gradients
  with replica_context.one_replica():
    assert tpu_optimizer.CrossShardOptimizer.apply_gradients is original
  with replica_context.one_replica(refuse_sum_reduction="no SUM here"):
    assert tpu_optimizer.CrossShardOptimizer.apply_gradients is not original
    with pytest.raises(ValueError, match="^no SUM here$"):
      _apply_one_gradient(_cross_shard(v1.losses.Reduction.SUM))
    graph = _apply_one_gradient(_cross_shard())
  assert tpu_optimizer.CrossShardOptimizer.apply_gradients is original
  assert "ResourceApplyGradientDescent" in _op_types(graph)


def test_the_api_module_cross_replica_sum_is_an_identity_inside_the_block():
  original = v1.tpu.cross_replica_sum
  graph = tf.Graph()
  with replica_context.one_replica(), graph.as_default():
    out = v1.tpu.cross_replica_sum(tf.constant([3.0]))
  assert v1.tpu.cross_replica_sum is original
  assert out.op.type == "Identity"


def test_the_block_is_one_shard_and_everything_is_restored_after_an_error():
  before = _current()
  with pytest.raises(RuntimeError, match="inside"):
    with replica_context.one_replica(refuse_sum_reduction="refused"):
      assert tpu_function.get_tpu_context().number_of_shards == 1
      assert all(a is not b for a, b in zip(_current(), before))
      raise RuntimeError("inside")
  assert all(a is b for a, b in zip(_current(), before))
  assert tpu_function.get_tpu_context().number_of_shards is None


def test_patches_lists_the_four_attributes_in_order():
  listed = [(owner, name) for owner, name, _ in replica_context.patches("m")]
  assert listed == [
      (tpu_optimizer, "tpu_ops"), (tpu_ops, "cross_replica_sum"),
      (tpu_optimizer.CrossShardOptimizer, "apply_gradients"),
      (sys.modules[replica_context.API_MODULE], "cross_replica_sum")]
