"""quiet.silence_deprecation_notices drops TF's deprecation notices and
nothing else."""
import logging
import warnings

import tensorflow as tf

from estimator_spec import quiet


def _passes(message):
  record = logging.LogRecord("tensorflow", logging.WARNING, __file__, 1,
                             message, None, None)
  return all(f.filter(record) for f in tf.get_logger().filters)


def test_deprecation_log_notices_are_dropped_and_others_kept():
  quiet.silence_deprecation_notices()
  assert not _passes("From x.py:3: RunConfig.__init__ (from y) is deprecated "
                     "and will be removed in a future version.")
  assert not _passes("From x.py:3: The name tf.estimator.tpu.TPUConfig is "
                     "deprecated. Please use tf.compat.v1.estimator.tpu."
                     "TPUConfig instead.")
  assert _passes("TPUEstimator on the host: these settings concern TPU "
                 "hardware and have no effect here")
  assert _passes("The name of the table is deprecated in our docs")


def test_layers_deprecation_warning_is_dropped_and_other_warnings_kept():
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    quiet.silence_deprecation_notices()
    with tf.Graph().as_default():
      x = tf.compat.v1.placeholder(tf.float32, [None, 3])
      tf.compat.v1.layers.dense(x, 2)
    warnings.warn("a real problem", UserWarning)
  messages = [str(w.message) for w in caught]
  assert not [m for m in messages if "tf.layers" in m], messages
  assert "a real problem" in messages
