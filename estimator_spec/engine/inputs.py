"""The one parser of embedding features: from a features dict to ids.

`read_feature` decides, when the graph is built, what the TPU infeed takes
from a features dict for one feature; the infeed (`enqueue.split_inputs`)
and the host engine (`parse_features`) both use it, so they accept and
refuse exactly the same inputs (docs/numerics.md, 'Lookup'):

* integer ids are taken as given, as TF's TPU input path takes them: a
  SparseTensor or RaggedTensor, or a dense tensor whose non-zero entries are
  the ids; for a table with combiner None, a dense rank-1 tensor holds one
  id per example;
* other inputs (strings for vocabulary and hash columns, floats for
  bucketized ones, the raw keys of crossed columns) are turned into ids by
  the feature's categorical column (columns form of the spec only);
* weights come from the feature's `weight_key` as a SparseTensor (or
  RaggedTensor) at the ids' positions, cast to float32; dense weights are
  refused, as on a TPU;
* a `GivenIds` under the feature's name holds ids already in the form TF2's
  mid-level API gives them (`HostTPUEmbedding`): a SparseTensor with its
  own optional weights, or one id per example. `read_mid_level_input`
  makes it from what TF2's `TPUEmbedding.enqueue` takes for one feature
  (SparseTensor or RaggedTensor ids of any rank, dense ids [batch] or
  [..., 1]), refusing what TF2 refuses.

`parse_features` then validates when the graph runs (indices inside the
dense_shape, weights at the ids' positions, ids in range after dropping
sequence positions past `max_sequence_length`) and flattens the ids.
"""
import collections
import dataclasses
from typing import Any, Dict, List, Mapping, Optional, Tuple

import tensorflow as tf

from tpu_embedding_columns import errors
from tpu_embedding_columns import lookup as column_lookup

from estimator_spec.config import model as model_lib


@dataclasses.dataclass(frozen=True)
class FeatureInput:
  """One feature's ids as the TPU infeed takes them.

  ids: a SparseTensor of integer ids, or (`single`) a dense rank-1 tensor
  with one id per example; weights: a float32 SparseTensor at the ids'
  positions, or None; transformed: whether the feature's column made the ids;
  keys: the features dict keys the feature read.
  """
  ids: Any
  weights: Any
  transformed: bool
  keys: Tuple[str, ...]
  # From a `GivenIds`: negative ids drop, one id per example is its row.
  given: bool = False

  @property
  def single(self) -> bool:
    return not isinstance(self.ids, tf.SparseTensor)


@dataclasses.dataclass
class GivenIds:
  """One feature's ids as TF2's mid-level API takes them.

  ids: a SparseTensor [batch, ids] (int), with `weights` None or a
  SparseTensor at the same positions; or a dense [batch] tensor, one id
  per example (no weights). Negative ids are dropped (that example or
  position gets zeros). One id per example gives the id's row whatever the
  table's combiner: sum, mean and sqrtn of one id of weight 1 all give the
  row, so the engine skips the combiner's arithmetic.
  """
  ids: Any
  weights: Any = None

  @property
  def one_per_example(self) -> bool:
    return not isinstance(self.ids, tf.SparseTensor)

  @property
  def rows(self) -> Any:
    """The examples (the engine's batch) of these ids."""
    if self.one_per_example:
      return tf.shape(self.ids, out_type=tf.int64)[0]
    return self.ids.dense_shape[0]

  def as_sparse(self) -> "GivenIds":
    """The same ids as a SparseTensor [batch, 1] when one per example."""
    if not self.one_per_example:
      return self
    return GivenIds(one_per_example_as_sparse(self.ids))

  @staticmethod
  def join(pieces: List["GivenIds"]) -> "GivenIds":
    """One `GivenIds` of the pieces' examples, in order (replicas' parts
    of a global batch); sparse when any piece is, weights of 1 where a
    piece has none and another has some."""
    if len(pieces) == 1:
      return pieces[0]
    if all(piece.one_per_example for piece in pieces):
      return GivenIds(tf.concat([piece.ids for piece in pieces], axis=0))
    pieces = [piece.as_sparse() for piece in pieces]
    ids = tf.sparse.concat(0, [piece.ids for piece in pieces],
                           expand_nonconcat_dims=True)
    if all(piece.weights is None for piece in pieces):
      return GivenIds(ids)
    weights = [
        piece.weights if piece.weights is not None else tf.SparseTensor(
            piece.ids.indices, tf.ones_like(piece.ids.values, tf.float32),
            piece.ids.dense_shape) for piece in pieces
    ]
    return GivenIds(ids, tf.sparse.concat(0, weights,
                                          expand_nonconcat_dims=True))


def one_per_example_as_sparse(ids: Any) -> Any:
  """A dense [batch] tensor of ids, one per example, as a SparseTensor
  [batch, 1] of int64 ids."""
  static = tf.compat.dimension_value(ids.shape[0])
  batch = (tf.constant(static, tf.int64) if static is not None else
           tf.shape(ids, out_type=tf.int64)[0])
  rows = tf.range(batch, dtype=tf.int64)
  # [example, 0] per id: few ops per feature (graphs of many features).
  indices = tf.stack([rows, rows], axis=1) * tf.constant([1, 0], tf.int64)
  return tf.SparseTensor(indices, tf.cast(ids, tf.int64),
                         tf.stack([batch, 1]))


@dataclasses.dataclass(frozen=True)
class MidLevelInput:
  """One feature's input as TF2's mid-level API takes it, read by
  `read_mid_level_input`.

  given: the engine's input (`GivenIds`): SparseTensor ids [batch, ids]
  with optional weights, or dense ids [batch], one per example. kind:
  'dense', 'sparse' or 'ragged', the form the ids were given in.
  flat_batch: the leading dimensions (int64 vector) of ids of higher rank
  that were flattened into the engine's batch, else None.
  """
  given: GivenIds
  kind: str
  flat_batch: Any = None


def read_mid_level_input(ids: Any, weights: Any, max_sequence_length: int,
                         where: str) -> MidLevelInput:
  """The `MidLevelInput` of one feature's `ids` and `weights` (None or of
  the ids' kind) as TF2's `TPUEmbedding.enqueue` takes them: a RaggedTensor
  [batch, (ids)], a SparseTensor [batch, ids] or of higher rank (flattened
  to [examples, ids]; not for a sequence feature), or dense ids [batch] or
  [..., 1] (no weights, not for a sequence feature). Raises ValueError or
  TypeError, starting with `where`, for anything else."""
  if isinstance(ids, tf.RaggedTensor):
    if weights is not None and not isinstance(weights, tf.RaggedTensor):
      raise ValueError(f"{where}: the ids are a RaggedTensor, the weights "
                       f"a {type(weights).__name__}; give them alike.")
    if ids.ragged_rank != 1 or ids.shape.rank != 2:
      raise ValueError(f"{where}: RaggedTensor ids must be [batch, (ids)] "
                       f"(rank 2); got shape {ids.shape}. Give ids of "
                       "higher rank as a SparseTensor.")
    result = MidLevelInput(GivenIds(
        ids.to_sparse(), None if weights is None else weights.to_sparse()),
                           "ragged")
  elif isinstance(ids, tf.SparseTensor):
    result = _mid_level_sparse(ids, weights, max_sequence_length, where)
  else:
    result = _mid_level_dense(ids, weights, max_sequence_length, where)
  if not result.given.ids.dtype.is_integer:
    raise TypeError(f"{where}: ids must be integers; got "
                    f"{result.given.ids.dtype.name}.")
  return result


def _mid_level_sparse(ids: Any, weights: Any, max_sequence_length: int,
                      where: str) -> MidLevelInput:
  if weights is not None and not isinstance(weights, tf.SparseTensor):
    raise ValueError(f"{where}: the ids are a SparseTensor, the weights "
                     f"a {type(weights).__name__}; give them alike.")
  rank = ids.shape.rank
  if rank is not None and rank < 2:
    raise ValueError(f"{where}: SparseTensor ids must be [batch, ids] or "
                     f"of higher rank; got shape {ids.shape}.")
  if rank is None or rank <= 2:
    return MidLevelInput(GivenIds(ids, weights), "sparse")
  if max_sequence_length > 0:
    raise ValueError(
        f"{where}: SparseTensor ids of rank {rank} for a sequence "
        f"feature (max_sequence_length={max_sequence_length}) "
        "are not supported: TF's TPUEmbedding ignores "
        "max_sequence_length for them and combines over the last "
        "dimension. Give [batch, ids] (rank 2), or a FeatureConfig "
        "without max_sequence_length for combined lookups.")
  if weights is not None and weights.shape.rank != rank:
    raise ValueError(f"{where}: the ids have shape {ids.shape}, the "
                     f"weights {weights.shape}; give them alike.")
  flat_batch = ids.dense_shape[:-1]
  sparse = _flatten_sparse(ids)
  if weights is not None:
    weights = _flatten_sparse(weights, like=ids)
  return MidLevelInput(GivenIds(sparse, weights), "sparse", flat_batch)


def _mid_level_dense(ids: Any, weights: Any, max_sequence_length: int,
                     where: str) -> MidLevelInput:
  dense = tf.convert_to_tensor(ids)
  if weights is not None:
    raise ValueError(f"{where}: weights were given for dense ids; dense "
                     "ids take no weights (give ids and weights as "
                     "SparseTensors or RaggedTensors).")
  if max_sequence_length > 0:
    raise ValueError(f"{where}: a sequence feature (max_sequence_length="
                     f"{max_sequence_length}) takes a "
                     "SparseTensor or RaggedTensor, not dense ids.")
  rank = dense.shape.rank
  if rank is None or rank == 0 or (
      rank > 1 and tf.compat.dimension_value(dense.shape[-1]) != 1):
    raise ValueError(
        f"{where}: dense ids must be [batch] or [..., 1], one id per "
        f"example (each looked up alone); got shape {dense.shape}. Give "
        "several ids per example as a SparseTensor or RaggedTensor.")
  flat_batch = None
  if rank > 1:
    flat_batch = tf.shape(dense, out_type=tf.int64)[:-1]
    dense = tf.reshape(dense, [-1])
  # One id per example: the engine's fast path.
  return MidLevelInput(GivenIds(dense), "dense", flat_batch)


def _flatten_sparse(sparse: Any, like: Any = None) -> Any:
  """`sparse` [d0, ..., dk, n] as [d0 * ... * dk, n] (rows in row-major
  order); `like`: the tensor whose dense shape decides both (the ids, for
  their weights)."""
  like = sparse if like is None else like
  leading = like.shape[:-1].num_elements()
  last = tf.compat.dimension_value(like.shape[-1])
  target = tf.stack([
      tf.constant(leading, tf.int64) if leading is not None else
      tf.reduce_prod(like.dense_shape[:-1]),
      tf.constant(last, tf.int64) if last is not None else
      like.dense_shape[-1]])
  return tf.sparse.reshape(sparse, target)


def read_feature(feature: model_lib.Feature, table: model_lib.Table,
                 column: Any, features: Mapping[str, Any], where: str,
                 integer_ids_as_given: bool = False) -> FeatureInput:
  """The `FeatureInput` of `feature` (a model.Feature of `table`, configured
  by `column`, None in the dict form) in `features`; raises for inputs a TPU
  infeed would refuse. `where` starts every message (it names the feature
  and the table). Integer inputs for a column that declares string inputs
  are refused, as TF's column refuses them, unless `integer_ids_as_given`
  (TF's TPU infeed takes any integer input as the ids themselves)."""
  name = feature.name
  raw = features.get(name)
  if isinstance(raw, GivenIds):
    if feature.weight_key is not None:
      raise ValueError(
          f"{where}: GivenIds carry their own weights; the feature's "
          f"weight_key {feature.weight_key!r} would be a second source.")
    return FeatureInput(raw.ids, raw.weights, False, (name,), given=True)
  if (column is not None and raw is not None and is_integer(raw) and
      not integer_ids_as_given):
    _check_column_dtype(column, raw, where)
  if column is not None and (raw is None or not is_integer(raw)):
    ids, keys = transformed_ids(column, features, where)
    transformed = True
  else:
    keys = (name,)
    _require(keys, features, where)
    ids = _as_sparse_or_dense(raw)
    if not ids.dtype.is_integer:
      raise errors.ArgumentTypeError(
          f"{where}: ids must be integers; got {ids.dtype.name} (SparseTensor "
          "with string as values are not supported on TPU). Build the spec "
          "from feature columns to have strings turned into ids, or convert "
          "them in the input_fn.")
    if not isinstance(ids, tf.SparseTensor):
      if (table.combiner is None and ids.shape.rank == 1 and
          not feature.is_sequence):
        if feature.weight_key is not None:
          raise ValueError(
              f"{where}: Found weights {feature.weight_key} for "
              "weighted_categorical_column, which is not compatible with "
              f"sparse feature {name} enqueued as dense tensor (combiner None "
              "with dense rank-1 ids: one id per example, no weights). Give "
              "the ids as a SparseTensor or drop the weight_key.")
        return FeatureInput(ids, None, False, keys)
      if ids.shape.rank == 1:
        ids = tf.expand_dims(ids, 1)
      if ids.shape.rank not in (2, 3):
        raise ValueError(
            f"{where}: dense ids must be [batch, ids per example] (rank 2); "
            f"got shape {ids.shape}. Give a SparseTensor or a RaggedTensor.")
      ids = column_lookup.dense_to_sparse(ids)
    transformed = False
  weights = None
  if feature.weight_key is not None:
    weights = _read_weights(feature, features, where)
    keys += (feature.weight_key,)
  return FeatureInput(ids, weights, transformed, keys)


def _check_column_dtype(column: Any, raw: Any, where: str) -> None:
  """Integer ids for a column that declares string inputs (a hash-bucket or
  vocabulary column of dtype string) are refused, as TF's column refuses
  them, when the graph is built (before any step)."""
  declared = getattr(column_lookup.id_column(column), "dtype", None)
  if declared is None or tf.as_dtype(declared).is_integer:
    return
  raise ValueError(
      f"{where}: Column dtype and SparseTensors dtype must be compatible. "
      f"key: {column_lookup.id_column(column).key}, column dtype: "
      f"{tf.as_dtype(declared)!r}, tensor dtype: {tf.as_dtype(raw.dtype)!r}. "
      "Feed strings, or declare the column with an integer dtype.")


def transformed_ids(column: Any, features: Mapping[str, Any],
                    where: str) -> Tuple[Any, Tuple[str, ...]]:
  """(SparseTensor ids, keys read): the raw inputs of a column turned into
  ids by the id part of its categorical column."""
  keys = tuple(sorted(column_lookup.id_column(column).parse_example_spec))
  _require(keys, features, where)
  ids = column_lookup.column_ids(column, features)
  if column.is_sequence and ids.shape.rank == 3:
    # Sequence columns give [batch, position, 1].
    ids = tf.SparseTensor(ids.indices[:, :2], ids.values,
                          ids.dense_shape[:2])
  return ids, keys


def _require(keys: Tuple[str, ...], features: Mapping[str, Any],
             where: str) -> None:
  missing = [key for key in keys if key not in features]
  if missing:
    raise ValueError(f"{where}: {missing} missing from the features dict; "
                     f"got keys {sorted(features)}.")


def _as_sparse_or_dense(value: Any) -> Any:
  if isinstance(value, tf.RaggedTensor):
    return value.to_sparse()
  if isinstance(value, tf.SparseTensor):
    return value
  return tf.convert_to_tensor(value)


def is_integer(value: Any) -> bool:
  dtype = getattr(value, "dtype", None)
  if dtype is None:
    dtype = tf.convert_to_tensor(value).dtype
  integer: bool = tf.as_dtype(dtype).is_integer
  return integer


def _read_weights(feature: model_lib.Feature, features: Mapping[Any, Any],
                  where: str) -> Any:
  key = feature.weight_key
  if key not in features:
    raise ValueError(
        f"{where}: {_tf_missing_weights(key)} (The features dict has no "
        f"{key!r}; its keys: {sorted(features)}.)")
  weights = features[key]
  if isinstance(weights, tf.RaggedTensor):
    weights = weights.to_sparse()
  if not isinstance(weights, tf.SparseTensor):
    raise ValueError(
        f"{where}: weighted_categorical_column with weight key name {key} has "
        "dense weights. Dense weights are not supported on TPU. Please use "
        "sparse weights instead (a SparseTensor or RaggedTensor with the "
        "ids' indices).")
  if not (weights.dtype.is_integer or weights.dtype.is_floating):
    raise errors.ArgumentTypeError(
        f"{where}: weights {key!r} must be numbers; got "
        f"{weights.dtype.name}.")
  if weights.dtype != tf.float32:
    # The TPU takes float32 weights (integer weights are cast, as TF's TPU
    # input path does).
    weights = tf.SparseTensor(weights.indices,
                              tf.cast(weights.values, tf.float32),
                              weights.dense_shape)
  return weights


def check_weight_keys(model: model_lib.EmbeddingModel, where: str) -> None:
  """Raises ValueError if several features of `model` (a config model) read
  their weights from one key: a TPU infeed hands the weights to the first
  feature that reads them, so the others find none. Checked when input is
  read (before any lookup or update), as TF's TPU input path does."""
  for key, names in model.shared_weight_keys.items():
    raise ValueError(
        f"{where}: {_tf_missing_weights(key)} (Here: features {list(names)} "
        f"all take their weights from the key {key!r}; a TPU infeed gives "
        "them to the first only. Give each weighted feature its own weight "
        "key: copy the weights in the input_fn.)")


def _tf_missing_weights(key: Optional[str]) -> str:
  """TF's own sentence for weights a TPU infeed cannot find (callers match
  it), which is also what it says of weights shared by two features."""
  return (f"Cannot find weights {key} for weighted_categorical_column. "
          "Please check if the weights are present in feature dict. Also "
          "note weight-sharing among weighted_categorical_column is not "
          "supported on TPU.")


@dataclasses.dataclass(frozen=True)
class FeatureIds:
  """Validated ids of one feature for one step."""
  name: str
  table: str
  flat: column_lookup.FlatIds
  max_sequence_length: int
  combiner: Optional[str]
  # Sequence lengths min(length, L) for sequence features, else None.
  lengths: Optional[Any] = None


@dataclasses.dataclass(frozen=True)
class _Parsing:
  """How one feature's ids become its `FeatureIds` once flattened: its
  combiner (None: at most one id per example, checked), its sequence length
  L (0 when not a sequence feature) and lengths, and the static batch size
  of one id per example (None when not known)."""
  feature: Any
  table: Any
  combiner: Optional[str]
  max_sequence_length: int
  lengths: Optional[Any]
  static_batch_size: Optional[int]


def parse_features(model: Any, spec: Any, features: Mapping[str, Any],
                   compiled_ops: Any = None) -> Dict[str, FeatureIds]:
  """{name: `FeatureIds`} of every feature of `model` (a config model), in
  the model's order, from `features`; `spec` gives each feature's column
  (`spec.column_for`), None in the dict form. `compiled_ops`: see
  `tpu_embedding_columns.lookup.flatten_many`.

  Python-side problems (missing keys, wrong types, ranks or forms) raise
  here, at graph-building time; the rest is checked when the graph runs,
  for all features together (`tpu_embedding_columns.lookup.flatten_many`).
  """
  check_weight_keys(model, "Embedding features")
  sources, parsings = [], []
  for feature in model.features.values():
    table = model.tables[feature.table]
    column = spec.column_for(feature.name)
    where = f"Feature {feature.name!r} (table {table.name!r})"
    given = read_feature(feature, table, column, features, where)
    source, parsing = _id_source(feature, table, column, given, where)
    sources.append(source)
    parsings.append(parsing)
  parsed = collections.OrderedDict()
  flats = (column_lookup.flatten_many(sources, compiled_ops)
           if sources else [])
  for flat, parsing in zip(flats, parsings):
    if parsing.static_batch_size is not None:
      flat.static_batch_size = parsing.static_batch_size
    parsed[parsing.feature.name] = FeatureIds(
        parsing.feature.name, parsing.table.name, flat,
        parsing.max_sequence_length, parsing.combiner, parsing.lengths)
  return parsed


def _id_source(feature: model_lib.Feature, table: model_lib.Table,
               column: Any, given: FeatureInput,
               where: str) -> Tuple[Any, "_Parsing"]:
  """(`lookup.IdSource`, `_Parsing`) of one feature's `FeatureInput`."""
  if given.single:
    # One id per example: with combiner None (negative ids refused, at
    # most one id per example checked by the combiner's plan), or from
    # a `GivenIds` (negative ids dropped; the row itself, as 'sum'
    # gives).
    source = column_lookup.IdSource(
        one_per_example_as_sparse(given.ids), None, table.vocabulary_size,
        where, drop_negative=given.given)
    return source, _Parsing(
        feature, table, "sum" if given.given else None, 0, None,
        tf.compat.dimension_value(given.ids.shape[0]))
  drop_negative = column.drops_negative_ids if column else True
  source = column_lookup.IdSource(
      given.ids, given.weights, table.vocabulary_size, where,
      drop_negative=drop_negative,
      ids_non_negative=given.transformed and
      column_lookup.never_negative(column.categorical_column),
      max_positions=feature.max_sequence_length or None)
  lengths = None
  if feature.max_sequence_length:
    lengths = column_lookup.sequence_lengths(given.ids,
                                             feature.max_sequence_length)
  return source, _Parsing(feature, table, table.combiner,
                          feature.max_sequence_length, lengths, None)


def check_batch_sizes(
    parsed: Mapping[str, FeatureIds]) -> Tuple[Any, List[Any]]:

  """All features must have the same batch size; returns (batch, checks)."""
  items = list(parsed.values())
  static = {}
  for item in items:
    if item.flat.static_batch_size is not None:
      static[item.name] = item.flat.static_batch_size
  if len(set(static.values())) > 1:
    raise ValueError(
        "Features have different batch sizes: "
        + ", ".join(f"{k}={v}" for k, v in sorted(static.items())) +
        "; every feature of a step must have the same batch size.")
  first = items[0]
  if len(items) == 1:
    return first.flat.batch_size, []
  sizes = tf.stack([item.flat.batch_size for item in items])
  names = ", ".join(repr(item.name) for item in items)
  checks = [
      column_lookup.check(
          tf.equal(sizes, first.flat.batch_size),
          f"Features {names} do not all have the same batch size; their "
          "batch sizes:", [sizes])
  ]
  return first.flat.batch_size, checks
