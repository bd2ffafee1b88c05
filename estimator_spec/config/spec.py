"""`EmbeddingConfigSpec`, `TableConfig` and `FeatureConfig`.

The user-facing description of TPU embeddings, with the fields, defaults and
validation of TF 2.15's classes of the same names. Constructing a spec also
derives the config model (`model.EmbeddingModel`), so that every problem with
tables and features is reported when the spec is built, not at the first
training step.
"""
import collections
import copy
from typing import Any, Callable, Iterable, Mapping, Optional, Self, Sequence

from tpu_embedding_columns import TPU_EMBEDDING_COLUMN_TYPES
from tpu_embedding_columns import checks
from tpu_embedding_columns import errors
from tpu_embedding_columns import api as _column_api
from tpu_embedding_columns import lookup as _lookup

from estimator_spec.config import model as _model
from estimator_spec.config import optimizers

PARTITION_STRATEGIES = ("div", "mod")


class _Validated:
  """Namedtuple mixin: `_replace`, `_make`, copy and pickle go through the
  constructor, so a changed field is validated like a new one."""

  # Given by the namedtuple the mixin goes with (annotated only, so that the
  # namedtuple's own method stays the one that runs).
  _asdict: Callable[[], dict[str, Any]]

  def _constructor_args(self) -> dict[str, Any]:
    return self._asdict()

  def _replace(self, **changes: Any) -> Self:
    args = self._constructor_args()
    unknown = set(changes) - set(args)
    if unknown:
      raise ValueError(
          f"{type(self).__name__}._replace: unknown fields {sorted(unknown)}.")
    args.update(changes)
    return type(self)(**args)

  @classmethod
  def _make(cls, iterable: Iterable[Any]) -> Any:
    return cls(*iterable)

  def __reduce__(self) -> tuple[Any, ...]:
    return (_rebuild, (type(self), self._constructor_args()))

  def __copy__(self) -> Self:
    return self

  def __deepcopy__(self, memo: dict[int, Any]) -> Self:
    return type(self)(**copy.deepcopy(self._constructor_args(), memo))


def _rebuild(cls: Callable[..., Any], args: dict[str, Any]) -> Any:
  return cls(**args)


# The mixin's validating `_make` (mypy takes a namedtuple's own as the
# only one its subclasses may have).
class TableConfig(  # type: ignore[misc]
    _Validated,
    collections.namedtuple("TableConfig", [
        "vocabulary_size", "dimension", "initializer", "combiner",
        "hot_id_replication", "learning_rate", "learning_rate_fn",
        "optimization_parameters"
    ])):
  """One embedding table.

  Args:
    vocabulary_size: rows, a positive int.
    dimension: width, a positive int.
    initializer: callable initializer; default truncated normal with stddev
      1/sqrt(dimension).
    combiner: 'mean' (default), 'sum', 'sqrtn', or None (one id per example).
    hot_id_replication: bool, a TPU placement hint written to the proto (no
      effect on the numbers).
    learning_rate: a positive static learning rate for this table, or None.
    learning_rate_fn: callable global_step -> learning rate, or None. At most
      one of learning_rate and learning_rate_fn.
    optimization_parameters: an optimizer for this table only, or None for
      the spec's.
  """

  def __new__(
      cls,
      vocabulary_size: int,
      dimension: int,
      initializer: Optional[Callable[..., Any]] = None,
      combiner: Optional[str] = "mean",
      hot_id_replication: bool = False,
      learning_rate: Optional[float] = None,
      learning_rate_fn: Optional[Callable[[Any], Any]] = None,
      optimization_parameters: Optional[
          optimizers.OptimizationParameters] = None) -> Self:
    owner = "TableConfig"
    vocabulary_size = checks.check_int(owner, "vocabulary_size",
                                        vocabulary_size, minimum=1)
    dimension = checks.check_int(owner, "dimension", dimension, minimum=1)
    if initializer is None:
      initializer = _column_api.default_initializer(dimension)
    elif not callable(initializer):
      checks.fail(owner, "initializer", "must be callable if specified",
                   initializer, TypeError)
    if combiner not in _lookup.COMBINERS + (None,):
      checks.fail(owner, "combiner", "must be 'mean', 'sum', 'sqrtn' or None",
                   combiner)
    hot_id_replication = checks.check_bool(owner, "hot_id_replication",
                                            hot_id_replication)
    if learning_rate is not None and learning_rate_fn is not None:
      raise ValueError(
          f"{owner}: give at most one of `learning_rate` ({learning_rate!r}) "
          f"and `learning_rate_fn` ({learning_rate_fn!r}).")
    if learning_rate is not None:
      learning_rate = checks.check_number(owner, "learning_rate",
                                           learning_rate)
      if learning_rate <= 0:
        checks.fail(
            owner, "learning_rate",
            "must be > 0 (None falls back to the optimizer's learning rate; "
            "to freeze a table give it an optimizer with learning_rate=0)",
            learning_rate)
    checks.check_callable(owner, "learning_rate_fn", learning_rate_fn)
    if optimization_parameters is not None and not isinstance(
        optimization_parameters, optimizers.OptimizationParameters):
      checks.fail(
          owner, "optimization_parameters",
          "must be an estimator_spec optimizer (AdagradParameters, ...) or "
          "None", optimization_parameters, TypeError)
    return super().__new__(cls, vocabulary_size, dimension, initializer,
                           combiner, hot_id_replication, learning_rate,
                           learning_rate_fn, optimization_parameters)


# The mixin's validating `_make` (mypy takes a namedtuple's own as the
# only one its subclasses may have).
class FeatureConfig(  # type: ignore[misc]
    _Validated,
    collections.namedtuple("FeatureConfig",
                           ["table_id", "max_sequence_length", "weight_key"])):
  """One feature: the table it looks up, its sequence length, its weights.

  Args:
    table_id: name of the table in `table_to_config_dict`.
    max_sequence_length: 0 for non-sequence features, else the length to
      which sequences are padded or truncated.
    weight_key: key of the feature holding per-id weights, or None.
  """

  def __new__(cls, table_id: str, max_sequence_length: int = 0,
              weight_key: Optional[str] = None) -> Self:
    owner = "FeatureConfig"
    checks.check_str(owner, "table_id", table_id)
    max_sequence_length = checks.check_int(owner, "max_sequence_length",
                                            max_sequence_length, minimum=0)
    checks.check_str(owner, "weight_key", weight_key, allow_none=True)
    return super().__new__(cls, table_id, max_sequence_length, weight_key)


# The mixin's validating `_make` (mypy takes a namedtuple's own as the
# only one its subclasses may have).
class EmbeddingConfigSpec(  # type: ignore[misc]
    _Validated,
    collections.namedtuple("EmbeddingConfigSpec", [
        "feature_columns", "tensor_core_feature_columns",
        "optimization_parameters", "clipping_limit",
        "pipeline_execution_with_tensor_core",
        "experimental_gradient_multiplier_fn", "feature_to_config_dict",
        "table_to_config_dict", "partition_strategy", "profile_data_directory"
    ])):
  """What a TPUEstimator needs to know about the model's embeddings.

  Give either `feature_columns` (built with `tpu_embedding_columns`) and
  `optimization_parameters`, or the pair `feature_to_config_dict` /
  `table_to_config_dict`.

  Args:
    feature_columns: the TPU embedding columns of the model. Columns with
      embedding_lookup_device='tpu_tensor_core' are kept apart in
      `tensor_core_feature_columns`.
    optimization_parameters: the embedding optimizer (an `*Parameters`
      instance); tables are trained only by it, never by the model's own
      optimizer.
    clipping_limit: optional positive number L: accumulated gradients are
      clipped to [-L, L] (together with the optimizer's clip_gradient_*).
    pipeline_execution_with_tensor_core: True lets step N+1's lookups run
      before step N's update (one step stale, as on TPU).
    experimental_gradient_multiplier_fn: optional callable global_step ->
      factor applied to every embedding gradient.
    feature_to_config_dict / table_to_config_dict: the dict form.
    partition_strategy: 'div' or 'mod' row sharding of tables.
    profile_data_directory: optional directory for TPU lookup statistics.
  """

  def __new__(
      cls,
      feature_columns: Optional[Sequence[Any]] = None,
      optimization_parameters: Optional[
          optimizers.OptimizationParameters] = None,
      clipping_limit: Optional[float] = None,
      pipeline_execution_with_tensor_core: bool = False,
      experimental_gradient_multiplier_fn: Optional[Callable[[Any],
                                                             Any]] = None,
      feature_to_config_dict: Optional[Mapping[str, FeatureConfig]] = None,
      table_to_config_dict: Optional[Mapping[str, TableConfig]] = None,
      partition_strategy: str = "div",
      profile_data_directory: Optional[str] = None) -> Self:
    owner = "EmbeddingConfigSpec"
    has_columns = bool(feature_columns)
    _check_form(owner, has_columns, bool(feature_to_config_dict),
                bool(table_to_config_dict))
    _check_partition_strategy(owner, partition_strategy)
    clipping_limit, pipeline_execution_with_tensor_core = _check_settings(
        owner, clipping_limit, pipeline_execution_with_tensor_core,
        experimental_gradient_multiplier_fn, profile_data_directory)
    _check_spec_optimizer(owner, optimization_parameters)

    tensor_core_columns = None
    embedding_core_columns = None
    if has_columns:
      embedding_core_columns, tensor_core_columns = _split_columns(
          owner, feature_columns, optimization_parameters)
    else:
      feature_to_config_dict = _check_dict(
          owner, "feature_to_config_dict", feature_to_config_dict,
          FeatureConfig)
      table_to_config_dict = _check_dict(owner, "table_to_config_dict",
                                         table_to_config_dict, TableConfig)

    spec = super().__new__(
        cls,
        feature_columns=embedding_core_columns,
        tensor_core_feature_columns=tensor_core_columns,
        optimization_parameters=optimization_parameters,
        clipping_limit=clipping_limit,
        pipeline_execution_with_tensor_core=pipeline_execution_with_tensor_core,
        experimental_gradient_multiplier_fn=experimental_gradient_multiplier_fn,
        feature_to_config_dict=feature_to_config_dict,
        table_to_config_dict=table_to_config_dict,
        partition_strategy=partition_strategy,
        profile_data_directory=profile_data_directory)
    # Derive the config model now: every table/feature problem surfaces here.
    spec.__dict__["_model"] = _model.EmbeddingModel.from_spec(spec)
    spec.__dict__["_columns"] = {
        column.feature_key: column for column in embedding_core_columns or ()
    }
    return spec

  def _constructor_args(self) -> dict[str, Any]:
    args = self._asdict()
    tensor_core = args.pop("tensor_core_feature_columns")
    if args["feature_columns"] is not None:
      args["feature_columns"] = list(args["feature_columns"]) + list(
          tensor_core or [])
    return args

  @property
  def model(self) -> _model.EmbeddingModel:
    """The config model (tables, features, optimizers) of this spec."""
    model: _model.EmbeddingModel = self.__dict__["_model"]
    return model

  def column_for(self, feature_name: str) -> Any:
    """The embedding column that configures feature `feature_name` (the
    live object the config model refers to by name), or None in the dict
    form."""
    return self.__dict__["_columns"].get(feature_name)


def _check_form(owner: str, has_columns: bool, has_features: bool,
                has_tables: bool) -> None:
  """Exactly one of the columns and the pair of dicts."""
  if has_features != has_tables:
    given, missing = (("feature_to_config_dict", "table_to_config_dict")
                      if has_features else
                      ("table_to_config_dict", "feature_to_config_dict"))
    raise ValueError(
        f"{owner}: `{given}` was given without `{missing}`; the dict form "
        "needs both.")
  if has_columns == has_features:
    raise ValueError(
        f"{owner}: Exactly one of `feature_columns` and the pair "
        "`feature_to_config_dict` and `table_to_config_dict` must be "
        f"specified; got {'both' if has_columns else 'neither'}.")


def _check_partition_strategy(owner: str, partition_strategy: str) -> None:
  if partition_strategy not in PARTITION_STRATEGIES:
    # TF's text, value unquoted (callers match it), then what to do.
    raise ValueError(
        f"{owner}: Invalid partition_strategy {partition_strategy}. Must "
        f"be one of \"mod\" or \"div\". (`partition_strategy` got "
        f"{partition_strategy!r}: 'div' shards a table's rows in "
        "contiguous blocks, 'mod' round-robin.)")


def _check_settings(owner: str, clipping_limit: Optional[float],
                    pipeline_execution_with_tensor_core: bool,
                    experimental_gradient_multiplier_fn: Any,
                    profile_data_directory: Optional[str]
                    ) -> tuple[Optional[float], bool]:
  """The spec's scalar settings, checked: (clipping_limit, pipelining)."""
  if clipping_limit is not None:
    clipping_limit = checks.check_number(owner, "clipping_limit",
                                         clipping_limit, above=0.0)
  pipelining = checks.check_bool(owner,
                                 "pipeline_execution_with_tensor_core",
                                 pipeline_execution_with_tensor_core)
  checks.check_callable(owner, "experimental_gradient_multiplier_fn",
                        experimental_gradient_multiplier_fn)
  checks.check_str(owner, "profile_data_directory", profile_data_directory,
                   allow_none=True)
  return clipping_limit, pipelining


def _check_spec_optimizer(owner: str, optimization_parameters: object) -> None:
  if optimization_parameters is not None and not isinstance(
      optimization_parameters, optimizers.OptimizationParameters):
    raise errors.ArgumentTypeError(
        f"{owner}: optimization_parameters must be an instance of type "
        "one of " + ", ".join(o.__name__ for o in optimizers.ALL_OPTIMIZERS)
        + " (estimator_spec's) (`optimization_parameters`). Got "
        f"{type(optimization_parameters)}. "
        "TensorFlow's own classes convert with "
        "estimator_spec.interop.from_tensorflow.")


def _split_columns(
    owner: str, feature_columns: Any, optimization_parameters: object
) -> tuple[list[Any], list[Any]]:
  """The spec's columns checked, as (embedding-core columns, tensor-core
  columns)."""
  if isinstance(feature_columns, dict) or not isinstance(
      feature_columns, (list, tuple)):
    checks.fail(owner, "feature_columns",
                 "must be a list of TPU embedding columns",
                 feature_columns, TypeError)
  for column in feature_columns:
    if not isinstance(column, TPU_EMBEDDING_COLUMN_TYPES):
      _unsupported_column(owner, column)
  tensor_core_columns = [c for c in feature_columns if c.is_tensor_core]
  embedding_core_columns = [
      c for c in feature_columns if not c.is_tensor_core
  ]
  if optimization_parameters is None:
    raise ValueError(
        f"{owner}: `optimization_parameters` is required with "
        "`feature_columns` (e.g. AdagradParameters(learning_rate=0.1)).")
  return embedding_core_columns, tensor_core_columns


def _unsupported_column(owner: str, column: object) -> None:
  if hasattr(column, "get_embedding_var_name"):
    raise errors.ArgumentTypeError(_tensorflow_column_error(owner, column))
  raise errors.ArgumentTypeError(
      f"{owner}: Unsupported feature column {type(column)}. "
      "Supported types are (EmbeddingColumn, SharedEmbeddingColumn) "
      f"of tpu_embedding_columns: `feature_columns` holds {column!r}, "
      "which is not a TPU embedding column; build embedding columns with "
      "tpu_embedding_columns.embedding_column / shared_embedding_columns; "
      "other feature columns belong to the dense model, not to the "
      "embedding spec.")


def _tensorflow_column_error(owner: str, column: Any) -> str:
  """One sentence for TensorFlow's own TPU column left in `feature_columns`
  by a program half migrated (docs/migration.md): the column, the function
  that builds ours, and `migrate`, which changes every such call."""
  kind = type(column)
  shared = "Shared" in kind.__name__
  # TF 1.x's shared columns name their table as `legacy`'s do.
  module = ("tpu_embedding_columns.legacy" if shared and
            kind.__module__.endswith(".tpu.feature_column") else
            "tpu_embedding_columns")
  function = "shared_embedding_columns" if shared else "embedding_column"
  name = getattr(column, "name", None)
  key = getattr(column, "get_feature_key_name", lambda: None)()
  label = (f"{name!r} (feature {key!r})" if isinstance(name, str) and
           isinstance(key, str) else kind.__name__)
  return (f"{owner}: `feature_columns` holds TensorFlow's own TPU embedding "
          f"column {label}; build it with {module}.{function}, or run "
          "`python -m estimator_spec migrate` on the program "
          "(docs/migration.md).")


def _check_dict(owner: str, arg: str, value: Any,
                value_type: type[Any]) -> dict[str, Any]:
  """`value` checked as a dict of `value_type`, copied."""
  if not isinstance(value, collections.abc.Mapping):
    checks.fail(owner, arg, "must be a dict", value, TypeError)
  for key, config in value.items():
    if not isinstance(key, str) or not key:
      checks.fail(owner, arg, "keys must be non-empty strings", key,
                   TypeError)
    if not isinstance(config, value_type):
      what = "feature" if value_type is FeatureConfig else "table"
      raise errors.ArgumentTypeError(
          f"{owner}: `{arg}[{key!r}]`: Config for {what} {key} must be of "
          f"type `{value_type.__name__}` (estimator_spec's). Got "
          f"{type(config)}.")
  return dict(value)


def model_of(owner: str, spec: Any) -> _model.EmbeddingModel:
  """The config model of `spec`; a clear TypeError naming `owner` when
  `spec` is not an `EmbeddingConfigSpec` of this library."""
  if not isinstance(spec, EmbeddingConfigSpec):
    checks.fail(owner, "spec", "must be an estimator_spec.EmbeddingConfigSpec",
                 spec, TypeError)
  model: _model.EmbeddingModel = spec.model
  return model
