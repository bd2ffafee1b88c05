"""`embedding_column` and `shared_embedding_columns`.

Same signatures and defaults as TF 2.15's
`tf.compat.v1.tpu.experimental.embedding_column` /
`shared_embedding_columns`. What TF's constructors refuse is refused here
with the same exception type and TF's own key phrase, followed by what to
do. Deliberate differences (README, "Deliberate differences from TF 2.15"):
numpy integers are accepted wherever TF wants a Python int; every
categorical column TF's columns accept is accepted, and raw strings, floats
and crossed keys are turned into ids by the column where TF's TPU input path
takes integer ids only; a few things TF accepts and then ignores or fails on
later are refused up front (e.g. `combiner=None` with a weighted column,
`tensor_core_shape` without the tensor-core device).
"""
import math

import tensorflow as tf

from tpu_embedding_columns import checks
from tpu_embedding_columns import errors
from tpu_embedding_columns import columns as cols
from tpu_embedding_columns import lookup

_OWNER = "embedding_column"
_SHARED_OWNER = "shared_embedding_columns"


def default_initializer(dimension):
  """Truncated normal, mean 0, stddev 1/sqrt(dimension) (the TPU default)."""
  return tf.compat.v1.truncated_normal_initializer(
      mean=0.0, stddev=1.0 / math.sqrt(dimension))


def embedding_column(categorical_column,
                     dimension,
                     combiner="mean",
                     initializer=None,
                     max_sequence_length=0,
                     learning_rate_fn=None,
                     embedding_lookup_device=None,
                     tensor_core_shape=None,
                     use_safe_embedding_lookup=True):
  """A dense column that embeds `categorical_column` through a TPU table.

  Args:
    categorical_column: any categorical column of `tf.feature_column`
      (identity, vocabulary list/file, hash bucket, crossed, bucketized,
      weighted, or a `sequence_categorical_column_with_*`).
    dimension: positive int, the embedding width.
    combiner: 'mean', 'sum', 'sqrtn', or None (one id per example, no
      weights). Ignored positions of sequence columns are zeros.
    initializer: callable initializer of the table; default truncated normal
      with stddev 1/sqrt(dimension).
    max_sequence_length: 0 for non-sequence columns; > 0 for sequence columns
      (activations are [batch, max_sequence_length, dimension]).
    learning_rate_fn: optional callable global_step -> learning rate of this
      table.
    embedding_lookup_device: None, 'cpu', 'tpu_embedding_core' or
      'tpu_tensor_core' (needs `tensor_core_shape`).
    tensor_core_shape: [batch or None/-1, ids per example] for
      'tpu_tensor_core' columns.
    use_safe_embedding_lookup: True drops negative ids; False refuses them
      (an error naming the feature and table), as TF's CPU lookup fails on
      them. Sequence columns drop them either way, as TF's CPU path does.

  Returns:
    An `EmbeddingColumn`.
  """
  owner = f"{_OWNER}({_column_name(categorical_column)!r})"
  _check_categorical(owner, "categorical_column", categorical_column)
  dimension = _check_dimension(owner, dimension)
  initializer = _check_initializer(owner, initializer, dimension)
  device, tensor_core_shape = _check_device(
      owner, embedding_lookup_device, tensor_core_shape, [categorical_column],
      combiner)
  max_sequence_length = _check_sequence_length(
      owner, "max_sequence_length", max_sequence_length, categorical_column)
  _check_combiner(owner, combiner, categorical_column)
  checks.check_callable(owner, "learning_rate_fn", learning_rate_fn)
  use_safe_embedding_lookup = checks.check_bool(
      owner, "use_safe_embedding_lookup", use_safe_embedding_lookup)
  return cols.EmbeddingColumn(
      categorical_column=categorical_column,
      dimension=dimension,
      combiner=combiner,
      initializer=initializer,
      max_sequence_length=max_sequence_length,
      learning_rate_fn=learning_rate_fn,
      embedding_lookup_device=device,
      tensor_core_shape=tensor_core_shape,
      use_safe_embedding_lookup=use_safe_embedding_lookup)


def shared_embedding_columns(categorical_columns,
                             dimension,
                             combiner="mean",
                             initializer=None,
                             shared_embedding_collection_name=None,
                             max_sequence_lengths=None,
                             learning_rate_fn=None,
                             embedding_lookup_device=None,
                             tensor_core_shape=None,
                             use_safe_embedding_lookup=True):
  """Dense columns that embed several categorical columns through one table.

  Arguments are those of `embedding_column`, plus:
    categorical_columns: a list of categorical columns with the same number
      of buckets.
    shared_embedding_collection_name: the shared table's variable name;
      default: the sorted column names joined by '_' plus '_shared_embedding'.
    max_sequence_lengths: None/empty (all 0) or one entry per column.

  Returns:
    A list of `SharedEmbeddingColumn`, in the order of `categorical_columns`.
  """
  return make_shared_columns(
      cols.SharedEmbeddingColumn, categorical_columns, dimension, combiner,
      initializer, shared_embedding_collection_name, max_sequence_lengths,
      learning_rate_fn, embedding_lookup_device, tensor_core_shape,
      use_safe_embedding_lookup)


def make_shared_columns(column_class, categorical_columns, dimension,
                        combiner, initializer,
                        shared_embedding_collection_name,
                        max_sequence_lengths, learning_rate_fn,
                        embedding_lookup_device, tensor_core_shape,
                        use_safe_embedding_lookup):
  """Validates the arguments of `shared_embedding_columns` and returns one
  `column_class` (a `SharedEmbeddingColumn` class) per categorical column,
  all on one `SharedTable`. `tpu_embedding_columns.legacy` passes its own
  class; the validation and the table are the same."""
  names = _check_column_list(categorical_columns)
  owner = f"{_SHARED_OWNER}({names!r})"
  max_sequence_lengths = _check_length_list(owner, max_sequence_lengths,
                                            categorical_columns)
  dimension = _check_dimension(owner, dimension)
  initializer = _check_initializer(owner, initializer, dimension)
  device, tensor_core_shape = _check_device(
      owner, embedding_lookup_device, tensor_core_shape, categorical_columns,
      combiner)
  lengths = [
      _check_sequence_length(f"{owner} column {c.name!r}",
                             "max_sequence_lengths", length, c)
      for c, length in zip(categorical_columns, max_sequence_lengths)
  ]
  for column in categorical_columns:
    _check_combiner(owner, combiner, column)
  checks.check_callable(owner, "learning_rate_fn", learning_rate_fn)
  use_safe_embedding_lookup = checks.check_bool(
      owner, "use_safe_embedding_lookup", use_safe_embedding_lookup)
  table = _shared_table(owner, categorical_columns, dimension, initializer,
                        shared_embedding_collection_name)
  return [
      column_class(
          categorical_column=column,
          shared_table=table,
          combiner=combiner,
          max_sequence_length=length,
          learning_rate_fn=learning_rate_fn,
          embedding_lookup_device=device,
          tensor_core_shape=tensor_core_shape,
          use_safe_embedding_lookup=use_safe_embedding_lookup)
      for column, length in zip(categorical_columns, lengths)
  ]


def _check_column_list(categorical_columns):
  """Checks `categorical_columns` of `shared_embedding_columns` (a non-empty
  list of distinct categorical columns); returns their names."""
  owner = _SHARED_OWNER
  if isinstance(categorical_columns, (str, bytes)) or not isinstance(
      categorical_columns, (list, tuple)):
    checks.fail(owner, "categorical_columns",
                 "must be a list of categorical columns", categorical_columns,
                 TypeError)
  if not categorical_columns:
    checks.fail(owner, "categorical_columns", "must not be empty",
                 categorical_columns)
  for column in categorical_columns:
    _check_categorical(owner, "categorical_columns", column)
  names = [c.name for c in categorical_columns]
  if len(set(names)) != len(names):
    checks.fail(owner, "categorical_columns",
                 "must not name the same column twice", names)
  return names


def _check_length_list(owner, max_sequence_lengths, categorical_columns):
  """`max_sequence_lengths`, one entry per column (None or empty: all 0)."""
  if max_sequence_lengths is None or (isinstance(max_sequence_lengths,
                                                 (list, tuple)) and
                                      not max_sequence_lengths):
    max_sequence_lengths = [0] * len(categorical_columns)
  if not isinstance(max_sequence_lengths, (list, tuple)):
    checks.fail(owner, "max_sequence_lengths", "must be a list of ints",
                 max_sequence_lengths, TypeError)
  if len(max_sequence_lengths) != len(categorical_columns):
    raise ValueError(
        f"{owner}: max_sequence_lengths and categorical_columns must be of "
        f"the same length. len(max_sequence_lengths)="
        f"{len(max_sequence_lengths)} len(categorical_columns)="
        f"{len(categorical_columns)} (`max_sequence_lengths` needs one entry "
        f"per column; got {list(max_sequence_lengths)!r}).")
  return max_sequence_lengths


def _shared_table(owner, categorical_columns, dimension, initializer,
                  shared_embedding_collection_name):
  """The one `SharedTable` of the columns: they must have the same number
  of buckets; its name defaults to their sorted names joined by '_' plus
  '_shared_embedding'."""
  by_name = sorted(categorical_columns, key=lambda c: c.name)
  num_buckets = by_name[0].num_buckets
  for column in by_name[1:]:
    if column.num_buckets != num_buckets:
      raise ValueError(
          f"{owner}: all categorical_columns must have the same number of "
          f"buckets to share a table; {by_name[0].name!r} has {num_buckets}, "
          f"{column.name!r} has {column.num_buckets}.")
  if shared_embedding_collection_name is None or (
      shared_embedding_collection_name == ""):
    shared_embedding_collection_name = (
        "_".join(c.name for c in by_name) + "_shared_embedding")
  checks.check_str(owner, "shared_embedding_collection_name",
                    shared_embedding_collection_name)
  return cols.SharedTable(shared_embedding_collection_name, num_buckets,
                          dimension, initializer)


def _column_name(column):
  return getattr(column, "name", type(column).__name__)


def _check_categorical(owner, arg, column):
  if not isinstance(column, cols.CategoricalColumn):
    kind = ("shared_embedding_columns" if owner.startswith(_SHARED_OWNER) else
            "embedding_column")
    raise errors.ArgumentTypeError(
        f"{owner}: categorical_column for tpu {kind} must be type "
        f"CategoricalColumn, got {type(column)}: {column!r} (`{arg}`: use a "
        "categorical column of tf.feature_column: categorical_column_with_*, "
        "sequence_categorical_column_with_*, weighted_categorical_column, "
        "crossed_column or bucketized_column).")


def _check_dimension(owner, dimension):
  if dimension is None or (checks.is_int(dimension) and dimension < 1):
    raise ValueError(
        f"{owner}: Invalid dimension {dimension}. `dimension` must be a "
        f"positive int; got {dimension!r}.")
  if not checks.is_int(dimension):
    raise errors.ArgumentTypeError(
        f"{owner}: Invalid dimension {dimension!r}. `dimension` must be a "
        f"positive int; got {dimension!r}.")
  return int(dimension)


def _check_initializer(owner, initializer, dimension):
  if initializer is None:
    return default_initializer(dimension)
  if not callable(initializer):
    raise errors.ArgumentTypeError(
        f"{owner}: initializer must be callable if specified; got "
        f"`initializer`={initializer!r} (e.g. "
        "tf.compat.v1.truncated_normal_initializer).")
  return initializer


def _check_combiner(owner, combiner, column):
  if combiner not in lookup.COMBINERS + (None,):
    checks.fail(owner, "combiner", "must be 'mean', 'sum', 'sqrtn' or None",
                 combiner)
  if combiner is None and isinstance(column, cols.WeightedCategoricalColumn):
    raise ValueError(
        f"{owner}: `combiner=None` takes one id per example without weights, "
        f"but {column.name!r} is a weighted_categorical_column; use a "
        "combiner or an unweighted column.")


def _check_sequence_length(owner, arg, value, column):
  value = checks.check_int(owner, arg, value, minimum=0)
  is_sequence = isinstance(column, cols.SequenceCategoricalColumn)
  if is_sequence and value < 1:
    raise ValueError(
        f"{owner}: max_sequence_length must be greater than 0 for sequence "
        f"columns. Got max_sequence_length={value} for sequence column "
        f"{column.name} (`{arg}`).")
  if not is_sequence and value != 0:
    raise ValueError(
        f"{owner}: Non zero max_seq_length={value} specified for non sequence "
        f"column {column.name} (`{arg}` must be 0). Use a "
        "sequence_categorical_column_with_* for sequence features.")
  return value


def _check_device(owner, device, tensor_core_shape, categorical_columns,
                  combiner):
  """Validates `embedding_lookup_device` and `tensor_core_shape`."""
  if device is not None and device not in cols.LOOKUP_DEVICES:
    raise ValueError(
        f"{owner}: If set, embedding_lookup_device must be in "
        f"{list(cols.LOOKUP_DEVICES)}; got `embedding_lookup_device`="
        f"{device!r}.")
  if tensor_core_shape is not None and not (
      isinstance(tensor_core_shape, (list, tuple)) and
      len(tensor_core_shape) == 2):
    raise ValueError(
        f"{owner}: tensor_core_shape must be size 2. Got "
        f"`tensor_core_shape`={tensor_core_shape!r} (give [batch or None, ids "
        "per example]).")
  if device != "tpu_tensor_core":
    if tensor_core_shape is not None:
      raise ValueError(
          f"{owner}: `tensor_core_shape` is only used with "
          "embedding_lookup_device='tpu_tensor_core'; got "
          f"embedding_lookup_device={device!r}. Drop tensor_core_shape or "
          "set the device.")
    return device, None
  if tensor_core_shape is None:
    raise ValueError(
        f"{owner}: Using embedding_lookup_device=tpu_tensor_core requires "
        "tensor_core_shape to be set (`tensor_core_shape`: [batch or None, "
        "ids per example]).")
  batch, width = tensor_core_shape
  if batch is not None and batch != -1:
    checks.check_int(owner, "tensor_core_shape[0]", batch, minimum=1)
  width = checks.check_int(owner, "tensor_core_shape[1]", width, minimum=1)
  if combiner not in ("sum", "mean"):
    raise ValueError(
        f"{owner}: Dense TPU Embedding does not support combiner other than "
        f"sum and mean; got `combiner`={combiner!r} with "
        "embedding_lookup_device='tpu_tensor_core'.")
  for column in categorical_columns:
    if isinstance(column, cols.SequenceCategoricalColumn):
      raise ValueError(
          f"{owner}: embedding_lookup_device=tpu_tensor_core currently does "
          f"not support sequence columns; {column.name!r} is one.")
    if isinstance(column, cols.WeightedCategoricalColumn):
      raise ValueError(
          f"{owner}: embedding_lookup_device='tpu_tensor_core' pads ids with "
          f"a 0/1 mask and cannot apply the weights of {column.name!r}; use "
          "'tpu_embedding_core' for weighted columns.")
  return device, [batch, width]
