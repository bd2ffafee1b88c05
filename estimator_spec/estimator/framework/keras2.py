"""One line for a program that needs Keras 2 where TensorFlow gives Keras 3.

TPUEstimator programs build their models with Keras 2's pieces:
`tf.compat.v1.layers`, `tf.compat.v1.keras.layers.DenseFeatures`,
`tf.keras.experimental.SequenceFeatures`. From TF 2.16 on, TensorFlow
gives them only through the `tf_keras` package, and only when
`TF_USE_LEGACY_KERAS=1` is set before TensorFlow is imported; otherwise a
model_fn fails deep inside with "`dense` is not available with Keras 3" or
"module 'keras._tf_keras.keras.layers' has no attribute 'DenseFeatures'"
(docs/install.md, 'Current TensorFlow'). `explained` turns such a failure
of the user's function into one error saying what to install and set.
"""
import contextlib
import os

import tensorflow as tf

_KERAS_3_SIGNS = ("is not available with Keras 3", "keras._tf_keras",
                  "keras.src", "'keras.")
_NO_KERAS = "Keras cannot be imported"


def legacy_keras_asked():
  """Whether TF_USE_LEGACY_KERAS asks TensorFlow for Keras 2."""
  return os.environ.get("TF_USE_LEGACY_KERAS", "").lower() in ("1", "true")


def _keras_missing(error):
  """Whether `error` is Keras 3's (or a missing tf_keras's) where a
  program asked for Keras 2."""
  text = str(error)
  if isinstance(error, AttributeError):
    return not legacy_keras_asked() and any(
        sign in text for sign in _KERAS_3_SIGNS)
  return isinstance(error, ImportError) and _NO_KERAS in text


def message(where):
  version = tf.__version__
  minor = ".".join(version.split(".")[:2])
  return (
      f"{where} uses Keras 2 (tf.compat.v1.layers, DenseFeatures, "
      f"SequenceFeatures), which TensorFlow {version} gives only through the "
      f"tf_keras package: install tf_keras=={minor}.* (installed with this "
      "library on Python 3.12 and later) and set TF_USE_LEGACY_KERAS=1 "
      "before TensorFlow is imported (docs/install.md).")


@contextlib.contextmanager
def explained(where):
  """Inside: a user's function (`where` names it) whose failure comes from
  Keras 2 being absent raises `ImportError` saying what to do."""
  try:
    yield
  except (AttributeError, ImportError) as error:
    if not _keras_missing(error):
      raise
    raise ImportError(message(where)) from error
