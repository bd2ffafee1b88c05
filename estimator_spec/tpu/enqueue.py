"""TPU infeed: host preprocessing of a batch and the embedding enqueue ops.

Two steps turn one host's batch into what the TPU embedding cores read
(docs/numerics.md, 'Lookup' and 'Tables and features'):

* `split_inputs(config, features, labels)` takes the ids of every engine
  feature out of the features dict, splits them across the host's cores and
  returns one `{feature: EnqueueData}` dict per core. It adds the
  `<key>_seq_length_` features, takes weights from each feature's weight
  key, turns dense ids into sparse ones (non-zero entries are ids, as on
  TF's TPU input path), transforms non-integer inputs (strings, floats for
  bucketized columns) into ids with the feature's categorical column, and
  pads/truncates tensor-core columns to `tensor_core_shape[1]` ids with a
  mask feature.
* `generate_enqueue_ops(config, features_per_core, mode_override, ragged)`
  builds one `EnqueueTPUEmbeddingArbitraryTensorBatch` op per core: inputs
  ordered like the proto's feature descriptors (table by table, feature by
  feature), one combiner per feature (its table's, `sum` when None),
  `device_ordinal` = the core's index within its host, and empty
  placeholders where a feature has no sample indices (or row splits) or no
  weights.

Integer ids are enqueued as given, as TensorFlow's TPU input path takes them
(an input_fn written for TF's TPUEstimator already yields ids).
"""
import collections
import logging
from typing import Mapping, Optional, Protocol, Sequence, Union

import tensorflow as tf

from tpu_embedding_columns import lookup

from estimator_spec.config import topology as config_lib
from estimator_spec.config import model as model_lib
from estimator_spec.engine import inputs as inputs_lib
from estimator_spec.tensor_types import Op, Tensor

MODE_OVERRIDES = ("unspecified", "inference", "training",
                  "backward_pass_only")

_log = logging.getLogger(__name__)


class EnqueueData(
    collections.namedtuple(
        "EnqueueData",
        ["embedding_indices", "sample_indices", "aggregation_weights"])):
  """One feature's ids for one core, in sparse form.

  Fields:
    embedding_indices: rank-1 int32/int64 ids (a SparseTensor's values).
    sample_indices: rank-2 int32/int64 positions of the ids (a SparseTensor's
      indices: [example] or [example, position]), or None when each id is
      its own example.
    aggregation_weights: rank-1 float32/float64 weights of the ids, or None
      for weight 1.
  """

  def __new__(cls, embedding_indices: Tensor,
              sample_indices: Optional[Tensor] = None,
              aggregation_weights: Optional[Tensor] = None) -> "EnqueueData":
    return super().__new__(cls, embedding_indices, sample_indices,
                           aggregation_weights)

  @classmethod
  def from_sparse_tensor(
      cls, sp_tensor: tf.SparseTensor,
      weights: Optional[tf.SparseTensor] = None) -> "EnqueueData":
    """From SparseTensor ids (and SparseTensor weights at the same
    positions)."""
    if not isinstance(sp_tensor, tf.SparseTensor):
      raise TypeError("EnqueueData.from_sparse_tensor: `sp_tensor` must be a "
                      f"SparseTensor; got {type(sp_tensor).__name__}.")
    if weights is not None and not isinstance(weights, tf.SparseTensor):
      raise TypeError("EnqueueData.from_sparse_tensor: `weights` must be a "
                      f"SparseTensor or None; got {type(weights).__name__}.")
    return cls(sp_tensor.values, sp_tensor.indices,
               None if weights is None else weights.values)


class RaggedEnqueueData(
    collections.namedtuple(
        "RaggedEnqueueData",
        ["embedding_indices", "row_splits", "aggregation_weights"])):
  """One feature's ids for one core, in ragged form.

  Fields:
    embedding_indices: rank-1 int32/int64 ids (a RaggedTensor's values).
    row_splits: rank-1 int32/int64 row splits, or None for one id per
      example.
    aggregation_weights: rank-1 float32/float64 weights, or None for 1.
  """

  def __new__(
      cls, embedding_indices: Tensor, row_splits: Optional[Tensor] = None,
      aggregation_weights: Optional[Tensor] = None) -> "RaggedEnqueueData":
    return super().__new__(cls, embedding_indices, row_splits,
                           aggregation_weights)

  @classmethod
  def from_ragged_tensor(
      cls, rg_tensor: tf.RaggedTensor,
      weights: Optional[tf.RaggedTensor] = None) -> "RaggedEnqueueData":
    """From RaggedTensor ids (and RaggedTensor weights of the same shape)."""
    if not isinstance(rg_tensor, tf.RaggedTensor):
      raise TypeError("RaggedEnqueueData.from_ragged_tensor: `rg_tensor` "
                      "must be a RaggedTensor; got "
                      f"{type(rg_tensor).__name__}.")
    if weights is not None and not isinstance(weights, tf.RaggedTensor):
      raise TypeError("RaggedEnqueueData.from_ragged_tensor: `weights` must "
                      f"be a RaggedTensor or None; got "
                      f"{type(weights).__name__}.")
    return cls(rg_tensor.values, rg_tensor.row_splits,
               None if weights is None else weights.values)


# One feature's ids for one core, normalized.
_Data = Union[EnqueueData, RaggedEnqueueData]
# One feature's ids for one core as `generate_enqueue_ops` takes them: an
# `EnqueueData` or a SparseTensor (sparse), a `RaggedEnqueueData` or a
# RaggedTensor (ragged), or another named tuple with the same fields.
FeatureData = Union[_Data, tf.SparseTensor, tf.RaggedTensor,
                    tuple[Optional[Tensor], ...]]

# --- enqueue ops -------------------------------------------------------------


def generate_enqueue_ops(config: config_lib.TopologyConfig,
                         features_per_core: Sequence[dict[str, FeatureData]],
                         mode_override: Union[str, Tensor, None] = None,
                         ragged: bool = False) -> list[Op]:
  """One `EnqueueTPUEmbeddingArbitraryTensorBatch` op per core.

  Args:
    config: an `EmbeddingConfig`.
    features_per_core: a list with one dict per core, {feature name: data};
      the cores of one host are contiguous, starting at a host boundary.
      Data is an `EnqueueData` (or a SparseTensor, or any object with the
      same fields, such as TF's `tpu_embedding.EnqueueData`) when `ragged`
      is False, a `RaggedEnqueueData` (or a RaggedTensor) when True.
    mode_override: None or 'unspecified' (the proto's mode), 'inference',
      'training', 'backward_pass_only', or a scalar string Tensor.
    ragged: whether the data is ragged (row splits) or sparse (sample
      indices).

  Returns:
    The list of enqueue ops, one per core.
  """
  mode_override = _check_mode_override(mode_override)
  per_core = _check_features_per_core(config, features_per_core, ragged)
  combiners = [config.tables[f.table].combiner or "sum"
               for f in config.features.values()]
  ops = []
  for index, datas in enumerate(per_core):
    # Colocated with the first feature the caller listed, as TF does.
    first = next(iter(datas.values()))
    with tf.compat.v1.colocate_with(first.embedding_indices):
      inputs = _op_inputs(config, datas, ragged)
      ops.append(
          tf.raw_ops.EnqueueTPUEmbeddingArbitraryTensorBatch(
              sample_indices_or_row_splits=inputs[0],
              embedding_indices=inputs[1],
              aggregation_weights=inputs[2],
              mode_override=mode_override,
              device_ordinal=index % config.num_cores_per_host,
              combiners=combiners))
  return ops


def _check_mode_override(
    mode_override: Union[str, Tensor, None]) -> Union[str, Tensor]:
  if mode_override is None:
    return "unspecified"
  if isinstance(mode_override, str):
    if mode_override not in MODE_OVERRIDES:
      raise ValueError(
          f"generate_enqueue_ops: `mode_override` must be one of "
          f"{list(MODE_OVERRIDES)} (or None); got {mode_override!r}.")
    return mode_override
  if isinstance(mode_override, (tf.Tensor, tf.Variable)):
    if mode_override.dtype != tf.string or mode_override.shape.rank not in (
        0, None):
      raise ValueError(
          "generate_enqueue_ops: a Tensor `mode_override` must be a scalar "
          f"string; got {mode_override.dtype.name} of shape "
          f"{mode_override.shape}.")
    return mode_override
  raise TypeError(
      "generate_enqueue_ops: `mode_override` must be a string, a scalar "
      f"string Tensor or None; got {type(mode_override).__name__}.")


def _as_data(value: FeatureData, feature: str, core: int,
             ragged: bool) -> _Data:
  """Normalizes one feature's data for one core; raises on the wrong form."""
  where = f"generate_enqueue_ops: `features_per_core[{core}][{feature!r}]`"
  if ragged:
    if isinstance(value, tf.RaggedTensor):
      return RaggedEnqueueData.from_ragged_tensor(value)
    fields = RaggedEnqueueData._fields
  else:
    if isinstance(value, tf.SparseTensor):
      return EnqueueData.from_sparse_tensor(value)
    fields = EnqueueData._fields
  if getattr(value, "_fields", None) != fields:
    wanted = ("a RaggedEnqueueData or a RaggedTensor (ragged=True)"
              if ragged else "an EnqueueData or a SparseTensor (ragged=False)")
    raise TypeError(f"{where} must be {wanted}; got {type(value).__name__}.")
  data = (RaggedEnqueueData if ragged else EnqueueData)(*value)
  for name, tensor in zip(fields, data):
    if tensor is not None and not isinstance(tensor, (tf.Tensor, tf.Variable)):
      raise TypeError(f"{where}.{name} must be a Tensor or None; got "
                      f"{type(tensor).__name__}.")
  ids = data.embedding_indices
  if ids is None or ids.dtype not in (tf.int32, tf.int64):
    raise TypeError(f"{where}.embedding_indices must be an int32 or int64 "
                    f"Tensor; got {None if ids is None else ids.dtype.name}.")
  positions = data[1]
  if positions is not None and positions.dtype not in (tf.int32, tf.int64):
    raise TypeError(f"{where}.{fields[1]} must be int32 or int64; got "
                    f"{positions.dtype.name}.")
  weights = data.aggregation_weights
  if weights is not None and weights.dtype not in (tf.float32, tf.float64):
    raise TypeError(f"{where}.aggregation_weights must be float32 or "
                    f"float64; got {weights.dtype.name}.")
  return data


def _check_features_per_core(
    config: config_lib.TopologyConfig,
    features_per_core: Sequence[dict[str, FeatureData]],
    ragged: bool) -> list[dict[str, _Data]]:
  if not isinstance(features_per_core, (list, tuple)) or not features_per_core:
    raise TypeError(
        "generate_enqueue_ops: `features_per_core` must be a non-empty list "
        "with one {feature name: data} dict per core; got "
        f"{type(features_per_core).__name__}.")
  per_host = config.num_cores_per_host
  if len(features_per_core) % per_host or len(
      features_per_core) > config.num_cores:
    raise ValueError(
        f"generate_enqueue_ops: `features_per_core` has "
        f"{len(features_per_core)} dicts; give whole hosts of "
        f"{per_host} cores each (at most {config.num_cores} cores in all).")
  expected = set(config.features)
  result = []
  host_device = None
  for core, datas in enumerate(features_per_core):
    if not isinstance(datas, dict):
      raise TypeError(
          f"generate_enqueue_ops: `features_per_core[{core}]` must be a dict "
          f"{{feature name: data}}; got {type(datas).__name__}.")
    missing = sorted(expected - set(datas))
    extra = sorted(set(datas) - expected)
    if missing or extra:
      raise ValueError(
          f"generate_enqueue_ops: `features_per_core[{core}]` must hold "
          f"exactly the spec's features; missing {missing}, unknown {extra}.")
    normalized, device = _core_data(config, core, datas, ragged)
    if core % per_host == 0:
      host_device = device
    elif device != host_device:
      raise ValueError(
          f"generate_enqueue_ops: core {core} is on device {device!r}, but "
          f"the other cores of its host are on {host_device!r}; list each "
          "host's cores contiguously.")
    result.append(normalized)
  return result


def _core_data(config: config_lib.TopologyConfig, core: int,
               datas: dict[str, FeatureData],
               ragged: bool) -> tuple[dict[str, _Data], Optional[str]]:
  """One core's {feature name: data}, normalized and checked (every input of
  a feature on its ids' device, every feature on one device), and that
  device."""
  normalized = {}
  device = None
  for name in datas:
    data = _as_data(datas[name], name, core, ragged)
    combiner = config.tables[config.features[name].table].combiner
    if data[1] is None and combiner:
      _log.warning(
          "generate_enqueue_ops: feature %r of table %r has no %s; each id "
          "is taken as one example, so combiner %r has no effect.", name,
          config.features[name].table, data._fields[1], combiner)
    ids_device = data.embedding_indices.device
    for field, tensor in zip(data._fields[1:], data[1:]):
      if tensor is not None and tensor.device != ids_device:
        raise ValueError(
            f"generate_enqueue_ops: feature {name!r} on core {core}: "
            f"{field} is on device {tensor.device!r} but its ids on "
            f"{ids_device!r}; place them on the same device.")
    if device is None:
      device = ids_device
    elif device != ids_device:
      raise ValueError(
          f"generate_enqueue_ops: `features_per_core[{core}]` mixes "
          f"devices ({device!r} and {ids_device!r} for feature {name!r}); "
          "one core's inputs must be on one host device.")
    normalized[name] = data
  return normalized, device


def _uniform(tensors: list[Tensor], wide: tf.DType) -> list[Tensor]:
  """The tensors of one op input list share one dtype: unchanged when they
  already do, else cast to `wide`."""
  if len({t.dtype for t in tensors}) <= 1:
    return tensors
  return [t if t.dtype == wide else tf.cast(t, wide) for t in tensors]


def _op_inputs(
    config: config_lib.TopologyConfig, datas: Mapping[str, _Data],
    ragged: bool) -> tuple[list[Tensor], list[Tensor], list[Tensor]]:
  """(positions, ids, weights) lists in feature-descriptor order."""
  int_zeros = tf.zeros((0,), dtype=tf.int64)
  float_zeros = tf.zeros((0,), dtype=tf.float32)
  positions, ids, weights = [], [], []
  for name, feature in config.features.items():
    data = datas[name]
    given = data[1]  # the row splits (ragged) or the sample indices
    if not ragged:
      width = (given.shape[1]
               if given is not None and given.shape.rank == 2 else None)
      if feature.max_sequence_length > 0 and width == 2:
        # Sequence ids given as [example, position]: the op wants a third
        # coordinate.
        given = tf.pad(given, paddings=[[0, 0], [0, 1]])
      elif width == 1:
        given = None
    positions.append(int_zeros if given is None else given)
    ids.append(data.embedding_indices)
    weights.append(float_zeros if data.aggregation_weights is None else
                   data.aggregation_weights)
  return (_uniform(positions, tf.int64), _uniform(ids, tf.int64),
          _uniform(weights, tf.float32))


# --- host preprocessing ------------------------------------------------------

# A batch's labels, passed through: a tensor or a dict of them.
Labels = Union[Tensor, dict[str, Tensor]]


class TensorCoreColumn(Protocol):
  """What `split_inputs` reads of a tensor-core column of the spec
  (`EmbeddingConfigSpec.tensor_core_feature_columns`, whose columns have a
  `tensor_core_shape` [batch or None, ids per example])."""

  @property
  def name(self) -> str:
    ...

  @property
  def feature_key(self) -> str:
    ...

  @property
  def tensor_core_mask_key(self) -> str:
    ...

  @property
  def tensor_core_shape(self) -> tuple[Optional[int], int]:
    ...



def split_inputs(
    config: config_lib.TopologyConfig, features: dict[str, Tensor],
    labels: Optional[Labels] = None
) -> tuple[dict[str, Tensor], Optional[Labels], list[dict[str, EnqueueData]]]:
  """Prepares one host's batch for the embedding enqueue.

  Args:
    config: an `EmbeddingConfig`; its batch size per host is
      `batch_size / num_hosts`, split over `num_cores_per_host` cores.
    features: the input_fn's features dict for this host (not modified).
    labels: passed through.

  Returns:
    (features, labels, features_per_core): a new features dict without the
    engine features' ids and weights, with `<key>_seq_length_` for sequence
    features and the padded ids and mask of tensor-core columns; `labels`;
    and one {feature name: EnqueueData} dict per core of the host, for
    `generate_enqueue_ops`.

  Features are read by the parser the host engine uses
  (`engine.inputs.read_feature`): the same inputs are accepted and refused,
  and the same run-time checks (indices inside the dense_shape, weights at
  the ids' positions) gate what is enqueued.
  """
  if not isinstance(features, dict):
    raise TypeError("split_inputs: `features` must be a dict of feature name "
                    f"to Tensor; got {type(features).__name__}.")
  inputs_lib.check_weight_keys(config.model, "split_inputs")
  num_splits = config.num_cores_per_host
  host_batch = config.batch_size // config.num_hosts
  per_feature: collections.OrderedDict[str, list[EnqueueData]] = (
      collections.OrderedDict())
  read: set[str] = set()
  added: dict[str, Tensor] = {}
  for name, feature in config.features.items():
    per_feature[name] = _feature_pieces(config, feature, features, read,
                                        added, host_batch)
  features = {k: v for k, v in features.items() if k not in read}
  features.update(added)
  for column in config.spec.tensor_core_feature_columns or ():
    _pad_tensor_core(column, features, host_batch)
  features_per_core = [{name: datas[core]
                        for name, datas in per_feature.items()}
                       for core in range(num_splits)]
  return features, labels, features_per_core


def _feature_pieces(config: config_lib.TopologyConfig,
                    feature: model_lib.Feature, features: dict[str, Tensor],
                    read: set[str], added: dict[str, Tensor],
                    host_batch: int) -> list[EnqueueData]:
  """`split_inputs` for one feature: its EnqueueData per core of the host.
  Adds the input keys it reads to `read` and its sequence lengths (if any)
  to `added`."""
  name = feature.name
  num_splits = config.num_cores_per_host
  table = config.tables[feature.table]
  where = f"split_inputs: feature {name!r} (table {table.name!r})"
  # As TF's TPU infeed: integer inputs are the ids themselves, whatever
  # the column declares.
  given = inputs_lib.read_feature(feature, table,
                                  config.spec.column_for(name), features,
                                  where, integer_ids_as_given=True)
  read.update(given.keys)
  if given.single:
    return [EnqueueData(piece) for piece in _split(given.ids, num_splits)]
  checks = lookup.structure_checks(given.ids, given.weights, where)
  with tf.control_dependencies(checks):
    ids = _identity(given.ids)
    weights = None if given.weights is None else _identity(given.weights)
  if feature.max_sequence_length > 0:
    lengths = lookup.sequence_lengths(ids, feature.max_sequence_length)
    lengths.set_shape([host_batch])
    added[feature.length_key] = lengths
  return [
      EnqueueData.from_sparse_tensor(piece, weights=weight_piece)
      for piece, weight_piece in zip(_split(ids, num_splits),
                                     _split(weights, num_splits))
  ]


def _identity(sparse: tf.SparseTensor) -> tf.SparseTensor:
  return tf.SparseTensor(tf.identity(sparse.indices),
                         tf.identity(sparse.values), sparse.dense_shape)


def _split(tensor: Optional[Tensor],
           num_splits: int) -> list[Optional[Tensor]]:
  if tensor is None:
    return [None] * num_splits
  if num_splits == 1:
    return [tensor]
  pieces: list[Optional[Tensor]]
  if isinstance(tensor, tf.SparseTensor):
    pieces = tf.sparse.split(tensor, num_splits, axis=0)
  else:
    pieces = tf.split(tensor, num_splits)
  return pieces


def _pad_tensor_core(column: TensorCoreColumn, features: dict[str, Tensor],
                     host_batch: int) -> None:
  """Replaces a tensor-core column's ids by [batch, n] padded int32 ids and
  adds its [batch, n] float32 mask (1 where an id is, 0 for padding)."""
  key = column.feature_key
  mask_key = column.tensor_core_mask_key
  if mask_key in features:
    raise ValueError(
        f"split_inputs: tensor-core column {column.name!r} writes its mask "
        f"to {mask_key!r}, which the features dict already holds; rename "
        "that feature.")
  raw = features.get(key)
  if raw is None or not inputs_lib.is_integer(raw):
    ids, keys = inputs_lib.transformed_ids(
        column, features, f"split_inputs: tensor-core column {column.name!r}")
    for k in keys:
      features.pop(k)
  else:
    ids = features.pop(key)
    if isinstance(ids, tf.RaggedTensor):
      ids = ids.to_sparse()
    if not isinstance(ids, tf.SparseTensor):
      ids = lookup.dense_to_sparse(tf.convert_to_tensor(ids))
  width = column.tensor_core_shape[1]
  keep = tf.reshape(tf.where(ids.indices[:, 1] < width), [-1])
  positions = tf.gather(ids.indices[:, :2], keep)
  shape = tf.stack([ids.dense_shape[0], tf.constant(width, tf.int64)])
  values = tf.scatter_nd(positions,
                         tf.cast(tf.gather(ids.values, keep), tf.int32),
                         shape)
  mask = tf.scatter_nd(positions, tf.ones_like(keep, dtype=tf.float32), shape)
  values.set_shape([host_batch, width])
  mask.set_shape([host_batch, width])
  features[key] = values
  features[mask_key] = mask


__all__ = [
    "EnqueueData", "RaggedEnqueueData", "MODE_OVERRIDES",
    "generate_enqueue_ops", "split_inputs"
]
