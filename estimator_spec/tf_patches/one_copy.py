"""One plain variable under a distribution strategy's scope.

TF 2.15's local strategies (the default one and `MirroredStrategy`) create
a plain variable on one device, not one copy per replica, when the
variable's `colocate_with` is TF's private marker
`tensorflow.python.distribute.numpy_dataset.SingleDevice` (what TF uses for
the variables that hold a NumPy dataset). `HostTPUEmbedding` keeps its
tables that way: one copy on the host, as a TPU keeps one.
tests/test_host_tpu_embedding_replicas.py fails if TF stops honouring it.
"""
import contextlib

import tensorflow as tf
from tensorflow.python.distribute import numpy_dataset


@contextlib.contextmanager
def single_device_variables(device):
  """Variables created in this scope are plain variables on `device`, one
  copy, even under a strategy's scope."""

  def creator(next_creator, **kwargs):
    kwargs["colocate_with"] = numpy_dataset.SingleDevice(device)
    return next_creator(**kwargs)

  with tf.variable_creator_scope(creator):
    yield
