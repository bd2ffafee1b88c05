"""Running `tf.compat.v1.tpu.CrossShardOptimizer` as a single replica on the
host."""
import contextlib

import tensorflow as tf

from tensorflow.python.tpu import tpu_function
from tensorflow.python.tpu import tpu_optimizer


class _SingleReplicaOps:
  """Stands in for `tpu_ops` inside `tpu_optimizer`: with one replica, the
  cross-replica sum of a gradient is the gradient itself."""

  def __init__(self, real):
    self._real = real

  @staticmethod
  def cross_replica_sum(x, group_assignment=None, name=None):
    if group_assignment:
      flat = [i for group in group_assignment for i in group]
      if sorted(flat) != [0]:
        raise ValueError(
            "CrossShardOptimizer: group_assignment "
            f"{group_assignment!r} names replicas other than replica 0, but "
            "the host engine runs the model as one replica.")
    return tf.identity(x, name=name)

  def __getattr__(self, attr):
    return getattr(self._real, attr)


@contextlib.contextmanager
def single_replica():
  """Runs TPU-replicated training code on the host as one replica.

  Inside the block, `CrossShardOptimizer` sees one shard (no loss scaling,
  no warning) and sums gradients over that one replica (an identity instead
  of the `CrossReplicaSum` op, which has no CPU kernel).
  """
  real = tpu_optimizer.tpu_ops
  tpu_optimizer.tpu_ops = _SingleReplicaOps(real)
  try:
    with tpu_function.tpu_shard_context(1):
      yield
  finally:
    tpu_optimizer.tpu_ops = real
