"""The host's side of one model_fn call with an embedding_config_spec.

A TPU runs every step as: look up the tables, run the dense model, send
the activation gradients back, update the tables. `HostStep` does the same
around the user's model_fn on the host embedding engine:

  step = HostStep(spec, mode, run_config, batch_sizes, placement)
  features, labels = step.begin(features, labels)   # checks, lookups
  estimator_spec = <model_fn(features, labels, ...) with step.source>
  estimator_spec = step.finish(estimator_spec)      # table update, saver

* `begin` checks the batch (`batch_checks`), builds the engine on the
  run's `placement.Placement` and starts the lookups; with the dict form of
  the spec it puts the activations into `features`, as TPUEstimator does.
* `source` feeds the columns in model_fn from those lookups. In training,
  every activation passes through a gradient tap (`_GradientTap`), so that
  the activation gradients come from the user's own backward pass: the
  dense backward pass runs once per step.
* `finish` refuses a model that leaves a configured feature without a
  gradient, adds the engine's update to the train op (ordered after the
  step's read of the global step), the pipelining flush hooks, and a
  layout-aware saver.
"""
import collections
import contextlib

import tensorflow as tf

from tpu_embedding_columns import context

from estimator_spec.checkpoints import restore as checkpoints
from estimator_spec.cluster import assignment_file
from estimator_spec.engine import engine as engine_lib
from estimator_spec.estimator import batch_checks
from estimator_spec.estimator import hooks as hooks_lib
from estimator_spec.estimator import monitoring
from estimator_spec.estimator import stack
from estimator_spec.tf_patches import control_inputs
from estimator_spec.tf_patches import gradient_taps

ModeKeys = stack.ModeKeys


class HostStep:
  """The embedding work of one model_fn call on the host.

  Args:
    spec: the estimator's `EmbeddingConfigSpec`.
    mode: the call's `tf.estimator.ModeKeys` value.
    run_config: the estimator's RunConfig (checkpoint and summary
      settings).
    batch_sizes: {mode: batch size of one step of this task, or None}.
    placement: the estimator's `placement.Placement` (cluster, the
      `EmbeddingConfig` of the mode, partition devices, ps assignment).
    sync: the `cluster.sync.SyncStep` of a synchronous cluster step, or
      None.
    profiler: the estimator's `profiling.Profiler` (profile_data_directory),
      or None; training steps then sample their lookups.

  Call `begin`, then model_fn with `source` installed, then `finish`.
  Without engine features (tensor-core columns only) the step checks the
  training batch and leaves the rest to the model.
  """

  def __init__(self, spec, mode, run_config, batch_sizes, placement,
               sync=None, profiler=None):
    self._spec = spec
    self._placement = placement
    self._profiler = profiler
    self._sync = sync
    self._mode = mode
    self._run_config = run_config
    self._batch_sizes = batch_sizes
    self._training = mode == ModeKeys.TRAIN
    self.source = None  # the ActivationSource for model_fn's columns
    self._engine = None
    self._local_device = None  # this task's device on a cluster
    self._lookup = None
    self._tap = None
    self._global_step = None
    self._step_value = None
    self._first_model_op = None

  def begin(self, features, labels):
    """Checks the batch and starts the step's lookups; returns the
    (features, labels) to hand to model_fn."""
    if not isinstance(features, dict):
      raise TypeError(
          "TPUEstimator: with an embedding_config_spec, input_fn must give "
          f"features as a dict; got {type(features).__name__}.")
    expected = self._batch_sizes[ModeKeys.TRAIN] if self._training else None
    if self._training:
      self._global_step = tf.compat.v1.train.get_or_create_global_step()
      self._step_value = self._global_step.read_value()
    if not self._spec.model.features:
      # Only tensor-core columns: the dense model looks them up itself.
      if expected is None:
        return features, labels
      return batch_checks.check_train_batch(features, labels, expected)
    config = self._placement.embedding_config(self._mode, self._batch_sizes)
    cluster = self._placement.cluster
    self._local_device = cluster.device if cluster else None
    self._engine = engine_lib.HostEmbeddingEngine(
        config, num_shards=config.num_hosts,
        shard_device_fn=self._placement.shard_device_fn(self._mode),
        local_device=self._local_device)
    self._lookup = self._engine.begin_lookup(features)
    features, labels = batch_checks.check_lookup_batch(
        self._lookup, features, labels, expected)
    tap = lambda names, activations: list(activations)
    if self._training:
      # Lookups (and so every update of the step) follow the read of the
      # global step, which the user's train op increments.
      with engine_lib.device_scope(self._local_device):
        self._tap = _GradientTap(after=self._step_value)
      if self._sync is not None:
        self._sync.add_local_variables([self._tap.anchor])
      tap = self._tap.tap
    self.source = _EngineSource(self._engine, self._lookup, tap)
    model = self._engine.model
    if not model.uses_columns:
      features = _dict_form_features(features, model, self._lookup, tap)
    self._first_model_op = len(
        tf.compat.v1.get_default_graph().get_operations())
    return features, labels

  def finish(self, spec):
    """The `tf.estimator.EstimatorSpec` model_fn returned (converted), with
    the step's table update in its train op when training."""
    if self._engine is None:
      if self._sync is not None:
        return with_sync_step(spec, self._sync, self._step_value)
      return spec
    if not self._training:
      return _with_layout_aware_saver(spec, self._engine, self._run_config)
    model = self._engine.model
    gradients = self._activation_gradients(spec)
    result = self._lookup.result()
    if self._sync is not None:
      # The chief applies every task's gradients (see `cluster.sync`).
      spec = with_sync_step(
          spec, self._sync, self._step_value,
          self._engine.table_gradients(result, gradients, self._step_value),
          self._engine)
      train_op = spec.train_op
    else:
      update = self._engine.apply_gradients(result, gradients,
                                            self._step_value)
      train_op = tf.group(spec.train_op, update, name="train_with_embedding")
    # After the optimizer made its state (the chief's, in a synchronous
    # step, is made by `SyncStep.finish`).
    self._tap.keep_anchor_state_local()
    _order_after(self._step_value, self._global_step, self._first_model_op)
    if self._run_config.save_summary_steps:
      # Per-table summaries, evaluated at summary steps only.
      monitoring.add_table_summaries(self._engine, self._lookup.tables,
                                     self._step_value)
    hooks = list(spec.training_hooks)
    if model.pipeline_execution_with_tensor_core:
      hooks.append(hooks_lib.flush_at_end(self._engine.flush()))
    if self._profiler is not None:
      # Every step runs the sampling op (it and its staging area stay on
      # this task, by the ids): docs/profile.md, 'Sampling'.
      with engine_lib.device_scope(self._local_device):
        sample, hook = self._profiler.sampling(self._lookup.feature_ids,
                                               self._run_config)
      train_op = tf.group(train_op, sample, name="train_with_statistics")
      hooks.append(hook)
    spec = spec._replace(train_op=train_op, training_hooks=hooks)
    return _with_layout_aware_saver(
        spec, self._engine, self._run_config, training=True,
        ps_assignment=self._placement.ps_assignment)

  def _activation_gradients(self, spec):
    """{feature: d loss / d activation} of a training step; refuses a
    model_fn that leaves a configured feature untrained."""
    model = self._engine.model
    # The dict form hands every activation to model_fn; whether the loss
    # uses them shows in their gradients below.
    unused = ([f for f in model.features if f not in self.source.used]
              if model.uses_columns else [])
    if unused:
      raise ValueError(
          "TPUEstimator: model_fn never uses the embedding columns of "
          f"features {unused}, which the embedding_config_spec configures. "
          "Every configured column must feed the model (a TPU step looks up "
          "and trains every table); remove unused columns from the spec.")
    if spec.loss is None or spec.train_op is None:
      raise ValueError("TPUEstimator: in TRAIN mode model_fn must return a "
                       "loss and a train_op.")
    gradients = self._tap.gradients(spec.loss)
    missing = [f for f, g in gradients.items() if g is None]
    if missing:
      raise ValueError(
          f"TPUEstimator: the loss does not depend on the activations of "
          f"features {missing}, so their tables get no gradient. Every "
          "configured column must feed the loss.")
    return gradients


# Activations per tap (one IdentityN): graph walkers that visit an op's
# inputs once per output (Keras' history check of a layer's inputs) take
# n * n steps through an op of n inputs and outputs.
_TAP_GROUP = 64


class _GradientTap:
  """Gets d loss / d activation from the user's own backward pass.

  Each activation passes through an identity (one IdentityN op) whose
  second input is a scalar "anchor" variable the user's optimizer finds
  (collection TRAINABLE_RESOURCE_VARIABLES, which
  `Optimizer.compute_gradients` reads but `tf.compat.v1.trainable_variables()`
  does not). When the optimizer differentiates the loss, the identity's
  gradient function receives the activation's gradient and records it; the
  anchor itself gets a zero gradient, so that `minimize` works for a loss of
  embedding activations only, and it never moves from 0. The anchor and
  whatever the optimizer creates for it are local variables: they are not
  in checkpoints. Each tapped activation waits for `after` (a tensor).
  """

  def __init__(self, after):
    with tf.compat.v1.name_scope(None):
      self.anchor = tf.compat.v1.Variable(
          0.0,
          name="tpu_embedding_gradient_anchor",
          trainable=False,
          use_resource=True,
          collections=[
              tf.compat.v1.GraphKeys.LOCAL_VARIABLES,
              tf.compat.v1.GraphKeys.TRAINABLE_RESOURCE_VARIABLES
          ])
      self._anchor_value = self.anchor.read_value()
    self._after = after
    self.tapped = collections.OrderedDict()    # feature -> tapped tensor
    self.recorded = collections.defaultdict(list)

  def tap(self, features, activations):
    """The tapped `activations` of `features` (names, in order): through
    one IdentityN per _TAP_GROUP of those not tapped yet."""
    new = [(f, a) for f, a in zip(features, activations)
           if f not in self.tapped]
    for start in range(0, len(new), _TAP_GROUP):
      group = new[start:start + _TAP_GROUP]
      with tf.control_dependencies([self._after]):
        tapped = gradient_taps.tapped_many(
            [a for _, a in group], self._anchor_value,
            [self.recorded[f] for f, _ in group])
      self.tapped.update(zip([f for f, _ in group], tapped))
    return [self.tapped[f] for f in features]

  def keep_anchor_state_local(self):
    """Moves what the user's optimizer created for the anchor (its slots)
    from the global to the local variables: initialized every session, never
    saved, so checkpoints hold only the model's own state."""
    graph = tf.compat.v1.get_default_graph()
    prefix = self.anchor.op.name + "/"
    global_variables = graph.get_collection_ref(
        tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
    for variable in [v for v in global_variables
                     if v.op.name.startswith(prefix)]:
      global_variables.remove(variable)
      graph.add_to_collection(tf.compat.v1.GraphKeys.LOCAL_VARIABLES,
                              variable)

  def gradients(self, loss):
    """{feature: gradient or None}: recorded when the user's optimizer ran
    exactly one backward pass through every tap, else from `loss`."""
    features = list(self.tapped)
    counts = {len(self.recorded.get(f, ())) for f in features}
    if counts == {1}:
      return {f: self.recorded[f][0] for f in features}
    if loss is None:
      return {f: None for f in features}
    grads = tf.gradients(loss, [self.tapped[f] for f in features])
    return dict(zip(features, grads))


class _EngineSource(context.ActivationSource):
  """Feeds the columns in model_fn from the engine's `LookupStep`."""

  def __init__(self, engine, lookup, tap):
    self._engine = engine
    self._lookup = lookup
    self._tap = tap
    self.used = collections.OrderedDict()
    self._activations = {}  # feature name -> tapped activation

  def _feature(self, column):
    return self._engine.model.feature_of_column(column)

  def register_variable(self, column, variable_name):
    feature = self._feature(column)
    self._engine.set_variable_name(feature.table, variable_name)

  def dense_activation(self, column):
    feature = self._feature(column)
    self.used[feature.name] = column
    return self._tapped(feature)

  def sequence_activation(self, column):
    feature = self._feature(column)
    self.used[feature.name] = column
    return (self._tapped(feature),
            self._lookup.sequence_length(feature.name))

  def _tapped(self, feature):
    """The tapped activation of `feature`: every feature of its table is
    tapped together, the first time one of them is asked for."""
    if feature.name not in self._activations:
      names = list(self._engine.model.tables[feature.table].features)
      self._activations.update(zip(names, self._tap(
          names, [self._lookup.activation(name) for name in names])))
    return self._activations[feature.name]

  def step_tables(self):
    """{table name: StepTable} of every table of the step (see
    `step_tables`)."""
    missing = [name for name in self._engine.model.tables
               if name not in self._lookup.tables]
    if missing:
      # Looking them up here would create their variables under names the
      # columns have not registered yet (checkpoints would not match).
      raise RuntimeError(
          f"step_tables: tables {missing} were not looked up yet; call it "
          "after model_fn's embedding columns have produced their "
          "activations.")
    result = collections.OrderedDict()
    for name, table in self._engine.model.tables.items():
      lookup = self._lookup.tables[name]
      result[name] = StepTable(
          name, table.vocabulary_size, lookup.unique_ids,
          self._engine.table_rows(name).read_all)
    return result


# One table as model_fn sees it during a host step: `ids` (int64 [n]) are
# the distinct rows the step looks up, which a training step's update
# writes; `read_rows()` returns the whole table [vocabulary_size, dimension]
# in row order (whatever the partition layout).
StepTable = collections.namedtuple(
    "StepTable", ["name", "vocabulary_size", "ids", "read_rows"])


def step_tables():
  """Inside a model_fn that the host TPUEstimator runs with an
  embedding_config_spec: {table name: `StepTable`} of the current step, for
  monitoring (rows touched, embedding norms); call it after the columns
  produced their activations. A TPU keeps its tables on the
  TPU, out of model_fn's reach; this exists on the host only."""
  source = context.current_source()
  if not isinstance(source, _EngineSource):
    raise RuntimeError(
        "step_tables: call it inside a model_fn run by the host "
        "TPUEstimator with an embedding_config_spec whose tables the "
        "engine looks up (not on a TPU, nor outside model_fn).")
  return source.step_tables()


def with_sync_step(spec, sync, step_value, embedding=None, engine=None):
  """`spec` (model_fn's, TRAIN) with the synchronous step of `sync`, a
  `cluster.sync.SyncStep`: its train op grouped with the step's, the
  step's hooks after its own (`SyncStep.finish`)."""
  train_op, hooks = sync.finish(spec.train_op, step_value, embedding, engine)
  return spec._replace(train_op=train_op,
                       training_hooks=list(spec.training_hooks) + hooks)


def _with_layout_aware_saver(spec, engine, config, training=False,
                             ps_assignment=None):
  """Gives the spec's Scaffold a `checkpoints.LayoutAwareSaver` (unless
  the model brings its own saver): checkpoints of other topologies and of
  TF's CPU path restore into the engine's tables correctly. Training
  checkpoints record the partition strategy and a cluster's ps
  assignment."""
  scaffold = spec.scaffold
  if scaffold is not None and scaffold.saver is not None:
    return spec
  # A training save reads the tables without copying them (the engine's
  # `share_on_read`; docs/performance.md, 'Table size').
  share = engine.share_on_read() if training else None
  with (tf.control_dependencies([share]) if share is not None else
        contextlib.nullcontext()):
    saver = checkpoints.LayoutAwareSaver(
        engine,
        allow_missing_slots=training,
        record_layout=training,
        record=assignment_file.checkpoint_record(ps_assignment),
        sharded=True,
        max_to_keep=config.keep_checkpoint_max,
        keep_checkpoint_every_n_hours=config.keep_checkpoint_every_n_hours,
        save_relative_paths=True)
  return spec._replace(scaffold=tf.compat.v1.train.Scaffold(
      saver=saver, copy_from_scaffold=scaffold) if scaffold is not None else
                       tf.compat.v1.train.Scaffold(saver=saver))


def _order_after(step_value, global_step, first_op):
  """Makes every write of the global step that model_fn created wait for
  `step_value` and for every other read of the step model_fn made (unless
  that read itself follows the write), so that the engine's learning-rate
  functions, the gradient multiplier and the user's own reads (e.g. for a
  host_call) all see the step as it was at the start of the step."""
  graph = tf.compat.v1.get_default_graph()
  target = (global_step.handle if hasattr(global_step, "handle") else
            global_step.op.outputs[0]).name
  new_ops = graph.get_operations()[first_op:]
  writes = [
      op for op in new_ops
      if op.type in ("AssignAddVariableOp", "AssignVariableOp", "AssignAdd",
                     "Assign") and op.inputs and op.inputs[0].name == target
  ]
  reads = [step_value.op] + [
      op for op in new_ops
      if op.type == "ReadVariableOp" and op.inputs[0].name == target
  ]
  for read in reads:
    before = _ancestors(read)
    for write in writes:
      if write not in before and read not in write.control_inputs:
        control_inputs.add_control_input(write, read)


def _ancestors(op):
  """Every op `op` depends on (data and control inputs)."""
  seen = set()
  stack = [op]
  while stack:
    current = stack.pop()
    for parent in [t.op for t in current.inputs] + list(current.control_inputs):
      if parent not in seen:
        seen.add(parent)
        stack.append(parent)
  return seen


def _dict_form_features(features, model, lookup, tap):
  """features with each configured feature's activation in place of its
  ids (and its sequence lengths under `Feature.length_key`), weights removed, as
  TPUEstimator hands them to model_fn on a TPU."""
  result = dict(features)
  tapped = {}
  for name, feature in model.features.items():
    if name not in tapped:
      # Every feature of its table, tapped together.
      names = list(model.tables[feature.table].features)
      tapped.update(zip(names, tap(
          names, [lookup.activation(other) for other in names])))
    result[name] = tapped[name]
    if feature.is_sequence:
      result[feature.length_key] = lookup.sequence_length(name)
    if feature.weight_key is not None:
      result.pop(feature.weight_key, None)
  return result
