"""The spec as TF2's mid-level TPU embedding API, and checkpoints for it.

`to_mid_level(spec)` gives the `tf.tpu.experimental.embedding` objects
(FeatureConfig / TableConfig / optimizer) that describe the same tables,
features and training settings; `export_mid_level_checkpoint` writes the
tables and slots of a TPUEstimator checkpoint as the object-based
checkpoint `TPUEmbedding` / `TPUEmbeddingForServing` restore.
"""
import collections
import os
import shutil
import tempfile

import tensorflow as tf

from estimator_spec.checkpoints import restore as checkpoints
from estimator_spec.checkpoints import convert
from estimator_spec.config import optimizers as _opt
from estimator_spec.checkpoints import progress as _progress
from estimator_spec.config import sharding
from tpu_embedding_columns import _checks

_tpu = tf.tpu.experimental.embedding

# The optimizers TF 2.15's mid-level API has (each class knows its TF2
# counterpart: `mid_level_class`).
_TF2_NAMES = ", ".join(
    cls.mid_level_class for cls in _opt.ALL_OPTIMIZERS if cls.mid_level_class)


class MidLevelConfig(
    collections.namedtuple("MidLevelConfig", ["feature_config", "optimizer"])):
  """What `to_mid_level` returns; unpacks as `(feature_config, optimizer)`.

  Attributes:
    feature_config: {feature name: `tf.tpu.experimental.embedding.
      FeatureConfig`}; features of one table share one `TableConfig`.
    optimizer: the spec-wide TF2 optimizer (None if the spec has none).
      Tables with their own optimizer or learning rate carry it in their
      `TableConfig.optimizer`.
    tables: {table name: TableConfig}, tables sorted by name.
    pipeline_execution_with_tensor_core: the spec's flag; TF2's
      `TPUEmbedding` takes it as an argument of the same name.
    weight_keys: {feature name: key of its weights in the features dict};
      TF2 takes weights as a separate `weights` structure in its lookups.
  """

  def __new__(cls, feature_config, optimizer, tables=None,
              pipeline_execution_with_tensor_core=False, weight_keys=None):
    self = super().__new__(cls, feature_config, optimizer)
    self.tables = dict(tables or {})
    self.pipeline_execution_with_tensor_core = (
        pipeline_execution_with_tensor_core)
    self.weight_keys = dict(weight_keys or {})
    return self

  def tpu_embedding_kwargs(self):
    """Keyword arguments for `tf.tpu.experimental.embedding.TPUEmbedding`."""
    return dict(feature_config=self.feature_config, optimizer=self.optimizer,
                pipeline_execution_with_tensor_core=(
                    self.pipeline_execution_with_tensor_core))


def to_mid_level(spec, *, global_step=None, for_serving=False):
  """The TF2 mid-level API configuration of an `EmbeddingConfigSpec`.

  Tables keep their names (the config model's: `tbl_<variable name>` from
  columns, the dict keys otherwise), vocabulary sizes, dimensions and
  initializers; the combiner `None` (one id per example) becomes 'sum',
  which gives that id's row, as on the TPU. Optimizers map to TF2's class
  of the same rule with every hyper-parameter carried over; the gradient
  clipping of the optimizer and the spec's `clipping_limit` become TF2's
  `clipvalue=(lower, upper)` (the tighter bound of each side). A table with
  its own optimizer (dict form) or its own `learning_rate` /
  `learning_rate_fn` gets its own TF2 optimizer in its `TableConfig`.
  Tensor-core columns are not part of it: in TF2, as in the spec, the dense
  model looks them up.

  Args:
    spec: an `estimator_spec.EmbeddingConfigSpec`.
    global_step: a `tf.Variable` counting training steps (e.g. a Keras
      optimizer's `iterations`); needed when a table has a
      `learning_rate_fn`, which TF2 calls with no argument: the TF2
      learning rate is `lambda: learning_rate_fn(global_step)`, one per
      distinct function. Refused when no table has a `learning_rate_fn`.
    for_serving: True to build the configuration for lookups only
      (`TPUEmbeddingForServing`, `export_mid_level_checkpoint`): settings
      that only act in training and that TF2 lacks (gradient multiplier,
      `hot_id_replication`, `profile_data_directory`) are not refused, and
      tables with a `learning_rate_fn` use their optimizer's constant
      learning rate. The optimizers still map (they decide the slots).

  Returns:
    A `MidLevelConfig`: `feature_config, optimizer = to_mid_level(spec)`;
    also `.tables`, `.pipeline_execution_with_tensor_core`,
    `.weight_keys` and `.tpu_embedding_kwargs()`.

  Raises:
    ValueError: naming the table, optimizer or argument, for what TF 2.15's
      mid-level API cannot express: the optimizers Momentum, RMSProp,
      ProximalAdagrad and ProximalYogi; an FTRL
      `initial_accumulator_value` of 0; and, unless `for_serving`,
      `experimental_gradient_multiplier_fn`, `hot_id_replication`,
      `profile_data_directory`, a `learning_rate_fn` without
      `global_step`, or a spec without an optimizer.
    TypeError: `spec`, `global_step` or `for_serving` of the wrong type.
  """
  return _build(spec, global_step=global_step, for_serving=for_serving,
                owner="to_mid_level")


def _build(spec, *, global_step, for_serving, owner, skeleton=False):
  model = convert.check_spec(owner, spec)
  for_serving = _checks.check_bool(owner, "for_serving", for_serving)
  uses_fn = [name for name in model.tables
             if model.learning_rate(name).fn is not None]
  if global_step is not None:
    if not isinstance(global_step, tf.Variable):
      _checks.fail(owner, "global_step", "must be a tf.Variable", global_step,
                   TypeError)
    if for_serving:
      raise ValueError(
          f"{owner}: `global_step` only feeds learning_rate_fn in training; "
          "drop it with for_serving=True.")
    if not uses_fn:
      raise ValueError(
          f"{owner}: `global_step` is only used for learning_rate_fn, and no "
          "table of this spec has one; drop it.")
  if not for_serving:
    _refuse_training_only(owner, model, uses_fn, global_step)

  converted = {}  # (id(parameters), learning rate key) -> TF2 optimizer
  keep = []  # keeps the parameter objects behind the ids alive

  def tf2_optimizer(parameters, rate, where):
    fn = rate if callable(rate) else None
    key = (id(parameters), ("fn", id(fn)) if fn else ("const", rate))
    if key not in converted:
      keep.append((parameters, fn))
      learning_rate = rate
      if fn is not None:
        learning_rate = _step_rate(fn, global_step)
      converted[key] = _convert_optimizer(model, parameters, learning_rate,
                                          where, owner)
    return converted[key]

  spec_optimizer = None
  if model.optimizer is not None:
    spec_optimizer = tf2_optimizer(model.optimizer,
                                   model.optimizer.learning_rate,
                                   "optimization_parameters")
  tables = {}
  for name, table in model.tables.items():
    parameters = model.optimizer_for(name)
    own = None
    if parameters is not None:
      _check_convertible(owner, parameters, f"table {name!r}")
      rate = model.learning_rate(name)
      # Serving has no global step: a table's schedule gives way to its
      # optimizer's constant rate.
      rate = (parameters.learning_rate if for_serving and rate.fn else
              rate.fn or rate.constant)
      if table.table_optimizer is not None or (
          rate != parameters.learning_rate):
        own = tf2_optimizer(parameters, rate, f"table {name!r}")
    try:
      tables[name] = _tpu.TableConfig(
          vocabulary_size=1 if skeleton else table.vocabulary_size,
          dim=table.dimension,
          initializer=(tf.zeros_initializer() if skeleton else
                       table.initializer),
          optimizer=own,
          combiner=table.combiner or "sum",
          name=name)
    except (TypeError, ValueError) as error:
      raise ValueError(
          f"{owner}: table {name!r}: TF2's TableConfig refuses it: "
          f"{error}") from error
  feature_config = {
      name: _tpu.FeatureConfig(table=tables[feature.table],
                               max_sequence_length=feature.max_sequence_length,
                               name=name)
      for name, feature in model.features.items()
  }
  return MidLevelConfig(
      feature_config, spec_optimizer, tables=tables,
      pipeline_execution_with_tensor_core=(
          model.pipeline_execution_with_tensor_core),
      weight_keys={
          name: f.weight_key for name, f in model.features.items()
          if f.weight_key is not None
      })


def _refuse_training_only(owner, model, uses_fn, global_step):
  if model.gradient_multiplier_fn is not None:
    raise ValueError(
        f"{owner}: the spec's `experimental_gradient_multiplier_fn` has no "
        "counterpart in TF 2.15's mid-level API (TPUEmbedding applies the "
        "gradients it is given); scale the activation gradients in your TF2 "
        "training step and drop it from the spec, or pass for_serving=True "
        "for lookups only.")
  if model.profile_data_directory is not None:
    raise ValueError(
        f"{owner}: the spec's `profile_data_directory` has no counterpart in "
        "TF 2.15's mid-level API; drop it, or pass for_serving=True for "
        "lookups only.")
  hot = sorted(t.name for t in model.tables.values() if t.hot_id_replication)
  if hot:
    raise ValueError(
        f"{owner}: tables {hot} set `hot_id_replication`, which TF 2.15's "
        "mid-level TableConfig lacks; set it to False, or pass "
        "for_serving=True for lookups only.")
  if uses_fn and global_step is None:
    raise ValueError(
        f"{owner}: tables {uses_fn} have a `learning_rate_fn(global_step)`, "
        "but TF2 calls learning rates with no argument; pass "
        "`global_step=` (a tf.Variable counting steps, e.g. your Keras "
        "optimizer's `iterations`) to have it called with that variable.")
  missing = sorted(t for t in model.tables if model.optimizer_for(t) is None)
  if missing:
    raise ValueError(
        f"{owner}: tables {missing} have no optimizer (the spec has no "
        "`optimization_parameters`); TF2's TPUEmbedding needs one to train. "
        "Give the spec an optimizer, or pass for_serving=True for lookups "
        "only.")


def _step_rate(fn, global_step):
  def rate():
    return fn(global_step)
  rate.__name__ = f"{getattr(fn, '__name__', 'learning_rate_fn')}_of_step"
  return rate


def _check_convertible(owner, parameters, where):
  if parameters.mid_level_class is None:
    raise ValueError(
        f"{owner}: {where} uses {type(parameters).__name__}, which TF 2.15's "
        f"tf.tpu.experimental.embedding does not have (it has {_TF2_NAMES}); "
        "train it with one of those to use the mid-level API.")


def _convert_optimizer(model, parameters, learning_rate, where, owner):
  _check_convertible(owner, parameters, where)
  lower, upper = model.gradient_clip_bounds(parameters)
  common = dict(
      learning_rate=learning_rate,
      use_gradient_accumulation=parameters.use_gradient_accumulation,
      clip_weight_min=parameters.clip_weight_min,
      clip_weight_max=parameters.clip_weight_max,
      weight_decay_factor=parameters.weight_decay_factor,
      multiply_weight_decay_factor_by_learning_rate=(
          parameters.multiply_weight_decay_factor_by_learning_rate),
      clipvalue=None if lower is None and upper is None else (lower, upper))
  p = parameters
  try:
    try:
      arguments = p.mid_level_arguments()
    except ValueError as error:
      raise ValueError(f"{owner}: {where} uses {error}") from error
    return getattr(_tpu, p.mid_level_class)(**arguments, **common)
  except ValueError as error:
    if str(error).startswith(owner):
      raise
    raise ValueError(
        f"{owner}: {where}: TF2's {type(p).__name__} counterpart refuses "
        f"{p!r}: {error}") from error


# --- checkpoint export ----------------------------------------------------------


def export_mid_level_checkpoint(model_dir, spec, output_prefix, *,
                                variable_names=None,
                                allow_missing_slots=False,
                                attribute="embedding", progress=False):
  """Writes a TPUEstimator checkpoint's tables and slots for TF2.

  Reads the latest checkpoint of `model_dir` (or the checkpoint prefix
  given), puts each table's and slot's rows back into row order (`mod`
  tables are stored in partition order; the partition count comes from the
  checkpoint, the strategy from what the checkpoint records, else from the
  spec) and writes an object-based
  checkpoint that

      config = to_mid_level(spec, for_serving=True)
      embedding = tf.tpu.experimental.embedding.TPUEmbeddingForServing(
          config.feature_config, config.optimizer)
      tf.train.Checkpoint(embedding=embedding).restore(path)

  restores completely (`assert_consumed()` holds once the embedding is
  built): the tables, and the optimizer slots TF2 creates for them
  (Adagrad `accumulators`, Adam `momenta`/`velocities`, FTRL
  `accumulators`/`linears`, AdagradMomentum `accumulators`/`momenta`).
  The checkpoint holds the same object graph a `tf.train.Checkpoint` of
  that embedding saves (with `save_counter`). Memory: one table (or slot)
  in row order plus one stored partition of it at a time.

  Args:
    model_dir: a TPUEstimator model directory or a checkpoint prefix.
    spec: the `EmbeddingConfigSpec` the model was trained with.
    output_prefix: where to write (e.g. `export/embedding`); must not hold a
      checkpoint yet. Its directory gets a `checkpoint` state file naming it
      if it has none.
    variable_names: optional {table name: checkpoint tensor name} for tables
      whose tensor cannot be found unambiguously (see
      `estimator_spec.checkpoints.convert.locate_tables`).
    allow_missing_slots: a checkpoint without a table's slots (e.g. written
      by TF's CPU path) is refused unless True; then the slots get their
      initial values.
    attribute: the name of the embedding object in the restoring
      `tf.train.Checkpoint(...)` (default 'embedding').
    progress: True for a progress bar per table on stderr, a text stream
      for one there, False/None for none.

  Returns:
    The written checkpoint prefix (absolute).

  Raises:
    FileNotFoundError: no checkpoint in `model_dir`.
    FileExistsError: `output_prefix` already holds a checkpoint.
    ValueError, TypeError: the spec does not convert (see `to_mid_level`),
      a table or slot is not in the checkpoint, or bad arguments. Nothing
      is written then.
  """
  owner = "export_mid_level_checkpoint"
  model = convert.check_spec(owner, spec)
  allow_missing_slots = _checks.check_bool(owner, "allow_missing_slots",
                                           allow_missing_slots)
  attribute = _checks.check_str(owner, "attribute", attribute)
  if not attribute.isidentifier():
    _checks.fail(owner, "attribute", "must be a Python identifier",
                 attribute)
  bar = _progress.factory(progress)
  _build(spec, global_step=None, for_serving=True, owner=owner)
  prefix = convert.resolve_checkpoint(model_dir, owner)
  reader = tf.compat.v1.train.NewCheckpointReader(prefix)
  table_tensors = convert.locate_tables(reader, model, variable_names, owner)
  stored = checkpoints.stored_partitions(reader)
  slice_shapes = checkpoints.stored_slice_shapes(reader)
  shapes = reader.get_variable_to_shape_map()
  dtypes = reader.get_variable_to_dtype_map()

  plans = []
  missing = []
  for name, tensor in table_tensors.items():
    table = model.tables[name]
    parameters = model.optimizer_for(name)
    slots = []
    if parameters is not None:
      for slot in parameters.slot_specs():
        source = f"{tensor}/{slot.suffix}"
        shape = [table.vocabulary_size, table.dimension]
        if source not in shapes or list(shapes[source]) != shape:
          missing.append(source)
          source = None
        slots.append((slot.mid_level, source,
                      slot.initial_value))
    plans.append((name, table, tensor, slots))
  if missing and not allow_missing_slots:
    raise ValueError(
        f"{owner}: the checkpoint {prefix} has no slot tensors {missing} "
        "(written by a run whose optimizer had no such slots?); pass "
        "allow_missing_slots=True to export them at their initial values.")

  keys, extra = _object_graph_keys(spec, attribute, owner)
  expected = {name for name, *_ in plans} | {
      f"{name}/{slot}" for name, _, _, slots in plans for slot, *_ in slots
  }
  if set(keys) != expected:
    raise RuntimeError(
        f"Internal error: TPUEmbeddingForServing checkpoints variables "
        f"{sorted(keys)}, expected {sorted(expected)}.")

  written_strategy = (checkpoints.recorded_strategy(reader) or
                      model.partition_strategy)
  with convert.StagedCheckpoint(output_prefix, owner) as staged:
    staged.save(*extra)
    for name, table, tensor, slots in plans:
      row_order = sharding.ShardLayout(table.vocabulary_size, 1, "div")
      with bar(name, table.vocabulary_size * (1 + len(slots))) as shown:
        sources = [(keys[name], tensor, 0.0)] + [
            (keys[f"{name}/{slot}"], source, initial)
            for slot, source, initial in slots
        ]
        for key, source, initial in sources:
          if source is None:
            value = tf.fill([table.vocabulary_size, table.dimension],
                            tf.constant(initial, tf.float32))
            shown.advance(table.vocabulary_size)
          else:
            layout = convert.source_layout(model, name, source, stored,
                                           slice_shapes,
                                           written_strategy, owner)
            rows, = convert.read_relaid(
                prefix, source, shapes[source], dtypes[source], layout,
                row_order,
                convert.axis0_sizes(slice_shapes.get(source), shapes[source]),
                shown.advance)
            value = convert.as_tensor(rows)
            del rows
          staged.save([key], [""], [value])
          del value
    return staged.commit()


def _object_graph_keys(spec, attribute, owner):
  """({variable full name: checkpoint key}, (names, slices, tensors) of the
  checkpoint's other entries) of `tf.train.Checkpoint(<attribute>=
  TPUEmbeddingForServing(...))`, from a one-row-per-table copy built and
  saved in a temporary directory."""
  from tensorflow.core.protobuf import trackable_object_graph_pb2  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  with tf.init_scope():
    if not tf.executing_eagerly():
      raise RuntimeError(
          f"{owner} needs eager execution (TF2 behaviour); it was called "
          "with eager execution disabled.")
    small = _build(spec, global_step=None, for_serving=True, owner=owner,
                   skeleton=True)
    embedding = _tpu.TPUEmbeddingForServing(small.feature_config,
                                            small.optimizer)
    embedding.build()
    scratch = tempfile.mkdtemp(prefix="mid_level_graph_")
    try:
      path = tf.train.Checkpoint(**{attribute: embedding}).save(
          os.path.join(scratch, "graph"))
      reader = tf.train.load_checkpoint(path)
      graph = trackable_object_graph_pb2.TrackableObjectGraph()
      graph.ParseFromString(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
      keys = {}
      for node in graph.nodes:
        for attr in node.attributes:
          if attr.checkpoint_key.startswith(attribute + "/"):
            keys[attr.full_name] = attr.checkpoint_key
      owned = set(keys.values())
      names, slices, tensors = [], [], []
      for key in sorted(reader.get_variable_to_shape_map()):
        if key not in owned:
          names.append(key)
          slices.append("")
          tensors.append(tf.constant(reader.get_tensor(key)))
      return keys, (names, slices, tensors)
    finally:
      shutil.rmtree(scratch, ignore_errors=True)
