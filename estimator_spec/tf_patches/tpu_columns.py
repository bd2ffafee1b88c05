"""TF's own TPU embedding columns, recognised in a graph built on the host.

TF 2.15's TPU columns (`tf.compat.v1.tpu.experimental.embedding_column`
and its shared form), built under a TPU shard context, record themselves
in a graph collection named by the private constant
`tensorflow.python.tpu.feature_column._TPU_FC_TO_SCOPE` (dicts keyed by
the columns' names). On the host, under one
replica, those columns take themselves to be on a TPU and read raw ids as
activations, which fails later with an unrelated shape error; this module
reads that record to refuse them with a message saying what to change.
tests/test_tf_patches_estimator.py fails if TF stops recording there.
"""
from tensorflow.python.tpu import feature_column as tf_tpu_columns


def recorded_tables(graph):
  """The names under which TF's own TPU columns recorded themselves in
  `graph` (sorted)."""
  recorded = graph.get_collection(tf_tpu_columns._TPU_FC_TO_SCOPE)
  return sorted(name for entry in recorded for name in entry)


def refuse_tensorflow_columns(graph, cause=None):
  """Raises a clear TypeError when TF's own TPU embedding columns ran in
  model_fn on the host. `cause`: the error model_fn raised, if any (kept as
  the cause)."""
  names = recorded_tables(graph)
  if not names:
    return
  raise TypeError(
      "TPUEstimator: model_fn uses TensorFlow's own TPU embedding columns "
      f"(tables {names}); build them with "
      "tpu_embedding_columns.embedding_column / shared_embedding_columns "
      "(the same arguments), or run `python -m estimator_spec migrate` on "
      "the program (docs/migration.md).") from cause
