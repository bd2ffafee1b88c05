"""What a training run shows with no code of the user's (docs/estimator.md,
'Monitoring').

* `add_table_summaries`: per embedding table, scalar summaries in the
  training graph: the learning rate of the step, the rows the step touched
  (its distinct ids), and the L2 norms of the table and of each optimizer
  slot. Summaries run only at summary steps (`RunConfig.save_summary_steps`,
  with Estimator's own), so the other steps pay nothing for them.
* `ProgressHook`: every `RunConfig.log_step_count_steps` steps, one
  progress line that shows at TF's default verbosity (the step of the
  step training ends at, the mean loss since the last line, examples per
  second, the evaluations that ran since the last line, an ETA), and the
  `examples/sec` and `loss/mean` scalars beside Estimator's
  `global_step/sec`.
"""
import logging
import math
import sys
import time

import tensorflow as tf

SUMMARY_PREFIX = "embedding"
EXAMPLES_PER_SEC_TAG = "examples/sec"
MEAN_LOSS_TAG = "loss/mean"


def summary_tag(table, what):
  """The tag of a table's summary: `embedding/<table>/<what>`."""
  return f"{SUMMARY_PREFIX}/{table}/{what}"


def add_table_summaries(engine, lookups, global_step):
  """Adds each table's summaries to the training graph (see the module
  docstring). `engine`: the step's `HostEmbeddingEngine`; `lookups`:
  {table: TableLookup} of the step (their distinct ids); `global_step`: the
  step's value (its learning rate).

  The norms read the tables during the summary step, unordered with its
  update (so with or without it): tied to the train op, a summary evaluated
  in a run of its own would train a step."""
  model = engine.model
  # In place by the kernels where the table's own step runs them.
  compiled = {name: engine.table_plan(name).ops is not None
              for name in model.tables}
  norms = {name: engine.table_rows(name).norm(compiled[name])
           for name in model.tables}
  slot_norms = {name: {slot: rows.norm(compiled[name]) for slot, rows in
                       engine.slot_rows(name).items()}
                for name in model.tables}
  for name in model.tables:
    rate = model.learning_rate(name)
    value = (tf.cast(rate.fn(global_step), tf.float32) if rate.fn is not None
             else tf.constant(rate.constant, tf.float32))
    tf.compat.v1.summary.scalar(summary_tag(name, "learning_rate"), value)
    tf.compat.v1.summary.scalar(
        summary_tag(name, "rows_touched"),
        tf.cast(tf.size(lookups[name].unique_ids), tf.float32))
    tf.compat.v1.summary.scalar(summary_tag(name, "norm"), norms[name])
    for slot, norm in slot_norms[name].items():
      tf.compat.v1.summary.scalar(summary_tag(name, f"{slot}_norm"), norm)


class ProgressHook(tf.compat.v1.train.SessionRunHook):
  """At every global step that is a multiple of `every_n_steps`: the mean
  of the loss over the steps since the last report (the first step
  included) and the examples per second since the last report, or since
  the end of the first step this hook saw for the first report (wall
  clock: checkpoints and evaluations in between count, as in TF's
  `global_step/sec`; the first step, which builds and starts the session,
  does not). Logged as one line at TF's default verbosity,

      TPUEstimator: step S/M, loss L (mean of N steps), E examples/s, ETA T

  and, with `output_dir`, written there as `examples/sec` and `loss/mean`
  at the global step. `M` is the step training ends at and `T` the time
  to reach it at the mean rate since the end of the first step (both left
  out when training runs until its input ends). When evaluations ran in
  the report's steps, their count and time follow the rate, with the rate
  of the training alone (`E examples/s (an evaluation ran: 6.1 s; 20512
  examples/s training)`).

  Args:
    global_batch_size: examples per global step (`train_batch_size`).
    every_n_steps: `RunConfig.log_step_count_steps`.
    loss: the training loss tensor (None: no loss in the line).
    output_dir: the directory of the training events, or None to only log.
    steps: `train`'s `steps` (training ends that many steps after the
      step it starts from), or None.
    max_steps: `train`'s `max_steps` (the step training ends at), or None.
    evaluations: a sequence the caller adds `(end time, seconds)` to for
      each evaluation it runs (`time.time()` clock), read at each report;
      or None.
  """

  def __init__(self, global_batch_size, every_n_steps, loss=None,
               output_dir=None, steps=None, max_steps=None,
               evaluations=None):
    if every_n_steps < 1:
      raise ValueError(
          f"ProgressHook: every_n_steps must be >= 1; got {every_n_steps}.")
    self._batch_size = global_batch_size
    self._every = every_n_steps
    self._loss = loss
    self._output_dir = output_dir
    self._steps = steps
    self._max_steps = max_steps
    self._evaluations = evaluations if evaluations is not None else ()
    self._writer = None
    self._global_step = None
    self._losses = []
    self._clock = None  # (global step, time) the current rate counts from
    self._start = None  # (global step, time) the ETA's rate counts from
    self._last_step = None

  def begin(self):
    self._global_step = tf.compat.v1.train.get_global_step()
    if self._global_step is None:
      raise RuntimeError("ProgressHook: the training graph has no global "
                         "step.")
    self._losses = []
    self._clock = None
    self._start = None
    self._step = None
    if self._output_dir:
      self._writer = tf.compat.v1.summary.FileWriterCache.get(
          self._output_dir)

  def after_create_session(self, session, coord):
    del coord
    self._step = int(session.run(self._global_step))
    self._last_step = self._max_steps
    if self._steps is not None:
      self._last_step = self._step + self._steps

  def before_run(self, run_context):
    # Only the loss each step (a fetch costs short steps); the global step
    # is counted here and read again when a line may be due.
    if self._loss is None:
      return None
    return tf.compat.v1.train.SessionRunArgs(self._loss)

  def after_run(self, run_context, run_values):
    now = time.time()
    if self._loss is not None:
      self._losses.append(float(run_values.results))
    self._step += 1
    if self._clock is None:
      self._clock = self._start = (self._step, now)
    if self._step % self._every:
      return
    # The run has ended: the step read now includes its increment (and,
    # on a cluster, other tasks' steps).
    step = self._step = int(run_context.session.run(self._global_step))
    if step == self._clock[0]:
      return
    losses, self._losses = self._losses, []
    steps, seconds = step - self._clock[0], now - self._clock[1]
    since = self._clock[1]
    self._clock = (step, now)
    values = []
    parts = [f"TPUEstimator: step {step}" + (
        "" if self._last_step is None else f"/{self._last_step}")]
    if losses:
      mean = math.fsum(losses) / len(losses)
      parts.append(f"loss {mean:.6g} (mean of {len(losses)} steps)")
      values.append(tf.compat.v1.Summary.Value(tag=MEAN_LOSS_TAG,
                                               simple_value=mean))
    if steps > 0 and seconds > 0:
      examples_per_sec = steps / seconds * self._batch_size
      parts.append(f"{examples_per_sec:.0f} examples/s" + self._evaluated(
          since, now, steps, seconds))
      values.append(tf.compat.v1.Summary.Value(
          tag=EXAMPLES_PER_SEC_TAG, simple_value=examples_per_sec))
    eta = self._eta(step, now)
    if eta is not None:
      parts.append(f"ETA {eta}")
    if len(parts) > 1:
      _report("%s", ", ".join(parts))
    if self._writer is not None and values:
      self._writer.add_summary(tf.compat.v1.Summary(value=values), step)

  def _evaluated(self, since, now, steps, seconds):
    """What the evaluations that ended between `since` and `now` took, and
    the training's own rate without them: '' if none ran."""
    took = [s for end, s in list(self._evaluations) if since < end <= now]
    if not took:
      return ""
    what = ("an evaluation ran" if len(took) == 1 else
            f"{len(took)} evaluations ran")
    total = math.fsum(took)
    training = ""
    if seconds > total:
      training = (f"; {steps / (seconds - total) * self._batch_size:.0f} "
                  "examples/s training")
    return f" ({what}: {total:.1f} s{training})"

  def _eta(self, step, now):
    """The time left to the last step at the mean rate since the end of
    the first step (evaluations included), as text; None without a last
    step."""
    if self._last_step is None or step <= self._start[0]:
      return None
    left = max(self._last_step - step, 0)
    return _duration(left * (now - self._start[1]) / (step - self._start[0]))

  def end(self, session):
    del session
    if self._writer is not None:
      self._writer.flush()


def _duration(seconds):
  """`seconds` as text: 45s, 3m05s, 2h07m."""
  seconds = int(round(seconds))
  if seconds < 60:
    return f"{seconds}s"
  if seconds < 3600:
    return f"{seconds // 60}m{seconds % 60:02d}s"
  return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _report(message, *args):
  """A progress line: in TF's log at INFO when TF's verbosity shows INFO
  (beside Estimator's own `loss = ..., step = ...` lines), else on stderr
  as it is (TF's default verbosity, WARN, shows no INFO line)."""
  logger = tf.get_logger()
  if logger.isEnabledFor(logging.INFO):
    logger.info(message, *args)
  else:
    print(message % args, file=sys.stderr, flush=True)

