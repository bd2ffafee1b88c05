"""The config model: one plain-data description of tables and features.

Everything downstream (the TPU configuration proto, enqueue ops, the host
engine, interop, reports) reads this model; nothing downstream looks at
columns or spec dicts again. There is no TensorFlow graph here.

Naming and order (docs/numerics.md, 'Tables and features'):
* from columns, a table is named `tbl_<embedding var name>` and a feature by
  its categorical column's key; from dicts, names are the dict keys;
* tables are sorted by name; features are grouped by table (tables sorted)
  and sorted by name within a table;
* dynamic learning-rate tags 0..k-1 number the distinct `learning_rate_fn`s
  in sorted-table order of first use.
"""
import collections
import dataclasses
import re
from typing import Any, Callable, Iterable, Mapping, Optional, Tuple

from tpu_embedding_columns import columns as _columns

from estimator_spec.config import optimizers as _optimizers
from estimator_spec.config import sharding


def _initializer_identity(initializer: Any) -> Any:
  """What makes two initializers the same: class and configuration (TF's
  initializer objects compare by identity, which a copy of the model sent
  to another process would not keep)."""
  get_config = getattr(initializer, "get_config", None)
  if get_config is None:
    return initializer
  return (type(initializer).__module__, type(initializer).__qualname__,
          repr(sorted(get_config().items())))


class _Initializer:
  """A table's initializer as a value: it compares and prints by class and
  configuration; `value` is the initializer itself."""

  def __init__(self, value: Any) -> None:
    self.value = value

  def __eq__(self, other: object) -> bool:
    return isinstance(other, _Initializer) and (
        _initializer_identity(self.value) == _initializer_identity(other.value))

  def __hash__(self) -> int:
    return hash(_initializer_identity(self.value))

  def __repr__(self) -> str:
    get_config = getattr(self.value, "get_config", None)
    if get_config is None:
      return repr(self.value)
    args = ", ".join(f"{k}={v!r}" for k, v in get_config().items())
    return f"{type(self.value).__name__}({args})"


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class Table:
  """One embedding table of the model. Tables compare and print by value,
  their initializers by class and configuration."""
  name: str
  vocabulary_size: int
  dimension: int
  initializer: Any
  combiner: Optional[str]
  learning_rate: Optional[float]
  learning_rate_fn: Optional[Callable[[Any], Any]]
  # The table's own optimizer (dict form), or None for the spec's.
  table_optimizer: Optional[_optimizers.OptimizationParameters]
  hot_id_replication: bool
  features: Tuple[str, ...]
  # The variable name a plain CPU lookup gives the table (without layer
  # scope): the categorical column's name, the shared collection name, or
  # the table name in the dict form.
  embedding_var_name: str

  def _values(self) -> Tuple[Tuple[str, Any], ...]:
    return tuple(
        (field.name, _Initializer(getattr(self, field.name))
         if field.name == "initializer" else getattr(self, field.name))
        for field in dataclasses.fields(self))

  def __eq__(self, other: object) -> bool:
    return isinstance(other, Table) and self._values() == other._values()

  def __hash__(self) -> int:
    return hash(self._values())

  def __repr__(self) -> str:
    return "Table(" + ", ".join(f"{k}={v!r}" for k, v in self._values()) + ")"


@dataclasses.dataclass(frozen=True)
class Feature:
  """One feature: the ids under `name` in the features dict."""
  name: str
  table: str
  max_sequence_length: int
  weight_key: Optional[str]
  # The name of the embedding column that configures it (None in the dict
  # form); the column object itself stays with the spec
  # (`EmbeddingConfigSpec.column_for`).
  column_name: Optional[str] = None

  @property
  def is_sequence(self) -> bool:
    return self.max_sequence_length > 0

  @property
  def length_key(self) -> str:
    """The key of the feature's sequence lengths beside its activation
    (`<feature>_seq_length_`, as TF's sequence columns name it)."""
    key: str = _columns.sequence_length_key(self.name)
    return key


@dataclasses.dataclass(frozen=True)
class LearningRate:
  """The learning rate that trains one table (docs/numerics.md, 'Learning
  rates and schedules').

  The table's own `learning_rate` comes first, then its `learning_rate_fn`
  (of the global step), then its optimizer's `learning_rate`. Exactly one of
  `constant` and `fn` is set (`constant` is None for a table without an
  optimizer, in inference); `tag` numbers the distinct functions in table
  order (the TPU's dynamic learning-rate tag), None for constants.
  """
  constant: Optional[float]
  fn: Optional[Callable[[Any], Any]] = None
  tag: Optional[int] = None

  def label(self) -> str:
    """A short printable form: the constant, `fn#<tag>`, or '-'."""
    if self.fn is not None:
      return f"fn#{self.tag}"
    return "-" if self.constant is None else f"{self.constant:g}"


@dataclasses.dataclass(frozen=True)
class TensorCoreFeature:
  """A column looked up by the dense model (tensor core), not the engine:
  its ids are padded to `shape` and masked under `mask_key`."""
  column_name: str
  shape: Tuple[int, ...]
  mask_key: str


class EmbeddingModel:
  """Tables, features and training settings of one `EmbeddingConfigSpec`.

  Plain data: it prints, compares by value and pickles (callables such as
  a `learning_rate_fn` pickle when they are module-level functions), so it
  can be sent to another process; the column objects stay with the spec.
  """

  def __init__(
      self, tables: Mapping[str, Table], features: Mapping[str, Feature],
      optimizer: Optional[_optimizers.OptimizationParameters], *,
      clipping_limit: Optional[float] = None,
      pipeline_execution_with_tensor_core: bool = False,
      gradient_multiplier_fn: Optional[Callable[[Any], Any]] = None,
      partition_strategy: str = "div",
      profile_data_directory: Optional[str] = None,
      tensor_core_features: Iterable[TensorCoreFeature] = ()) -> None:
    self.tables = collections.OrderedDict(
        (name, tables[name]) for name in sorted(tables))
    self.features = collections.OrderedDict(
        (f, features[f])
        for table in self.tables.values()
        for f in table.features)
    self.optimizer = optimizer
    self.clipping_limit = clipping_limit
    self.pipeline_execution_with_tensor_core = (
        pipeline_execution_with_tensor_core)
    self.gradient_multiplier_fn = gradient_multiplier_fn
    self.partition_strategy = partition_strategy
    self.profile_data_directory = profile_data_directory
    self.tensor_core_features = tuple(tensor_core_features)
    # A table's own rate (constant or function), None for its optimizer's.
    self._own_rates: dict[str, Optional[LearningRate]] = {}
    fns: list[Callable[[Any], Any]] = []
    for name, table in self.tables.items():
      rate = None
      if table.learning_rate is not None:
        rate = LearningRate(table.learning_rate)
      elif table.learning_rate_fn is not None:
        if table.learning_rate_fn not in fns:
          fns.append(table.learning_rate_fn)
        rate = LearningRate(None, table.learning_rate_fn,
                            fns.index(table.learning_rate_fn))
      self._own_rates[name] = rate
    self.learning_rate_fns = tuple(fns)
    if clipping_limit is not None:
      self._check_clipping_limit(clipping_limit)

  def _check_clipping_limit(self, clipping_limit: float) -> None:
    """`clipping_limit` needs gradient accumulation and leaves every table
    some allowed gradient value."""
    for table in self.tables.values():
      opt = self.optimizer_for(table.name)
      if opt is None:
        continue
      if not opt.use_gradient_accumulation:
        raise ValueError(
            f"EmbeddingConfigSpec: `clipping_limit` clips accumulated "
            f"gradients, but table {table.name!r} uses {opt!r} with "
            "use_gradient_accumulation=False; enable accumulation or drop "
            "clipping_limit.")
      lower, upper = self.gradient_clip_bounds(opt)
      # Both are numbers: the clipping limit bounds them.
      if lower is not None and upper is not None and lower > upper:
        raise ValueError(
            f"EmbeddingConfigSpec: `clipping_limit` ({clipping_limit}) and "
            f"the gradient clipping of table {table.name!r} "
            f"(clip_gradient_min={opt.clip_gradient_min}, "
            f"clip_gradient_max={opt.clip_gradient_max}) leave no allowed "
            "gradient value; widen one of them.")

  # --- construction --------------------------------------------------------

  @classmethod
  def from_spec(cls, spec: Any) -> "EmbeddingModel":
    settings = dict(
        clipping_limit=spec.clipping_limit,
        pipeline_execution_with_tensor_core=(
            spec.pipeline_execution_with_tensor_core),
        gradient_multiplier_fn=spec.experimental_gradient_multiplier_fn,
        partition_strategy=spec.partition_strategy,
        profile_data_directory=spec.profile_data_directory)
    if spec.feature_columns is not None:
      tables, features = _from_columns(spec.feature_columns)
      return cls(tables, features, spec.optimization_parameters,
                 tensor_core_features=tuple(
                     TensorCoreFeature(c.name, tuple(c.tensor_core_shape),
                                       c.tensor_core_mask_key)
                     for c in spec.tensor_core_feature_columns or ()),
                 **settings)
    tables, features = _from_dicts(spec.table_to_config_dict,
                                   spec.feature_to_config_dict)
    return cls(tables, features, spec.optimization_parameters, **settings)

  # --- queries ---------------------------------------------------------------

  @property
  def uses_columns(self) -> bool:
    """Whether the spec was given as feature columns (else as dicts)."""
    return any(f.column_name is not None for f in self.features.values())

  def optimizer_for(
      self, table_name: str) -> Optional[_optimizers.OptimizationParameters]:
    """The optimizer that trains `table_name` (its own, else the spec's)."""
    table = self.tables[table_name]
    return table.table_optimizer or self.optimizer

  def learning_rate(
      self, table_name: str,
      optimizer: Optional[_optimizers.OptimizationParameters] = None
  ) -> LearningRate:
    """The `LearningRate` of a table: its own, else that of `optimizer` (by
    default the optimizer that trains it). The precedence is decided here
    only."""
    own = self._own_rates[table_name]
    if own is not None:
      return own
    if optimizer is None:
      optimizer = self.optimizer_for(table_name)
    return LearningRate(None if optimizer is None else optimizer.learning_rate)

  def feature_of_column(self, column: Any) -> Feature:
    """The configured `Feature` an embedding column used in a model_fn
    reads; ValueError when the spec does not configure that column (same
    feature key, table, dimension and sequence length)."""
    feature = self.features.get(column.feature_key)
    if feature is None or feature.column_name is None or (
        feature.table != column.table_name) or (
            self.tables[feature.table].dimension != column.dimension) or (
                feature.max_sequence_length != column.max_sequence_length):
      configured = sorted(
          f.column_name for f in self.features.values()
          if f.column_name is not None)
      raise ValueError(
          f"model_fn uses embedding column {column.name!r} (feature "
          f"{column.feature_key!r}, table {column.table_name!r}), which is "
          "not in the embedding_config_spec's feature_columns (configured: "
          f"{configured}). Add it to EmbeddingConfigSpec(feature_columns=...)"
          " or use the spec's own column objects.")
    return feature

  @property
  def shared_weight_keys(self) -> dict[str, Tuple[str, ...]]:
    """{weight key: feature names} of the weight keys several features read
    (see `shared_weight_keys`); empty for most models."""
    return shared_weight_keys(self.features)

  def shard_layout(self, table_name: str,
                   num_shards: int) -> sharding.ShardLayout:
    return sharding.ShardLayout(self.tables[table_name].vocabulary_size,
                                num_shards, self.partition_strategy)

  def gradient_clip_bounds(
      self, optimizer: _optimizers.OptimizationParameters
  ) -> Tuple[Optional[float], Optional[float]]:
    """[lower, upper] for accumulated gradients (None = unbounded): the
    optimizer's clip_gradient_* intersected with [-clipping_limit,
    clipping_limit]."""
    lower = optimizer.clip_gradient_min
    upper = optimizer.clip_gradient_max
    if self.clipping_limit is not None:
      limit = self.clipping_limit
      lower = -limit if lower is None else max(lower, -limit)
      upper = limit if upper is None else min(upper, limit)
    return lower, upper

  def _values(self) -> Tuple[Any, ...]:
    return (self.tables, self.features, self.optimizer, self.clipping_limit,
            self.pipeline_execution_with_tensor_core,
            self.gradient_multiplier_fn, self.partition_strategy,
            self.profile_data_directory, self.tensor_core_features)

  def __eq__(self, other: object) -> bool:
    return isinstance(other, EmbeddingModel) and (
        self._values() == other._values())

  # A mutable container of tables is unhashable, as Python's own are; mypy
  # takes object's __hash__ for the only type this attribute may have.
  __hash__ = None  # type: ignore[assignment]

  def __repr__(self) -> str:
    return (f"EmbeddingModel(tables={list(self.tables)}, "
            f"features={list(self.features)}, optimizer={self.optimizer!r})")


_Tables = dict[str, dict[str, Any]]  # a table's fields, before its features
_Model = Tuple[dict[str, Table], dict[str, Feature]]


def _from_columns(columns: Iterable[Any]) -> _Model:
  """Tables and features from TPU embedding columns."""
  tables: _Tables = {}
  features: dict[str, Feature] = {}
  owners: dict[str, Any] = {}  # table name -> column that defined it
  for column in columns:
    feature = column.feature_key
    if feature in features:
      raise ValueError(
          f"EmbeddingConfigSpec: `feature_columns`: Feature column {feature} "
          "is used with multiple embeddings and this is not supported "
          f"(feature {feature!r}: columns {features[feature].column_name!r} "
          f"and {column.name!r}); a feature can look up only one table.")
    features[feature] = Feature(feature, column.table_name,
                                column.max_sequence_length, column.weight_key,
                                column.name)
    name = column.table_name
    if name in owners:
      first = owners[name]
      same_group = (getattr(first, "shared_table", None) is not None and
                    getattr(first, "shared_table", None) is getattr(
                        column, "shared_table", None))
      if not same_group:
        raise ValueError(
            f"EmbeddingConfigSpec: `feature_columns`: columns {first.name!r} "
            f"and {column.name!r} both map to table "
            f"{name!r} without being one shared_embedding_columns group; give "
            "the shared group a distinct shared_embedding_collection_name or "
            "create the shared columns in one call.")
      continue
    owners[name] = column
    tables[name] = dict(
        name=name,
        vocabulary_size=column.vocabulary_size,
        dimension=column.dimension,
        initializer=column.initializer,
        combiner=column.combiner,
        learning_rate=None,
        learning_rate_fn=column.learning_rate_fn,
        table_optimizer=None,
        hot_id_replication=False,
        embedding_var_name=column.embedding_var_name)
  for name, column in owners.items():
    check_table_name(name, f"`feature_columns`: column {column.name!r}")
  return _finish(tables, features)


def _from_dicts(table_to_config_dict: Mapping[str, Any],
                feature_to_config_dict: Mapping[str, Any]) -> _Model:
  """Tables and features from the dict form of the spec."""
  features: dict[str, Feature] = {}
  for name, config in feature_to_config_dict.items():
    if config.table_id not in table_to_config_dict:
      raise ValueError(
          f"EmbeddingConfigSpec: `feature_to_config_dict[{name!r}]`: Feature "
          f"{name} refers to table {config.table_id} which is not in the "
          f"table_to_config_dict (feature {name!r}, table {config.table_id!r};"
          f" tables: {sorted(table_to_config_dict)}).")
    features[name] = Feature(name, config.table_id,
                             config.max_sequence_length, config.weight_key)
  used = {f.table for f in features.values()}
  unused = sorted(set(table_to_config_dict) - used)
  if unused:
    raise ValueError(
        "EmbeddingConfigSpec: `table_to_config_dict` has tables that no "
        f"feature uses: {unused}; "
        "remove them or add features for them.")
  tables: _Tables = {}
  for name, config in table_to_config_dict.items():
    check_table_name(name, "`table_to_config_dict`")
    tables[name] = dict(
        name=name,
        vocabulary_size=config.vocabulary_size,
        dimension=config.dimension,
        initializer=config.initializer,
        combiner=config.combiner,
        learning_rate=config.learning_rate,
        learning_rate_fn=config.learning_rate_fn,
        table_optimizer=config.optimization_parameters,
        hot_id_replication=config.hot_id_replication,
        embedding_var_name=name)
  return _finish(tables, features)


def shared_weight_keys(
    features: Mapping[str, Feature]) -> dict[str, Tuple[str, ...]]:
  """{weight key: sorted names of the features reading it} for each weight
  key that several features read. A spec may configure that (TF's spec
  does); a TPU infeed hands a weight feature to the first feature that reads
  it, so reading such input fails (`engine.inputs.check_weight_keys`)."""
  readers: collections.defaultdict[str, list[str]] = (
      collections.defaultdict(list))
  for feature in features.values():
    if feature.weight_key is not None:
      readers[feature.weight_key].append(feature.name)
  return {key: tuple(sorted(names))
          for key, names in sorted(readers.items()) if len(names) > 1}


# A table's name names its variables (a root name scope of the graph) and
# its lookup statistics file: TF's rule for a root scope name
# (`[A-Za-z0-9.][A-Za-z0-9_.\\/>-]*`) less what TF's node names or a file
# name cannot carry: no backslash, no leading '.' (a hidden file), no empty
# part between '/'s.
TABLE_NAME_RULE = "[A-Za-z0-9][A-Za-z0-9_.>/-]*, no '//', not ending in '/'"
_TABLE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.>/-]*")


def check_table_name(name: object, where: str) -> None:
  """Raises ValueError (naming `where` and the rule) unless `name` is a
  table name TF can scope and a statistics file can carry."""
  if not isinstance(name, str):
    raise TypeError(f"EmbeddingConfigSpec: {where}: table name {name!r} must "
                    "be a string.")
  if (not _TABLE_NAME.fullmatch(name) or "//" in name or
      name.endswith("/")):
    raise ValueError(
        f"EmbeddingConfigSpec: {where}: table name {name!r} is not allowed: "
        f"a table name must match {TABLE_NAME_RULE} (it becomes the root name "
        "scope of the table's variables and the name of its statistics "
        "file); rename the table (or the column's key or "
        "shared_embedding_collection_name it comes from).")


def _finish(table_fields: _Tables, features: dict[str, Feature]) -> _Model:
  by_table: collections.defaultdict[str, list[str]] = (
      collections.defaultdict(list))
  for feature in features.values():
    by_table[feature.table].append(feature.name)
  tables = {
      name: Table(features=tuple(sorted(by_table[name])), **fields)
      for name, fields in table_fields.items()
  }
  return tables, features
