"""Silences TensorFlow's deprecation notices at the program's edge.

TF 2.15 logs a multi-line deprecation notice for every `tf.feature_column`
and Estimator API a legacy model uses. Entry points (examples, tests, the CLI)
call `silence_deprecation_notices()`; the library itself never does, and
every other warning still gets through.
"""
import logging
import os
import re
import warnings

_ALIAS_NOTICE = re.compile(r"The name tf\.\S+ is deprecated\. Please use ")


class _DropDeprecationNotices(logging.Filter):

  def filter(self, record):
    message = record.getMessage()
    return not ("is deprecated and will be removed" in message or
                # TF's notice for a deprecated alias of a v1 name, e.g.
                # "The name tf.estimator.tpu.TPUConfig is deprecated. Please
                # use tf.compat.v1.estimator.tpu.TPUConfig instead."
                _ALIAS_NOTICE.search(message) is not None or
                "non-resource variables are not supported in the long term"
                in message)


def silence_deprecation_notices():
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  logger = tf.get_logger()
  if not any(isinstance(f, _DropDeprecationNotices) for f in logger.filters):
    logger.addFilter(_DropDeprecationNotices())
  # Keras' Python warning for each tf.compat.v1.layers call (`tf.layers.dense`
  # is deprecated ...), which legacy model_fns make on every graph build.
  warnings.filterwarnings(
      "ignore", message=r"`tf\.layers\.\w+` is deprecated",
      category=UserWarning)
