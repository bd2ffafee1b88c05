"""From a features dict to validated flat ids, one entry per engine feature.

Accepted per feature (SEMANTICS.md section 3):
* with a column (columns form of the spec): whatever the column's own
  categorical column takes (raw strings for vocabulary/hash columns, floats
  for bucketized ones, dense or sparse ids, RaggedTensors); the column turns
  it into ids and weights exactly as in a plain lookup;
* without a column (dict form): a SparseTensor, a RaggedTensor or a dense
  rank-2 tensor of integer ids (dense: the non-zero entries are the ids, as in
  TPUEstimator's input path), or, for a table with combiner None, a dense
  rank-1 tensor with one id per example; weights under the feature's
  `weight_key` in the same form as the ids.
"""
import dataclasses
from typing import Any, Optional

import tensorflow as tf

from tpu_embedding_columns import lookup as column_lookup


@dataclasses.dataclass
class FeatureIds:
  """Validated ids of one feature for one step."""
  name: str
  table: str
  flat: column_lookup.FlatIds
  max_sequence_length: int
  combiner: Optional[str]
  # Sequence lengths min(length, L) for sequence features, else None.
  lengths: Optional[Any] = None


def _to_sparse(value, feature, what):
  if isinstance(value, tf.SparseTensor):
    return value
  if isinstance(value, tf.RaggedTensor):
    return value.to_sparse()
  value = tf.convert_to_tensor(value)
  if value.shape.rank != 2:
    raise ValueError(
        f"Feature {feature!r}: {what} must be a SparseTensor, a RaggedTensor "
        f"or a rank-2 tensor; got shape {value.shape}.")
  return column_lookup.dense_to_sparse(value)


def _assert_same_positions(a, b, message):
  same = tf.cond(
      tf.equal(tf.shape(a)[0], tf.shape(b)[0]),
      lambda: tf.reduce_all(tf.equal(a, b)), lambda: tf.constant(False))
  return tf.debugging.assert_equal(same, True, message=message)


def parse_feature(feature, table, features, *, drop_negative=True):
  """Returns the `FeatureIds` of `feature` (a model.Feature) from `features`.

  Python-side problems (missing keys, wrong types or ranks) raise here, at
  graph-building time; id ranges are checked when the graph runs.
  """
  name = feature.name
  column = feature.column
  # A column reads its raw inputs under its own keys (a crossed column
  # 'a_X_b' reads 'a' and 'b'); the dict form reads the feature's name.
  needed = (sorted(column.categorical_column.parse_example_spec)
            if column is not None else [name])
  missing = [key for key in needed if key not in features]
  if missing:
    raise ValueError(
        f"Feature {name!r} (table {table.name!r}): {missing} missing from "
        f"the features dict; got keys {sorted(features)}.")
  if feature.weight_key is not None and feature.weight_key not in features:
    raise ValueError(
        f"Feature {name!r} (table {table.name!r}) takes weights from "
        f"{feature.weight_key!r}, which is missing from the features dict.")
  if column is not None:
    drop_negative = column.use_safe_embedding_lookup
    sparse_ids, sparse_weights = column_lookup.categorical_ids(
        column, features)
  else:
    raw = features[name]
    if table.combiner is None and not isinstance(
        raw, (tf.SparseTensor, tf.RaggedTensor)):
      return _single_ids(feature, table, raw, features)
    sparse_ids = _to_sparse(raw, name, "ids")
    sparse_weights = None
    if feature.weight_key is not None:
      sparse_weights = _to_sparse(features[feature.weight_key], name,
                                  f"weights {feature.weight_key!r}")
      with tf.control_dependencies([
          _assert_same_positions(
              sparse_weights.indices, sparse_ids.indices,
              f"Feature {name!r} (table {table.name!r}): weights "
              f"{feature.weight_key!r} do not match the ids (different "
              "positions).")
      ]):
        sparse_weights = tf.SparseTensor(
            sparse_weights.indices, tf.identity(sparse_weights.values),
            sparse_weights.dense_shape)
  if not sparse_ids.dtype.is_integer:
    raise TypeError(
        f"Feature {name!r} (table {table.name!r}): ids must be integers; got "
        f"{sparse_ids.dtype.name}. Use the columns form of the spec to turn "
        "strings into ids, or convert them in the input_fn.")
  flat = column_lookup.flatten_ids(
      sparse_ids, sparse_weights, table.vocabulary_size, feature=name,
      table=table.name, drop_negative=drop_negative,
      ids_non_negative=(column is not None and column_lookup.never_negative(
          column.categorical_column)))
  lengths = None
  if feature.max_sequence_length:
    lengths = column_lookup.sequence_lengths(sparse_ids,
                                             feature.max_sequence_length)
    flat = column_lookup.truncate_positions(flat, feature.max_sequence_length)
  return FeatureIds(name, table.name, flat, feature.max_sequence_length,
                    table.combiner, lengths)


def _single_ids(feature, table, raw, features):
  """combiner=None with a dense rank-1 tensor: one id per example."""
  name = feature.name
  if feature.weight_key is not None:
    raise ValueError(
        f"Feature {name!r} (table {table.name!r}) has combiner None with "
        f"dense ids, which takes no weights; drop weight_key "
        f"{feature.weight_key!r}.")
  del features
  ids = tf.convert_to_tensor(raw)
  if ids.shape.rank != 1:
    raise ValueError(
        f"Feature {name!r} (table {table.name!r}): combiner None takes a "
        f"rank-1 tensor of ids (one per example); got shape {ids.shape}.")
  if not ids.dtype.is_integer:
    raise TypeError(
        f"Feature {name!r} (table {table.name!r}): ids must be integers; got "
        f"{ids.dtype.name}.")
  batch = tf.shape(ids, out_type=tf.int64)[0]
  sparse = tf.SparseTensor(
      tf.stack([tf.range(batch), tf.zeros([batch], tf.int64)], axis=1),
      tf.cast(ids, tf.int64), tf.stack([batch, 1]))
  flat = column_lookup.flatten_ids(
      sparse, None, table.vocabulary_size, feature=name, table=table.name,
      drop_negative=False)
  return FeatureIds(name, table.name, flat, 0, None, None)


def check_batch_sizes(parsed):
  """All features must have the same batch size; returns (batch, checks)."""
  items = list(parsed.values())
  static = {}
  for item in items:
    if item.flat.static_batch_size is not None:
      static[item.name] = item.flat.static_batch_size
  if len(set(static.values())) > 1:
    raise ValueError(
        "Features have different batch sizes: "
        + ", ".join(f"{k}={v}" for k, v in sorted(static.items())) +
        "; every feature of a step must have the same batch size.")
  first = items[0]
  if len(items) == 1:
    return first.flat.batch_size, []
  sizes = tf.stack([item.flat.batch_size for item in items])
  names = ", ".join(repr(item.name) for item in items)
  checks = [
      column_lookup.check(
          tf.equal(sizes, first.flat.batch_size),
          f"Features {names} do not all have the same batch size; their "
          "batch sizes:", [sizes])
  ]
  return first.flat.batch_size, checks
