"""The spec as TF2's mid-level TPU embedding API.

`to_mid_level(spec)` gives the `tf.tpu.experimental.embedding` objects
(FeatureConfig / TableConfig / optimizer) that describe the same tables,
features and training settings. Checkpoints for them:
`estimator_spec.checkpoints.mid_level.export_mid_level_checkpoint`.
"""
import collections

import tensorflow as tf

from estimator_spec.config import spec as spec_lib
from estimator_spec.config import optimizers as _opt
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
  model = spec_lib.model_of(owner, spec)
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
