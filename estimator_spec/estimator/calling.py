"""Calling a user's model_fn / input_fn with the arguments it declares.

TF's Estimator passes `labels`, `mode`, `params` and `config` to model_fn
only when its signature names them; the host estimator and the model_fn
handed to TF's TPUEstimator both follow that rule through this module.
"""
import functools
import inspect


def fn_args(fn):
  """The names of `fn`'s parameters that Estimator fills by name: those
  that may be given by position or keyword (not `*args`, `**kwargs` or
  keyword-only ones), without `self` of a bound method or callable object
  and, for a `functools.partial`, without the ones it binds. Empty when
  `fn` has no signature."""
  if isinstance(fn, functools.partial):
    names = fn_args(fn.func)
    return tuple(name for name in names[len(fn.args):]
                 if name not in (fn.keywords or {}))
  try:
    parameters = inspect.signature(fn).parameters.values()
  except (TypeError, ValueError):
    return ()
  return tuple(p.name for p in parameters
               if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))


def model_fn_kwargs(args, labels, mode, params, config,
                    caller="TPUEstimator"):
  """Keyword arguments (besides `features`) for a model_fn whose parameter
  names are `args`. Labels given to a model_fn without a `labels`
  parameter are refused, as TF's Estimator refuses them; `caller` starts
  the message."""
  kwargs = {}
  if "labels" in args:
    kwargs["labels"] = labels
  elif labels is not None:
    raise ValueError(
        f"{caller}: input_fn returned labels but model_fn takes no `labels` "
        "argument; add one, or return features only.")
  for name, value in (("mode", mode), ("params", params), ("config", config)):
    if name in args:
      kwargs[name] = value
  return kwargs


def input_fn_kwargs(args, mode, config, input_context=None):
  """Keyword arguments for an input_fn whose parameter names are `args`,
  but `params`, which each caller gives its own (the batch size differs):
  `mode`, `config`, and `input_context` when there is one."""
  kwargs = {}
  if "mode" in args:
    kwargs["mode"] = mode
  if "config" in args:
    kwargs["config"] = config
  if input_context is not None and "input_context" in args:
    kwargs["input_context"] = input_context
  return kwargs
