"""Silences TensorFlow's deprecation notices at the program's edge.

TF 2.15 logs a multi-line deprecation notice for every `tf.feature_column`
and Estimator API a legacy model uses. Entry points (examples, tests, the CLI)
call `silence_deprecation_notices()`; the library itself never does, and
every other warning still gets through.
"""
import contextlib
import logging
import os
import re
import warnings

from estimator_spec.tf_patches import deprecation_notices

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


# --- The library's own calls into deprecated TF APIs ----------------------
#
# TF 2.15 marks most of the Estimator API deprecated, and logs a notice the
# first time a process calls each deprecated function or class. Many of
# those calls are the library's (Estimator.__init__, EstimatorSpec, the
# session hooks Estimator.train makes), not the user's: the library runs
# them with the notices off, and turns them back on around the user's own
# code that it calls (model_fn, input_fn, metric and host-call functions,
# serving_input_receiver_fn), whose notices stay the user's. TF-version
# bound: TF's `deprecation` module prints only while its module-level flag
# is true, and records a function as warned only when it printed
# (`tf_patches.deprecation_notices`; tests/test_quiet.py fails if that
# changes).

_NOTICES_ON = []  # the flag's values outside each library call, innermost last


@contextlib.contextmanager
def library_call():
  """TF's deprecation notices off for the block: the library's own calls."""
  _NOTICES_ON.append(deprecation_notices.printing())
  deprecation_notices.set_printing(False)
  try:
    yield
  finally:
    deprecation_notices.set_printing(_NOTICES_ON.pop())


@contextlib.contextmanager
def user_call():
  """Inside a library call, the user's own code: TF's deprecation notices
  as they were outside the library (on, unless the user turned them off)."""
  if not _NOTICES_ON:
    yield
    return
  inside = deprecation_notices.printing()
  deprecation_notices.set_printing(_NOTICES_ON[0])
  try:
    yield
  finally:
    deprecation_notices.set_printing(inside)


def users(fn):
  """`fn` (the user's function) called with `user_call`."""

  def call(*args, **kwargs):
    with user_call():
      return fn(*args, **kwargs)

  return call


def quiet_generator(generator):
  """Each step of `generator` (a library generator) as a library call, and
  the consumer's code between its items as the user's."""
  while True:
    with library_call():
      try:
        item = next(generator)
      except StopIteration:
        return
    yield item
