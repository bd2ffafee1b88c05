"""The exceptions this project raises for users to catch (the classes of
`tpu_embedding_columns.errors`, importable from either package, and the
cluster's)."""
from tpu_embedding_columns.errors import ArgumentTypeError
from tpu_embedding_columns.errors import TPUNotReachableError


class SyncStepTimeoutError(RuntimeError):
  """A synchronous training step on a cluster did not complete within
  `ClusterTraining(step_timeout_secs)`: a training task stopped sending
  gradients (the message names it)."""


__all__ = ["ArgumentTypeError", "TPUNotReachableError", "SyncStepTimeoutError"]
