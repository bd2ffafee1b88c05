"""An input of a built op replaced by another tensor.

TF 2.15 works around: a `tf.Operation`'s inputs are fixed when it is built
and there is no public way to change one. The engine needs it where the
op that produces a tensor can only be built after its consumers: a
cluster step's one request per ps task for the rows of every table
(`engine/requests.py`) gathers from every table's variables, which exist
only once model_fn's columns have named them, one by one, after the first
table's activations are already in use. Its consumers are built on a
stand-in, whose place the request's reply then takes. The private
`Operation._update_input` does it; it exists and the op then reads the new
tensor in TF 2.15 (tests/test_tf_patches_estimator.py).
"""
from typing import Any


def replace_input(op: Any, index: int, tensor: Any) -> None:
  """Makes the built `op` read `tensor` (same dtype) as its input `index`."""
  op._update_input(index, tensor)
