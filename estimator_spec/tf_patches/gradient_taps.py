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
reaches the function and that a name registers only once.
"""
import weakref

import tensorflow as tf

_NAME = "HostEmbeddingGradientTap"
_RECORDS = weakref.WeakKeyDictionary()  # {graph: {op name: [gradients]}}


def _gradient(op, grad, anchor_grad):
  del anchor_grad
  _RECORDS[op.graph][op.name].append(grad)
  # A zero gradient for the anchor: a model whose loss depends only on
  # embedding activations still gives its optimizer a variable with a
  # gradient (TF's TPU path has dummy table variables for this).
  return [None, tf.zeros_like(op.inputs[1])]


tf.RegisterGradient(_NAME)(_gradient)


def tapped(activation, anchor, recorded):
  """`activation` through one IdentityN op with the scalar `anchor`: each
  gradient a backward pass sends to it is appended to `recorded` (a list),
  and `anchor` gets a zero gradient."""
  graph = tf.compat.v1.get_default_graph()
  with graph.gradient_override_map({"IdentityN": _NAME}):
    result, _ = tf.raw_ops.IdentityN(input=[activation, anchor])
  _RECORDS.setdefault(graph, {})[result.op.name] = recorded
  return result
