"""The hook through which a host embedding engine feeds columns.

Outside any engine, columns look up their own variables (a plain CPU lookup).
While an `ActivationSource` is installed on the graph, embedding-core columns
instead ask it for their activations; the engine owns the tables, the lookup
and the update. This module holds only the protocol and the installation, so
that columns never import the engine.
"""
import contextlib

import tensorflow as tf

_COLLECTION = "tpu_embedding_columns.activation_sources"
_PLAIN_LOOKUPS = "tpu_embedding_columns.plain_lookups"


class ActivationSource:
  """What an engine offers to the columns while a model_fn builds its graph."""

  def register_variable(self, column, variable_name):
    """Tells the engine the full name the column's table would have in a
    plain CPU lookup here (e.g. `dense_features/a_embedding/embedding_weights`
    or `a_b_shared_embedding`), so that it names its table the same way."""
    raise NotImplementedError

  def dense_activation(self, column):
    """Returns the [batch, dimension] activation of a non-sequence column."""
    raise NotImplementedError

  def sequence_activation(self, column):
    """Returns ([batch, max_sequence_length, dimension], lengths [batch])."""
    raise NotImplementedError


@contextlib.contextmanager
def activation_source(source, graph=None):
  """Installs `source` on `graph` (default graph) for the `with` block."""
  if not isinstance(source, ActivationSource):
    raise TypeError(
        "activation_source: `source` must be an ActivationSource; got "
        f"{type(source).__name__}.")
  graph = graph or tf.compat.v1.get_default_graph()
  sources = graph.get_collection_ref(_COLLECTION)
  sources.append(source)
  try:
    yield source
  finally:
    sources.remove(source)


def current_source(graph=None):
  """Returns the innermost installed `ActivationSource`, or None."""
  if tf.executing_eagerly() and graph is None:
    return None
  graph = graph or tf.compat.v1.get_default_graph()
  sources = graph.get_collection(_COLLECTION)
  return sources[-1] if sources else None


def record_plain_lookup(column, graph=None):
  """Notes that `column` looked up its own table (no engine) in `graph`."""
  graph = graph or tf.compat.v1.get_default_graph()
  graph.add_to_collection(_PLAIN_LOOKUPS, column.name)


def plain_lookups(graph=None):
  """Names of the embedding columns (all but tensor-core ones) that looked
  up their own tables in `graph` (default graph), in order of use."""
  graph = graph or tf.compat.v1.get_default_graph()
  return list(graph.get_collection(_PLAIN_LOOKUPS))


def under_tpu_inference(graph=None):
  """Whether ops built now run inside TensorFlow's TPU inference rewrite
  (its `_TPUInferenceContext`, which TF's TPU serving export opens): there a
  TPU embedding-core lookup has no TPU embedding to read from."""
  graph = graph or tf.compat.v1.get_default_graph()
  while graph is not None:
    context = graph._get_control_flow_context()
    while context is not None:
      if type(context).__name__ == "_TPUInferenceContext":
        return True
      context = context.outer_context
    graph = getattr(graph, "outer_graph", None)
  return False
