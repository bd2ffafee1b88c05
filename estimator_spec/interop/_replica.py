"""Running `tf.compat.v1.tpu.CrossShardOptimizer` as a single replica on the
host."""
import contextlib

from tensorflow.python.tpu import feature_column as tf_tpu_columns

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
