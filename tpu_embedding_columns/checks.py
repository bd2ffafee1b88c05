"""Argument checks shared by both packages.

Every check names who is being built (``owner``), the argument and the bad
value, so that a refusal says what to change.
"""
import math
import numbers

import numpy as np

from tpu_embedding_columns.errors import ArgumentTypeError


def fail(owner, arg, message, value, error=ValueError):
  if error is TypeError:
    error = ArgumentTypeError
  raise error(f"{owner}: `{arg}` {message}; got {value!r}.")


def is_int(value):
  return isinstance(value, (int, np.integer)) and not isinstance(
      value, (bool, np.bool_))


def is_number(value):
  return isinstance(value, numbers.Real) and not isinstance(
      value, (bool, np.bool_))


def check_int(owner, arg, value, minimum=None):
  """Returns `value` as a Python int, refusing non-integers and small values."""
  if not is_int(value):
    fail(owner, arg, "must be an integer", value, TypeError)
  value = int(value)
  if minimum is not None and value < minimum:
    fail(owner, arg, f"must be >= {minimum}", value)
  return value


def check_number(owner, arg, value, *, minimum=None, above=None, below=None,
                 maximum=None, allow_none=False):
  """Returns `value` as a finite float within the given bounds."""
  if value is None:
    if allow_none:
      return None
    fail(owner, arg, "must be a number, not None", value, TypeError)
  if not is_number(value):
    fail(owner, arg, "must be a real number", value, TypeError)
  value = float(value)
  if not math.isfinite(value):
    fail(owner, arg, "must be finite", value)
  if minimum is not None and value < minimum:
    fail(owner, arg, f"must be >= {minimum}", value)
  if above is not None and value <= above:
    fail(owner, arg, f"must be > {above}", value)
  if below is not None and value >= below:
    fail(owner, arg, f"must be < {below}", value)
  if maximum is not None and value > maximum:
    fail(owner, arg, f"must be <= {maximum}", value)
  return value


def check_bool(owner, arg, value, allow_none=False):
  if value is None and allow_none:
    return None
  if not isinstance(value, (bool, np.bool_)):
    fail(owner, arg, "must be True or False", value, TypeError)
  return bool(value)


def check_callable(owner, arg, value, allow_none=True):
  if value is None and allow_none:
    return None
  if not callable(value):
    fail(owner, arg, "must be callable", value, TypeError)
  return value


def check_str(owner, arg, value, allow_none=False, allow_empty=False):
  if value is None and allow_none:
    return None
  if not isinstance(value, str):
    fail(owner, arg, "must be a string", value, TypeError)
  if not value and not allow_empty:
    fail(owner, arg, "must not be empty", value)
  return value


def check_range(owner, low_arg, low, high_arg, high):
  if low is not None and high is not None and low > high:
    raise ValueError(
        f"{owner}: `{low_arg}` ({low!r}) must not exceed `{high_arg}` "
        f"({high!r}).")
