"""The deadline of a synchronous step and the report of a step that waits:
`SyncWatchHook` gives each step `ClusterTraining.step_timeout_secs` and
logs, every `report_after_secs` while it waits, which training tasks have
not sent their gradients (read from the record `send.push` keeps on ps 0);
`timeout_error` turns the deadline's error into
`errors.SyncStepTimeoutError` naming them.
"""
import threading
import time
from typing import Optional, Sequence

import numpy as np
import tensorflow as tf

from estimator_spec import errors
from estimator_spec.cluster import tasks
from estimator_spec.tensor_types import Tensor

# (the global step a step waited at, as the session read it, [the names of
# the training tasks it waited for])
Report = tuple[np.int64, list[str]]


class SyncWatchHook(tf.compat.v1.train.SessionRunHook):  # type: ignore[misc]  # TF is untyped
  """Gives every training step a deadline and, while a step waits, logs
  which training tasks have not sent their gradients for it."""

  def __init__(self, cluster: tasks.Cluster, options: tasks.ClusterTraining,
               contributions: Tensor, reports: list[Report]) -> None:
    self._cluster = cluster
    self._options = options
    self._reports = reports
    self._export = tf.raw_ops.LookupTableExportV2(
        table_handle=contributions, Tkeys=tf.int64, Tvalues=tf.int64)
    self._global_step = tf.compat.v1.train.get_global_step()
    self._session: Optional[tf.compat.v1.Session] = None
    # One watcher thread per session, woken by each step: starting a thread
    # per step costs more than 100 us and waits for the new thread to be
    # scheduled, on every task's step.
    self._condition = threading.Condition()
    # when the running step is next reported, or None
    self._deadline: Optional[float] = None
    self._started: Optional[float] = None  # when the running step started
    self._closed = True
    self._watcher: Optional[threading.Thread] = None

  def after_create_session(self, session: tf.compat.v1.Session,
                           coord: tf.train.Coordinator) -> None:
    del coord
    with self._condition:
      self._session = session
      self._closed = False
      if self._watcher is None or not self._watcher.is_alive():
        self._watcher = threading.Thread(
            target=self._watch, name="synchronous_step_watch", daemon=True)
        self._watcher.start()

  def before_run(self, run_context: tf.compat.v1.train.SessionRunContext
                 ) -> tf.compat.v1.train.SessionRunArgs:
    del run_context
    with self._condition:
      self._started = time.monotonic()
      self._deadline = self._started + self._options.report_after_secs
      self._condition.notify()
    options = tf.compat.v1.RunOptions(
        timeout_in_ms=int(self._options.step_timeout_secs * 1000))
    return tf.compat.v1.train.SessionRunArgs(None, options=options)

  def after_run(self, run_context: tf.compat.v1.train.SessionRunContext,
                run_values: tf.compat.v1.train.SessionRunValues) -> None:
    del run_context, run_values
    with self._condition:
      self._deadline = None

  def end(self, session: tf.compat.v1.Session) -> None:
    del session
    with self._condition:
      self._deadline = None
      self._closed = True
      self._condition.notify()

  def _watch(self) -> None:
    """The watcher thread: reports a step that runs past its deadline, then
    again every `report_after_secs` while it still runs; ends with the
    session, or when a report cannot be read."""
    with self._condition:
      while not self._closed:
        if self._deadline is None:
          self._condition.wait()
          continue
        remaining = self._deadline - time.monotonic()
        if remaining > 0:
          self._condition.wait(remaining)
          continue
        self._deadline += self._options.report_after_secs
        started, session = self._started, self._session
        assert started is not None  # set with the deadline
        self._condition.release()
        try:
          reported = self._report(started, session)
        finally:
          self._condition.acquire()
        if not reported:
          # The step's state cannot be read: its session is most likely
          # gone (a failed step does not end the hook), and with it this
          # thread; a new session starts another.
          self._deadline = None
          return

  def _report(self, started: float, session: tf.compat.v1.Session) -> bool:
    """Logs which tasks the running step waits for; False when that cannot
    be read."""
    # Whatever the read raises means it cannot be read: the step ended or
    # the session closed meanwhile.
    try:
      step, names = self.waiting_for(session)
    except Exception:
      return False
    self._reports.append((step, names))
    waited = time.monotonic() - started
    tf.compat.v1.logging.warning(
        "Synchronous step %d has waited %.0f s for gradients from: %s "
        "(the step fails after %.0f s: ClusterTraining(step_timeout_secs)).",
        step, waited, ", ".join(names) or "none (the chief is applying it)",
        self._options.step_timeout_secs)
    return True

  def waiting_for(self, session: tf.compat.v1.Session
                  ) -> tuple[np.int64, list[str]]:
    """(step, [names of training tasks that have not sent it])."""
    step, (keys, values) = session.run([self._global_step, self._export])
    sent = dict(zip(keys.tolist(), values.tolist()))
    names = []
    for index in range(self._cluster.num_training_tasks):
      last = sent.get(index)
      if last is None or last < step:
        name = self._cluster.training_task_name(index)
        names.append(name + (" (nothing sent yet)" if last is None else
                             f" (last sent step {last})"))
    return step, names


def timeout_error(reports: Sequence[Report],
                  error: tf.errors.DeadlineExceededError
                  ) -> errors.SyncStepTimeoutError:
  """A `errors.SyncStepTimeoutError` for a step's DeadlineExceededError;
  `reports`: what the watch hooks reported, [(step, [task names])]."""
  report = reports[-1] if reports else None
  detail = (f"; step {report[0]} was waiting for: " + ", ".join(report[1])
            if report and report[1] else "")
  return errors.SyncStepTimeoutError(
      "A synchronous training step did not complete within "
      f"ClusterTraining(step_timeout_secs) seconds{detail}. A training task "
      "stopped sending gradients: restart it (it rejoins), or raise "
      f"step_timeout_secs. ({error.message})")
