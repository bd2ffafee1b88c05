"""The backward pass: per table, the float32 gradient sum of each distinct id.

docs/numerics.md, 'The backward pass, table by table', steps 1 to 3 for
every table of a step: the gradient multiplier, the combiner's backward,
float32 accumulation per id across examples and features, every input and
gradient check in one gate that the writes wait for; the learning rate at
the step. `table_gradients` gives the step's `StepGradients`, which the
update (`updates.py`, `remote.py`) or a synchronous cluster step applies.
"""
import collections
import weakref
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import tensorflow as tf

from tpu_embedding_columns import lookup as column_lookup

from estimator_spec.config import model as model_lib
from estimator_spec.engine import kernels
from estimator_spec.engine import lookup as lookup_lib
from estimator_spec.engine import pipeline as pipeline_lib
from estimator_spec.tensor_types import Op, Tensor
from estimator_spec.tf_patches import gradient_gates


class StepGradients:
  """A step's embedding gradients, per table: `ids` (distinct ids), `grads`
  (their float32 sums after the gradient multiplier), `rates` (learning
  rate at the step), `gate` (every input and gradient check; writes wait
  for it), `requests` (the lookup's `requests.StepRequests`, or None)."""

  def __init__(self, ids: Dict[str, Any], grads: Dict[str, Any],
               rates: Dict[str, Any], gate: Any, requests: Any = None) -> None:
    self.ids = ids
    self.grads = grads
    self.rates = rates
    self.gate = gate
    self.requests = requests


def table_gradients(model: model_lib.EmbeddingModel,
                    result: lookup_lib.LookupResult,
                    gradients: Mapping[str, Any], global_step: Any,
                    pipelines: Callable[[str], pipeline_lib.UpdatePipeline],
                    compiled: bool) -> StepGradients:
  """docs/numerics.md, 'The backward pass, table by table' for every table:
  the step's `StepGradients` (distinct ids, their float32 gradient sums
  after the multiplier, the learning rate at `global_step` by each table's
  pipeline, and the gate of every check; the checks by one compiled op
  where `compiled`)."""
  _check_gradients(model, gradients)
  step = tf.convert_to_tensor(global_step)
  checks = list(result.checks)
  multiplier = None
  if model.gradient_multiplier_fn is not None:
    multiplier = finite(
        tf.cast(model.gradient_multiplier_fn(step), tf.float32),
        "experimental_gradient_multiplier_fn", step, checks)
  rates = collections.OrderedDict(
      (name, learning_rate(name, pipelines(name), step, checks))
      for name in result.tables)
  # A non-finite multiplier is reported as such, not as the non-finite
  # gradients it makes.
  scalar_checks = checks[len(result.checks):]
  accumulated = collections.OrderedDict()
  finite_flags, messages = [], []
  for name, lookup in result.tables.items():
    grads = _feature_gradients(result, lookup, gradients)
    # Checked per table, on what would be written: a non-finite gradient
    # of any feature that reaches the table shows up here.
    accumulated[name], all_finite = id_gradients(lookup, grads, multiplier)
    finite_flags.append(all_finite)
    names = ", ".join(repr(i.name) for i in lookup.features)
    messages.append(f"Gradient of features {names} (table {name!r}) is "
                    "not finite; no table was updated.")
  if finite_flags:
    # One Assert for all tables, naming each table at fault.
    with tf.control_dependencies(scalar_checks):
      if compiled:
        # One op between the last sum and the first update.
        checks.append(kernels.check_all(finite_flags, messages))
      else:
        checks.append(column_lookup.check_each(tf.stack(finite_flags),
                                               messages))
  ids = collections.OrderedDict(
      (name, lookup.unique_ids) for name, lookup in result.tables.items())
  return StepGradients(ids, accumulated, rates, column_lookup.gate(checks),
                       result.requests)


def _check_gradients(model: model_lib.EmbeddingModel,
                     gradients: Mapping[str, Any]) -> None:
  """Every configured feature has a gradient."""
  missing = [
      f"{f!r} (table {feature.table!r})"
      for f, feature in model.features.items()
      if gradients.get(f) is None
  ]
  if missing:
    raise ValueError(
        "HostEmbeddingEngine.apply_gradients: no gradient for features "
        f"{', '.join(missing)}; every configured feature needs one (the "
        "model must use every embedding activation).")


def _feature_gradients(result: lookup_lib.LookupResult,
                       lookup: lookup_lib.TableLookup,
                       gradients: Mapping[str, Any]) -> List[Tensor]:
  """The float32 activation gradients of `lookup`'s features, in order,
  each checked to have its activation's shape."""
  grads = []
  for item in lookup.features:
    grad = tf.convert_to_tensor(gradients[item.name], tf.float32)
    expected = result.activations[item.name].shape
    if not grad.shape.is_compatible_with(expected):
      raise ValueError(
          f"Gradient of feature {item.name!r} (table {lookup.table.name!r}) "
          f"has shape {grad.shape}; the activation has shape {expected}.")
    grads.append(grad)
  return grads


def id_gradients(lookup: lookup_lib.TableLookup, grads: List[Tensor],
                 multiplier: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
  """docs/numerics.md, 'The backward pass, table by table' for one table: the
  float32 sum of every contribution to each of `lookup.unique_ids` [U, D],
  from the activation gradients `grads` of its features (in feature order),
  times `multiplier` (if not None), and whether all of it is finite (a bool
  scalar): by the compiled kernel where the lookup was compiled, else by
  TF ops (the same operations in the same order)."""
  plans = [lookup.plans[item.name] for item in lookup.features]
  num_ids = (lookup.num_ids if lookup.num_ids is not None else
             tf.shape(lookup.unique_ids)[0])
  if not lookup.compiled:
    summed = tf.math.unsorted_segment_sum(
        tf.concat([plan.backprop(g) for plan, g in zip(plans, grads)],
                  axis=0), lookup.index, num_ids)
    if multiplier is not None:
      summed = summed * multiplier
    return summed, tf.reduce_all(tf.math.is_finite(summed))
  # A feature's gradient that is a column window of a wider one (the
  # gradient of the concatenated activations, split) is read in place:
  # the split is then not needed.
  # Read before TF's gradient gate: the sums need not wait for the dense
  # weights' gradients (tf_patches.gradient_gates).
  grads = [gradient_gates.ungated(grad) for grad in grads]
  dimension = lookup.table.dimension
  windows = [_split_window(grad, dimension) for grad in grads]
  window_attrs = {}
  if any(window is not None for window in windows):
    grads = [grad if window is None else window[0]
             for grad, window in zip(grads, windows)]
    window_attrs = {"offsets": [0 if window is None else window[1]
                                for window in windows],
                    "dim": dimension}
  summed, finite = kernels.id_gradients(
      grads=grads,
      segments=[plan.segment for plan in plans],
      weights=kernels.or_empty([plan.weights for plan in plans]),
      scales=lookup.scales, index=lookup.index, num_ids=num_ids,
      multiplier=kernels.or_empty([multiplier])[0], **window_attrs)
  summed.set_shape([None, dimension])
  return summed, finite


def learning_rate(name: str, pipeline: pipeline_lib.UpdatePipeline,
                  step: Tensor, checks: List[Op]) -> Tensor:
  """Table `name`'s learning rate at `step`; a `learning_rate_fn` value is
  checked to be finite (the check joins `checks`, which gate writes)."""
  rate = pipeline.learning_rate
  if rate.fn is not None:
    return finite(
        tf.cast(rate.fn(step), tf.float32),
        f"learning_rate_fn of table {name!r}", step, checks)
  return tf.constant(rate.constant, tf.float32)


def finite(value: Tensor, what: str, step: Tensor,
           checks: List[Op]) -> Tensor:
  """`value` (a scalar), with a check that it is finite added to `checks`."""
  if value.shape.rank not in (0, None):
    raise ValueError(f"{what} must return a scalar; got shape {value.shape}.")
  checks.append(
      column_lookup.check(
          tf.math.is_finite(value),
          f"{what} returned a value that is not finite at this global step; "
          "no table was updated. Global step and value:", [step, value]))
  return value



def _split_window(grad: Any, dimension: int) -> Optional[Tuple[Any, int]]:
  """(matrix, column) when `grad`, a graph tensor [rows, dimension], is
  columns [column, column + dimension) of `matrix` [rows, width] as a
  SplitV along the columns gives them (TF's gradient of a concatenation of
  more than 16 tensors: DenseFeatures' of its columns' activations), up to
  identities and reshapes that keep the shape; else None. The values are
  the same bits either way."""
  if not isinstance(grad, tf.Tensor) or tf.executing_eagerly():
    return None
  tensor = grad
  while (tensor.op.type in ("Identity", "Reshape") and
         _is_rows_of(tensor, dimension) and
         _is_rows_of(tensor.op.inputs[0], dimension)):
    tensor = tensor.op.inputs[0]
  if tensor.op.type != "SplitV" or not _is_rows_of(tensor, dimension):
    return None
  split = _column_split(tensor.op)
  if split is None:
    return None
  matrix, offsets = split
  return matrix, offsets[tensor.value_index]


# {SplitV op: its `_column_split`}: the pieces of one split are the
# gradients of many features (up to every feature of the model), each of
# which asks; the split is read once, not once per piece.
_ColumnSplit = Optional[Tuple[Any, List[int]]]
_COLUMN_SPLITS: "weakref.WeakKeyDictionary[Any, _ColumnSplit]" = (
    weakref.WeakKeyDictionary())


def _column_split(op: Any) -> _ColumnSplit:
  """(matrix, the first column of each piece) when the SplitV `op` splits a
  float32 matrix along its columns, else None."""
  if op not in _COLUMN_SPLITS:
    _COLUMN_SPLITS[op] = _read_column_split(op)
  return _COLUMN_SPLITS[op]


def _read_column_split(op: Any) -> _ColumnSplit:
  matrix = gradient_gates.ungated(op.inputs[0])
  pieces = op.outputs
  width = (tf.compat.dimension_value(matrix.shape[1])
           if matrix.shape.rank == 2 else None)
  widths: List[Any] = [tf.compat.dimension_value(piece.shape[1])
                       if piece.shape.rank == 2 else None
                       for piece in pieces]
  # Pieces narrower than the matrix that add up to its width: a split of
  # its columns (a split of its rows gives pieces as wide as the matrix).
  if (matrix.dtype != tf.float32 or width is None or len(pieces) < 2 or
      None in widths or sum(widths) != width or max(widths) >= width or
      any(not piece.shape[:1].is_compatible_with(matrix.shape[:1])
          for piece in pieces)):
    return None
  offsets = [0]
  for piece_width in widths[:-1]:
    offsets.append(offsets[-1] + piece_width)
  return matrix, offsets


def _is_rows_of(tensor: Any, dimension: int) -> bool:
  """Whether `tensor` is a float32 [rows, dimension] (rows may be unknown)."""
  rows_of: bool = (tensor.dtype == tf.float32 and tensor.shape.rank == 2 and
                   tf.compat.dimension_value(tensor.shape[1]) == dimension)
  return rows_of


