"""TPU embedding columns named as TF1's were.

TF 1.x exported `tf.compat.v1.tpu.experimental.embedding_column` and
`shared_embedding_columns` from `tensorflow.python.tpu.feature_column`, whose
shared columns name their table differently from the TF 2.x columns that
`tpu_embedding_columns.shared_embedding_columns` follows. Use this module
when a model (and its checkpoints) was built with those TF1 columns:

* a shared column's `_var_scope_name` is the group's collection name (by
  default the sorted column names joined by '_' plus '_shared_embedding',
  else `shared_embedding_collection_name`), so `input_layer` opens
  `input_layer/<collection name>` for each column of the group;
* the group has one variable `embedding_weights`, created in the variable
  scope current at its first use (`input_layer/<collection name>/
  embedding_weights` through `input_layer`, plain `embedding_weights` when
  `_get_dense_tensor` is called directly) and kept in the graph collection
  named by the collection name, from which every other use takes it;
* with an engine installed (the host TPUEstimator), every column of the
  group registers that same first name, so the engine's table and its
  checkpoint carry it.

Non-shared columns are named alike in both eras (`<column>/embedding_weights`
under the layer's scope); `embedding_column` here is
`tpu_embedding_columns.embedding_column`. Arguments, defaults and what is
refused are those of `tpu_embedding_columns`.
"""
from tpu_embedding_columns import api as _api
from tpu_embedding_columns.columns import LegacySharedEmbeddingColumn


def embedding_column(categorical_column,
                     dimension,
                     combiner="mean",
                     initializer=None,
                     max_sequence_length=0,
                     learning_rate_fn=None,
                     use_safe_embedding_lookup=True,
                     embedding_lookup_device=None,
                     tensor_core_shape=None):
  """`tpu_embedding_columns.embedding_column` (TF1 named a non-shared
  column's table as TF 2.x does), with TF1's argument order
  (`use_safe_embedding_lookup` after `learning_rate_fn`; the TF 2.x
  arguments after it). Returns an `EmbeddingColumn`."""
  return _api.embedding_column(
      categorical_column,
      dimension,
      combiner=combiner,
      initializer=initializer,
      max_sequence_length=max_sequence_length,
      learning_rate_fn=learning_rate_fn,
      embedding_lookup_device=embedding_lookup_device,
      tensor_core_shape=tensor_core_shape,
      use_safe_embedding_lookup=use_safe_embedding_lookup)


def shared_embedding_columns(categorical_columns,
                             dimension,
                             combiner="mean",
                             initializer=None,
                             shared_embedding_collection_name=None,
                             max_sequence_lengths=None,
                             learning_rate_fn=None,
                             use_safe_embedding_lookup=True,
                             embedding_lookup_device=None,
                             tensor_core_shape=None):
  """`tpu_embedding_columns.shared_embedding_columns` with TF1's naming (see
  the module docstring) and TF1's argument order: the same arguments,
  checks and table, but `LegacySharedEmbeddingColumn`s, in the order of
  `categorical_columns`."""
  return _api.make_shared_columns(
      LegacySharedEmbeddingColumn, categorical_columns, dimension, combiner,
      initializer, shared_embedding_collection_name, max_sequence_lengths,
      learning_rate_fn, embedding_lookup_device, tensor_core_shape,
      use_safe_embedding_lookup)


__all__ = [
    "embedding_column",
    "shared_embedding_columns",
    "LegacySharedEmbeddingColumn",
]
