"""What a model_fn returns to the framework: `ModeKeys` and `EstimatorSpec`.

`EstimatorSpec` checks what model_fn built as `tf.estimator.EstimatorSpec`
does, when it is built: the fields each mode needs, that tensors and ops
belong to the graph being built, a scalar loss, `(value, update_op)` pairs
(or metric objects) for the metrics, hooks that are `SessionRunHook`s, and,
in PREDICT mode, the export outputs of the serving graph (a default
`serving_default` signature of the predictions when model_fn gives none).
"""
import collections

import tensorflow as tf

from estimator_spec.config import modes
from estimator_spec.estimator.framework import signatures


class ModeKeys:
  """The modes a model_fn is called in (the values of TF's `ModeKeys`)."""
  TRAIN = modes.TRAIN
  EVAL = modes.EVAL
  PREDICT = modes.PREDICT


_FIELDS = ("mode", "predictions", "loss", "train_op", "eval_metric_ops",
           "export_outputs", "training_chief_hooks", "training_hooks",
           "scaffold", "evaluation_hooks", "prediction_hooks")

# The key under which `evaluate` reports the mean loss.
LOSS_METRIC_KEY = "loss"


class EstimatorSpec(collections.namedtuple("EstimatorSpec", _FIELDS)):
  """The ops and objects model_fn built for one mode.

  Args:
    mode: a `ModeKeys` value.
    predictions: a tensor or a dict of tensors; required in PREDICT.
    loss: a scalar tensor (or of shape [1]); required in TRAIN and EVAL.
    train_op: the op (or tensor) one training step runs; required in TRAIN.
    eval_metric_ops: {name: (value tensor, update op)} or {name: metric
      object with `update_state` called}, evaluated in EVAL.
    export_outputs: {signature name: an `export.ExportOutput`} for the
      serving graph (PREDICT only).
    training_chief_hooks, training_hooks, evaluation_hooks,
      prediction_hooks: `tf.compat.v1.train.SessionRunHook`s of each mode
      (the chief-only ones run on the chief of a cluster only).
    scaffold: a `tf.compat.v1.train.Scaffold` (saver, init ops, init_fn).
  """

  def __new__(cls, mode, predictions=None, loss=None, train_op=None,
              eval_metric_ops=None, export_outputs=None,
              training_chief_hooks=None, training_hooks=None, scaffold=None,
              evaluation_hooks=None, prediction_hooks=None):
    if mode not in modes.MODES:
      raise ValueError(
          f"EstimatorSpec: `mode` must be one of ModeKeys.TRAIN, EVAL or "
          f"PREDICT ({', '.join(repr(m) for m in modes.MODES)}); got "
          f"{mode!r}.")
    graph = tf.compat.v1.get_default_graph()
    predictions = _checked_predictions(predictions, mode, graph)
    if mode == ModeKeys.PREDICT:
      export_outputs = signatures.export_outputs_for_predictions(
          export_outputs, predictions)
    return super().__new__(
        cls, mode=mode, predictions=predictions,
        loss=_checked_loss(loss, mode, graph),
        train_op=_checked_train_op(train_op, mode, graph),
        eval_metric_ops=_checked_metrics(eval_metric_ops, graph),
        export_outputs=export_outputs,
        training_chief_hooks=_checked_hooks(training_chief_hooks,
                                            "training_chief_hooks"),
        training_hooks=_checked_hooks(training_hooks, "training_hooks"),
        scaffold=_checked_scaffold(scaffold),
        evaluation_hooks=_checked_hooks(evaluation_hooks, "evaluation_hooks"),
        prediction_hooks=_checked_hooks(prediction_hooks, "prediction_hooks"))

  def _replace(self, **changes):
    """A copy with `changes`, checked again; the mode cannot change."""
    if "mode" in changes and changes["mode"] != self.mode:
      raise ValueError(
          f"EstimatorSpec: the mode of a spec cannot change ({self.mode!r} "
          f"to {changes['mode']!r}); build a new EstimatorSpec instead.")
    fields = self._asdict()
    fields.update(changes)
    return EstimatorSpec(**fields)


def _in_graph(value, what, graph):
  """Refuses a tensor or op of another graph than the one being built."""
  if getattr(value, "graph", graph) is not graph:
    raise ValueError(
        f"EstimatorSpec: {what} ({value.name}) belongs to another graph "
        "than the one model_fn is building: build every tensor inside "
        "model_fn, in the call that returns this spec.")


def _tensor(value, what):
  if not isinstance(value, tf.compat.v2.__internal__.types.Tensor):
    raise TypeError(f"EstimatorSpec: {what} must be a Tensor; got "
                    f"{type(value).__name__}: {value!r}.")
  return value


def _checked_predictions(predictions, mode, graph):
  if predictions is None:
    if mode == ModeKeys.PREDICT:
      raise ValueError("EstimatorSpec: PREDICT mode needs `predictions` (a "
                       "tensor or a dict of tensors).")
    return {}
  if isinstance(predictions, dict):
    for key, value in predictions.items():
      _in_graph(_tensor(value, f"predictions[{key!r}]"),
                f"predictions[{key!r}]", graph)
    return dict(predictions)
  _in_graph(_tensor(predictions, "`predictions`"), "`predictions`", graph)
  return predictions


def _checked_loss(loss, mode, graph):
  if loss is None:
    if mode in (ModeKeys.TRAIN, ModeKeys.EVAL):
      raise ValueError(f"EstimatorSpec: {mode.upper()} mode needs `loss` (a "
                       "scalar tensor).")
    return None
  _tensor(loss, "`loss`")
  shape = loss.get_shape()
  if shape.num_elements() not in (None, 1):
    raise ValueError(f"EstimatorSpec: `loss` must be a scalar; got a tensor "
                     f"of shape {shape}: {loss}.")
  _in_graph(loss, "`loss`", graph)
  if not shape.is_compatible_with(tf.TensorShape([])):
    loss = tf.reshape(loss, [])
  return loss


def _checked_train_op(train_op, mode, graph):
  if train_op is None:
    if mode == ModeKeys.TRAIN:
      raise ValueError("EstimatorSpec: TRAIN mode needs `train_op` (e.g. "
                       "optimizer.minimize(loss, global_step)).")
    return None
  if isinstance(train_op, tf.Variable):
    train_op = train_op.op
  if not isinstance(train_op, (tf.Operation,
                               tf.compat.v2.__internal__.types.Tensor)):
    raise TypeError("EstimatorSpec: `train_op` must be an Operation or a "
                    f"Tensor; got {type(train_op).__name__}: {train_op!r}.")
  _in_graph(train_op, "`train_op`", graph)
  return train_op


def _is_metric_object(value):
  """A Keras-style metric object (`update_state` called, `result()`)."""
  return all(hasattr(value, name) for name in ("update_state", "result",
                                               "updates", "variables"))


def _checked_metrics(eval_metric_ops, graph):
  """{name: (value, update_op)}, metric objects turned into their pair and
  their variables registered as local metric variables."""
  if eval_metric_ops is None:
    return {}
  if not isinstance(eval_metric_ops, dict):
    raise TypeError("EstimatorSpec: `eval_metric_ops` must be a dict of "
                    f"name: (value, update_op); got {eval_metric_ops!r}.")
  checked = {}
  for key, value in eval_metric_ops.items():
    if _is_metric_object(value):
      checked[key] = _metric_object_pair(key, value)
    elif isinstance(value, tuple) and len(value) == 2:
      checked[key] = value
    else:
      raise TypeError(
          f"EstimatorSpec: eval_metric_ops[{key!r}] must be a (metric "
          f"value, update op) pair, as tf.compat.v1.metrics.* return; got "
          f"{value!r}.")
    for part in tf.nest.flatten(checked[key]):
      _in_graph(part, f"eval_metric_ops[{key!r}]", graph)
  return checked


def _metric_object_pair(key, metric):
  if not metric.updates:
    raise ValueError(
        f"EstimatorSpec: eval_metric_ops[{key!r}] is a metric object whose "
        "update_state(...) was never called in model_fn; call it on the "
        "batch's values before returning the spec.")
  for collection in (tf.compat.v1.GraphKeys.LOCAL_VARIABLES,
                     tf.compat.v1.GraphKeys.METRIC_VARIABLES):
    present = set(tf.compat.v1.get_collection(collection))
    for variable in metric.variables:
      if variable not in present:
        tf.compat.v1.add_to_collection(collection, variable)
  return metric.result(), metric.updates[0]


def _checked_hooks(hooks, name):
  hooks = tuple(hooks or ())
  for hook in hooks:
    if not isinstance(hook, tf.compat.v1.train.SessionRunHook):
      raise TypeError(
          f"EstimatorSpec: `{name}` must hold tf.compat.v1.train."
          f"SessionRunHook instances; got {type(hook).__name__}: {hook!r}.")
  return hooks


def _checked_scaffold(scaffold):
  scaffold = scaffold or tf.compat.v1.train.Scaffold()
  if not isinstance(scaffold, tf.compat.v1.train.Scaffold):
    raise TypeError("EstimatorSpec: `scaffold` must be a tf.compat.v1.train."
                    f"Scaffold; got {type(scaffold).__name__}.")
  return scaffold
