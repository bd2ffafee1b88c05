"""Running `tf.compat.v1.tpu.CrossShardOptimizer` as a single replica on the
host."""
import contextlib
import sys

import tensorflow as tf

from tensorflow.python.tpu import feature_column as tf_tpu_columns
from tensorflow.python.tpu import tpu_function
from tensorflow.python.tpu import tpu_optimizer
from tensorflow.python.tpu.ops import tpu_ops


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
def single_replica(refuse_sum_reduction=None):
  """Runs TPU-replicated training code on the host as one replica.

  Inside the block, `CrossShardOptimizer` sees one shard (no loss scaling,
  no warning) and sums gradients over that one replica, and so does a
  model_fn's own `tf.compat.v1.tpu.cross_replica_sum`: an identity instead
  of the `CrossReplicaSum` op, which has no CPU kernel.

  Args:
    refuse_sum_reduction: None, or the message of the ValueError raised when
      a `CrossShardOptimizer` with `reduction=SUM` applies gradients (where
      the replicas' gradients are averaged elsewhere, as on a synchronous
      cluster).
  """
  single = _SingleReplicaOps(tpu_ops)
  patches = [(tpu_optimizer, "tpu_ops", single),
             (tpu_ops, "cross_replica_sum", single.cross_replica_sum)]
  if refuse_sum_reduction is not None:
    apply_gradients = tpu_optimizer.CrossShardOptimizer.apply_gradients

    def averaged_only(optimizer, *args, **kwargs):
      if optimizer._reduction != tf.compat.v1.losses.Reduction.MEAN:
        raise ValueError(refuse_sum_reduction)
      return apply_gradients(optimizer, *args, **kwargs)

    patches.append((tpu_optimizer.CrossShardOptimizer, "apply_gradients",
                    averaged_only))
  api = sys.modules.get("tensorflow._api.v2.compat.v1.tpu")
  if api is not None and hasattr(api, "cross_replica_sum"):
    patches.append((api, "cross_replica_sum", single.cross_replica_sum))
  saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
  for owner, name, value in patches:
    setattr(owner, name, value)
  try:
    with tpu_function.tpu_shard_context(1):
      yield
  finally:
    for owner, name, value in saved:
      setattr(owner, name, value)


def refuse_tensorflow_columns(graph, cause=None):
  """Raises a clear TypeError when TF's own TPU embedding columns ran in
  model_fn on the host (they record their tables in TF's collection): under
  one replica they take themselves to be on a TPU and read raw ids as
  activations, which fails later with an unrelated shape error. `cause`:
  the error model_fn raised, if any (kept as the cause)."""
  recorded = graph.get_collection(tf_tpu_columns._TPU_FC_TO_SCOPE)
  names = sorted(name for entry in recorded for name in entry)
  if not names:
    return
  raise TypeError(
      "TPUEstimator: model_fn uses TensorFlow's own TPU embedding columns "
      f"(tables {names}), from tf.compat.v1.tpu.experimental / "
      "tf.tpu.experimental. Change the import: build the columns with "
      "tpu_embedding_columns.embedding_column / shared_embedding_columns "
      "(the same arguments), or convert an existing spec with "
      "estimator_spec.interop.from_tensorflow and use its columns "
      "(interop.columns_by_name).") from cause
