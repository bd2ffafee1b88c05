"""The parts of this library that need TensorFlow 2.15's own stack.

The interop with TF's own TPU classes (`interop.to_tensorflow`,
`from_tensorflow`, `columns_by_name`, `delegate_to_tensorflow`,
`DelegatedTPUEstimator`, and so `TPUEstimator(use_tpu=True)` with a real
TPU) uses TF 2.15's `tensorflow.python.tpu.tpu_embedding` and
tensorflow-estimator's TPUEstimator, which ended with TF 2.15. Each of
those modules calls `require` before importing them, so that on current
TensorFlow it fails with one message naming what is missing and which
install provides it, instead of an attribute or module error from deep
inside TensorFlow. Everything else (the columns, the config model and its
proto, the host engine, the TPUEstimator on the host and its Estimator
framework, `estimator/stack.py`) runs on both stacks.
"""
import importlib.util

# What provides the TF 2.15 stack.
INSTALL = (
    "install this package with its default dependencies, which pin "
    "tensorflow-cpu==2.15.* and tensorflow-estimator==2.15.* on Python 3.11 "
    "(`pip install -e .` in a checkout, or `make venv`, which builds .venv/)")


def _found(module):
  try:
    return importlib.util.find_spec(module) is not None
  except (ImportError, ValueError):
    return False


def missing():
  """What of TF 2.15's stack this environment lacks ([] when it is all
  there), found without importing tensorflow-estimator."""
  lacks = []
  if not _found("tensorflow_estimator"):
    lacks.append("tensorflow-estimator")
  if not _found("tensorflow.python.tpu.tpu_embedding"):
    lacks.append("TF 2.15's tensorflow.python.tpu.tpu_embedding")
  return lacks


def available():
  """Whether the TPUEstimator surface and the TF 2.15 interop can load."""
  return not missing()


def require(part):
  """Raises ImportError naming `part` when TF 2.15's stack is missing."""
  lacks = missing()
  if not lacks:
    return
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  raise ImportError(
      f"{part} needs TensorFlow 2.15 and tensorflow-estimator 2.15; this "
      f"environment has TensorFlow {tf.__version__} and lacks "
      f"{' and '.join(lacks)}. To use it, {INSTALL}. On current TensorFlow "
      "(Python 3.12 and later) the rest of the library works without them, "
      "the TPUEstimator on the host included.")
