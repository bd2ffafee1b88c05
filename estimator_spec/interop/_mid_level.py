"""The spec as TF2's mid-level TPU embedding API.

`to_mid_level(spec)` gives the `tf.tpu.experimental.embedding` objects
(FeatureConfig / TableConfig / optimizer) that describe the same tables,
features and training settings. Checkpoints for them:
`export_mid_level_checkpoint` (`_mid_level_export.py`).
"""
import collections

import tensorflow as tf
# TF's nest with paths (the public tf.nest lacks them); the same names TF2's
# TPUEmbedding gives features.
from tensorflow.python.util import nest as _nest

from estimator_spec.config import spec as spec_lib
from estimator_spec.config import optimizers as _opt
from tpu_embedding_columns import checks

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
  model = spec_lib.model_of(owner, spec)
  for_serving = checks.check_bool(owner, "for_serving", for_serving)
  uses_fn = [name for name in model.tables
             if model.learning_rate(name).fn is not None]
  if global_step is not None:
    _check_global_step(owner, global_step, for_serving, uses_fn)
  if not for_serving:
    _refuse_training_only(owner, model, uses_fn, global_step)
  tf2_optimizer = _Tf2OptimizerOf(model, global_step, owner)
  spec_optimizer = None
  if model.optimizer is not None:
    spec_optimizer = tf2_optimizer(model.optimizer,
                                   model.optimizer.learning_rate,
                                   "optimization_parameters")
  tables = {
      name: _tf2_table(owner, model, name, table, tf2_optimizer, for_serving,
                       skeleton)
      for name, table in model.tables.items()
  }
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


def _check_global_step(owner, global_step, for_serving, uses_fn):
  if not isinstance(global_step, tf.Variable):
    checks.fail(owner, "global_step", "must be a tf.Variable", global_step,
                 TypeError)
  if for_serving:
    raise ValueError(
        f"{owner}: `global_step` only feeds learning_rate_fn in training; "
        "drop it with for_serving=True.")
  if not uses_fn:
    raise ValueError(
        f"{owner}: `global_step` is only used for learning_rate_fn, and no "
        "table of this spec has one; drop it.")


class _Tf2OptimizerOf:
  """The TF2 optimizer of (our parameters, learning rate), converted once
  per parameters object and rate (a constant, or a function of the global
  step, called by TF2 with no argument)."""

  def __init__(self, model, global_step, owner):
    self._model = model
    self._global_step = global_step
    self._owner = owner
    self._converted = {}  # (id(parameters), learning rate key) -> optimizer
    self._keep = []  # keeps the parameter objects behind the ids alive

  def __call__(self, parameters, rate, where):
    fn = rate if callable(rate) else None
    key = (id(parameters), ("fn", id(fn)) if fn else ("const", rate))
    if key not in self._converted:
      self._keep.append((parameters, fn))
      learning_rate = rate
      if fn is not None:
        learning_rate = _step_rate(fn, self._global_step)
      self._converted[key] = _convert_optimizer(
          self._model, parameters, learning_rate, where, self._owner)
    return self._converted[key]


def _tf2_table(owner, model, name, table, tf2_optimizer, for_serving,
               skeleton):
  """TF2's TableConfig of the table `name` (zero-size when `skeleton`)."""
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
    return _tpu.TableConfig(
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


# --- the other way: TF2's configuration objects -> the config model -------

# TF2's optimizer classes this project trains, by class name -> our class
# (whose `mid_level_names` says which TF2 attribute holds each of its own
# hyper-parameters).
_FROM_TF2 = {cls.mid_level_class: cls for cls in _opt.ALL_OPTIMIZERS
             if cls.mid_level_class}
# The attributes every TF2 optimizer holds that map one to one.
_COMMON_TF2 = ("use_gradient_accumulation", "clip_weight_min",
               "clip_weight_max", "weight_decay_factor",
               "multiply_weight_decay_factor_by_learning_rate",
               "clip_gradient_min", "clip_gradient_max")
# Attributes that are read and checked separately: the learning rate, a
# TPU memory-layout hint with no effect on any value, and the slot creation
# hook (refused by `from_mid_level`; `HostTPUEmbedding` calls it).
_SPECIAL_TF2 = ("learning_rate", "low_dimensional_packing_status",
                "slot_variable_creation_fn")
_TABLE_ATTRIBUTES = ("vocabulary_size", "dim", "initializer", "optimizer",
                     "combiner", "name", "quantization_config", "layout",
                     "dtype")
_FEATURE_ATTRIBUTES = ("table", "max_sequence_length",
                       "validate_weights_and_indices", "output_shape", "name")


class StepFreeRate:
  """A TF2 learning rate (a callable with no argument, called at each
  update, as TF2 calls it) as a `learning_rate_fn(global_step)` of the
  config model, which ignores the step. Two of them are equal when they
  wrap the same callable (one dynamic learning-rate tag per callable)."""

  def __init__(self, fn):
    self.fn = fn

  def __call__(self, global_step):
    del global_step  # TF2's learning rates take no argument.
    return self.fn()

  def __eq__(self, other):
    return isinstance(other, StepFreeRate) and other.fn is self.fn

  def __hash__(self):
    return id(self.fn)

  def __repr__(self):
    return f"StepFreeRate({getattr(self.fn, '__name__', self.fn)!r})"


class MidLevelConversion:
  """What `convert_mid_level` returns.

  Attributes:
    spec: the `EmbeddingConfigSpec` (dict form) of the same tables,
      features and training settings.
    paths: joined string paths of the features, in the order of
      `tf.nest.flatten(feature_config)`.
    feature_names: the spec's feature names, aligned with `paths`.
    feature_configs: TF2's FeatureConfigs, aligned with `paths`.
    table_configs: {table name: TF2 TableConfig}, in order of first use.
    slot_variable_creation_fns: {table name: the `slot_variable_creation_fn`
      of the table's TF2 optimizer (its own, else the default)}, for the
      tables whose optimizer has one (only when the caller allows them).
  """

  def __init__(self, spec, paths, feature_names, feature_configs,
               table_configs, slot_variable_creation_fns=None):
    self.spec = spec
    self.paths = paths
    self.feature_names = feature_names
    self.feature_configs = feature_configs
    self.table_configs = table_configs
    self.slot_variable_creation_fns = dict(slot_variable_creation_fns or {})


def from_mid_level(feature_config, optimizer=None,
                   pipeline_execution_with_tensor_core=False, *,
                   weight_keys=None):
  """The `EmbeddingConfigSpec` of TF2 mid-level API configuration objects.

  The reverse of `to_mid_level`: `feature_config` (one
  `tf.tpu.experimental.embedding.FeatureConfig` or a nested structure of
  them) and `optimizer` (the default optimizer of tables without their
  own) as `TPUEmbedding` takes them. Features are named by their path in
  the structure (`tf.nest`'s joined string paths: dict keys, list
  indices, joined with '/'), or for a single FeatureConfig by its `name`
  (else 'feature'); tables by their `name`, else `table_<i>` in order of
  first use, as TF2 names them (TF's objects are never modified). Callable
  learning rates become a `learning_rate_fn` of each table they train,
  called with no argument at each update (`StepFreeRate`), and the
  optimizer's own learning rate is then 0.

  Args:
    feature_config: TF2 FeatureConfig(s).
    optimizer: a TF2 `SGD`, `Adagrad`, `AdagradMomentum`, `Adam` or `FTRL`,
      or None (tables without their own optimizer are then only looked up).
    pipeline_execution_with_tensor_core: as TF2's `TPUEmbedding` takes it.
    weight_keys: optional {feature name: key of its weights}, e.g.
      `to_mid_level(spec).weight_keys`.

  Raises:
    ValueError: naming the argument, for what this project cannot honour:
      other optimizer classes (`CustomOptimizer`), `slot_variable_creation_fn`
      (a spec has no slot variables of its own to create: the estimator
      side creates them; `HostTPUEmbedding` calls the function),
      custom combiners, `quantization_config`, SparseCore `layout`, a
      `dtype` other than float32, an attribute this converter does not know
      (a newer TensorFlow), duplicate table or feature names.
    TypeError: an entry of `feature_config` that is not a FeatureConfig.
  """
  return convert_mid_level(feature_config, optimizer,
                           pipeline_execution_with_tensor_core,
                           weight_keys=weight_keys,
                           owner="from_mid_level").spec


def convert_mid_level(feature_config, optimizer=None,
                      pipeline_execution_with_tensor_core=False, *,
                      weight_keys=None, owner="from_mid_level",
                      slot_variable_creation_fn=False):
  """`from_mid_level`, returning a `MidLevelConversion` (the spec and how
  TF2's objects map to its names). `slot_variable_creation_fn=True`
  accepts optimizers with a `slot_variable_creation_fn` and lists them in
  `MidLevelConversion.slot_variable_creation_fns` (the spec does not hold
  them); otherwise they are refused."""
  pipeline_execution_with_tensor_core = checks.check_bool(
      owner, "pipeline_execution_with_tensor_core",
      pipeline_execution_with_tensor_core)
  paths, configs, names = _flat_features(owner, feature_config)
  if optimizer is not None:
    _check_tf2_optimizer(owner, "optimizer", optimizer,
                         slot_variable_creation_fn)
  tables, table_names = _tables_in_use(owner, configs)
  ours = _OursOf(owner)
  spec_optimizer, spec_rate = (ours(optimizer, "optimizer")
                               if optimizer is not None else (None, None))
  table_dict = {}
  creation_fns = {}
  for table in tables:
    name = table_names[id(table)]
    table_dict[name], creation_fn = _table_from_tf2(
        owner, table, f"table {name!r}", optimizer, spec_rate, ours,
        slot_variable_creation_fn)
    if creation_fn is not None:
      creation_fns[name] = creation_fn
  feature_dict = _features_from_tf2(owner, names, configs, table_names,
                                    weight_keys)
  spec = spec_lib.EmbeddingConfigSpec(
      feature_to_config_dict=feature_dict, table_to_config_dict=table_dict,
      optimization_parameters=spec_optimizer,
      pipeline_execution_with_tensor_core=pipeline_execution_with_tensor_core)
  return MidLevelConversion(
      spec, paths, names, configs,
      collections.OrderedDict((table_names[id(t)], t) for t in tables),
      creation_fns)


def _flat_features(owner, feature_config):
  """(paths, FeatureConfigs, feature names) of `feature_config`, in the
  order of `tf.nest.flatten`."""
  flat = _nest.flatten_with_joined_string_paths(feature_config)
  if not flat:
    raise ValueError(f"{owner}: `feature_config` holds no FeatureConfig.")
  paths, configs, names = [], [], []
  for path, feature in flat:
    if not isinstance(feature, _tpu.FeatureConfig):
      checks.fail(owner, f"feature_config[{path!r}]",
                   "must be a tf.tpu.experimental.embedding.FeatureConfig",
                   feature, TypeError)
    name = path or feature.name or "feature"
    if name in names:
      raise ValueError(f"{owner}: two features are named {name!r}.")
    paths.append(path)
    configs.append(feature)
    names.append(name)
  return paths, configs, names


def _tables_in_use(owner, configs):
  """The TF2 TableConfigs of the features in order of first use, and
  {id(table): name}, named as TF2 names them."""
  tables = []
  for feature in configs:
    if not any(feature.table is t for t in tables):
      tables.append(feature.table)
  table_names = {}
  for i, table in enumerate(tables):
    name = table.name if table.name is not None else f"table_{i}"
    if name in table_names.values():
      raise ValueError(
          f"{owner}: two tables are named {name!r}; TF2 needs unique table "
          "names.")
    table_names[id(table)] = name
  return tables, table_names


class _OursOf:
  """(our parameters, StepFreeRate or None) of a TF2 optimizer, converted
  once per optimizer object (the objects are kept alive, so their ids stay
  theirs)."""

  def __init__(self, owner):
    self._owner = owner
    self._converted = {}  # id(TF2 optimizer) -> (parameters, rate)
    self._keep = []

  def __call__(self, tf2, where):
    if id(tf2) not in self._converted:
      self._keep.append(tf2)
      self._converted[id(tf2)] = _from_tf2_optimizer(self._owner, tf2, where)
    return self._converted[id(tf2)]


def _table_from_tf2(owner, table, where, optimizer, spec_rate, ours,
                    slot_variable_creation_fn):
  """The spec's TableConfig of the TF2 `table`, and the
  `slot_variable_creation_fn` of its TF2 optimizer (None if it has none)."""
  _check_tf2_table(owner, table, where)
  own, rate = None, None
  # TF2's TPUEmbedding stores the default optimizer into tables without
  # one: that is not a table optimizer of its own.
  if table.optimizer is not None and table.optimizer is not optimizer:
    _check_tf2_optimizer(owner, f"{where}: optimizer", table.optimizer,
                         slot_variable_creation_fn)
    own, rate = ours(table.optimizer, f"{where}: optimizer")
  elif optimizer is not None:
    rate = spec_rate
  tf2 = table.optimizer if table.optimizer is not None else optimizer
  creation_fn = getattr(tf2, "slot_variable_creation_fn", None)
  try:
    return spec_lib.TableConfig(
        vocabulary_size=table.vocabulary_size, dimension=table.dim,
        initializer=table.initializer, combiner=table.combiner,
        learning_rate_fn=rate, optimization_parameters=own), creation_fn
  except (TypeError, ValueError) as error:
    raise ValueError(f"{owner}: {where}: {error}") from error


def _features_from_tf2(owner, names, configs, table_names, weight_keys):
  """{feature name: the spec's FeatureConfig} of TF2's FeatureConfigs."""
  weight_keys = dict(weight_keys or {})
  unknown = sorted(set(weight_keys) - set(names))
  if unknown:
    raise ValueError(f"{owner}: `weight_keys` names unknown features "
                     f"{unknown}; features are {names}.")
  feature_dict = {}
  for name, feature in zip(names, configs):
    _check_attributes(owner, feature, _FEATURE_ATTRIBUTES,
                      f"feature {name!r}")
    feature_dict[name] = spec_lib.FeatureConfig(
        table_names[id(feature.table)],
        max_sequence_length=feature.max_sequence_length,
        weight_key=weight_keys.get(name))
  return feature_dict


def _check_attributes(owner, obj, known, where):
  unknown = sorted(set(vars(obj)) - set(known))
  if unknown:
    raise ValueError(
        f"{owner}: {where}: {type(obj).__name__} has settings this project "
        f"does not know ({', '.join(unknown)}); it cannot honour them, so it "
        "refuses them rather than ignore them.")


def _check_tf2_table(owner, table, where):
  _check_attributes(owner, table, _TABLE_ATTRIBUTES, where)
  if not isinstance(table.combiner, str):
    raise ValueError(
        f"{owner}: {where}: `combiner` {type(table.combiner).__name__} (a "
        "custom combiner) is not supported; use 'sum', 'mean' or 'sqrtn'.")
  if getattr(table, "quantization_config", None) is not None:
    raise ValueError(
        f"{owner}: {where}: `quantization_config` (quantized TPU "
        "activations) is not supported; set it to None.")
  if getattr(table, "layout", None) is not None:
    raise ValueError(
        f"{owner}: {where}: `layout` (a SparseCore table layout) is not "
        "supported; set it to None.")
  dtype = getattr(table, "dtype", tf.float32)
  if tf.as_dtype(dtype) != tf.float32:
    raise ValueError(
        f"{owner}: {where}: `dtype` {tf.as_dtype(dtype).name} is not "
        "supported; tables are float32 (as on the TPU's embedding cores).")


def _check_tf2_optimizer(owner, where, tf2, slot_variable_creation_fn=False):
  name = type(tf2).__name__
  if name not in _FROM_TF2 or getattr(_tpu, name, None) is not type(tf2):
    raise ValueError(
        f"{owner}: `{where}` is a {type(tf2).__module__}.{name}; only "
        f"tf.tpu.experimental.embedding's {', '.join(_FROM_TF2)} are "
        "supported (custom optimizers are not).")
  _check_attributes(owner, tf2, _COMMON_TF2 + _SPECIAL_TF2 + tuple(
      _FROM_TF2[name].mid_level_names.values()), f"`{where}`")
  if (getattr(tf2, "slot_variable_creation_fn", None) is not None and
      not slot_variable_creation_fn):
    raise ValueError(
        f"{owner}: `{where}`: `slot_variable_creation_fn` has no place in an "
        "EmbeddingConfigSpec (the estimator side creates its slot variables "
        "with the optimizer's initial values); set it to None here. "
        "`HostTPUEmbedding` takes it and calls it.")


def _from_tf2_optimizer(owner, tf2, where):
  """(our parameters, StepFreeRate or None) of a TF2 optimizer."""
  ours_class = _FROM_TF2[type(tf2).__name__]
  rate = tf2.learning_rate
  step_free = None
  if callable(rate):
    step_free = StepFreeRate(rate)
    rate = 0.0
  arguments = {ours: getattr(tf2, theirs)
               for ours, theirs in ours_class.mid_level_names.items()}
  arguments.update({arg: getattr(tf2, arg) for arg in _COMMON_TF2})
  try:
    return ours_class(learning_rate=rate, **arguments), step_free
  except (TypeError, ValueError) as error:
    raise ValueError(
        f"{owner}: `{where}` ({type(tf2).__name__}): {error}") from error
