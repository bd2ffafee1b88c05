"""Warm-starting: which variables a new model's training starts from, taken
from a checkpoint or a SavedModel (the counterpart of
`tf.estimator.WarmStartSettings`, tensorflow-estimator 2.15).

`WarmStartSettings` holds the arguments of TF's
`tf.compat.v1.train.warm_start`, in its order, so the run loop applies a
setting as `tf.compat.v1.train.warm_start(*settings)` when `model_dir` has
no checkpoint yet. `warm_start_settings` turns an Estimator's
`warm_start_from` argument into settings. `VocabInfo` (a vocabulary
remapping for one variable) is TF core's own.
"""
import collections
import os

import tensorflow as tf

VocabInfo = tf.compat.v1.train.VocabInfo


class WarmStartSettings(
    collections.namedtuple("WarmStartSettings", (
        "ckpt_to_initialize_from", "vars_to_warm_start",
        "var_name_to_vocab_info", "var_name_to_prev_var_name"))):
  """What training warm-starts from, as `tf.compat.v1.train.warm_start`
  takes it.

  Args:
    ckpt_to_initialize_from: a checkpoint (its prefix, or a directory whose
      latest checkpoint is taken); required.
    vars_to_warm_start: which trainable variables: a regular expression
      (default '.*': all), a list of names or expressions, or a list of
      variables; None for none.
    var_name_to_vocab_info: {variable name: `VocabInfo`} for variables whose
      rows follow a vocabulary that changed; {} when None.
    var_name_to_prev_var_name: {variable name: its name in the checkpoint}
      for renamed variables; {} when None.

  Raises:
    ValueError: `ckpt_to_initialize_from` is empty.
  """
  __slots__ = ()

  def __new__(cls, ckpt_to_initialize_from, vars_to_warm_start=".*",
              var_name_to_vocab_info=None, var_name_to_prev_var_name=None):
    if not ckpt_to_initialize_from:
      raise ValueError(
          "WarmStartSettings: `ckpt_to_initialize_from` (the checkpoint to "
          f"start from) is required; got {ckpt_to_initialize_from!r}.")
    return super().__new__(cls, ckpt_to_initialize_from, vars_to_warm_start,
                           var_name_to_vocab_info or {},
                           var_name_to_prev_var_name or {})


class WarmStartFromError(TypeError, ValueError):
  """An Estimator's `warm_start_from` of a kind it does not take. A
  TypeError; also a ValueError, which tf.estimator raised there, so that
  code written for it still catches it."""


def warm_start_settings(warm_start_from):
  """The settings an Estimator's `warm_start_from` stands for.

  Args:
    warm_start_from: None (no warm start); a path (str, bytes or PathLike)
      to a checkpoint, or to a SavedModel directory (one with
      `variables/variables.index`), whose variables are then the
      checkpoint; or a `WarmStartSettings`, returned as it is.

  Returns:
    A `WarmStartSettings` (all variables, for a path), or None.

  Raises:
    WarmStartFromError: `warm_start_from` is of another kind.
  """
  if warm_start_from is None or isinstance(warm_start_from,
                                           WarmStartSettings):
    return warm_start_from
  if isinstance(warm_start_from, os.PathLike):
    warm_start_from = os.fspath(warm_start_from)
  if not isinstance(warm_start_from, (str, bytes)):
    raise WarmStartFromError(
        "Estimator: `warm_start_from` must be a checkpoint or SavedModel "
        "path (str or PathLike) or a WarmStartSettings; got "
        f"{type(warm_start_from).__name__}: {warm_start_from!r}.")
  variables = os.path.join(tf.compat.as_text(warm_start_from), "variables")
  if tf.io.gfile.exists(os.path.join(variables, "variables.index")):
    tf.compat.v1.logging.info("Warm-starting from the SavedModel %s",
                              tf.compat.as_text(warm_start_from))
    return WarmStartSettings(os.path.join(variables, "variables"))
  return WarmStartSettings(warm_start_from)
