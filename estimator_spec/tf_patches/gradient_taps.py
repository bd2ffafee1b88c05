"""Taking a tensor's gradient from a backward pass someone else runs.

TF 2.15 works around: a graph's gradient functions are found by op type in
a process-wide registry (`tf.RegisterGradient`, once per name, picked for
an op by `Graph.gradient_override_map`) and are called with the op and its
output gradients only: nothing per call reaches them. The estimator needs
the gradient of each embedding activation from the user's own optimizer
(its one backward pass), so each activation goes through an identity whose
registered gradient function finds, by the op, the list to record into:
this module keeps that map, per graph (weakly: a graph's entries go with
the graph). tests/test_tf_patches_estimator.py checks that the override
reaches the function, that a name registers only once, and that an output
of a tap that no gradient reaches gets TF's filled zero, recorded as none.
"""
import weakref

import tensorflow as tf

_NAME = "HostEmbeddingGradientTap"
# {graph: {op name: [[gradients] per tapped activation]}}
_RECORDS = weakref.WeakKeyDictionary()


def _gradient(op, *grads):
  records = _RECORDS[op.graph][op.name]
  for index, (grad, recorded) in enumerate(zip(grads, records)):
    if not _filled_zero(op, index, grad):
      recorded.append(grad)
  # A zero gradient for the anchor: a model whose loss depends only on
  # embedding activations still gives its optimizer a variable with a
  # gradient (TF's TPU path has dummy table variables for this).
  return [None] * len(records) + [tf.zeros_like(op.inputs[-1])]


def _filled_zero(op, index, grad):
  """Whether `grad` is the zero TF 2.15's backward pass fills in for output
  `index` of `op` when no gradient reaches that output but one reaches
  another (`zeros_like(output)`, a ZerosLike op reading the output): the
  activation does not feed the loss, and records no gradient."""
  return (isinstance(grad, tf.Tensor) and grad.op.type == "ZerosLike" and
          grad.op.inputs[0].name == op.outputs[index].name)


tf.RegisterGradient(_NAME)(_gradient)


def tapped(activation, anchor, recorded):
  """`activation` through one IdentityN op with the scalar `anchor`: each
  gradient a backward pass sends to it is appended to `recorded` (a list),
  and `anchor` gets a zero gradient."""
  return tapped_many([activation], anchor, [recorded])[0]


def tapped_many(activations, anchor, recorded):
  """`tapped` for several activations through one IdentityN op: each
  gradient a backward pass sends to activation i is appended to
  `recorded[i]`; an activation that no gradient reaches records none."""
  graph = tf.compat.v1.get_default_graph()
  with graph.gradient_override_map({"IdentityN": _NAME}):
    results = tf.raw_ops.IdentityN(input=list(activations) + [anchor])
  _RECORDS.setdefault(graph, {})[results[0].op.name] = list(recorded)
  return list(results[:-1])
