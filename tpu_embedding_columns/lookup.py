"""TPU-semantics embedding lookups as plain TensorFlow ops (no engine).

These functions implement the forward rules of `../shared/SEMANTICS.md`
section 3 for one feature and one table: id validation, the `sum`/`mean`/
`sqrtn` combiners (empty examples give zeros), sequence features padded or
truncated to `max_sequence_length`, and the padded lookup of tensor-core
columns. Columns use them outside the embedding engine (plain Estimator,
Keras, serving export), so that a lookup gives the same numbers everywhere.
"""
import tensorflow as tf

COMBINERS = ("sum", "mean", "sqrtn")


def check(condition, message, data=()):
  """One Assert op: fails with `message` (and `data`) when the boolean
  tensor `condition` is not all true. (tf.debugging.assert_* build a guard
  cond and static-shape machinery per call; this runs as a single op.)"""
  rank = condition.shape.rank
  if rank is None:
    condition = tf.reduce_all(condition)
  elif rank:
    condition = tf.reduce_all(condition, axis=list(range(rank)))
  return tf.raw_ops.Assert(condition=condition,
                           data=[tf.constant(message)] + list(data),
                           summarize=8)


def gate(checks):
  """One op that depends on every check: ops that must wait for many checks
  depend on this (one control edge each) instead of on all of them."""
  checks = [c for c in checks if c is not None]
  if not checks:
    return None
  return tf.group(*checks)


def dense_to_sparse(tensor):
  """The non-zero entries of a dense id (or weight) tensor, as a
  SparseTensor: TPUEstimator's input convention for dense ids."""
  positions = tf.compat.v1.where(tf.not_equal(tensor, tf.zeros_like(tensor)))
  return tf.SparseTensor(positions, tf.gather_nd(tensor, positions),
                         tf.shape(tensor, out_type=tf.int64))


def id_column(column):
  """The categorical column that makes a TPU embedding column's ids: its
  categorical column without the weighted wrapper (weights are read from the
  weight key as they are, as on a TPU)."""
  categorical = column.categorical_column
  if type(categorical).__name__ == "WeightedCategoricalColumn":
    return categorical.categorical_column
  return categorical


def column_ids(column, features):
  """SparseTensor ids: a TPU embedding column's id column (`id_column`) run
  on the raw inputs it reads from `features` (RaggedTensors are taken as
  sparse)."""
  categorical = id_column(column)
  raw = {}
  for key in categorical.parse_example_spec:
    value = features[key]
    raw[key] = value.to_sparse() if isinstance(value,
                                               tf.RaggedTensor) else value
  cache = tf.__internal__.feature_column.FeatureTransformationCache(raw)
  return categorical.get_sparse_tensors(cache, None).id_tensor


class FlatIds:
  """The ids of one feature in flat form, after validation.

  example: int64 [N] example (row) of each id; position: int64 [N] position of
  each id within its example; ids: int64 [N]; weights: float32 [N] or None;
  batch_size: scalar int64 tensor.
  """

  def __init__(self, example, position, ids, weights, batch_size,
               static_batch_size=None):
    self.example = example
    self.position = position
    self.ids = ids
    self.weights = weights
    self.batch_size = batch_size
    self.static_batch_size = static_batch_size


def structure_checks(sparse_ids, sparse_weights, where):
  """Run-time checks of a feature's SparseTensors, before any use of them:
  every index lies inside the ids' dense_shape, and the weights (if any) sit
  at exactly the ids' positions. `where` names the feature and table."""
  # The example and position of each id (the dimensions a lookup reads),
  # reduced first, then compared: cheaper than comparing every index. Empty
  # indices reduce to the dtype's extremes and pass.
  rank = tf.compat.dimension_value(sparse_ids.dense_shape.shape[0])
  indices = sparse_ids.indices
  shape = sparse_ids.dense_shape
  if rank is None or rank > 2:
    indices, shape = indices[:, :2], shape[:2]
  largest = tf.reduce_max(indices, axis=0)
  smallest = tf.reduce_min(indices, axis=0)
  checks = [
      check(
          tf.logical_and(tf.less(largest, shape),
                         tf.greater_equal(smallest, 0)),
          f"{where}: SparseTensor indices are out of bounds of its "
          "dense_shape (an id would land in another example or position); "
          "make dense_shape cover every index. dense_shape and the largest "
          "example and position:", [sparse_ids.dense_shape, largest])
  ]
  if sparse_weights is not None:
    count = check(
        tf.equal(tf.size(sparse_weights.values), tf.size(sparse_ids.values)),
        f"{where}: weights do not match the ids (different number of "
        "values).")
    with tf.control_dependencies([count]):
      same = tf.reduce_all(tf.equal(sparse_weights.indices,
                                    sparse_ids.indices))
    checks += [
        count,
        check(
            same, f"{where}: weights are at other positions than the ids "
            "(their SparseTensors' indices differ); give weights at exactly "
            "the ids' positions.")
    ]
  return checks


def flatten_ids(sparse_ids, sparse_weights, vocabulary_size, *, feature,
                table, drop_negative, ids_non_negative=False,
                max_positions=None):
  """Validates a SparseTensor of ids (and weights) and returns `FlatIds`.

  Ids at positions >= `max_positions` (sequence length, tensor-core width)
  are dropped first: they are never looked up, so they are never checked.
  Negative ids are then dropped when `drop_negative` (the behaviour of
  `use_safe_embedding_lookup=True`), else refused; ids >= vocabulary_size are
  always refused. Weights are cast to float32. Errors are raised when the
  graph runs and name the feature and the table; `structure_checks` run
  too. `ids_non_negative`: the ids come from a transformation that never
  yields negative ids (see `never_negative`), so none are dropped.
  """
  where = f"Feature {feature!r} (table {table!r})"
  if not isinstance(sparse_ids, tf.SparseTensor):
    raise TypeError(
        f"{where}: ids must arrive as a SparseTensor here; got "
        f"{type(sparse_ids).__name__}.")
  if not sparse_ids.dtype.is_integer:
    raise TypeError(
        f"{where}: ids must be integers; got dtype {sparse_ids.dtype.name}. "
        "Pass the raw feature through the categorical column so that it is "
        "turned into ids.")
  checks = structure_checks(sparse_ids, sparse_weights, where)
  indices = sparse_ids.indices
  ids = tf.cast(sparse_ids.values, tf.int64)
  weights = None
  if sparse_weights is not None:
    weights = tf.cast(sparse_weights.values, tf.float32)
  rank = tf.compat.dimension_value(sparse_ids.dense_shape.shape[0])
  if rank is None:
    example, position = indices[:, 0], indices[:, 1]
  elif rank == 1:
    (example,) = tf.unstack(indices, num=1, axis=1)
    position = tf.zeros_like(example)
  else:
    example, position = tf.unstack(indices, num=rank, axis=1)[:2]
  if max_positions is not None:
    ids, example, position, weights = _kept(
        tf.math.less(position, max_positions), ids, example, position,
        weights)
  # The range check compares the batch's smallest and largest id (the
  # numbers its message prints) rather than every id. Empty ids reduce to
  # the dtype's extremes and pass.
  smallest, largest = tf.reduce_min(ids), tf.reduce_max(ids)
  in_range = tf.less(largest, vocabulary_size)
  if drop_negative:
    message = f"id out of range [0, {vocabulary_size})"
  else:
    in_range = tf.logical_and(in_range, tf.greater_equal(smallest, 0))
    message = (f"id out of range [0, {vocabulary_size}) (negative ids are "
               "refused with use_safe_embedding_lookup=False)")
  with tf.control_dependencies(checks):
    checks.append(
        check(in_range, f"{where}: {message}; smallest and largest id of "
              "the batch:", [smallest, largest]))
  with tf.control_dependencies(checks):
    ids = tf.identity(ids)
    if weights is not None:
      weights = tf.identity(weights)
  if drop_negative and not ids_non_negative:
    ids, example, position, weights = _kept(
        tf.math.greater_equal(ids, 0), ids, example, position, weights)
  static_batch = (tf.compat.dimension_value(sparse_ids.shape[0])
                  if sparse_ids.shape.rank else None)
  return FlatIds(example, position, ids, weights, sparse_ids.dense_shape[0],
                 static_batch)


def _kept(keep, *tensors):
  """`tensors` (None passes through) at the entries where the boolean
  vector `keep` is true."""
  where = tf.squeeze(tf.where(keep), axis=1)
  axis = tf.constant(0)
  return [None if t is None else tf.gather(t, where, axis=axis)
          for t in tensors]


# Categorical columns whose ids are never negative: hashing, crossing and
# bucketizing cannot give negative ids. (An identity column passes negative
# ids through unless it has a default_value, which replaces them.)
_NON_NEGATIVE_COLUMNS = ("HashedCategoricalColumn", "CrossedColumn",
                         "BucketizedColumn")
_VOCABULARY_COLUMNS = ("VocabularyListCategoricalColumn",
                       "VocabularyFileCategoricalColumn")


def never_negative(categorical_column):
  """Whether a categorical column's transformation never yields a negative
  id (weighted and sequence wrappers are looked through)."""
  column = categorical_column
  while type(column).__name__ in ("WeightedCategoricalColumn",
                                  "SequenceCategoricalColumn"):
    column = column.categorical_column
  name = type(column).__name__
  if name in _NON_NEGATIVE_COLUMNS:
    return True
  if name == "IdentityCategoricalColumn":
    return column.default_value is not None
  if name in _VOCABULARY_COLUMNS:
    # Out-of-vocabulary values get an oov bucket, or default_value (-1 when
    # there are no oov buckets and no default).
    return column.num_oov_buckets > 0 or (
        column.default_value is not None and column.default_value >= 0)
  return False


def gather_rows(table, ids):
  """Gathers rows of `table` (a variable, a PartitionedVariable or a list of
  `div` partitions) for `ids`, reading each distinct id once."""
  unique_ids, index = tf.unique(ids)
  if isinstance(table, (list, tuple)) or hasattr(table, "_get_variable_list"):
    rows = tf.compat.v1.nn.embedding_lookup(
        table, unique_ids, partition_strategy="div")
  else:
    rows = tf.gather(table, unique_ids)
  return tf.gather(rows, index)


def combiner_scale(weights, segment, num_segments, combiner):
  """Per-segment factor c of the combiner: 1 (sum), 1/sum(w) (mean),
  1/sqrt(sum(w^2)) (sqrtn); 0 where the denominator is 0 (empty examples).
  Returns None for 'sum'."""
  if combiner == "sum":
    return None
  if weights is None:
    weights = tf.ones_like(segment, dtype=tf.float32)
  if combiner == "mean":
    denominator = tf.math.unsorted_segment_sum(weights, segment, num_segments)
  elif combiner == "sqrtn":
    denominator = tf.sqrt(
        tf.math.unsorted_segment_sum(weights * weights, segment, num_segments))
  else:
    raise ValueError(f"Unknown combiner {combiner!r}; use one of {COMBINERS}.")
  return tf.math.divide_no_nan(tf.ones_like(denominator), denominator)


class Plan:
  """How the ids of one feature combine into its activation, and back.

  Output segment s (the example, or the (example, position) slot of a
  sequence feature) is `scale[s] * sum of weight[i] * row(id_i)` over the
  ids i in it; the backward pass sends `scale[segment[i]] * weight[i] *
  grad[segment[i]]` to id i (SEMANTICS.md 4.2). `weights` (per id) and
  `scale` (per segment: the combiner's 1/sum(w) or 1/sqrt(sum(w^2))) are None
  when they are all 1.
  """

  def __init__(self, segment, num_segments, weights, scale, output_shape,
               checks):
    self.segment = segment
    self.num_segments = num_segments
    self.weights = weights
    self.scale = scale
    self.output_shape = output_shape
    self.checks = checks

  def combine(self, rows):
    """Rows [N, D] of the ids -> activation [B, D] or [B, L, D]."""
    if self.weights is not None:
      rows = rows * tf.expand_dims(self.weights, 1)
    with tf.control_dependencies(self.checks):
      out = tf.math.unsorted_segment_sum(rows, self.segment, self.num_segments)
    if self.scale is not None:
      out = out * tf.expand_dims(self.scale, 1)
    out = tf.reshape(out, [-1] + self.output_shape)
    out.set_shape([None] + self.output_shape)
    return out

  def backprop(self, grad):
    """Activation gradient -> per-id gradient contributions [N, D]."""
    dimension = self.output_shape[-1]
    grad = tf.reshape(grad, [-1, dimension])
    if self.scale is not None:
      grad = grad * tf.expand_dims(self.scale, 1)
    contributions = tf.gather(grad, self.segment)
    if self.weights is not None:
      contributions = contributions * tf.expand_dims(self.weights, 1)
    return contributions


def make_plan(flat, combiner, dimension, max_sequence_length=0, *,
              feature="", table=""):
  """The `Plan` of a feature's (already truncated) ids.

  combiner None (non-sequence): each example has at most one id, which must
  be checked when the graph runs; its activation is the row itself. Sequence
  features place ids at their positions (several ids at one position are
  combined with the combiner, `sum` when None).
  """
  example = tf.cast(flat.example, tf.int32)
  batch = tf.cast(flat.batch_size, tf.int32)
  checks = []
  if max_sequence_length:
    segment = example * max_sequence_length + tf.cast(flat.position, tf.int32)
    num_segments = batch * max_sequence_length
    output_shape = [max_sequence_length, dimension]
    combiner = combiner or "sum"
  else:
    segment = example
    num_segments = batch
    output_shape = [dimension]
    if combiner is None:
      counts = tf.math.unsorted_segment_sum(
          tf.ones_like(segment), segment, num_segments)
      checks.append(
          check(
              tf.less_equal(counts, 1),
              f"Feature {feature!r} (table {table!r}): combiner=None takes "
              "exactly one id per example."))
      combiner = "sum"
  scale = combiner_scale(flat.weights, segment, num_segments, combiner)
  return Plan(segment, num_segments, flat.weights, scale, output_shape,
              checks)


def sequence_lengths(sparse_ids, max_sequence_length):
  """The `<key>_seq_length_` feature: min(last position + 1, L) per example."""
  example = tf.cast(sparse_ids.indices[:, 0], tf.int32)
  batch = tf.cast(sparse_ids.dense_shape[0], tf.int32)
  last = tf.math.unsorted_segment_max(
      tf.cast(sparse_ids.indices[:, 1], tf.int64) + 1, example, batch)
  lengths = tf.maximum(last, 0)  # empty examples give the dtype's minimum
  return tf.minimum(lengths, max_sequence_length)
