"""`TPUEstimator`: TPU-embedding models on the host.

`TPUEstimator` takes the arguments of TF 2.15's
`tf.compat.v1.estimator.tpu.TPUEstimator` and runs the model on the host
embedding engine (docs/numerics.md), so a model written for TPUs trains its
tables as a TPU would, on CPU (and GPU):

* TRAIN: the engine looks up every table once per step; the columns in
  model_fn (or, with the dict form of the spec, `features[name]`) return its
  activations. The user's optimizer trains the dense variables; the tables are
  trained only by the spec's optimization parameters, with clipping, gradient
  multiplier and learning-rate functions. The activation gradients come from
  the user's own backward pass, so the dense backward pass runs once per
  step (`host_step.HostStep` does a step's embedding work).
* EVAL and PREDICT: lookups only, from the same variables.
* export: the serving graph does plain lookups (gather and combine) from the
  trained tables; it holds no optimizer, slot or pipelining state.

This module is the TPUEstimator surface: arguments, modes, params and
context, input_fn calls, hooks and export. With `use_tpu=True` and a TPU
named in the RunConfig, the constructor returns TF's own TPUEstimator
instead (`interop.DelegatedTPUEstimator`, loaded only then).
"""
import contextlib
import inspect
import os
import time

import tensorflow as tf

from tpu_embedding_columns import context

from estimator_spec import quiet
from estimator_spec import tpu_runner
from estimator_spec.checkpoints import tables as checkpoint_tables
from estimator_spec.cluster import placement
from estimator_spec.cluster import session as session_lib
from estimator_spec.cluster import sync as sync_lib
from estimator_spec.cluster import tasks as cluster_lib
from estimator_spec.config import spec as spec_lib
from estimator_spec.estimator import calling
from estimator_spec.estimator import hooks as hooks_lib
from estimator_spec.estimator import host_step
from estimator_spec.estimator import monitoring
from estimator_spec.estimator import profiling
from estimator_spec.estimator import stack
from estimator_spec.estimator import target
from estimator_spec.estimator import tpu_context
from estimator_spec.estimator.spec import ExportSavedModelApiVersion
from estimator_spec.estimator.spec import TPUEstimatorSpec
from estimator_spec.estimator.spec import to_estimator_spec
from estimator_spec.estimator.framework import keras2
from estimator_spec.profiling import sampling
from estimator_spec.tf_patches import replica_context
from estimator_spec.tf_patches import tpu_columns

ModeKeys = stack.ModeKeys

_RESERVED_PARAMS = ("batch_size", "context")
# The evaluations an estimator remembers for its progress lines (one line
# names those that ran since the previous line).
_EVALUATIONS_KEPT = 64
_BATCH_ARGUMENT = {
    ModeKeys.TRAIN: "train_batch_size",
    ModeKeys.EVAL: "eval_batch_size",
    ModeKeys.PREDICT: "predict_batch_size",
}


class _Params(dict):
  """The `params` TPUEstimator hands model_fn and input_fn: a dict whose
  missing `batch_size` says which constructor argument gives it (TF's gives
  a bare KeyError: 'batch_size' there)."""

  def __init__(self, params, mode):
    super().__init__(params)
    self._mode = mode

  def __missing__(self, key):
    if key == "batch_size":
      argument = _BATCH_ARGUMENT[self._mode]
      raise KeyError(
          f"params['batch_size'] is not set in {self._mode} mode: "
          f"TPUEstimator was given no {argument}; pass {argument}=... to "
          "TPUEstimator (input_fn and model_fn read the batch size of "
          "their mode there).")
    raise KeyError(key)

  def __reduce__(self):
    return dict, (dict(self),)


def _check_arguments(model_fn, model_dir, config, params, use_tpu,
                     train_batch_size, eval_batch_size, predict_batch_size,
                     batch_axis, eval_on_tpu, export_to_tpu, export_to_cpu,
                     warm_start_from, embedding_config_spec,
                     export_saved_model_api_version, cluster_training=None,
                     profile_sampling_rate=None):
  """Checks TPUEstimator's arguments, for the host and the TPU paths alike
  (`model_dir`, `config` and `warm_start_from` are checked by Estimator)."""
  del model_dir, config, warm_start_from
  cluster_lib.check_options(cluster_training)
  owner = "TPUEstimator"
  _check_sampling_rate(profile_sampling_rate, embedding_config_spec)
  _check_model_fn_and_params(model_fn, params)
  for name, value in (("use_tpu", use_tpu), ("eval_on_tpu", eval_on_tpu),
                      ("export_to_tpu", export_to_tpu),
                      ("export_to_cpu", export_to_cpu)):
    if not isinstance(value, bool):
      raise TypeError(f"{owner}: `{name}` must be a bool; got "
                      f"{type(value).__name__}: {value!r}.")
  for name, value in (("train_batch_size", train_batch_size),
                      ("eval_batch_size", eval_batch_size),
                      ("predict_batch_size", predict_batch_size)):
    if value is not None and (isinstance(value, bool) or
                              not isinstance(value, int) or value < 1):
      raise ValueError(f"{owner}: `{name}` must be a positive int; got "
                       f"{value!r}.")
  if batch_axis is not None and not isinstance(batch_axis,
                                               (tuple, list, dict)):
    raise TypeError(
        f"{owner}: `batch_axis` must be None or a tuple/list/dict of ints "
        f"matching the input_fn's structure; got {batch_axis!r}.")
  if export_saved_model_api_version not in (ExportSavedModelApiVersion.V1,
                                            ExportSavedModelApiVersion.V2):
    raise ValueError(
        f"{owner}: `export_saved_model_api_version` must be "
        "ExportSavedModelApiVersion.V1 or V2; got "
        f"{export_saved_model_api_version!r}.")
  if not (export_to_cpu or export_to_tpu):
    raise ValueError(
        f"{owner}: export_to_cpu and export_to_tpu are both False; "
        "export_saved_model would write nothing.")
  if use_tpu and train_batch_size is None:
    raise ValueError(
        f"{owner}: `train_batch_size` cannot be `None` with use_tpu=True "
        "(a TPU step has a fixed global batch); set it, or use "
        "use_tpu=False.")
  if embedding_config_spec is not None:
    _check_spec(embedding_config_spec, train_batch_size)


def _check_sampling_rate(rate, spec):
  """`profile_sampling_rate` (None or a share of steps) needs the spec's
  profile_data_directory."""
  if rate is None:
    return
  sampling.sampling_period(rate, "TPUEstimator: `profile_sampling_rate`")
  if spec is None or spec.profile_data_directory is None:
    raise ValueError(
        "TPUEstimator: `profile_sampling_rate` is the share of training steps "
        "whose lookups are sampled into the spec's profile_data_directory, "
        "but the embedding_config_spec has no profile_data_directory. Set "
        "one, or drop the argument.")


def _check_model_fn_and_params(model_fn, params):
  owner = "TPUEstimator"
  if model_fn is None or not callable(model_fn):
    raise TypeError(f"{owner}: `model_fn` must be a callable; got "
                    f"{type(model_fn).__name__}.")
  if params is not None and not isinstance(params, dict):
    raise TypeError(f"{owner}: `params` must be a dict; got "
                    f"{type(params).__name__}.")
  reserved = [key for key in _RESERVED_PARAMS if params and key in params]
  if reserved:
    # TF's TPUEstimator reserves these two ('use_tpu' it overwrites).
    raise ValueError(
        f"{owner}: {list(_RESERVED_PARAMS)} are reserved keys but existed in "
        f"params {params}: TPUEstimator sets {reserved} for model_fn and "
        "input_fn. Pass batch sizes as train_batch_size/eval_batch_size/"
        "predict_batch_size and remove these keys.")


def _check_spec(spec, train_batch_size):
  """A spec (not None) must be ours and come with a training batch."""
  if not isinstance(spec, spec_lib.EmbeddingConfigSpec):
    raise TypeError(
        "TPUEstimator: `embedding_config_spec` must be an estimator_spec."
        f"EmbeddingConfigSpec; got {type(spec)!r}. A "
        "spec built with TF's classes converts with estimator_spec."
        "interop.from_tensorflow.")
  if train_batch_size is None:
    raise ValueError(
        "TPUEstimator: `train_batch_size` is required with an "
        "embedding_config_spec (the TPU embedding configuration is "
        "built for a fixed batch size).")


def _with_cluster_session(config):
  """`config` with the session config a host run on a cluster needs
  (`session.cluster_session_config`), when it needs one."""
  cluster_session = (None if config is None else
                     session_lib.cluster_session_config(config))
  if cluster_session is None:
    return config
  return config.replace(session_config=cluster_session)


class TPUEstimator(stack.Estimator):
  """TF 2.15's TPUEstimator, run on the host embedding engine.

  Arguments are those of `tf.compat.v1.estimator.tpu.TPUEstimator`:

  Args:
    model_fn: `model_fn(features, labels, mode, params[, config])` returning
      a `TPUEstimatorSpec` (or a `tf.estimator.EstimatorSpec`).
    model_dir, config, params, warm_start_from: as for `Estimator`; `config`
      may be `tf.compat.v1.estimator.tpu.RunConfig` or a plain `RunConfig`.
      `params` must not hold 'batch_size' or 'context' (TF reserves both);
      model_fn and input_fn find the batch size of the call's mode there,
      model_fn also `use_tpu` (overwritten), and both `context` when the
      mode runs as on a TPU (see `tpu_context`).
    use_tpu: True runs on a TPU when the RunConfig names one (`master`,
      `cluster`, or a local TPU device): the constructor then returns
      `estimator_spec.interop.DelegatedTPUEstimator`, which IS TF's
      `tf.compat.v1.estimator.tpu.TPUEstimator` (train, evaluate, predict,
      export_saved_model are TF's) built with the spec converted by
      `interop.to_tensorflow`; model_fn keeps using our columns, which read
      the activations TF's TPU step puts into `features`. `params` then
      follow TF (per-core `batch_size` in model_fn). An unreachable TPU
      raises `errors.TPUNotReachableError` at train/evaluate/predict.
      Without a TPU, use_tpu=True runs on the host as on the TPU topology
      `tpu_config.num_shards` describes: input_fn is deployed as
      `per_host_input_for_training` says, with `params['context']`, and
      model_fn runs once on the global batch.
    train_batch_size, eval_batch_size, predict_batch_size: global batch
      sizes. A training batch must have exactly `train_batch_size` examples
      (a TPU step has a fixed shape).
    batch_axis: how input tensors would be split across TPU cores; checked
      for form. On the host the whole batch runs as one replica.
    eval_on_tpu: evaluate on the TPU; False (with use_tpu=True) evaluates
      as with use_tpu=False (no context, global batch), as TF does.
    export_to_tpu, export_to_cpu: which serving graphs `export_saved_model`
      writes. The CPU graph is written when `export_to_cpu` is True; a TPU
      serving graph needs a TPU run (not yet available), so on the host
      `export_to_tpu` alone is refused and with `export_to_cpu` a warning
      says no TPU graph was written.
    embedding_config_spec: an `estimator_spec.EmbeddingConfigSpec`.
    export_saved_model_api_version: `ExportSavedModelApiVersion.V1` or `V2`
      (how the TPU serving graph would call model_fn; checked for value).
    cluster_training: an `estimator_spec.ClusterTraining`: how training runs
      on a cluster with `ps` tasks (TF_CONFIG). Default: synchronous, as a
      TPU pod trains: `train_batch_size` is the global batch, each training
      task's input_fn reads `train_batch_size / W` examples (W = chief +
      workers) and gets `params['context']` saying which task it is; one
      update per step from the gradients of all tasks. Not an argument of
      TF's TPUEstimator (which has no cluster off the TPU).
    profile_sampling_rate: with the spec's `profile_data_directory`, the
      share of training steps whose lookups are sampled into lookup
      statistics: one step in round(1 / rate), the first step of each
      `train()` call included. Default 0.02 (a TPU samples about 3% of the
      inputs; at 0.02 the sampling costs at most 2% of step time). Not
      an argument of TF's TPUEstimator (a TPU samples at its own rate).
  """

  # It restores the engine's checkpoints as they are: `convert_for_tf_cpu`
  # refuses it (`checkpoints.tf_cpu.RESTORES_HOST_CHECKPOINTS`).
  restores_host_embedding_checkpoints = True

  def __new__(cls, *args, **kwargs):
    # With use_tpu=True and a TPU named in the RunConfig, the model runs on
    # that TPU through TF's own TPUEstimator (see the class docstring).
    try:
      bound = inspect.signature(cls.__init__).bind(None, *args, **kwargs)
    except TypeError:
      return super().__new__(cls)  # __init__ reports the bad call.
    bound.apply_defaults()
    arguments = dict(bound.arguments)
    del arguments["self"]
    if arguments["use_tpu"] is True and target.tpu_named(arguments["config"]):
      _check_arguments(**arguments)
      if arguments.pop("profile_sampling_rate") is not None:
        raise ValueError(
            "TPUEstimator: `profile_sampling_rate` sets how the host samples "
            "lookup statistics; this RunConfig names a TPU, whose embedding "
            "runtime samples at its own rate. Remove the argument.")
      if arguments.pop("cluster_training") is not None:
        raise ValueError(
            "TPUEstimator: `cluster_training` is for training off the TPU "
            "on a cluster of parameter servers; this RunConfig names a TPU, "
            "which trains synchronously on its own. Remove the argument.")
      return tpu_runner.run(**arguments)
    return super().__new__(cls)

  def __init__(self,
               model_fn=None,
               model_dir=None,
               config=None,
               params=None,
               use_tpu=True,
               train_batch_size=None,
               eval_batch_size=None,
               predict_batch_size=None,
               batch_axis=None,
               eval_on_tpu=True,
               export_to_tpu=True,
               export_to_cpu=True,
               warm_start_from=None,
               embedding_config_spec=None,
               export_saved_model_api_version=ExportSavedModelApiVersion.V1,
               cluster_training=None,
               profile_sampling_rate=None):
    _check_arguments(model_fn, model_dir, config, params, use_tpu,
                     train_batch_size, eval_batch_size, predict_batch_size,
                     batch_axis, eval_on_tpu, export_to_tpu, export_to_cpu,
                     warm_start_from, embedding_config_spec,
                     export_saved_model_api_version,
                     profile_sampling_rate=profile_sampling_rate)
    self._cluster_options = cluster_lib.check_options(cluster_training)
    self._sync_reports = []
    self._user_model_fn = model_fn
    self._embedding_spec = embedding_config_spec
    # Examples per global step, for `examples/sec` (a synchronous cluster
    # step takes the global batch, an asynchronous task step a whole one).
    self._examples_per_step = train_batch_size
    self.use_tpu = use_tpu
    self.eval_on_tpu = eval_on_tpu
    self.export_to_tpu = export_to_tpu
    self.export_to_cpu = export_to_cpu
    self.batch_axis = batch_axis
    self.export_saved_model_api_version = export_saved_model_api_version
    self._exporting = False
    self._warned_plain_lookups = False
    self._reported_settings = False
    # For the progress lines (monitoring.ProgressHook): the steps and
    # max_steps of the train call, and (end time, seconds) of the latest
    # evaluations.
    self._train_until = (None, None)
    self._evaluations = []
    with quiet.library_call():
      super().__init__(
          model_fn=self._host_model_fn,
          model_dir=model_dir,
          config=_with_cluster_session(config),
          params=params or {},
          warm_start_from=warm_start_from)
    self._place(train_batch_size, eval_batch_size, predict_batch_size)
    self._check_emulated_tpu()
    self._profiler = self._make_profiler(profile_sampling_rate)

  def _place(self, train_batch_size, eval_batch_size, predict_batch_size):
    """The run's one `placement.Placement` and the batch size of a step of
    each mode on this task (a training task of a cluster reads its share
    of the global batch in synchronous training). The placement takes the
    TPU topology the RunConfig's `tpu_config` gives, which is this
    layer's to read (`tpu_context`)."""
    cluster = cluster_lib.Cluster.from_run_config(self.config)
    self._placement = placement.Placement(
        self._embedding_spec, cluster,
        cluster_lib.task_batch_size(cluster, self._cluster_options,
                                    train_batch_size),
        tpu_context.Topology.from_run_config(self.config))
    self._batch_sizes = {
        ModeKeys.TRAIN: self._placement.task_batch_size,
        ModeKeys.EVAL: eval_batch_size,
        ModeKeys.PREDICT: predict_batch_size,
    }
    self._input_pipeline = tpu_context.input_pipeline(self.config)

  def _check_emulated_tpu(self):
    """Refuses now what a TPU would refuse: an input deployment TPU
    embedding does not support, a training batch the topology cannot
    split."""
    if self.use_tpu and self._embedding_spec is not None and (
        self._input_pipeline not in (tpu_context.PER_HOST_V1,
                                     tpu_context.PER_HOST_V2)):
      raise ValueError(
          "TPUEstimator: Only PER_HOST_V1 and PER_HOST_V2 is supported when "
          "using TPU Embedding; got tpu_config.per_host_input_for_training="
          f"{tpu_context.pipeline_name(self._input_pipeline)} (TF's "
          "TPUEstimator refuses it too). Use True (PER_HOST_V1) or "
          "InputPipelineConfig.PER_HOST_V2.")
    if self.use_tpu and self._batch_sizes[ModeKeys.TRAIN] is not None:
      # The emulated TPU splits the batch like a TPU would: check it now.
      self._deployment(ModeKeys.TRAIN)

  def _make_profiler(self, sampling_rate):
    """The `profiling.Profiler` of the spec's profile_data_directory, or
    None. Builds the training `EmbeddingConfig` either way: the spec is
    checked against the topology now, not at the first step."""
    spec = self._embedding_spec
    if spec is None:
      return None
    train_config = self._placement.embedding_config(ModeKeys.TRAIN,
                                                    self._batch_sizes)
    if spec.profile_data_directory is None:
      return None
    cluster = self._placement.cluster
    return profiling.Profiler(
        spec.model, spec.profile_data_directory,
        (sampling.DEFAULT_SAMPLING_RATE if sampling_rate is None
         else sampling_rate),
        num_shards=train_config.num_cores,
        writes=cluster is None or cluster.trains)

  @property
  def _cluster(self):
    """The run's `cluster.Cluster` (the placement's), or None."""
    return self._placement.cluster

  def _assert_members_are_not_overridden(self):
    # train/predict/export_saved_model are extended below, as TF's
    # TPUEstimator extends them.
    pass

  # --- Estimator API ---------------------------------------------------------

  def _refuse_special_checkpoint_files(self, method):
    """A checkpoint file in model_dir that TF's reader would wait on for
    ever (a FIFO or a device) is refused before TF reads it (TF reads the
    latest checkpoint's global step first thing)."""
    if not self.model_dir or not os.path.isdir(self.model_dir):
      return
    try:
      checkpoint_tables.resolve_checkpoint(
          self.model_dir, owner=f"TPUEstimator.{method}")
    except FileNotFoundError:
      return  # no checkpoint yet, or TF's reader says what is missing

  def train(self, input_fn, hooks=None, steps=None, max_steps=None,
            saving_listeners=None):
    self._refuse_special_checkpoint_files("train")
    if not self._reported_settings:
      self._reported_settings = True
      notes = host_only_settings(self)
      if notes:
        tf.compat.v1.logging.warning(
            "TPUEstimator on the host: these settings concern TPU hardware "
            "and have no effect here:\n%s", "\n".join(
                f"  * {note}" for note in notes))
    listeners = list(saving_listeners or [])
    if (self._embedding_spec is not None and
        self._embedding_spec.pipeline_execution_with_tensor_core and
        (self.config.save_checkpoints_steps or
         self.config.save_checkpoints_secs)):
      listeners.append(hooks_lib.FlushListener())
    if self._profiler is not None:
      saved = self._profiler.load()
      self._profiler.startup_report(self._placement.embedding_config(
          ModeKeys.TRAIN, self._batch_sizes), saved)
      if self._cluster is not None and self._cluster.trains:
        self._profiler.resolve_ps_assignment(
            self._placement, self.model_dir,
            self._cluster_options.step_timeout_secs, saved)
    if self._cluster is not None and self._cluster.trains:
      cluster_lib.log_cluster(self._cluster, self._cluster_options,
                              self._batch_sizes[ModeKeys.TRAIN])
    del self._sync_reports[:]
    self._train_until = (steps, max_steps)
    try:
      with (cluster_lib.prompt_session_recovery() if self._cluster else
            contextlib.nullcontext()), quiet.library_call():
        return super().train(
            input_fn, hooks=hooks, steps=steps, max_steps=max_steps,
            saving_listeners=listeners)
    except tf.errors.DeadlineExceededError as error:
      if not self._synchronous(ModeKeys.TRAIN):
        raise
      raise sync_lib.timeout_error(self._sync_reports, error) from error

  def evaluate(self, input_fn, steps=None, hooks=None, checkpoint_path=None,
               name=None):
    if self._emulates_tpu(ModeKeys.EVAL) and (
        isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
      # TF's TPUEstimator refuses it too: a TPU evaluates a fixed number of
      # batches.
      raise ValueError(
          "TPUEstimator.evaluate: `steps` must be a positive int when "
          "evaluation runs as on a TPU (use_tpu=True, eval_on_tpu=True); "
          f"got {steps!r}. Pass the number of batches, or construct with "
          "eval_on_tpu=False (or use_tpu=False) to evaluate the whole input.")
    self._refuse_special_checkpoint_files("evaluate")
    started = time.time()
    try:
      with quiet.library_call():
        return super().evaluate(input_fn, steps=steps, hooks=hooks,
                                checkpoint_path=checkpoint_path, name=name)
    finally:
      # A progress line of a training that this evaluation paused says so.
      ended = time.time()
      self._evaluations.append((ended, ended - started))
      del self._evaluations[:-_EVALUATIONS_KEPT]

  def predict(self, input_fn, predict_keys=None, hooks=None,
              checkpoint_path=None, yield_single_examples=True):
    self._refuse_special_checkpoint_files("predict")
    return quiet.quiet_generator(super().predict(
        input_fn, predict_keys=predict_keys, hooks=hooks,
        checkpoint_path=checkpoint_path,
        yield_single_examples=yield_single_examples))

  def export_saved_model(self, export_dir_base, serving_input_receiver_fn,
                         assets_extra=None, as_text=False,
                         checkpoint_path=None,
                         experimental_mode=ModeKeys.PREDICT):
    if not self.export_to_cpu:
      raise ValueError(
          "TPUEstimator.export_saved_model: export_to_cpu=False asks for a "
          "TPU serving graph only, which needs a TPU run (not available in "
          "this version). Use export_to_cpu=True.")
    if self.export_to_tpu:
      tf.compat.v1.logging.warning(
          "TPUEstimator.export_saved_model: no TPU serving graph written "
          "(the model runs on the host engine); the SavedModel has the CPU "
          "serving graph.")
    with quiet.library_call():
      return super().export_saved_model(
          export_dir_base, quiet.users(serving_input_receiver_fn),
          assets_extra=assets_extra, as_text=as_text,
          checkpoint_path=checkpoint_path,
          experimental_mode=experimental_mode)

  def _validate_features_in_predict_input(self, result):
    # Estimator's check looks at top-level tensors only: features that are
    # all SparseTensors read from a Dataset get its false warning "predict
    # yields forever". TF's TPUEstimator skips the check; so does this one.
    del result

  def _call_input_fn(self, input_fn, mode, input_context=None):
    """input_fn as TPUEstimator calls it: with `use_tpu=False` once, with
    the global batch size; when the host emulates a TPU, once per
    invocation of the emulated deployment (see `tpu_context`), each with its
    `params['context']`, and the invocations' batches concatenated into the
    global batch."""
    args = calling.fn_args(input_fn)
    kwargs = calling.input_fn_kwargs(args, mode, self.config, input_context)

    def call(params):
      if "params" in args:
        kwargs["params"] = params
      with tf.compat.v1.device("/cpu:0"), quiet.user_call(), (
          keras2.explained("input_fn")):
        return input_fn(**kwargs)

    if mode == ModeKeys.TRAIN and self._cluster is not None and (
        self._cluster.trains):
      # One call per training task, for its share of the batch; its context
      # says which task it is, as a TPU pod's host is told.
      params = dict(self.params)
      params["batch_size"] = self._batch_sizes[mode]
      params["context"] = tpu_context.TPUContext.for_cluster_task(
          self._cluster, self._batch_sizes[mode], mode)
      return call(params)
    if not self._emulates_tpu(mode):
      params = _Params(self.params, mode=mode)
      if self._batch_sizes.get(mode) is not None:
        params["batch_size"] = self._batch_sizes[mode]
      return call(params)
    deploy = self._deployment(mode)
    results = []
    for index in range(deploy.invocations):
      params = dict(self.params)
      params["batch_size"] = deploy.batch_size
      params["context"] = tpu_context.TPUContext(
          self._placement.tpu_topology, deploy, mode, invocation_index=index)
      results.append(call(params))
    # A TPU step takes one batch per core: training and evaluation stop at
    # the last whole step; prediction pads the last step to the full batch
    # (model_fn's predictions of padded examples are dropped).
    return tpu_context.combine(
        results, deploy.elements_per_step,
        pad_to=self._batch_sizes[mode] if mode == ModeKeys.PREDICT else None)

  def _emulates_tpu(self, mode):
    """Whether `mode` runs as on a TPU (use_tpu=True without a TPU): TF's
    TPUEstimator runs evaluation on the CPU when eval_on_tpu=False, and
    exports the CPU serving graph as a CPU model."""
    if not self.use_tpu or self._exporting:
      return False
    return mode != ModeKeys.EVAL or self.eval_on_tpu

  def _deployment(self, mode):
    batch = self._batch_sizes.get(mode)
    if batch is None:
      raise ValueError(
          f"TPUEstimator: `{_BATCH_ARGUMENT[mode]}` in TPUEstimator "
          f"constructor cannot be `None` if {mode} is running on TPU "
          "(use_tpu=True, emulated on the host here): the TPU topology "
          "splits the global batch. Set it, or use use_tpu=False.")
    return tpu_context.deployment(self._placement.tpu_topology,
                                  self._input_pipeline, mode, batch)

  def _params_for(self, mode, params):
    """`params` for model_fn, as TPUEstimator gives them: the mode's batch
    size, `use_tpu` (overwritten), and `context` when the mode runs as on a
    TPU. On the host, model_fn runs once, as one replica, on the global
    batch: its `batch_size` is the global batch size and its context says
    one replica (see `tpu_context.TPUContext.for_model_fn`)."""
    params = _Params(params, mode=mode)
    batch_size = self._batch_sizes.get(mode)
    if batch_size is not None:
      params["batch_size"] = batch_size
    emulated = self._emulates_tpu(mode)
    params["use_tpu"] = emulated
    if emulated:
      self._deployment(mode)  # The batch must split over the topology.
      params["context"] = tpu_context.TPUContext.for_model_fn(mode)
    return params

  def _export_all_saved_models(self, *args, **kwargs):
    # The serving graph is a CPU graph: model_fn sees use_tpu=False there,
    # as TF's TPUEstimator gives it for its CPU export.
    self._exporting = True
    try:
      return super()._export_all_saved_models(*args, **kwargs)
    finally:
      self._exporting = False

  # --- model_fn on the host --------------------------------------------------

  def _host_model_fn(self, features, labels, mode, config, params):
    real_batch_size = None
    if isinstance(features, dict) and (
        tpu_context.REAL_BATCH_SIZE_KEY in features):
      features = dict(features)
      real_batch_size = features.pop(tpu_context.REAL_BATCH_SIZE_KEY)
    spec = self._model_fn_on_host(features, labels, mode, config, params)
    if real_batch_size is not None and spec.predictions is not None:
      # A padded prediction step: only the real examples' predictions.
      spec = spec._replace(predictions=tf.nest.map_structure(
          lambda p: p[:real_batch_size], spec.predictions))
    return spec

  def _model_fn_on_host(self, features, labels, mode, config, params):
    params = self._params_for(mode, params)
    kwargs = calling.model_fn_kwargs(calling.fn_args(self._user_model_fn),
                                     labels, mode, params, config)
    sync = None
    if self._synchronous(mode):
      sync = sync_lib.SyncStep(self._placement, self._cluster_options,
                               self._sync_reports)
    if self._embedding_spec is None:
      step_value = None
      if sync is not None:
        step_value = (
            tf.compat.v1.train.get_or_create_global_step().read_value())
      spec = self._call_user_model_fn(features, kwargs, sync=sync)
      self._warn_plain_lookups()
      spec = self._estimator_spec(spec)
      return (spec if sync is None else
              host_step.with_sync_step(spec, sync, step_value))
    step = host_step.HostStep(
        self._embedding_spec, mode, config, self._batch_sizes,
        self._placement, sync=sync,
        profiler=self._profiler if mode == ModeKeys.TRAIN else None)
    features, labels = step.begin(features, labels)
    if "labels" in kwargs:
      kwargs["labels"] = labels
    spec = self._call_user_model_fn(features, kwargs, step.source, sync)
    return step.finish(self._estimator_spec(spec))

  def _synchronous(self, mode):
    """Whether `mode` runs synchronous steps over several training tasks."""
    return (mode == ModeKeys.TRAIN and self._cluster is not None and
            self._cluster.trains and
            self._cluster.num_training_tasks > 1 and
            not self._cluster_options.asynchronous)

  def _call_user_model_fn(self, features, kwargs, source=None, sync=None):
    """The user's model_fn, as one replica (CrossShardOptimizer) and with
    the engine's activation source (if any) installed; in a synchronous
    cluster step, with its optimizer's updates recorded (`sync.SyncStep`)."""
    graph = tf.compat.v1.get_default_graph()
    with contextlib.ExitStack() as stack:
      if source is not None:
        stack.enter_context(context.activation_source(source))
      stack.enter_context(replica_context.one_replica(
          None if sync is None else sync_lib.SUM_REDUCTION_REFUSED))
      if sync is not None:
        stack.enter_context(sync.recording())
      try:
        with quiet.user_call():
          spec = self._user_model_fn(features=features, **kwargs)
      except Exception as error:
        tpu_columns.refuse_tensorflow_columns(graph, error)
        raise
    tpu_columns.refuse_tensorflow_columns(graph)
    return spec

  def _estimator_spec(self, spec):
    every_n = getattr(getattr(self.config, "tpu_config", None),
                      "experimental_host_call_every_n_steps", 1)
    spec = to_estimator_spec(spec, every_n)
    every_n_steps = self.config.log_step_count_steps
    if (spec.mode == ModeKeys.TRAIN and every_n_steps and
        self._examples_per_step):
      # TF's TPUEstimator reports examples/sec beside Estimator's
      # global_step/sec; the events are written by the chief, as those.
      output_dir = (self.model_dir if self.config.is_chief and
                    self.config.save_summary_steps else None)
      steps, max_steps = self._train_until
      spec = spec._replace(training_hooks=list(spec.training_hooks) + [
          monitoring.ProgressHook(
              self._examples_per_step, every_n_steps, loss=spec.loss,
              output_dir=output_dir, steps=steps, max_steps=max_steps,
              evaluations=self._evaluations)])
    return spec

  def _warn_plain_lookups(self):
    """Warns once when model_fn looks up our embedding columns while the
    estimator has no embedding_config_spec (their tables then train like any
    variable, with model_fn's optimizer)."""
    names = sorted(set(context.plain_lookups()))
    if names and not self._warned_plain_lookups:
      self._warned_plain_lookups = True
      tf.compat.v1.logging.warning(
          "TPUEstimator: model_fn looks up the TPU embedding columns %s, but "
          "the estimator has no embedding_config_spec: their tables are "
          "ordinary variables trained by model_fn's own optimizer, without "
          "the embedding optimizer, clipping, gradient multiplier or "
          "learning-rate functions a TPU would apply. Pass "
          "embedding_config_spec=estimator_spec.EmbeddingConfigSpec("
          "feature_columns=[...], optimization_parameters=...) to train them "
          "as on a TPU.", names)


_TPU_CONFIG_NOTES = {
    "tpu_job_name": "the job of the TPU workers",
    "initial_infeed_sleep_secs": "a delay before the TPU infeed starts",
    "eval_training_input_configuration":
        "how a TPU splits evaluation input during training",
    "experimental_allow_per_host_v2_parallel_get_next":
        "parallel infeed dequeues on a TPU host",
    "experimental_feed_hook": "a hook around the TPU infeed",
    "input_partition_dims": "spatial partitioning over TPU cores",
    "num_cores_per_replica":
        "model parallelism over TPU cores (the host runs one replica)",
}


def host_only_settings(estimator):
  """What `estimator` accepted that concerns TPU hardware only and has no
  effect on the host, each with the reason (one line each)."""
  notes = []
  tpu_config = getattr(estimator.config, "tpu_config", None)
  if tpu_config is not None:
    with quiet.library_call():  # TF 2.15's TPUConfig is deprecated
      defaults = type(tpu_config)()
    # TF's default (2) is no setting of the user's, and 1 is what the host
    # does anyway.
    if tpu_config.iterations_per_loop not in (1,
                                              defaults.iterations_per_loop):
      notes.append(
          f"tpu_config.iterations_per_loop={tpu_config.iterations_per_loop}: "
          "a TPU runs that many steps per session run; the host runs one "
          "step per run (hooks and logging see every step).")
    for field, what in _TPU_CONFIG_NOTES.items():
      value = getattr(tpu_config, field)
      if value != getattr(defaults, field):
        notes.append(f"tpu_config.{field}={value!r}: {what}.")
    if not estimator.use_tpu and tpu_config.per_host_input_for_training != (
        defaults.per_host_input_for_training):
      notes.append(
          "tpu_config.per_host_input_for_training: how a TPU deploys "
          "input_fn; with use_tpu=False input_fn runs once with the global "
          "batch.")
  if estimator.batch_axis is not None:
    notes.append(
        f"batch_axis={estimator.batch_axis!r}: how a TPU splits inputs over "
        "cores; the host runs the whole batch as one replica.")
  if estimator.export_saved_model_api_version != (
      ExportSavedModelApiVersion.V1):
    notes.append(
        "export_saved_model_api_version: the form of a TPU serving graph; "
        "the host exports the CPU serving graph.")
  spec = estimator._embedding_spec
  if spec is not None:
    model = spec.model
    hot = [t.name for t in model.tables.values() if t.hot_id_replication]
    if hot:
      notes.append(
          f"hot_id_replication of tables {hot}: a TPU placement hint "
          "(written to the configuration proto); the host keeps one copy of "
          "each row.")
    unaccumulated = sorted(
        name for name in model.tables
        if model.optimizer_for(name) is not None and
        not model.optimizer_for(name).use_gradient_accumulation)
    if unaccumulated:
      notes.append(
          f"use_gradient_accumulation=False (tables {unaccumulated}): the "
          "host always sums a step's gradients per id before one update "
          "(the TPU default).")
  return notes


__all__ = ["TPUEstimator", "TPUEstimatorSpec", "ExportSavedModelApiVersion",
           "host_only_settings"]
