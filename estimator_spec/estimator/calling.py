"""Calling a user's model_fn / input_fn with the arguments it declares.

TF's Estimator passes `labels`, `mode`, `params` and `config` to model_fn
only when its signature names them; the host estimator and the model_fn
handed to TF's TPUEstimator both follow that rule through this module.
"""
import inspect


def fn_args(fn):
  """The parameter names of `fn` (empty when it has no signature)."""
  try:
    return set(inspect.signature(fn).parameters)
  except (TypeError, ValueError):
    return set()


def model_fn_kwargs(args, labels, mode, params, config):
  """Keyword arguments (besides `features`) for a model_fn whose parameter
  names are `args`. Labels given to a model_fn without a `labels`
  parameter are refused, as TF's Estimator refuses them."""
  kwargs = {}
  if "labels" in args:
    kwargs["labels"] = labels
  elif labels is not None:
    raise ValueError(
        "TPUEstimator: input_fn returned labels but model_fn does not take "
        "a `labels` argument.")
  for name, value in (("mode", mode), ("params", params), ("config", config)):
    if name in args:
      kwargs[name] = value
  return kwargs
