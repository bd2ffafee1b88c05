"""Whether TF prints its deprecation notices.

TF 2.15's `tensorflow.python.util.deprecation` prints a notice only while
its private module-level flag `_PRINT_DEPRECATION_WARNINGS` is true, and
records a function as warned only when it printed, so that turning the
flag off for a block and back on later loses no notice the user would get.
`estimator_spec.quiet` turns it off around the library's own calls;
tests/test_quiet.py fails if TF changes that behaviour.
"""


def _module():
  from tensorflow.python.util import deprecation
  return deprecation


def printing():
  """Whether TF prints deprecation notices now."""
  return _module()._PRINT_DEPRECATION_WARNINGS


def set_printing(value):
  """Turns TF's deprecation notices on or off (`value`, a bool)."""
  _module()._PRINT_DEPRECATION_WARNINGS = value
