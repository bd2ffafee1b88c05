"""Session hooks of the host TPUEstimator.

* `HostCallHook`: a `TPUEstimatorSpec.host_call` run with the training
  steps, as TPUEstimator runs it with the outfeed.
* `ExamplesPerSecondHook`: `examples/sec` in the training log and events,
  next to Estimator's `global_step/sec`, as TF's TPUEstimator writes it.
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


class ExamplesPerSecondHook(tf.compat.v1.train.SessionRunHook):
  """Every `every_n_steps` global steps: the global steps per second since
  the last report times `global_batch_size`, logged as `examples/sec: V`
  and, with `output_dir`, written there as the scalar `examples/sec` at
  the global step (the first report counts from the first step seen).

  Args:
    global_batch_size: examples per global step (`train_batch_size`).
    every_n_steps: `RunConfig.log_step_count_steps`.
    output_dir: the directory of the training events, or None to only log.
  """

  def __init__(self, global_batch_size, every_n_steps, output_dir=None):
    if every_n_steps < 1:
      raise ValueError(
          f"ExamplesPerSecondHook: every_n_steps must be >= 1; got "
          f"{every_n_steps}.")
    self._batch_size = global_batch_size
    self._timer = tf.compat.v1.train.SecondOrStepTimer(
        every_steps=every_n_steps)
    self._output_dir = output_dir
    self._writer = None
    self._global_step = None

  def begin(self):
    self._global_step = tf.compat.v1.train.get_global_step()
    if self._global_step is None:
      raise RuntimeError(
          "ExamplesPerSecondHook: the training graph has no global step.")
    self._timer.reset()
    if self._output_dir:
      self._writer = tf.compat.v1.summary.FileWriterCache.get(
          self._output_dir)

  def before_run(self, run_context):
    return tf.compat.v1.train.SessionRunArgs(self._global_step)

  def after_run(self, run_context, run_values):
    # The value fetched may precede the step's own increment: read it again
    # when a report may be due.
    if not self._timer.should_trigger_for_step(run_values.results + 1):
      return
    step = int(run_context.session.run(self._global_step))
    if not self._timer.should_trigger_for_step(step):
      return
    seconds, steps = self._timer.update_last_triggered_step(step)
    if seconds is None or steps is None or seconds <= 0:
      return  # the first report only starts the clock
    examples_per_sec = steps / seconds * self._batch_size
    tf.compat.v1.logging.info("examples/sec: %g", examples_per_sec)
    if self._writer is not None:
      self._writer.add_summary(tf.compat.v1.Summary(value=[
          tf.compat.v1.Summary.Value(tag="examples/sec",
                                     simple_value=examples_per_sec)]), step)


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
