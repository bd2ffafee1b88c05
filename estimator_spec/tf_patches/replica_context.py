# TF 2.15 behaviour worked around: `tf.compat.v1.tpu.CrossShardOptimizer`
# (tensorflow/python/tpu/tpu_optimizer.py) sums every gradient with
# `tpu_ops.cross_replica_sum`, read through its module attribute `tpu_ops`,
# and `tf.compat.v1.tpu.cross_replica_sum` is that same function bound again
# in TF's generated API module; both build a `CrossReplicaSum` op, which has
# no CPU kernel. `CrossShardOptimizer.compute_gradients` takes the replica
# count from `tpu_function.get_tpu_context()` and warns when none is set.
"""TPU-replicated training code run as one replica on the host.

`one_replica()` installs, for the duration of a block, the four patches of
`patches()` and a TPU shard context of one shard:

* `tpu_optimizer.tpu_ops`: a stand-in for TF's `tpu_ops` module whose
  `cross_replica_sum` is the identity (one replica's sum is its own
  gradient) and whose other attributes are TF's;
* `tpu_ops.cross_replica_sum`: the same identity, for code that calls it
  from TF's module;
* `CrossShardOptimizer.apply_gradients` (only when `refuse_sum_reduction`
  is given): TF's method, after refusing an optimizer whose reduction is
  not MEAN;
* `cross_replica_sum` of TF's API module `tf.compat.v1.tpu` (when that
  module is loaded): the identity, for a model_fn's own call.

Every attribute is put back when the block ends, however it ends.
tests/test_tf_patches_interop.py fails if TF changes what these rely on.
"""
import contextlib
import sys

import tensorflow as tf

from tensorflow.python.tpu import tpu_function
from tensorflow.python.tpu import tpu_optimizer
from tensorflow.python.tpu.ops import tpu_ops

# The name of TF's generated API module that `tf.compat.v1.tpu` is.
API_MODULE = "tensorflow._api.v2.compat.v1.tpu"


class SingleReplicaOps:
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


def _refusing_sum_reduction(message):
  """`CrossShardOptimizer.apply_gradients` that raises ValueError(message)
  unless the optimizer's reduction is MEAN."""
  apply_gradients = tpu_optimizer.CrossShardOptimizer.apply_gradients

  def averaged_only(optimizer, *args, **kwargs):
    if optimizer._reduction != tf.compat.v1.losses.Reduction.MEAN:
      raise ValueError(message)
    return apply_gradients(optimizer, *args, **kwargs)

  return averaged_only


def patches(refuse_sum_reduction=None):
  """The (owner, attribute name, replacement) triples `one_replica` sets,
  in the order it sets them (see the module docstring)."""
  single = SingleReplicaOps(tpu_ops)
  result = [(tpu_optimizer, "tpu_ops", single),
            (tpu_ops, "cross_replica_sum", single.cross_replica_sum)]
  if refuse_sum_reduction is not None:
    result.append((tpu_optimizer.CrossShardOptimizer, "apply_gradients",
                   _refusing_sum_reduction(refuse_sum_reduction)))
  api = sys.modules.get(API_MODULE)
  if api is not None and hasattr(api, "cross_replica_sum"):
    result.append((api, "cross_replica_sum", single.cross_replica_sum))
  return result


@contextlib.contextmanager
def installed(replacements):
  """Sets each (owner, name, value) of `replacements` for the block and
  restores the values it found when the block ends."""
  saved = [(owner, name, getattr(owner, name))
           for owner, name, _ in replacements]
  for owner, name, value in replacements:
    setattr(owner, name, value)
  try:
    yield
  finally:
    for owner, name, value in saved:
      setattr(owner, name, value)


@contextlib.contextmanager
def one_replica(refuse_sum_reduction=None):
  """The block runs as one TPU replica: `patches(refuse_sum_reduction)`
  installed, inside TF's shard context of one shard."""
  with installed(patches(refuse_sum_reduction)):
    with tpu_function.tpu_shard_context(1):
      yield
