"""What a batch must satisfy on the host, as on a TPU.

A training batch has exactly `train_batch_size` examples (a TPU step has a
fixed shape), and labels have one row per example. Each rule is checked
when the graph is built if the shapes are static, else by an Assert op that
every lookup and every write of the step waits for, so that a bad batch
fails on the check and changes no variable.
"""
import tensorflow as tf

from tpu_embedding_columns import lookup as column_lookup


def check_train_batch(features, labels, expected):
  """(features, labels) of a training step that no engine table reads,
  checked to have `expected` examples before model_fn reads them."""
  static, dynamic = _batch_of(features)
  _check_static_batch(static, expected)
  if dynamic is None:
    return features, labels
  gate = _train_batch_check(dynamic, expected)
  return _after_check(features, gate), _after_check(labels, gate)


def check_lookup_batch(lookup, features, labels, expected=None):
  """Checks the batch of an engine step (a `LookupStep` of the engine) and
  returns (features, labels) for model_fn; the checks join `lookup`'s, so
  they gate its lookups and every write of the step.

  Args:
    lookup: the step's `LookupStep`, before its first table lookup.
    features, labels: what input_fn gave.
    expected: `train_batch_size` in a training step, else None.
  """
  checks = []
  if expected is not None:
    _check_static_batch(lookup.static_batch_size, expected)
    checks.append(_train_batch_check(lookup.batch_size, expected))
    # A TPU step has static shapes: so do the activations (the run-time
    # check above holds them to it, and model_fn's other inputs wait for
    # it, so that a partial batch fails on it, not on a shape).
    lookup.static_batch_size = expected
    features = _after_check(features, checks[0])
    labels = _after_check(labels, checks[0])
  elif lookup.static_batch_size is None:
    lookup.static_batch_size = _batch_of((features, labels))[0]
  labels, label_checks = _check_labels(labels, lookup)
  lookup.add_checks(checks + label_checks)
  return features, labels


def _check_static_batch(static, expected):
  if static is not None and static != expected:
    raise ValueError(
        f"TPUEstimator: a training batch has {static} examples; "
        f"train_batch_size is {expected}. A TPU step has a fixed batch: "
        "make input_fn batch with params['batch_size'] and "
        "drop_remainder=True.")


def _train_batch_check(batch_size, expected):
  """The run-time check that a training batch has `expected` examples."""
  return _check_op(
      batch_size, tf.constant(expected, tf.int64),
      message=(f"TPUEstimator: a training batch does not have "
               f"train_batch_size={expected} examples; no variable was "
               "updated. Batch with drop_remainder=True."))


def _batch_of(structure):
  """(static batch size or None, int64 batch size tensor or None) of the
  tensors in `structure` (features, labels): the static size is the first
  one known among them, the tensor that of the first with a batch
  dimension."""
  static, dynamic = None, None
  for value in tf.nest.flatten(structure):
    if not isinstance(value, (tf.SparseTensor, tf.RaggedTensor, tf.Tensor,
                              tf.Variable)) or not value.shape.rank:
      continue
    if static is None:
      static = tf.compat.dimension_value(value.shape[0])
    if dynamic is None:
      if isinstance(value, tf.SparseTensor):
        dynamic = value.dense_shape[0]
      elif isinstance(value, tf.RaggedTensor):
        dynamic = value.nrows(out_type=tf.int64)
      else:
        dynamic = tf.shape(value, out_type=tf.int64)[0]
  return static, dynamic


def _after_check(structure, check):
  """`structure` with every tensor waiting for the `check` op: through
  IdentityN ops of at most _GATE_GROUP tensors each (an op with n inputs and
  n outputs costs graph walkers that visit each input once per output, as
  Keras' history check of a layer's inputs does, n * n steps)."""
  values = tf.nest.flatten(structure)
  gated = []
  with tf.control_dependencies([check]):
    parts = [_gated_parts(value) for value in values]
    tensors = [tensor for part in parts for tensor in part]
    for start in range(0, len(tensors), _GATE_GROUP):
      group = tensors[start:start + _GATE_GROUP]
      gated.extend([tf.identity(group[0])] if len(group) == 1 else
                   tf.identity_n(group))
  rebuilt = []
  for value, part in zip(values, parts):
    rebuilt.append(_rebuilt(value, gated[:len(part)]))
    gated = gated[len(part):]
  return tf.nest.pack_sequence_as(structure, rebuilt)


# Tensors per gating IdentityN (see `_after_check`).
_GATE_GROUP = 64


def _gated_parts(value):
  """The tensors of `value` that wait for a check: a SparseTensor's indices
  and values, a RaggedTensor's flat values, a tensor or variable itself."""
  if isinstance(value, tf.SparseTensor):
    return [value.indices, value.values]
  if isinstance(value, tf.RaggedTensor):
    return [value.flat_values]
  if isinstance(value, tf.Variable):
    return [value.read_value()]
  if isinstance(value, tf.Tensor):
    return [value]
  return []


def _rebuilt(value, gated):
  """`value` with its `_gated_parts` replaced by `gated`."""
  if isinstance(value, tf.SparseTensor):
    return tf.SparseTensor(gated[0], gated[1], value.dense_shape)
  if isinstance(value, tf.RaggedTensor):
    return value.with_flat_values(gated[0])
  return gated[0] if gated else value


def _check_labels(labels, lookup):
  """Labels must have one row per example: static check, or a run-time one
  that gates every write of the step."""
  if labels is None:
    return None, []
  flat = tf.nest.flatten(labels)
  checks = []
  for i, tensor in enumerate(flat):
    if isinstance(tensor, (tf.SparseTensor, tf.RaggedTensor)):
      continue
    tensor = tf.convert_to_tensor(tensor)
    where = "labels" if len(flat) == 1 else f"labels (entry {i})"
    if tensor.shape.rank == 0:
      raise ValueError(
          f"TPUEstimator: {where} is a scalar; labels need one row per "
          "example (shape [batch, ...]).")
    static = tensor.shape[0] if tensor.shape.rank is not None else None
    if static is not None and lookup.static_batch_size is not None and (
        static != lookup.static_batch_size):
      raise ValueError(
          f"TPUEstimator: {where} has {static} rows but the features have "
          f"{lookup.static_batch_size} examples; labels need one row per "
          "example.")
    checks.append(
        _check_op(
            tf.shape(tensor, out_type=tf.int64)[0], lookup.batch_size,
            message=(f"TPUEstimator: {where} do not have one row per "
                     "example; no variable was updated.")))
  if not checks:
    return labels, []
  with tf.control_dependencies(checks):
    checked = [
        t if isinstance(t, (tf.SparseTensor, tf.RaggedTensor)) else
        tf.identity(t) for t in flat
    ]
  return tf.nest.pack_sequence_as(labels, checked), checks


def _check_op(x, y, message):
  """A check that x == y (one Assert op)."""
  return column_lookup.check(tf.equal(x, y), message, [x, y])
