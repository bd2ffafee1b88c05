"""The exceptions both packages raise for users to catch.

Most refusals are plain `ValueError`s and `TypeError`s (as TF's own classes
raise them), each naming the argument, the value and what to do. The
classes here are the ones of this project:

* `ArgumentTypeError`: an argument of the wrong type.
* `TPUNotReachableError`: a run that asks for a TPU (a `master` or
  `cluster` in the RunConfig) whose TPU does not answer.
"""


class ArgumentTypeError(TypeError, ValueError):
  """An argument of the wrong type.

  It is a TypeError, and also a ValueError because TensorFlow's own classes
  raise ValueError for several of these cases; code written against either
  keeps catching it.
  """


class TPUNotReachableError(RuntimeError):
  """The TPU that the RunConfig names does not answer."""


__all__ = ["ArgumentTypeError", "TPUNotReachableError"]
