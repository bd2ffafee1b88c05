"""`TrainSpec`, `EvalSpec` and `train_and_evaluate`: training with
evaluation, in one process or as one task of a cluster (docs/cluster.md).

Without a cluster in the RunConfig, `train_and_evaluate` trains and
evaluates after each checkpoint save once `throttle_secs` have passed since
the last evaluation, and once more at the end (unless the last checkpoint
was just evaluated); it returns the last evaluation's metrics and its
exports. On a cluster (TF_CONFIG) each task does its part, as
tensorflow-estimator's does: a `ps` task serves its variables until it is
killed; the `chief` (or `master`) and the `worker`s start their server and
train (workers after a delay of 5 s per index, at most 60 s or
`experimental_max_worker_delay_secs`), the chief saving the checkpoints; a
`master` also evaluates after its checkpoint saves; the `evaluator`
evaluates each new checkpoint, at most every `throttle_secs`, until one
reaches `max_steps`. After each evaluation the spec's exporters run.
"""
import collections
import json
import os
import time

import tensorflow as tf

from estimator_spec.estimator.framework import estimator as estimator_lib
from estimator_spec.estimator.framework import run_config as run_config_lib

_WORKER_DELAY_SECS = 5
_MAX_WORKER_DELAY_SECS = 60
_TRAINING_TASKS = (run_config_lib.TaskType.CHIEF,
                   run_config_lib.TaskType.MASTER,
                   run_config_lib.TaskType.WORKER)
# An evaluator that finds no new checkpoint says so at most this often.
_QUIET_SECS = 600


def _callable(input_fn, owner):
  if not callable(input_fn):
    raise TypeError(f"{owner}: `input_fn` must be callable; got "
                    f"{type(input_fn).__name__}: {input_fn!r}.")


def _hooks(hooks, owner):
  hooks = tuple(hooks or ())
  for hook in hooks:
    if not isinstance(hook, tf.compat.v1.train.SessionRunHook):
      raise TypeError(
          f"{owner}: `hooks` must hold tf.compat.v1.train.SessionRunHook "
          f"instances; got {type(hook).__name__}: {hook!r}.")
  return hooks


class TrainSpec(collections.namedtuple(
    "TrainSpec", ["input_fn", "max_steps", "hooks", "saving_listeners"])):
  """The training half of `train_and_evaluate`: input_fn, the global step
  to stop at (None: until the input ends), hooks and checkpoint listeners."""

  def __new__(cls, input_fn, max_steps=None, hooks=None,
              saving_listeners=None):
    _callable(input_fn, "TrainSpec")
    if max_steps is not None and max_steps <= 0:
      raise ValueError(f"TrainSpec: `max_steps` must be positive; got "
                       f"{max_steps!r}.")
    listeners = tuple(saving_listeners or ())
    for listener in listeners:
      if not isinstance(listener, tf.compat.v1.train.CheckpointSaverListener):
        raise TypeError(
            "TrainSpec: `saving_listeners` must hold tf.compat.v1.train."
            f"CheckpointSaverListener instances; got {listener!r}.")
    return super().__new__(cls, input_fn, max_steps,
                           _hooks(hooks, "TrainSpec"), listeners)


class EvalSpec(collections.namedtuple(
    "EvalSpec", ["input_fn", "steps", "name", "hooks", "exporters",
                 "start_delay_secs", "throttle_secs"])):
  """The evaluation half of `train_and_evaluate`: input_fn and `steps`
  batches per evaluation (None: the whole input), the evaluation's `name`,
  hooks, exporters run after each evaluation, how long an evaluator task
  waits before its first evaluation, and the least time between two."""

  def __new__(cls, input_fn, steps=100, name=None, hooks=None,
              exporters=None, start_delay_secs=120, throttle_secs=600):
    _callable(input_fn, "EvalSpec")
    if steps is not None and steps <= 0:
      raise ValueError(f"EvalSpec: `steps` must be positive or None; got "
                       f"{steps!r}.")
    if name is not None and not isinstance(name, str):
      raise TypeError(f"EvalSpec: `name` must be a string; got {name!r}.")
    for field, value in (("start_delay_secs", start_delay_secs),
                         ("throttle_secs", throttle_secs)):
      if value < 0:
        raise ValueError(f"EvalSpec: `{field}` must be >= 0; got {value!r}.")
    return super().__new__(cls, input_fn, steps, name,
                           _hooks(hooks, "EvalSpec"),
                           _exporters(exporters), start_delay_secs,
                           throttle_secs)


def _exporters(exporters):
  """A tuple of exporters, each an object with a unique string `name` and
  `export(estimator, export_path, checkpoint_path, eval_result,
  is_the_final_export)`."""
  if not exporters:
    return ()
  if hasattr(exporters, "export") and hasattr(exporters, "name"):
    exporters = [exporters]
  try:
    exporters = tuple(exporters)
  except TypeError:
    raise TypeError("EvalSpec: `exporters` must be an exporter or a list of "
                    f"exporters; got {exporters!r}.") from None
  names = []
  for exporter in exporters:
    if not (callable(getattr(exporter, "export", None)) and
            hasattr(exporter, "name")):
      raise TypeError(
          "EvalSpec: each exporter must have a `name` and an `export` "
          f"method; got {exporter!r}.")
    if not isinstance(exporter.name, str) or not exporter.name:
      raise ValueError("EvalSpec: each exporter needs a non-empty string "
                       f"name; names: {[e.name for e in exporters]}.")
    if exporter.name in names:
      raise ValueError("EvalSpec: exporter names must be unique; names: "
                       f"{[e.name for e in exporters]}.")
    names.append(exporter.name)
  return exporters


class _Evaluator:
  """Evaluates the newest checkpoint (once each) and runs the exporters."""

  def __init__(self, estimator, eval_spec, max_steps):
    self._estimator = estimator
    self._spec = eval_spec
    self._max_steps = max_steps
    self._last_path = None
    self._last_note = 0.0

  def _note(self, message):
    if time.time() - self._last_note > _QUIET_SECS:
      tf.compat.v1.logging.warning(message)
      self._last_note = time.time()

  def evaluate_and_export(self):
    """(metrics or None when there was no new checkpoint, exports)."""
    path = self._estimator.latest_checkpoint()
    if not path or path == self._last_path:
      self._note("train_and_evaluate: no new checkpoint to evaluate yet "
                 f"in {self._estimator.model_dir}.")
      return None, []
    metrics = self._estimator.evaluate(
        self._spec.input_fn, steps=self._spec.steps, name=self._spec.name,
        checkpoint_path=path, hooks=list(self._spec.hooks))
    final = bool(self._max_steps) and (
        metrics[tf.compat.v1.GraphKeys.GLOBAL_STEP] >= self._max_steps)
    base = os.path.join(tf.compat.as_str_any(self._estimator.model_dir),
                        "export")
    exports = [exporter.export(
        estimator=self._estimator,
        export_path=os.path.join(base, exporter.name), checkpoint_path=path,
        eval_result=metrics, is_the_final_export=final)
               for exporter in self._spec.exporters]
    self._last_path, self._last_note = path, 0.0
    return metrics, exports


class _EvaluateAfterSaves(tf.compat.v1.train.CheckpointSaverListener):
  """Evaluates after checkpoint saves, at most every `throttle_secs`
  (not after the save at the session's start), and at the end."""

  def __init__(self, evaluator, throttle_secs):
    self._evaluator = evaluator
    self._throttle_secs = throttle_secs
    self.metrics, self.exports = None, None
    self._timer = None
    self._first = True

  def begin(self):
    self._timer = tf.compat.v1.train.SecondOrStepTimer(
        every_secs=self._throttle_secs)
    self._first = True

  def after_save(self, session, global_step_value):
    del session
    if self._first:
      self._first = False
      return
    if self._timer.should_trigger_for_step(global_step_value):
      self._evaluate(global_step_value)
    else:
      tf.compat.v1.logging.info(
          "train_and_evaluate: the checkpoint of step %d is not evaluated "
          "(the last evaluation was less than throttle_secs=%s ago).",
          global_step_value, self._throttle_secs)

  def end(self, session, global_step_value):
    del session
    if global_step_value != self._timer.last_triggered_step():
      self._evaluate(global_step_value)

  def _evaluate(self, global_step_value):
    self._timer.update_last_triggered_step(global_step_value)
    metrics, exports = self._evaluator.evaluate_and_export()
    if metrics is None:
      raise RuntimeError(
          "train_and_evaluate: training saved no new checkpoint to evaluate "
          f"at step {global_step_value}.")
    self.metrics, self.exports = metrics, exports


def train_and_evaluate(estimator, train_spec, eval_spec):
  """Trains `estimator` by `train_spec` and evaluates it by `eval_spec`,
  locally or as this task's part of the TF_CONFIG cluster (see the module
  docstring). Returns (metrics, exports) of the last evaluation locally;
  None on a cluster."""
  _check_arguments(estimator, train_spec, eval_spec)
  config = estimator.config
  if (not config.cluster_spec and
      config.task_type != run_config_lib.TaskType.EVALUATOR):
    tf.compat.v1.logging.info(
        "Running training and evaluation locally (non-distributed).")
    return _run_local(estimator, train_spec, eval_spec)
  task = config.task_type
  if not task:
    raise ValueError(
        "train_and_evaluate: the RunConfig has a cluster but no task type; "
        "TF_CONFIG must say which task this process is ('task': {'type': "
        "..., 'index': ...}).")
  if task == run_config_lib.TaskType.EVALUATOR and config.task_id > 0:
    raise ValueError(
        "train_and_evaluate: a cluster has one evaluator task, with index 0; "
        f"this one has index {config.task_id}.")
  runs = {run_config_lib.TaskType.PS: _run_ps,
          run_config_lib.TaskType.CHIEF: _run_chief,
          run_config_lib.TaskType.WORKER: _run_worker,
          run_config_lib.TaskType.MASTER: _run_master,
          run_config_lib.TaskType.EVALUATOR: _run_evaluator}
  if task not in runs:
    raise ValueError(
        f"train_and_evaluate: task type {task!r} is not one this runs; "
        f"TF_CONFIG's task type must be one of {sorted(runs)} (or absent, "
        "with no cluster, to run locally).")
  runs[task](estimator, train_spec, eval_spec)
  return None


def _check_arguments(estimator, train_spec, eval_spec):
  if not isinstance(estimator, estimator_lib.Estimator):
    raise TypeError(
        "train_and_evaluate: `estimator` must be an estimator_spec Estimator "
        f"(a TPUEstimator); got {type(estimator).__name__}.")
  if not isinstance(train_spec, TrainSpec):
    raise TypeError("train_and_evaluate: `train_spec` must be a TrainSpec "
                    f"(estimator_spec.estimator); got {train_spec!r}.")
  if not isinstance(eval_spec, EvalSpec):
    raise TypeError("train_and_evaluate: `eval_spec` must be an EvalSpec "
                    f"(estimator_spec.estimator); got {eval_spec!r}.")


def _run_local(estimator, train_spec, eval_spec):
  config = estimator.config
  tf.compat.v1.logging.info(
      "Training with an evaluation after each checkpoint (every "
      "save_checkpoints_steps=%s or save_checkpoints_secs=%s), at most every "
      "throttle_secs=%s.", config.save_checkpoints_steps,
      config.save_checkpoints_secs, eval_spec.throttle_secs)
  listener = _EvaluateAfterSaves(
      _Evaluator(estimator, eval_spec, train_spec.max_steps),
      eval_spec.throttle_secs)
  estimator.train(train_spec.input_fn, max_steps=train_spec.max_steps,
                  hooks=list(train_spec.hooks),
                  saving_listeners=list(train_spec.saving_listeners) +
                  [listener])
  return listener.metrics, listener.exports


def start_server(config):
  """Starts this task's TF server of the cluster (None for a cluster of
  one training task, which needs none)."""
  if not (config.cluster_spec and config.task_type and
          config.task_id is not None):
    raise RuntimeError(
        "train_and_evaluate: cannot start this task's server: the RunConfig "
        "needs a cluster, a task type and a task index (TF_CONFIG).")
  if not config.master:
    jobs = config.cluster_spec.jobs
    if (len(jobs) == 1 and len(config.cluster_spec.job_tasks(jobs[0])) == 1
        and config.task_type in _TRAINING_TASKS):
      tf.compat.v1.logging.info(
          "One task in the cluster: no TensorFlow server started.")
      return None
    raise RuntimeError(
        "train_and_evaluate: cannot start this task's server: the RunConfig "
        "has no master (TF_CONFIG's cluster must list this task).")
  tf.compat.v1.logging.info("Starting the TensorFlow server of %s task %d.",
                            config.task_type, config.task_id)
  server_config = tf.compat.v1.ConfigProto(log_device_placement=False)
  if config.session_config is not None:
    server_config.gpu_options.CopyFrom(config.session_config.gpu_options)
  server = tf.distribute.Server(
      config.cluster_spec, job_name=config.task_type,
      task_index=config.task_id, config=server_config, start=False,
      protocol=config.protocol)
  server.start()
  return server


def _run_ps(estimator, train_spec, eval_spec):
  del train_spec, eval_spec
  start_server(estimator.config).join()


def _run_trainer(estimator, train_spec, listeners=None):
  """A chief's, master's or worker's part: its server (unless TF_CONFIG
  says the environment runs it), then training."""
  config = estimator.config
  if not _server_run_elsewhere():
    start_server(config)
  if config.task_type == run_config_lib.TaskType.WORKER:
    limit = (_MAX_WORKER_DELAY_SECS
             if config.experimental_max_worker_delay_secs is None else
             int(config.experimental_max_worker_delay_secs))
    delay = min(limit, (config.task_id + 1) * _WORKER_DELAY_SECS)
    if delay > 0:
      tf.compat.v1.logging.info("Waiting %d secs before starting training.",
                                delay)
      time.sleep(delay)
  estimator.train(train_spec.input_fn, max_steps=train_spec.max_steps,
                  hooks=list(train_spec.hooks), saving_listeners=listeners)


def _server_run_elsewhere():
  """TF_CONFIG's `environment: google`: the cluster's servers are started
  by the environment, not by the tasks."""
  tf_config = json.loads(os.environ.get("TF_CONFIG") or "{}")
  return tf_config.get("environment") == "google"


def _run_chief(estimator, train_spec, eval_spec):
  del eval_spec
  _run_trainer(estimator, train_spec, list(train_spec.saving_listeners))


def _run_worker(estimator, train_spec, eval_spec):
  del eval_spec
  _run_trainer(estimator, train_spec)


def _run_master(estimator, train_spec, eval_spec):
  """A master trains (saving the checkpoints) and evaluates after its
  saves."""
  evaluate = _EvaluateAfterSaves(
      _Evaluator(estimator, eval_spec, train_spec.max_steps),
      eval_spec.throttle_secs)
  _run_trainer(estimator, train_spec,
               list(train_spec.saving_listeners) + [evaluate])


def _run_evaluator(estimator, train_spec, eval_spec):
  """Evaluates each new checkpoint until one reaches `max_steps`."""
  if eval_spec.start_delay_secs:
    tf.compat.v1.logging.info("Waiting %s secs before the first evaluation.",
                              eval_spec.start_delay_secs)
    time.sleep(eval_spec.start_delay_secs)
  evaluator = _Evaluator(estimator, eval_spec, train_spec.max_steps)
  while True:
    start = time.time()
    metrics, _ = evaluator.evaluate_and_export()
    step = (metrics or {}).get(tf.compat.v1.GraphKeys.GLOBAL_STEP)
    if step and train_spec.max_steps and step >= train_spec.max_steps:
      tf.compat.v1.logging.info(
          "Evaluation done: global step %s reached max_steps=%s.", step,
          train_spec.max_steps)
      return
    wait = eval_spec.throttle_secs - (time.time() - start)
    if wait > 0:
      time.sleep(wait)
