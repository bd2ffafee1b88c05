"""`TPUEstimatorSpec`, what a model_fn returns, and its conversion to the
`tf.estimator.EstimatorSpec` the host Estimator runs."""
import collections

import tensorflow as tf

from estimator_spec import quiet
from estimator_spec.estimator import hooks as hooks_lib
from estimator_spec.estimator import stack


class ExportSavedModelApiVersion:
  """The `export_saved_model_api_version` values of TF's TPUEstimator."""
  V1 = 1
  V2 = 2


_SPEC_FIELDS = ("mode", "predictions", "loss", "train_op", "eval_metrics",
                "export_outputs", "scaffold_fn", "host_call", "training_hooks",
                "evaluation_hooks", "prediction_hooks")


class TPUEstimatorSpec(
    collections.namedtuple("TPUEstimatorSpec", _SPEC_FIELDS)):
  """What a TPUEstimator model_fn returns.

  As TF's `TPUEstimatorSpec`: `eval_metrics` is `(metric_fn, tensors)` with
  `tensors` a list (positional) or dict (keyword arguments) of tensors;
  `host_call` is `(fn, tensors)` in the same form, run on the host every
  training step; `scaffold_fn` is a callable returning a `Scaffold`.
  """

  def __new__(cls, mode, predictions=None, loss=None, train_op=None,
              eval_metrics=None, export_outputs=None, scaffold_fn=None,
              host_call=None, training_hooks=None, evaluation_hooks=None,
              prediction_hooks=None):
    for name, value in (("eval_metrics", eval_metrics),
                        ("host_call", host_call)):
      if value is not None:
        _check_fn_and_tensors(name, value)
    if scaffold_fn is not None and not callable(scaffold_fn):
      raise TypeError(
          "TPUEstimatorSpec: `scaffold_fn` must be a callable returning a "
          f"tf.compat.v1.train.Scaffold; got {type(scaffold_fn).__name__}.")
    for name, hooks in (("training_hooks", training_hooks),
                        ("evaluation_hooks", evaluation_hooks),
                        ("prediction_hooks", prediction_hooks)):
      for hook in hooks or ():
        if not isinstance(hook, tf.compat.v1.train.SessionRunHook):
          raise TypeError(
              f"TPUEstimatorSpec: `{name}` must hold SessionRunHooks; got "
              f"{type(hook).__name__}.")
    return super().__new__(cls, mode, predictions, loss, train_op,
                           eval_metrics, export_outputs, scaffold_fn,
                           host_call, tuple(training_hooks or ()),
                           tuple(evaluation_hooks or ()),
                           tuple(prediction_hooks or ()))

  def as_estimator_spec(self):
    """The equivalent `tf.estimator.EstimatorSpec` on the host."""
    return to_estimator_spec(self)


def _check_fn_and_tensors(name, value):
  if not (isinstance(value, (tuple, list)) and len(value) == 2 and
          callable(value[0]) and isinstance(value[1], (tuple, list, dict))):
    raise TypeError(
        f"TPUEstimatorSpec: `{name}` must be a pair (fn, tensors) with "
        "tensors a list or dict of tensors; got "
        f"{type(value).__name__}: {value!r}.")


def _call_with(fn_and_tensors):
  """The user's metric or host-call function on its tensors (their own
  code: TF's deprecation notices as outside the library)."""
  fn, tensors = fn_and_tensors
  with quiet.user_call():
    if isinstance(tensors, dict):
      return fn(**tensors)
    return fn(*tensors)


def _is_tpu_spec(spec):
  """TPUEstimatorSpec of ours or of TF (the same fields)."""
  return all(hasattr(spec, f) for f in ("eval_metrics", "scaffold_fn",
                                        "host_call"))


def to_estimator_spec(spec, host_call_every_n_steps=1):
  """The `tf.estimator.EstimatorSpec` of what model_fn returned: a
  TPUEstimatorSpec's scaffold_fn, eval_metrics and host_call (a training
  hook run every `host_call_every_n_steps` steps) called on the host."""
  if isinstance(spec, stack.EstimatorSpec):
    return spec
  if not _is_tpu_spec(spec):
    raise TypeError(
        "model_fn must return a TPUEstimatorSpec or an EstimatorSpec "
        f"(estimator_spec.estimator.EstimatorSpec); got "
        f"{type(spec).__name__}.")
  scaffold = (quiet.users(spec.scaffold_fn)() if spec.scaffold_fn is not None
              else None)
  if scaffold is not None and not isinstance(scaffold,
                                             tf.compat.v1.train.Scaffold):
    raise TypeError(
        "TPUEstimatorSpec.scaffold_fn must return a tf.compat.v1.train."
        f"Scaffold; got {type(scaffold).__name__}.")
  eval_metric_ops = None
  if spec.eval_metrics is not None:
    eval_metric_ops = _call_with(spec.eval_metrics)
  training_hooks = list(spec.training_hooks or ())
  if spec.host_call is not None and spec.mode == stack.ModeKeys.TRAIN:
    training_hooks.append(
        hooks_lib.HostCallHook(_call_with(spec.host_call),
                               host_call_every_n_steps))
  return stack.EstimatorSpec(
      mode=spec.mode,
      predictions=spec.predictions,
      loss=spec.loss,
      train_op=spec.train_op,
      eval_metric_ops=eval_metric_ops,
      export_outputs=spec.export_outputs,
      scaffold=scaffold,
      training_hooks=training_hooks,
      evaluation_hooks=list(spec.evaluation_hooks or ()),
      prediction_hooks=list(spec.prediction_hooks or ()))
