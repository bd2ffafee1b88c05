"""Session hooks of the host TPUEstimator.

* `HostCallHook`: a `TPUEstimatorSpec.host_call` run with the training
  steps, as TPUEstimator runs it with the outfeed.
* (`examples/sec` and the progress lines: `monitoring.ProgressHook`.)
* `flush_at_end` and `FlushListener`: with
  `pipeline_execution_with_tensor_core` the engine holds each step's table
  update until the next step; these apply the held update when training
  ends and before every checkpoint.
"""
import tensorflow as tf

# Where each training graph records its engine's flush op for the listener.
_FLUSH_COLLECTION = "estimator_spec.embedding_flush"


class HostCallHook(tf.compat.v1.train.SessionRunHook):
  """Runs a host_call's ops with every n-th training step and initializes
  and flushes the summary writers the graph creates.

  Args:
    outputs: what the host_call's fn returned (an op, a tensor, a list of
      them, or None).
    every_n_steps: `TPUConfig.experimental_host_call_every_n_steps`.
  """

  def __init__(self, outputs, every_n_steps=1):
    if outputs is None:
      outputs = []
    elif not isinstance(outputs, (list, tuple)):
      outputs = [outputs]
    self._outputs = list(outputs)
    self._every_n_steps = every_n_steps
    self._runs = 0
    self._init = None
    self._flush = None

  def begin(self):
    # Graph-mode tf.summary writers register their creation ops here; the
    # writer resource is each op's first input.
    self._init = tf.compat.v1.get_collection("_SUMMARY_WRITER_V2")
    writers = [op.inputs[0] for op in self._init if op.inputs]
    self._flush = tf.group(*[
        tf.raw_ops.FlushSummaryWriter(writer=w) for w in writers
    ]) if writers else None

  def after_create_session(self, session, coord):
    del coord
    if self._init:
      session.run(self._init)

  def before_run(self, run_context):
    due = self._runs % self._every_n_steps == 0
    self._runs += 1
    return tf.compat.v1.train.SessionRunArgs(self._outputs if due else [])

  def end(self, session):
    if self._flush is not None:
      session.run(self._flush)


class FlushListener(tf.compat.v1.train.CheckpointSaverListener):
  """Applies the update pipelining holds before each checkpoint (the flush
  ops `flush_at_end` recorded in the training graph)."""

  def begin(self):
    self._flush = tf.compat.v1.get_collection(_FLUSH_COLLECTION)

  def before_save(self, session, global_step_value):
    del global_step_value
    if self._flush:
      session.run(self._flush)


class _FlushAtEndHook(tf.compat.v1.train.SessionRunHook):
  """Applies a held update when training ends (also without checkpoints)."""

  def __init__(self, flush_op):
    self._flush = flush_op

  def end(self, session):
    session.run(self._flush)


def flush_at_end(flush_op):
  """Records `flush_op` for `FlushListener` (checkpoints) and returns the
  training hook that runs it when training ends."""
  tf.compat.v1.add_to_collection(_FLUSH_COLLECTION, flush_op)
  return _FlushAtEndHook(flush_op)
