"""What an input_fn returned, as the run loop reads it.

An input_fn returns a `tf.data.Dataset` of `(features, labels)` (or of
features alone), or the tensors themselves: `(features, labels)` or
features. A Dataset is read through an initializable iterator, initialized
when the session starts (so that every `train`/`evaluate`/`predict` call
reads the data from its beginning), as Estimator reads it.
"""
import tensorflow as tf


class DatasetInitializerHook(tf.compat.v1.train.SessionRunHook):
  """Initializes an input iterator once the session exists."""

  def __init__(self, iterator):
    self._iterator = iterator
    self._initializer = None

  def begin(self):
    self._initializer = self._iterator.initializer

  def after_create_session(self, session, coord):
    del coord
    session.run(self._initializer)


def features_and_labels(result):
  """`(features, labels, hooks)` of an input_fn's result; labels None when
  it gave features only, hooks the iterator's initializer for a Dataset."""
  hooks = []
  if isinstance(result, tf.data.Dataset):
    iterator = tf.compat.v1.data.make_initializable_iterator(result)
    hooks.append(DatasetInitializerHook(iterator))
    result = iterator.get_next()
  if isinstance(result, (list, tuple)):
    if len(result) != 2:
      raise ValueError(
          "input_fn must return features, a (features, labels) pair, or a "
          "Dataset of either; got a sequence of "
          f"{len(result)} elements.")
    return result[0], result[1], hooks
  return result, None, hooks


def reads_to_the_end(features):
  """Whether `features` come from a Dataset or queue, so that prediction
  stops when the input ends (else it would go on for ever). SparseTensor
  features count by their parts."""
  for value in tf.nest.flatten(features, expand_composites=True):
    if isinstance(value, tf.Tensor) and _from_iterator(value):
      return True
  graph = tf.compat.v1.get_default_graph()
  return bool(graph.get_collection(tf.compat.v1.GraphKeys.QUEUE_RUNNERS))


def _from_iterator(tensor):
  """Whether `tensor` is, or is taken from, an iterator's next element
  (through the ops that rebuild its structure, such as a SparseTensor's)."""
  seen, pending = set(), [tensor.op]
  while pending:
    op = pending.pop()
    if op.type in ("IteratorGetNext", "IteratorGetNextSync"):
      return True
    if op in seen or len(seen) > 64:
      continue
    seen.add(op)
    pending.extend(t.op for t in op.inputs)
  return False
