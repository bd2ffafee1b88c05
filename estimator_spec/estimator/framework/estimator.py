"""`Estimator`: the run loop of a model_fn, on `tf.compat.v1` graph mode.

Each call builds a new graph: the global step, input_fn's tensors, and
model_fn's ops for the call's mode, then runs it in a session TF's own
machinery manages (`MonitoredTrainingSession` for training, a
`MonitoredSession` restoring a checkpoint for evaluation and prediction).
What a TPUEstimator program relies on behaves as in tensorflow-estimator
2.15 (docs/estimator.md, 'Two stacks'):

* `train`: `steps` counts from the restored step, `max_steps` is absolute
  (a model already there returns at once); checkpoints go to `model_dir`
  when the session starts, every `save_checkpoints_steps` or `_secs`, and
  at the end, `keep_checkpoint_max` kept; summaries every
  `save_summary_steps` (model_fn's and a `loss` scalar); the loss and step
  logged and `global_step/sec` written every `log_step_count_steps`; a NaN
  loss stops training with `NanLossDuringTrainingError`; on a cluster the
  chief alone saves.
* `evaluate`: the metrics' update ops once per batch for `steps` batches or
  to the input's end, from the latest (or a named) checkpoint, the mean
  loss added as `loss` and the global step as `global_step`; the values are
  written to `model_dir/eval` (or `eval_<name>`).
* `predict`: predictions batch by batch, or example by example.
* `export_saved_model`: the PREDICT graph on the serving receiver's tensors
  with the trained variables, one signature per export output.

Subclasses (the TPUEstimator) extend it through the same methods
tensorflow-estimator's Estimator offers them: `_call_input_fn`,
`_call_model_fn` and `_export_all_saved_models`.
"""
import copy
import os
import tempfile

import tensorflow as tf

from estimator_spec.cluster import session as session_lib
from estimator_spec.estimator import calling
from estimator_spec.estimator.framework import evaluation
from estimator_spec.estimator.framework import inputs
from estimator_spec.estimator.framework import keras2
from estimator_spec.estimator.framework import model_fn as model_fn_lib
from estimator_spec.estimator.framework import run_config as run_config_lib
from estimator_spec.estimator.framework import saved_model
from estimator_spec.estimator.framework import warm_start
from estimator_spec.tf_patches import global_step_read
from estimator_spec.tf_patches import saver_listeners

ModeKeys = model_fn_lib.ModeKeys
_MODEL_FN_ARGS = frozenset(("features", "labels", "mode", "params", "self",
                            "config"))


class Estimator:
  """Trains, evaluates, predicts with and exports a model_fn.

  Args:
    model_fn: `model_fn(features, labels, mode, params, config)` (only
      `features` required) returning an `EstimatorSpec`.
    model_dir: where checkpoints and summaries go; `config.model_dir` when
      None; a new temporary directory when both are None.
    config: a `RunConfig` (this framework's).
    params: a dict handed to model_fn (a copy).
    warm_start_from: a checkpoint or SavedModel path, or a
      `WarmStartSettings`: the variables training starts from when
      `model_dir` has no checkpoint yet.
  """

  def __init__(self, model_fn, model_dir=None, config=None, params=None,
               warm_start_from=None):
    self._config = _config_with_model_dir(config, model_dir)
    self._model_dir = self._config.model_dir
    self._session_config = self._config.session_config
    self._device_fn = (self._config.device_fn or
                       _replica_device_setter(self._config))
    tf.compat.v1.logging.info("Using config: %s", self._config)
    if model_fn is None:
      raise ValueError("Estimator: `model_fn` is required.")
    _check_model_fn_args(model_fn, params)
    self._model_fn = model_fn
    self._params = copy.deepcopy(params or {})
    self._warm_start_settings = warm_start.warm_start_settings(
        warm_start_from)

  # --- what a program reads ----------------------------------------------

  @property
  def model_dir(self):
    return self._model_dir

  @property
  def config(self):
    return copy.deepcopy(self._config)

  @property
  def params(self):
    return copy.deepcopy(self._params)

  @property
  def model_fn(self):
    """model_fn bound to this estimator's params:
    `fn(features, labels, mode, config)` returning an `EstimatorSpec`."""

    def bound_model_fn(features, labels, mode, config):
      return self._call_model_fn(features, labels, mode, config)

    return bound_model_fn

  def latest_checkpoint(self):
    """The path of the newest checkpoint in `model_dir`, or None."""
    return tf.train.latest_checkpoint(self._model_dir)

  def get_variable_names(self):
    """The names of the variables in the latest checkpoint."""
    _require_checkpoint(self._model_dir)
    return [name for name, _ in tf.train.list_variables(self._model_dir)]

  def get_variable_value(self, name):
    """The value (numpy) of variable `name` in the latest checkpoint."""
    _require_checkpoint(self._model_dir)
    return tf.train.load_variable(self._model_dir, name)

  def eval_dir(self, name=None):
    """Where `evaluate(name=name)` writes its events."""
    return os.path.join(self._model_dir, "eval_" + name if name else "eval")

  # --- train ---------------------------------------------------------------

  def train(self, input_fn, hooks=None, steps=None, max_steps=None,
            saving_listeners=None):
    """Trains for `steps` more steps, or up to the global step `max_steps`,
    or until input_fn's data ends. Returns self."""
    if self._config.task_type in (run_config_lib.TaskType.EVALUATOR,
                                  run_config_lib.TaskType.PS):
      raise ValueError(
          f"Estimator.train: this task is a {self._config.task_type} task "
          "(TF_CONFIG), which does not train; run every task through "
          "train_and_evaluate, which gives each its part.")
    _check_steps(steps, max_steps)
    if max_steps is not None:
      reached = load_global_step_from_checkpoint_dir(self._model_dir)
      if max_steps <= reached:
        tf.compat.v1.logging.info(
            "Skipping training: the checkpoint in %s is at step %d, not "
            "below max_steps=%d.", self._model_dir, reached, max_steps)
        return self
    hooks = _checked_hooks(hooks, "hooks")
    if steps is not None or max_steps is not None:
      hooks.append(tf.compat.v1.train.StopAtStepHook(steps, max_steps))
    listeners = _checked_listeners(saving_listeners)
    loss = self._train_model(input_fn, hooks, listeners)
    tf.compat.v1.logging.info("Loss for final step: %s.", loss)
    return self

  def _train_model(self, input_fn, hooks, listeners):
    with tf.Graph().as_default() as graph, graph.device(self._device_fn):
      tf.compat.v1.random.set_random_seed(self._config.tf_random_seed)
      self._create_and_assert_global_step(graph)
      global_step_read.make(graph)
      features, labels, input_hooks = inputs.features_and_labels(
          self._call_input_fn(input_fn, ModeKeys.TRAIN))
      spec = self._call_model_fn(features, labels, ModeKeys.TRAIN,
                                 self.config)
      global_step = tf.compat.v1.train.get_global_step(graph)
      self._warm_start_training()
      worker_hooks = input_hooks + hooks + self._loss_hooks(spec, global_step)
      worker_hooks += list(spec.training_hooks)
      _add_default_saver(spec.scaffold, self._config)
      chief_hooks = self._checkpoint_hooks(spec, worker_hooks, listeners)
      return self._run_training(spec, worker_hooks, chief_hooks)

  def _warm_start_training(self):
    if self._warm_start_settings and not self.latest_checkpoint():
      tf.compat.v1.logging.info("Warm-starting with %s",
                                self._warm_start_settings)
      tf.compat.v1.train.warm_start(*self._warm_start_settings)

  def _loss_hooks(self, spec, global_step):
    """The `loss` summary and collection entry, the NaN check, and the
    periodic log line of the loss and step."""
    summaries = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.SUMMARIES)
    if not any(summary.op.name == "loss" for summary in summaries):
      tf.compat.v1.summary.scalar("loss", spec.loss)
    tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.LOSSES, spec.loss)
    hooks = [tf.compat.v1.train.NanTensorHook(spec.loss)]
    if self._config.log_step_count_steps is not None:
      hooks.append(tf.compat.v1.train.LoggingTensorHook(
          {"loss": spec.loss, "step": global_step},
          every_n_iter=self._config.log_step_count_steps))
    return hooks

  def _checkpoint_hooks(self, spec, worker_hooks, listeners):
    """The chief's CheckpointSaverHook (unless the user gave one), with
    `listeners` attached to whichever saver hook runs."""
    config = self._config
    everything = worker_hooks + list(spec.training_chief_hooks)
    savers = [hook for hook in everything
              if isinstance(hook, tf.compat.v1.train.CheckpointSaverHook)]
    chief_hooks = []
    if not savers and (config.save_checkpoints_secs or
                       config.save_checkpoints_steps):
      chief_hooks.append(tf.compat.v1.train.CheckpointSaverHook(
          self._model_dir, save_secs=config.save_checkpoints_secs,
          save_steps=config.save_checkpoints_steps, scaffold=spec.scaffold,
          save_graph_def=config.checkpoint_save_graph_def))
      savers = chief_hooks
    if listeners:
      if not savers:
        raise ValueError(
            "Estimator.train: saving_listeners run around checkpoint saves, "
            "but this run saves none; set RunConfig.save_checkpoints_steps "
            "or save_checkpoints_secs.")
      saver_listeners.add(savers[0], listeners)
    return chief_hooks + list(spec.training_chief_hooks)

  def _run_training(self, spec, worker_hooks, chief_hooks):
    """Runs train_op until a hook stops; returns the last step's loss."""
    config = self._config
    summary_steps, log_steps = config.save_summary_steps, (
        config.log_step_count_steps)
    if _master_and_workers(config):
      # Here the first worker, not the master, writes the step rate and the
      # summaries.
      summary_steps, log_steps = 0, None
      worker_hooks += _first_worker_hooks(config, spec.scaffold)
    with tf.compat.v1.train.MonitoredTrainingSession(
        master=config.master, is_chief=config.is_chief,
        checkpoint_dir=self._model_dir, scaffold=spec.scaffold,
        hooks=worker_hooks, chief_only_hooks=chief_hooks,
        save_checkpoint_secs=0, save_summaries_steps=summary_steps,
        config=self._session_config,
        max_wait_secs=config.session_creation_timeout_secs,
        log_step_count_steps=log_steps,
        save_graph_def=config.checkpoint_save_graph_def) as session:
      loss, steps = None, 0
      while not session.should_stop():
        steps += 1
        _, loss = session.run([spec.train_op, spec.loss])
    if steps == 0:
      tf.compat.v1.logging.warning(
          "Estimator.train ran no step: input_fn's data was empty, or a "
          "hook stopped training before the first step.")
    return loss

  # --- evaluate ------------------------------------------------------------

  def evaluate(self, input_fn, steps=None, hooks=None, checkpoint_path=None,
               name=None):
    """Evaluates model_fn's metrics over `steps` batches (all of input_fn's
    data when None) from `checkpoint_path` (the latest checkpoint when None;
    initialized variables when there is none). Returns {metric: value}
    with `loss` and `global_step`."""
    hooks = _checked_hooks(hooks, "hooks")
    if steps is not None and steps <= 0:
      raise ValueError(
          f"Estimator.evaluate: `steps` must be a positive number of "
          f"batches, or None for all of input_fn's data; got {steps!r}.")
    if not checkpoint_path:
      checkpoint_path = self.latest_checkpoint()
      if not checkpoint_path:
        tf.compat.v1.logging.info(
            "Could not find trained model in model_dir: %s, running "
            "initialization to evaluate.", self._model_dir)
    with tf.Graph().as_default() as graph:
      tf.compat.v1.random.set_random_seed(self._config.tf_random_seed)
      global_step = self._create_and_assert_global_step(graph)
      features, labels, input_hooks = inputs.features_and_labels(
          self._call_input_fn(input_fn, ModeKeys.EVAL))
      spec = self._call_model_fn(features, labels, ModeKeys.EVAL,
                                 self.config)
      update_op, values = evaluation.split_metrics(
          evaluation.metric_ops_with_loss(spec.eval_metric_ops, spec.loss),
          global_step)
      self._maybe_warm_start(checkpoint_path)
      batches_done = evaluation.counting(update_op)
      all_hooks = (input_hooks + hooks +
                   [evaluation.StopAfterBatchesHook(steps, batches_done)] +
                   list(spec.evaluation_hooks))
      results = evaluation.run(
          checkpoint_path, self._config.evaluation_master,
          _eval_scaffold(spec.scaffold), batches_done, values, all_hooks,
          self._session_config)
      evaluation.write_results(self.eval_dir(name), results, checkpoint_path)
    return results

  def _maybe_warm_start(self, checkpoint_path):
    """Evaluation and prediction without a checkpoint start from the
    warm-start variables, when there are some."""
    if not checkpoint_path and self._warm_start_settings:
      tf.compat.v1.logging.info("Warm-starting with %s",
                                self._warm_start_settings)
      tf.compat.v1.train.warm_start(*self._warm_start_settings)

  # --- predict -------------------------------------------------------------

  def predict(self, input_fn, predict_keys=None, hooks=None,
              checkpoint_path=None, yield_single_examples=True):
    """Yields model_fn's predictions for input_fn's features, one example
    at a time (or one batch at a time with yield_single_examples=False),
    until input_fn's data ends; `predict_keys` keeps only those keys of
    dict predictions."""
    hooks = _checked_hooks(hooks, "hooks")
    if not checkpoint_path:
      checkpoint_path = self.latest_checkpoint()
      if not checkpoint_path:
        tf.compat.v1.logging.info(
            "Could not find trained model in model_dir: %s, running "
            "initialization to predict.", self._model_dir)
    with tf.Graph().as_default() as graph:
      tf.compat.v1.random.set_random_seed(self._config.tf_random_seed)
      self._create_and_assert_global_step(graph)
      features, _, input_hooks = inputs.features_and_labels(
          self._call_input_fn(input_fn, ModeKeys.PREDICT))
      if not inputs.reads_to_the_end(features):
        tf.compat.v1.logging.warning(
            "Estimator.predict: input_fn's features come from no Dataset or "
            "queue, so prediction never ends; return a tf.data.Dataset.")
      spec = self._call_model_fn(features, None, ModeKeys.PREDICT,
                                 self.config)
      self._maybe_warm_start(checkpoint_path)
      predictions = _selected_predictions(spec.predictions, predict_keys)
      creator = tf.compat.v1.train.ChiefSessionCreator(
          checkpoint_filename_with_path=checkpoint_path,
          master=self._config.master, scaffold=spec.scaffold,
          config=self._session_config)
      with tf.compat.v1.train.MonitoredSession(
          session_creator=creator,
          hooks=input_hooks + hooks + list(spec.prediction_hooks)) as session:
        while not session.should_stop():
          batch = session.run(predictions)
          yield from _examples(batch, yield_single_examples)

  # --- export --------------------------------------------------------------

  def export_saved_model(self, export_dir_base, serving_input_receiver_fn,
                         assets_extra=None, as_text=False,
                         checkpoint_path=None,
                         experimental_mode=ModeKeys.PREDICT):
    """Writes a serving SavedModel of the latest (or the named) checkpoint
    under `export_dir_base/<timestamp>`; returns its path (bytes)."""
    if not serving_input_receiver_fn:
      raise ValueError("export_saved_model: `serving_input_receiver_fn` is "
                       "required (a function returning a "
                       "ServingInputReceiver).")
    if experimental_mode != ModeKeys.PREDICT:
      raise ValueError(
          f"export_saved_model: experimental_mode={experimental_mode!r}: "
          "this Estimator exports serving (PREDICT) graphs only; leave "
          "experimental_mode at its default.")
    return self._export_all_saved_models(
        export_dir_base, {ModeKeys.PREDICT: serving_input_receiver_fn},
        assets_extra=assets_extra, as_text=as_text,
        checkpoint_path=checkpoint_path, strip_default_attrs=True)

  def export_savedmodel(self, export_dir_base, serving_input_receiver_fn,
                        assets_extra=None, as_text=False,
                        checkpoint_path=None, strip_default_attrs=False):
    """The old name of `export_saved_model` (default attributes kept unless
    `strip_default_attrs`)."""
    if not serving_input_receiver_fn:
      raise ValueError("export_savedmodel: `serving_input_receiver_fn` is "
                       "required (a function returning a "
                       "ServingInputReceiver).")
    return self._export_all_saved_models(
        export_dir_base, {ModeKeys.PREDICT: serving_input_receiver_fn},
        assets_extra=assets_extra, as_text=as_text,
        checkpoint_path=checkpoint_path,
        strip_default_attrs=strip_default_attrs)

  def _export_all_saved_models(self, export_dir_base, input_receiver_fn_map,
                               assets_extra=None, as_text=False,
                               checkpoint_path=None,
                               strip_default_attrs=True):
    modes = set(input_receiver_fn_map)
    if modes != {ModeKeys.PREDICT}:
      raise ValueError(
          "export: this Estimator exports serving (PREDICT) graphs only; got "
          f"receivers for modes {sorted(modes)}.")
    checkpoint = saved_model.checkpoint_to_export(
        self._model_dir, checkpoint_path, self._warm_start_settings)
    receiver_fn = input_receiver_fn_map[ModeKeys.PREDICT]

    def add_graph(builder):
      with tf.Graph().as_default() as graph:
        self._create_and_assert_global_step(graph)
        tf.compat.v1.random.set_random_seed(self._config.tf_random_seed)
        with keras2.explained("serving_input_receiver_fn"):
          receiver = _checked_receiver(receiver_fn())
        spec = self._call_model_fn(receiver.features,
                                   getattr(receiver, "labels", None),
                                   ModeKeys.PREDICT, self.config)
        saved_model.add_serving_graph(builder, spec, receiver, checkpoint,
                                      self._session_config,
                                      strip_default_attrs)

    return saved_model.write(export_dir_base, add_graph, assets_extra,
                             as_text)

  # --- calling the user's functions ------------------------------------------

  def _create_and_assert_global_step(self, graph):
    step = tf.compat.v1.train.create_global_step(graph)
    assert step is tf.compat.v1.train.get_global_step(graph)
    assert step.dtype.is_integer
    return step

  def _call_input_fn(self, input_fn, mode, input_context=None):
    """input_fn with the arguments it declares (`mode`, `params`, `config`,
    `input_context`), its ops on the CPU."""
    names = calling.fn_args(input_fn)
    kwargs = calling.input_fn_kwargs(names, mode, self.config, input_context)
    if "params" in names:
      kwargs["params"] = self.params
    with tf.compat.v1.device("/cpu:0"), keras2.explained("input_fn"):
      return input_fn(**kwargs)

  def _call_model_fn(self, features, labels, mode, config):
    """model_fn with the arguments it declares; its result must be an
    `EstimatorSpec`."""
    kwargs = calling.model_fn_kwargs(calling.fn_args(self._model_fn), labels,
                                     mode, self.params, config,
                                     caller="Estimator")
    tf.compat.v1.logging.info("Calling model_fn.")
    with keras2.explained("model_fn"):
      spec = self._model_fn(features=features, **kwargs)
    tf.compat.v1.logging.info("Done calling model_fn.")
    if not isinstance(spec, model_fn_lib.EstimatorSpec):
      raise ValueError(
          "Estimator: model_fn must return an EstimatorSpec "
          "(estimator_spec.estimator.EstimatorSpec); got "
          f"{type(spec).__name__}.")
    return spec


def load_global_step_from_checkpoint_dir(checkpoint_dir):
  """The global step of the latest checkpoint in `checkpoint_dir`; 0 when
  there is no checkpoint, or one without a global step."""
  path = tf.train.latest_checkpoint(checkpoint_dir)
  if not path:
    return 0
  try:
    reader = tf.compat.v1.train.NewCheckpointReader(path)
  except (tf.errors.OpError, ValueError) as error:
    raise ValueError(
        f"The checkpoint {path} (the latest in {checkpoint_dir}) cannot be "
        f"read: {error}. Remove it or restore a good copy.") from error
  name = tf.compat.v1.GraphKeys.GLOBAL_STEP
  if not reader.has_tensor(name):
    return 0
  return int(reader.get_tensor(name))


def _config_with_model_dir(config, model_dir):
  """The estimator's config: a default RunConfig when None, TF's default
  session config when it has none, and `model_dir` resolved (the
  argument, the config's, or a new temporary directory)."""
  if config is None:
    config = run_config_lib.RunConfig()
    tf.compat.v1.logging.info("Using default config.")
  if not isinstance(config, run_config_lib.RunConfig):
    raise ValueError(
        "Estimator: `config` must be a RunConfig (estimator_spec.RunConfig "
        "or estimator_spec.estimator.RunConfig); got "
        f"{type(config).__name__}: {config!r}.")
  if config.session_config is None:
    config = config.replace(
        session_config=session_lib.default_session_config())
  if isinstance(model_dir, os.PathLike):
    model_dir = os.fspath(model_dir)
  if model_dir is not None and config.model_dir not in (None, model_dir):
    raise ValueError(
        "Estimator: `model_dir` is set both as an argument and in the "
        f"RunConfig, with different values ({model_dir!r} and "
        f"{config.model_dir!r}); set one of them.")
  if model_dir:
    return config.replace(model_dir=model_dir)
  if config.model_dir is None:
    model_dir = tempfile.mkdtemp()
    tf.compat.v1.logging.warning(
        "Using temporary folder as model directory: %s", model_dir)
    return config.replace(model_dir=model_dir)
  return config


def _replica_device_setter(config):
  """Estimator's placement on a cluster with ps tasks: variables on the ps
  tasks, the rest on this task."""
  if config.num_ps_replicas <= 0:
    return None
  worker = (f"/job:{config.task_type}/task:{config.task_id}"
            if config.task_type else "/job:worker")
  return tf.compat.v1.train.replica_device_setter(
      ps_tasks=config.num_ps_replicas, worker_device=worker,
      merge_devices=True, cluster=config.cluster_spec)


def _check_model_fn_args(model_fn, params):
  names = set(calling.fn_args(model_fn))
  if "features" not in names:
    raise ValueError(f"Estimator: model_fn ({model_fn}) must take a "
                     "`features` argument.")
  if params is not None and "params" not in names:
    raise ValueError(
        f"Estimator: params were given ({params}) but model_fn ({model_fn}) "
        "takes no `params` argument; add one, or drop params.")
  if params is None and "params" in names:
    tf.compat.v1.logging.warning(
        "Estimator: model_fn (%s) takes `params`, but no params were given.",
        model_fn)
  unexpected = sorted(names - _MODEL_FN_ARGS)
  if unexpected:
    raise ValueError(
        f"Estimator: model_fn ({model_fn}) takes arguments the estimator "
        f"never passes: {unexpected}; it may take only features, labels, "
        "mode, params and config.")


def _check_steps(steps, max_steps):
  if steps is not None and max_steps is not None:
    raise ValueError("Estimator.train: give `steps` (more steps) or "
                     "`max_steps` (the step to reach), not both.")
  for name, value in (("steps", steps), ("max_steps", max_steps)):
    if value is not None and value <= 0:
      raise ValueError(f"Estimator.train: `{name}` must be positive; got "
                       f"{value!r}.")


def _checked_hooks(hooks, name):
  hooks = list(hooks or [])
  for hook in hooks:
    if not isinstance(hook, tf.compat.v1.train.SessionRunHook):
      raise TypeError(
          f"Estimator: `{name}` must hold tf.compat.v1.train.SessionRunHook "
          f"instances; got {type(hook).__name__}: {hook!r}.")
  return hooks


def _checked_listeners(listeners):
  listeners = list(listeners or [])
  for listener in listeners:
    if not isinstance(listener, tf.compat.v1.train.CheckpointSaverListener):
      raise TypeError(
          "Estimator.train: `saving_listeners` must hold tf.compat.v1.train."
          f"CheckpointSaverListener instances; got "
          f"{type(listener).__name__}: {listener!r}.")
  return listeners


def _require_checkpoint(model_dir):
  if not tf.train.latest_checkpoint(model_dir):
    raise ValueError(
        f"Could not find trained model in model_dir: {model_dir} (no "
        "checkpoint yet: train first).")


def _add_default_saver(scaffold, config):
  """A sharded saver keeping `keep_checkpoint_max` checkpoints, unless the
  scaffold or the graph has one."""
  if scaffold.saver or tf.compat.v1.get_collection(
      tf.compat.v1.GraphKeys.SAVERS):
    return
  tf.compat.v1.add_to_collection(
      tf.compat.v1.GraphKeys.SAVERS,
      tf.compat.v1.train.Saver(
          sharded=True, max_to_keep=config.keep_checkpoint_max,
          keep_checkpoint_every_n_hours=config.keep_checkpoint_every_n_hours,
          defer_build=True, save_relative_paths=True))


def _master_and_workers(config):
  """A cluster with both a `master` and `worker` jobs."""
  jobs = config.cluster_spec.jobs if config.cluster_spec else ()
  return (run_config_lib.TaskType.WORKER in jobs and
          run_config_lib.TaskType.MASTER in jobs)


def _first_worker_hooks(config, scaffold):
  """On worker 0 of a master/worker cluster, the summary and step-rate
  hooks the master does not run there."""
  if not (config.task_type == run_config_lib.TaskType.WORKER and
          config.task_id == 0):
    return []
  hooks = []
  if config.save_summary_steps and config.save_summary_steps > 0:
    hooks.append(tf.compat.v1.train.SummarySaverHook(
        save_steps=config.save_summary_steps, output_dir=config.model_dir,
        scaffold=scaffold))
  if config.log_step_count_steps and config.log_step_count_steps > 0:
    hooks.append(tf.compat.v1.train.StepCounterHook(
        every_n_steps=config.log_step_count_steps,
        output_dir=config.model_dir))
  return hooks


def _eval_scaffold(scaffold):
  """The scaffold evaluation runs with: a local_init_op of the user's also
  initializes the metric variables."""
  if not scaffold.local_init_op:
    return scaffold
  evaluation.eval_step_variable()
  return tf.compat.v1.train.Scaffold(
      local_init_op=tf.group(
          scaffold.local_init_op,
          tf.compat.v1.train.Scaffold.default_local_init_op()),
      copy_from_scaffold=scaffold)


def _selected_predictions(predictions, keys):
  if not keys:
    return predictions
  if not isinstance(predictions, dict):
    raise ValueError(
        f"Estimator.predict: predict_keys={keys!r} selects keys of dict "
        "predictions, but model_fn's predictions are one tensor; leave "
        "predict_keys out.")
  selected = {key: value for key, value in predictions.items()
              if key in keys}
  if not selected:
    raise ValueError(
        f"Estimator.predict: none of predict_keys={keys!r} is a key of "
        f"model_fn's predictions {sorted(predictions)}.")
  return selected


def _examples(batch, one_by_one):
  """The items predict yields of one evaluated batch of predictions."""
  if not one_by_one:
    yield batch
    return
  if not isinstance(batch, dict):
    yield from batch
    return
  length = None
  for key, value in batch.items():
    length = length or value.shape[0]
    if value.shape[0] != length:
      raise ValueError(
          f"Estimator.predict: predictions[{key!r}] has {value.shape[0]} "
          f"rows where the others have {length}, so they cannot be split "
          "into examples; use yield_single_examples=False.")
  for index in range(length or 0):
    yield {key: value[index] for key, value in batch.items()}


def _checked_receiver(receiver):
  if not (hasattr(receiver, "features") and
          hasattr(receiver, "receiver_tensors")):
    raise TypeError(
        "export: serving_input_receiver_fn must return a ServingInputReceiver "
        "(estimator_spec.estimator.export); got "
        f"{type(receiver).__name__}: {receiver!r}.")
  return receiver
