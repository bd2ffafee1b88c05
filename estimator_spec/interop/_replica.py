"""Running `tf.compat.v1.tpu.CrossShardOptimizer` as a single replica on the
host."""
import contextlib

from estimator_spec.tf_patches import replica_context


@contextlib.contextmanager
def single_replica(refuse_sum_reduction=None):
  """Runs TPU-replicated training code on the host as one replica.

  Inside the block, `CrossShardOptimizer` sees one shard (no loss scaling,
  no warning) and sums gradients over that one replica, and so does a
  model_fn's own `tf.compat.v1.tpu.cross_replica_sum`: an identity instead
  of the `CrossReplicaSum` op, which has no CPU kernel. The patches of
  TensorFlow this takes live in `estimator_spec.tf_patches.replica_context`.

  Args:
    refuse_sum_reduction: None, or the message of the ValueError raised when
      a `CrossShardOptimizer` with `reduction=SUM` applies gradients (where
      the replicas' gradients are averaged elsewhere, as on a synchronous
      cluster).
  """
  with replica_context.one_replica(refuse_sum_reduction):
    yield
