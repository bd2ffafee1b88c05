"""Which Estimator framework this process runs on, decided once at import
(docs/estimator.md, 'Two stacks').

Where tensorflow-estimator is installed (TF 2.15, the reference stack) the
TPUEstimator stands on it: its `Estimator` is the base class, and
`ModeKeys`, `EstimatorSpec`, `RunConfig`, `export`, `train_and_evaluate`
are its own, so that a TPUEstimator also works with TF's
`tf.estimator.train_and_evaluate`, exporters and hooks. Elsewhere (current
TensorFlow, where tensorflow-estimator no longer exists) it stands on the
framework written here (`estimator/framework/`), with the same behaviour.
Environment variable `ESTIMATOR_SPEC_FRAMEWORK=own` picks this library's
framework on TF 2.15 too (to compare the two in one environment);
`=tensorflow-estimator` insists on TF's and fails where it is missing.

Every other module asks this one for those names, and nothing else asks
which stack it is on.
"""
import importlib.util
import os

ENVIRONMENT_VARIABLE = "ESTIMATOR_SPEC_FRAMEWORK"
OWN_NAME = "own"
TENSORFLOW_NAME = "tensorflow-estimator"


def _tensorflow_estimator_found():
  try:
    return importlib.util.find_spec("tensorflow_estimator") is not None
  except (ImportError, ValueError):
    return False


def _choose():
  """True for this library's framework, False for tensorflow-estimator's."""
  asked = os.environ.get(ENVIRONMENT_VARIABLE, "")
  if asked not in ("", OWN_NAME, TENSORFLOW_NAME):
    raise ValueError(
        f"{ENVIRONMENT_VARIABLE}={asked!r}: use {OWN_NAME!r} (this "
        f"library's Estimator framework) or {TENSORFLOW_NAME!r} (TF 2.15's "
        "tensorflow-estimator), or leave it unset to take tensorflow-"
        "estimator where it is installed.")
  found = _tensorflow_estimator_found()
  if asked == TENSORFLOW_NAME and not found:
    raise ImportError(
        f"{ENVIRONMENT_VARIABLE}={TENSORFLOW_NAME} asks for "
        "tensorflow-estimator, which this environment lacks (it exists for "
        "TF 2.15 on Python 3.11 only); unset the variable to use this "
        "library's own Estimator framework.")
  return asked == OWN_NAME or not found


OWN = _choose()

# pylint: disable=g-import-not-at-top
if OWN:
  from estimator_spec.estimator.framework import export
  from estimator_spec.estimator.framework import tpu_config as _tpu_config
  from estimator_spec.estimator.framework import training as _training
  from estimator_spec.estimator.framework import warm_start as _warm_start
  from estimator_spec.estimator.framework.estimator import Estimator
  from estimator_spec.estimator.framework.model_fn import EstimatorSpec
  from estimator_spec.estimator.framework.model_fn import ModeKeys
  from estimator_spec.estimator.framework.run_config import RunConfig
  from estimator_spec.estimator.framework.run_config import TaskType
  WarmStartSettings = _warm_start.WarmStartSettings
else:
  from tensorflow_estimator.python.estimator import estimator as _estimator
  from tensorflow_estimator.python.estimator import model_fn as _model_fn
  from tensorflow_estimator.python.estimator import run_config as _run_config
  from tensorflow_estimator.python.estimator import training as _training
  from tensorflow_estimator.python.estimator.export import export_lib as export
  from tensorflow_estimator.python.estimator.mode_keys import ModeKeys
  from tensorflow_estimator.python.estimator.tpu import tpu_config as _tpu_config
  Estimator = _estimator.Estimator
  EstimatorSpec = _model_fn.EstimatorSpec
  RunConfig = _run_config.RunConfig
  TaskType = _run_config.TaskType
  WarmStartSettings = _estimator.WarmStartSettings

TPURunConfig = _tpu_config.RunConfig
TPUConfig = _tpu_config.TPUConfig
InputPipelineConfig = _tpu_config.InputPipelineConfig
TrainSpec = _training.TrainSpec
EvalSpec = _training.EvalSpec
train_and_evaluate = _training.train_and_evaluate


def name():
  """The framework in use, as the environment variable spells it."""
  return OWN_NAME if OWN else TENSORFLOW_NAME
