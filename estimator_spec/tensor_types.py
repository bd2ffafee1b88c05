"""Names for the TensorFlow values that cross the library's doors.

TensorFlow ships no type information, so a tensor is `Any` to the type
checker; these aliases say what a signature means where `Any` would say
nothing (docs/architecture.md, 'The rules the layers keep'). They check
nothing at run time.
"""
from typing import Any, TypeAlias

# A `tf.Tensor` (graph or eager), or a value TF converts to one.
Tensor: TypeAlias = Any
# A `tf.Variable` (a resource variable: a table or slot partition, or a
# variable the engine holds between steps).
Variable: TypeAlias = Any
# A `tf.Operation` (an update, a check, a group of them), or None eagerly.
Op: TypeAlias = Any
