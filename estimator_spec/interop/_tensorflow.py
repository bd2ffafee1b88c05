"""Converting an embedding spec to and from TF 2.15's own classes.

`to_tensorflow(spec)` turns an `estimator_spec.EmbeddingConfigSpec` into the
`EmbeddingConfigSpec` of tensorflow_estimator
(`tf.compat.v1.estimator.tpu.experimental.EmbeddingConfigSpec`), built from
TF's own columns (`tf.compat.v1.tpu.experimental.embedding_column` /
`shared_embedding_columns`) or TF's `TableConfig` / `FeatureConfig`, and TF's
optimization-parameter classes. `from_tensorflow(tf_spec)` goes the other
way. Both directions keep the TPU configuration proto unchanged (see the
docstrings for the one setting TF ignores, `clipping_limit`).

Columns keep their names across the conversion (`a_embedding`,
`a_shared_embedding`), and the converted columns reuse the same categorical
columns, so `columns_by_name(spec)` on either side gives the column to use in
model_fn for a column of the other side.
"""
import collections
import inspect

from estimator_spec import tf215

tf215.require("estimator_spec.interop.to_tensorflow, from_tensorflow and "
              "columns_by_name (TF 2.15's own TPU embedding classes)")

# The imports below load TF 2.15's TPU estimator; they follow the check
# above so that without it the import fails with that check's message
# (what to install), not with the name of a missing module.
import tensorflow as tf
from tensorflow.python.tpu import feature_column_v2 as _tf_columns
from tensorflow.python.tpu import tpu_embedding as _tf_embedding
from tensorflow_estimator.python.estimator.tpu import _tpu_estimator_embedding as _tf_estimator_embedding

from tpu_embedding_columns import TPU_EMBEDDING_COLUMN_TYPES
from tpu_embedding_columns import checks
from tpu_embedding_columns import errors
from tpu_embedding_columns import api as _column_api
from tpu_embedding_columns import columns as _columns

from estimator_spec.config import optimizers as _optimizers
from estimator_spec.config import spec as _spec

TensorFlowEmbeddingConfigSpec = _tf_estimator_embedding.EmbeddingConfigSpec

# TF's EmbeddingConfigSpec takes only these as the spec-wide optimizer with
# feature columns (its TPUEstimator cannot name the slots of the others).
_TF_COLUMN_FORM_OPTIMIZERS = tuple(
    _tf_estimator_embedding._SUPPORTED_OPTIMIZERS)

_DEVICE_NAMES = {
    _tf_columns.EmbeddingDevice.CPU: "cpu",
    _tf_columns.EmbeddingDevice.TPU_TENSOR_CORE: "tpu_tensor_core",
    _tf_columns.EmbeddingDevice.TPU_EMBEDDING_CORE: "tpu_embedding_core",
}
_TF_COLUMN_TYPES = (_tf_columns._TPUEmbeddingColumnV2,
                    _tf_columns._TPUSharedEmbeddingColumnV2)
# Our column classes TF has, by exact class: a kind of ours TF lacks (a
# subclass that changes ids or rows) is refused, never converted as its base.
_CONVERTIBLE_COLUMNS = (_columns.EmbeddingColumn,
                        _columns.SharedEmbeddingColumn,
                        _columns.LegacySharedEmbeddingColumn)


# --- ours -> TF --------------------------------------------------------------


def to_tensorflow(spec):
  """TF 2.15's `EmbeddingConfigSpec` for an `estimator_spec` spec.

  Args:
    spec: an `estimator_spec.EmbeddingConfigSpec`.

  Returns:
    A tensorflow_estimator `EmbeddingConfigSpec`
    (`tf.compat.v1.estimator.tpu.experimental.EmbeddingConfigSpec`):
    * columns form: `feature_columns` (and `tensor_core_feature_columns`)
      hold TF's columns, built with `tf.compat.v1.tpu.experimental.
      embedding_column` / `shared_embedding_columns` on the same categorical
      columns with every column argument carried over; each shared group
      becomes one TF group with the same `shared_embedding_collection_name`.
      The TF columns have the names of ours: `columns_by_name(tf_spec)[
      our_column.name]` is the TF column to use in a model_fn that TF's
      TPUEstimator runs.
    * dict form: TF's `TableConfig` / `FeatureConfig`
      (`tensorflow.python.tpu.tpu_embedding`), under the same keys.
    Optimizers become TF's classes of the same names with every argument.

  `clipping_limit` (which TF 2.15 accepts but never applies, and this
  project applies) is folded into each optimizer: its `clip_gradient_min`/
  `clip_gradient_max` become the intersection with [-L, L], so TF writes
  the gradient clipping this project would; the TF spec also keeps
  `clipping_limit` itself, so `from_tensorflow` gives it back.

  Raises:
    TypeError: `spec` is not an `estimator_spec.EmbeddingConfigSpec`.
    ValueError: TF cannot express the spec: an optimizer TF lacks (its class
      declares no `tf1_class` of its own, or names a class this TensorFlow
      does not have), AdagradMomentum or ProximalYogi as the spec-wide
      optimizer of the columns form (TF's spec refuses them there; use the
      dict form with per-table optimizers), or a column TF's constructors
      refuse.
  """
  owner = "estimator_spec.interop.to_tensorflow"
  _check_ours(owner, spec)
  optimizer = _optimizer_to_tensorflow(owner, spec.optimization_parameters,
                                       spec.model)
  if spec.feature_columns is not None:
    return _columns_form_to_tensorflow(owner, spec, optimizer)
  tables = {
      name: _table_as(
          _tf_embedding.TableConfig, table,
          _optimizer_to_tensorflow(owner, table.optimization_parameters,
                                   spec.model))
      for name, table in spec.table_to_config_dict.items()
  }
  features = {
      name: _feature_as(_tf_embedding.FeatureConfig, feature)
      for name, feature in spec.feature_to_config_dict.items()
  }
  return TensorFlowEmbeddingConfigSpec(
      feature_to_config_dict=features,
      table_to_config_dict=tables,
      optimization_parameters=optimizer,
      **_settings(spec))


def _check_ours(owner, spec):
  if not isinstance(spec, _spec.EmbeddingConfigSpec):
    hint = (" (it already is TensorFlow's; from_tensorflow converts the "
            "other way)" if isinstance(spec, TensorFlowEmbeddingConfigSpec)
            else "")
    checks.fail(owner, "spec",
                 "must be an estimator_spec.EmbeddingConfigSpec" + hint, spec,
                 TypeError)


def _columns_form_to_tensorflow(owner, spec, optimizer):
  """TF's spec of the columns form of `spec`, with TF's `optimizer`."""
  if not isinstance(optimizer, _TF_COLUMN_FORM_OPTIMIZERS):
    raise ValueError(
        f"{owner}: TensorFlow's EmbeddingConfigSpec does not take "
        f"{type(spec.optimization_parameters).__name__} as the "
        "optimization_parameters of feature columns (its TPUEstimator "
        "cannot name that optimizer's slot variables). Use one of "
        + ", ".join(c.__name__ for c in _TF_COLUMN_FORM_OPTIMIZERS) +
        ", or the dict form (table_to_config_dict with a per-table "
        "optimizer).")
  columns = list(spec.feature_columns) + list(
      spec.tensor_core_feature_columns or ())
  return TensorFlowEmbeddingConfigSpec(
      feature_columns=_columns_to_tensorflow(owner, columns),
      optimization_parameters=optimizer,
      **_settings(spec))


# What both spec classes take under the same names: the spec-wide settings,
# and the fields of TableConfig and FeatureConfig (besides the optimizer).
_SETTINGS = ("clipping_limit", "pipeline_execution_with_tensor_core",
             "experimental_gradient_multiplier_fn", "partition_strategy",
             "profile_data_directory")
_TABLE_FIELDS = ("vocabulary_size", "dimension", "initializer", "combiner",
                 "hot_id_replication", "learning_rate", "learning_rate_fn")
_FEATURE_FIELDS = ("table_id", "max_sequence_length", "weight_key")


def _settings(spec):
  return {name: getattr(spec, name) for name in _SETTINGS}


def _table_as(cls, table, optimizer):
  """`table` as a TableConfig of class `cls` with `optimizer`."""
  return cls(optimization_parameters=optimizer,
             **{name: getattr(table, name) for name in _TABLE_FIELDS})


def _feature_as(cls, feature):
  return cls(**{name: getattr(feature, name) for name in _FEATURE_FIELDS})


def _optimizer_to_tensorflow(owner, optimizer, model):
  """TF's class for `optimizer`, its gradient clipping intersected with the
  spec's clipping_limit (`model.gradient_clip_bounds`)."""
  if optimizer is None:
    return None
  args = optimizer.get_config()
  args["clip_gradient_min"], args["clip_gradient_max"] = (
      model.gradient_clip_bounds(optimizer))
  return _tf_optimizer_class(owner, optimizer)(**args)


def _tf_optimizer_class(owner, optimizer):
  """TF's class for `optimizer`: the one its class names (`tf1_class`,
  declared by that class itself, not inherited), looked up in TF's
  tpu_embedding now; ValueError where there is none."""
  cls = type(optimizer)
  name = vars(cls).get("tf1_class")
  if name is None:
    raise ValueError(
        f"{owner}: {cls.__name__} has no counterpart among TensorFlow's TPU embedding "
        "optimizers: its class declares no `tf1_class` (a subclass does not "
        "take its base class's, whose rule it may change). Convert a spec "
        "that uses one of " + ", ".join(_tf1_names()) + ".")
  found = getattr(_tf_embedding, name, None)
  if found is None:
    raise ValueError(
        f"{owner}: {cls.__name__} converts to TensorFlow's {name}, which TensorFlow "
        f"{tf.__version__} does not have "
        "(tensorflow.python.tpu.tpu_embedding); use another optimizer, or "
        "a TensorFlow version that has it.")
  return found


def _tf1_names():
  """The names of TF's classes our optimizers convert to, sorted."""
  return sorted(cls.tf1_class for cls in _optimizers.ALL_OPTIMIZERS
                if cls.tf1_class is not None)


def _column_args(column):
  """The arguments shared by TF's embedding_column and
  shared_embedding_columns, from one of our columns."""
  return dict(
      combiner=column.combiner,
      learning_rate_fn=column.learning_rate_fn,
      embedding_lookup_device=column.embedding_lookup_device,
      tensor_core_shape=(None if column.tensor_core_shape is None else list(
          column.tensor_core_shape)),
      use_safe_embedding_lookup=column.use_safe_embedding_lookup)


def _columns_to_tensorflow(owner, columns):
  """TF columns for ours, in the same order; one TF call per shared group
  (with only the group's members that are in `columns`)."""
  converted = {}  # id(our column) -> TF column
  for column in columns:
    if id(column) in converted:
      continue
    if type(column) not in _CONVERTIBLE_COLUMNS:
      raise ValueError(
          f"{owner}: column {column.name!r} is a {type(column).__name__}, "
          "which TensorFlow's TPU embedding columns cannot express (TF has "
          "embedding_column and shared_embedding_columns only); keep this "
          "spec with estimator_spec, or use those columns.")
    if isinstance(column, _columns.SharedEmbeddingColumn):
      group = [c for c in columns
               if isinstance(c, _columns.SharedEmbeddingColumn) and
               c.shared_table is column.shared_table]
      table = column.shared_table
      try:
        built = tf.compat.v1.tpu.experimental.shared_embedding_columns(
            [c.categorical_column for c in group],
            dimension=table.dimension,
            initializer=table.initializer,
            shared_embedding_collection_name=table.name,
            max_sequence_lengths=[c.max_sequence_length for c in group],
            **_column_args(column))
      except (TypeError, ValueError) as error:
        raise ValueError(
            f"{owner}: TensorFlow's shared_embedding_columns refuses the "
            f"shared group {table.name!r} (columns "
            f"{[c.name for c in group]}): {error}") from error
      converted.update(zip(map(id, group), built))
    else:
      try:
        converted[id(column)] = tf.compat.v1.tpu.experimental.embedding_column(
            column.categorical_column,
            dimension=column.dimension,
            initializer=column.initializer,
            max_sequence_length=column.max_sequence_length,
            **_column_args(column))
      except (TypeError, ValueError) as error:
        raise ValueError(
            f"{owner}: TensorFlow's embedding_column refuses column "
            f"{column.name!r}: {error}") from error
  return [converted[id(c)] for c in columns]


# --- TF -> ours --------------------------------------------------------------


def from_tensorflow(tf_spec):
  """An `estimator_spec.EmbeddingConfigSpec` for TF 2.15's spec.

  Args:
    tf_spec: a tensorflow_estimator `EmbeddingConfigSpec`
      (`tf.compat.v1.estimator.tpu.experimental.EmbeddingConfigSpec`) whose
      columns come from `tf.compat.v1.tpu.experimental.embedding_column` /
      `shared_embedding_columns`, or whose dicts hold TF's `TableConfig` /
      `FeatureConfig`; optimizers of TF's `*Parameters` classes.

  Returns:
    An `estimator_spec.EmbeddingConfigSpec` with our columns (built with
    `tpu_embedding_columns.embedding_column` / `shared_embedding_columns`
    on the same categorical columns, one call per TF shared group with its
    collection name) or our `TableConfig` / `FeatureConfig`, and our
    optimizer classes, every argument carried over. Pass it to
    `estimator_spec.TPUEstimator`; a model_fn written with TF's columns
    uses `columns_by_name(our_spec)[tf_column.name]` instead of each TF
    column (our columns have TF's names).

  `clipping_limit` is carried over, and this project applies it (TF 2.15
  accepts it and ignores it); drop it from the TF spec to train exactly as
  TF did.

  Raises:
    TypeError: `tf_spec` is not TF's EmbeddingConfigSpec, or holds a column,
      table, feature or optimizer of another type (e.g. a numeric column,
      which belongs to the dense model).
    ValueError: a TF column with settings TF's public constructors cannot
      give (a checkpoint to load from, max_norm, trainable=False), or a
      value our stricter validation refuses (the message names it).
  """
  owner = "estimator_spec.interop.from_tensorflow"
  if not isinstance(tf_spec, TensorFlowEmbeddingConfigSpec):
    hint = (" (it already is an estimator_spec spec)"
            if isinstance(tf_spec, _spec.EmbeddingConfigSpec) else "")
    checks.fail(
        owner, "tf_spec",
        "must be tensorflow_estimator's EmbeddingConfigSpec "
        "(tf.compat.v1.estimator.tpu.experimental.EmbeddingConfigSpec)" + hint,
        tf_spec, TypeError)
  optimizer = _optimizer_from_tensorflow(owner, "optimization_parameters",
                                         tf_spec.optimization_parameters)
  settings = dict(_settings(tf_spec), optimization_parameters=optimizer)
  if tf_spec.feature_columns is not None:
    columns = list(tf_spec.feature_columns) + list(
        tf_spec.tensor_core_feature_columns or ())
    return _spec.EmbeddingConfigSpec(
        feature_columns=_columns_from_tensorflow(owner, columns), **settings)
  tables = _tables_from_tensorflow(owner, tf_spec)
  features = _features_from_tensorflow(owner, tf_spec)
  return _spec.EmbeddingConfigSpec(
      feature_to_config_dict=features, table_to_config_dict=tables, **settings)


def _tables_from_tensorflow(owner, tf_spec):
  """Our TableConfigs of TF's `table_to_config_dict`."""
  tables = {}
  for name, table in tf_spec.table_to_config_dict.items():
    if not isinstance(table, _tf_embedding.TableConfig):
      raise errors.ArgumentTypeError(
          f"{owner}: `table_to_config_dict[{name!r}]` must be TF's "
          f"TableConfig; got {type(table).__name__}.")
    tables[name] = _table_as(
        _spec.TableConfig, table,
        _optimizer_from_tensorflow(
            owner, f"table_to_config_dict[{name!r}].optimization_parameters",
            table.optimization_parameters))
  return tables


def _features_from_tensorflow(owner, tf_spec):
  """Our FeatureConfigs of TF's `feature_to_config_dict`."""
  features = {}
  for name, feature in tf_spec.feature_to_config_dict.items():
    if not isinstance(feature, _tf_embedding.FeatureConfig):
      raise errors.ArgumentTypeError(
          f"{owner}: `feature_to_config_dict[{name!r}]` must be TF's "
          f"FeatureConfig; got {type(feature).__name__}.")
    features[name] = _feature_as(_spec.FeatureConfig, feature)
  return features


def _optimizer_from_tensorflow(owner, where, optimizer):
  if optimizer is None:
    return None
  cls = _our_optimizer_class(optimizer)
  if cls is None:
    raise errors.ArgumentTypeError(
        f"{owner}: `{where}` must be one of TensorFlow's TPU embedding "
        "optimizers (tf.compat.v1.tpu.experimental.AdagradParameters, ...: "
        + ", ".join(_tf1_names()) +
        f"); got {type(optimizer).__name__}: {optimizer!r}.")
  names = [
      p for p in inspect.signature(cls.__init__).parameters if p != "self"
  ]
  return cls(**{arg: getattr(optimizer, arg) for arg in names})


def _our_optimizer_class(tf_optimizer):
  """Our optimizer class whose `tf1_class` is exactly the class of
  `tf_optimizer` in this TensorFlow, or None."""
  for cls in _optimizers.ALL_OPTIMIZERS:
    if cls.tf1_class is not None and type(tf_optimizer) is getattr(
        _tf_embedding, cls.tf1_class, None):
      return cls
  return None


def _device_name(owner, column):
  device = getattr(column, "_embedding_lookup_device", None)
  if device is None:
    return None
  if device not in _DEVICE_NAMES:
    raise ValueError(
        f"{owner}: column {column.name!r} has embedding_lookup_device "
        f"{device!r}, which is not one of {sorted(_DEVICE_NAMES.values())}.")
  return _DEVICE_NAMES[device]


def _tensor_core_shape(column):
  shape = getattr(column, "_tensor_core_shape", None)
  return None if shape is None else list(shape)


def _check_plain_tf_column(owner, column, ckpt, tensor_name, max_norm,
                           trainable):
  """TF's TPU column constructors always leave these fields at their
  defaults; a column that has them set (by `_replace`) cannot be carried."""
  if ckpt is not None or tensor_name is not None or max_norm is not None or (
      trainable not in (None, True)):
    raise ValueError(
        f"{owner}: column {column.name!r} sets ckpt_to_load_from="
        f"{ckpt!r}, tensor_name_in_ckpt={tensor_name!r}, max_norm="
        f"{max_norm!r}, trainable={trainable!r}; TPU embedding columns "
        "support none of these (restore tables with a checkpoint or "
        "warm_start_from instead).")


def _columns_from_tensorflow(owner, columns):
  converted = {}  # id(TF column) -> our column
  for column in columns:
    if id(column) in converted:
      continue
    if not isinstance(column, _TF_COLUMN_TYPES):
      if isinstance(column, TPU_EMBEDDING_COLUMN_TYPES):
        hint = ("it is already an estimator_spec column; build the spec "
                "directly with estimator_spec.EmbeddingConfigSpec")
      else:
        hint = ("only columns of tf.compat.v1.tpu.experimental."
                "embedding_column / shared_embedding_columns convert; other "
                "feature columns (numeric, plain embedding columns) belong to "
                "the dense model, not to the embedding spec")
      raise errors.ArgumentTypeError(
          f"{owner}: `feature_columns` holds {column!r} of type "
          f"{type(column).__name__}; {hint}.")
    if isinstance(column, _tf_columns._TPUSharedEmbeddingColumnV2):
      creator = column.shared_embedding_column_creator
      group = [c for c in columns
               if isinstance(c, _tf_columns._TPUSharedEmbeddingColumnV2) and
               c.shared_embedding_column_creator is creator]
      _check_plain_tf_column(owner, column, creator._ckpt_to_load_from,
                             creator._tensor_name_in_ckpt, column.max_norm,
                             creator._trainable)
      args = [_shared_group_args(owner, c) for c in group]
      for member, member_args in zip(group[1:], args[1:]):
        if member_args != args[0]:
          raise ValueError(
              f"{owner}: the shared columns {group[0].name!r} and "
              f"{member.name!r} (group {column.get_embedding_var_name()!r}) "
              f"differ in their settings ({args[0]} vs {member_args}); one "
              "shared group has one set of settings.")
      vocabulary_size, dimension = column.get_embedding_table_size()
      del vocabulary_size  # The categorical columns give it.
      built = _column_api.shared_embedding_columns(
          [c.categorical_column for c in group],
          dimension=dimension,
          initializer=column.get_initializer(),
          shared_embedding_collection_name=column.get_embedding_var_name(),
          max_sequence_lengths=[c.get_max_sequence_length() for c in group],
          **args[0])
      converted.update(zip(map(id, group), built))
    else:
      _check_plain_tf_column(owner, column, column.ckpt_to_load_from,
                             column.tensor_name_in_ckpt, column.max_norm,
                             column.trainable)
      converted[id(column)] = _column_api.embedding_column(
          column.categorical_column,
          dimension=column.dimension,
          initializer=column.get_initializer(),
          max_sequence_length=column.get_max_sequence_length(),
          **_shared_group_args(owner, column))
  return [converted[id(c)] for c in columns]


def _shared_group_args(owner, column):
  return dict(
      combiner=column.get_combiner(),
      learning_rate_fn=column.get_learning_rate_fn(),
      embedding_lookup_device=_device_name(owner, column),
      tensor_core_shape=_tensor_core_shape(column),
      use_safe_embedding_lookup=column.use_safe_embedding_lookup)


# --- columns in model_fn -----------------------------------------------------


def columns_by_name(spec):
  """{column name: column} of a spec, ours or TF's.

  Converted columns keep their names (`<key>_embedding`,
  `<key>_shared_embedding`), so this maps a column of one side to its
  counterpart on the other:

    tf_spec = to_tensorflow(spec)
    tf_column = columns_by_name(tf_spec)[our_column.name]
    our_column = columns_by_name(from_tensorflow(tf_spec))[tf_column.name]

  Embedding-core columns come first, then tensor-core ones, each in spec
  order. The dict form has no columns: the result is empty.

  Raises:
    TypeError: `spec` is neither kind of EmbeddingConfigSpec.
  """
  if not isinstance(spec, (_spec.EmbeddingConfigSpec,
                           TensorFlowEmbeddingConfigSpec)):
    checks.fail(
        "estimator_spec.interop.columns_by_name", "spec",
        "must be an estimator_spec or a TensorFlow EmbeddingConfigSpec", spec,
        TypeError)
  columns = list(spec.feature_columns or ()) + list(
      spec.tensor_core_feature_columns or ())
  return collections.OrderedDict((c.name, c) for c in columns)
