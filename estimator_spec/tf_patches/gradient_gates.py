"""Reading a gradient before TF's gate on it opens.

TF 2.15 works around: with `gate_gradients=True` (what
`Optimizer.minimize` and `compute_gradients` ask for by default, GATE_OP),
the backward pass hands on the gradients of an op's inputs only once all of
them are computed: each passes through an Identity named
`.../tuple/control_dependency[_N]` whose one control input is the NoOp
`.../tuple/group_deps` that waits for all of them (`tf.tuple`). Behind a
matrix product this makes the gradient of its input (the concatenated
embedding activations) wait for the gradient of its weights, a product as
large again that the embedding's update has no use for.

`ungated` returns the tensor such an Identity passes on: the same values,
without the wait. The engine reads the activations' gradient through it,
so that the per-id sums and the table updates run while the dense backward
pass finishes (docs/performance.md, 'Against TorchRec and TF 2.15'). It
recognises the gate by TF's names and structure only;
tests/test_tf_patches_estimator.py checks that a gated gradient of TF 2.15
is recognised, and that an identity the user made to wait is not.
"""
from typing import Any

import tensorflow as tf


def _is_gate(op: Any) -> bool:
  """Whether `op` is the Identity of a `tf.tuple` in a backward pass."""
  if op.type != "Identity" or len(op.control_inputs) != 1:
    return False
  gate = op.control_inputs[0]
  scope = op.name.rsplit("/", 1)
  gated: bool = (len(scope) == 2 and scope[0].endswith("/tuple") and
                 scope[1].startswith("control_dependency") and
                 gate.type == "NoOp" and
                 gate.name == scope[0] + "/group_deps")
  return gated


def ungated(tensor: Any) -> Any:
  """`tensor`, or the tensor it passes on when it is the output of a
  gradient gate (see the module's docstring); the values are the same."""
  if (isinstance(tensor, tf.Tensor) and not tf.executing_eagerly() and
      _is_gate(tensor.op)):
    return tensor.op.inputs[0]
  return tensor
