"""The exceptions this project raises for users to catch (the classes of
`tpu_embedding_columns.errors`, importable from either package)."""
from tpu_embedding_columns.errors import ArgumentTypeError
from tpu_embedding_columns.errors import TPUNotReachableError

__all__ = ["ArgumentTypeError", "TPUNotReachableError"]
