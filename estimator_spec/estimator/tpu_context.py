"""`params['context']` on the host: the TPU topology a `use_tpu=True` run
emulates, and how input_fn is deployed on it.

On a TPU, TPUEstimator calls input_fn once per host (or per core, or once in
all, as `TPUConfig.per_host_input_for_training` says) and hands each call a
`TPUContext` that says which call it is, so that input functions can shard
their files. When `use_tpu=True` runs on the host (no TPU named in the
RunConfig), this module gives input_fn the same information for the topology
the run emulates: `tpu_config.num_shards` cores (one when unset), eight
cores per host. The host then concatenates the batches of all invocations,
host by host and core by core, into the global batch, and runs model_fn
once on it, as one replica: model_fn's context says so.
"""
import dataclasses
import math

import tensorflow as tf

from estimator_spec.cluster import placement
from estimator_spec.cluster import tasks
from estimator_spec.config import modes

# TPUConfig.per_host_input_for_training: True and False are TF's spellings of
# PER_HOST_V1 and PER_SHARD_V1 (TPUConfig converts them to these values).
PER_SHARD_V1 = 1
PER_HOST_V1 = 2
PER_HOST_V2 = 3
BROADCAST = 4
_PIPELINE_NAMES = {PER_SHARD_V1: "PER_SHARD_V1", PER_HOST_V1: "PER_HOST_V1",
                   PER_HOST_V2: "PER_HOST_V2", BROADCAST: "BROADCAST"}
CORES_PER_HOST = 8
HOST_DEVICE = "/device:CPU:0"


@dataclasses.dataclass(frozen=True)
class Topology:
  """The TPU system a host run emulates: `num_replicas` cores over
  `num_hosts` hosts."""
  num_replicas: int
  num_hosts: int

  @property
  def num_of_replicas_per_host(self):
    return self.num_replicas // self.num_hosts

  @classmethod
  def from_run_config(cls, config):
    """`tpu_config.num_shards` cores (1 when unset), 8 per host."""
    tpu_config = getattr(config, "tpu_config", None)
    cores = getattr(tpu_config, "num_shards", None) or 1
    hosts = max(1, math.ceil(cores / CORES_PER_HOST))
    if cores % hosts:
      raise ValueError(
          f"TPUEstimator: tpu_config.num_shards={cores} cannot be spread "
          f"evenly over {hosts} hosts of {CORES_PER_HOST} cores; use a "
          f"multiple of {CORES_PER_HOST} (or fewer than {CORES_PER_HOST}).")
    return cls(cores, hosts)


def table_topology(config):
  """(hosts, cores, on_tpu_layout) the tables of a run with RunConfig
  `config` are laid out for (`cluster.placement.table_layout`): over the
  ps tasks of its cluster, else over the hosts of its `Topology`."""
  cluster = tasks.Cluster.from_run_config(config)
  return placement.table_layout(
      cluster, None if cluster is not None else
      Topology.from_run_config(config))


def input_pipeline(config):
  """The run's `per_host_input_for_training` as one of the constants."""
  tpu_config = getattr(config, "tpu_config", None)
  value = getattr(tpu_config, "per_host_input_for_training", True)
  if value is True:
    return PER_HOST_V1
  if value is False:
    return PER_SHARD_V1
  value = int(value)
  if value not in _PIPELINE_NAMES:
    raise ValueError(
        "TPUEstimator: tpu_config.per_host_input_for_training must be a bool "
        f"or an InputPipelineConfig value; got {value!r}.")
  return value


@dataclasses.dataclass(frozen=True)
class Deployment:
  """How input_fn runs for one mode: `invocations` calls, each with
  `batch_size` examples per element, `elements_per_step` elements of each
  call making one step (PER_HOST_V2: one per core of the host)."""
  invocations: int
  batch_size: int
  elements_per_step: int
  replicas_consumed: int
  per_core: bool  # one invocation per core (else per host, or broadcast)


def deployment(topology, pipeline, mode, global_batch):
  """TF's input deployment for `mode` on `topology` (see TF's TPUConfig:
  PER_SHARD_V1 splits per core in training only)."""
  cores = topology.num_replicas
  hosts = topology.num_hosts
  per_host = topology.num_of_replicas_per_host
  if pipeline == BROADCAST:
    return Deployment(1, global_batch, 1, cores, False)
  if pipeline == PER_SHARD_V1 and mode == modes.TRAIN:
    return Deployment(cores, _divide(global_batch, cores, mode), 1, 1, True)
  if pipeline == PER_HOST_V2:
    return Deployment(hosts, _divide(global_batch, cores, mode), per_host,
                      per_host, False)
  return Deployment(hosts, _divide(global_batch, hosts, mode), 1, per_host,
                    False)


def _divide(batch, parts, mode):
  if batch % parts:
    raise ValueError(
        f"TPUEstimator: {modes.BATCH_NAMES.get(mode, mode)} batch size "
        f"{batch} must be divisible by number of replicas {parts} (the "
        "input_fn invocations or replicas of the emulated TPU topology).")
  return batch // parts


class TPUContext:
  """What `params['context']` holds on a host run emulating a TPU.

  The same attributes and methods as TF's `TPUContext`, for the emulated
  topology: `current_input_fn_deployment()` and `current_host` in input_fn
  only, `device_assignment` in model_fn only (None: no TPU devices).
  """

  @classmethod
  def for_model_fn(cls, mode):
    """The context of model_fn on the host: model_fn runs once, as one
    replica on one host, on the global batch (`params['batch_size']`), so
    per-replica arithmetic (`cross_replica_sum(x) / num_replicas`,
    `batch_size * num_replicas`) gives the global values a TPU gives."""
    return cls(Topology(1, 1), None, mode, call_from_input_fn=False)

  @classmethod
  def for_cluster_task(cls, cluster, batch_size, mode):
    """The context of input_fn on a training task of a cluster: one of
    `cluster.num_training_tasks` hosts, as a TPU pod's host sees itself
    (its device, its index among the training tasks, their number, one
    replica fed), reading `batch_size` examples per step."""
    tasks = cluster.num_training_tasks
    return cls(Topology(tasks, tasks),
               Deployment(tasks, batch_size, 1, 1, False), mode,
               invocation_index=cluster.index, host_device=cluster.device)

  def __init__(self, topology, deploy, mode, *, invocation_index=None,
               call_from_input_fn=True, host_device=HOST_DEVICE):
    self._host_device = host_device
    self._topology = topology
    self._deployment = deploy
    self._mode = mode
    self._invocation_index = invocation_index
    self._call_from_input_fn = call_from_input_fn

  @property
  def mode(self):
    return self._mode

  def current_input_fn_deployment(self):
    """(host device, invocation index, total invocations, replicas fed by
    this invocation)."""
    self._input_fn_only("current_input_fn_deployment")
    return (self._host_device, self._invocation_index,
            self._deployment.invocations, self._deployment.replicas_consumed)

  @property
  def num_replicas(self):
    return self._topology.num_replicas

  @property
  def num_hosts(self):
    return self._topology.num_hosts

  @property
  def num_of_replicas_per_host(self):
    return self._topology.num_of_replicas_per_host

  @property
  def num_of_cores_per_host(self):
    return self._topology.num_of_replicas_per_host

  @property
  def current_host(self):
    self._input_fn_only("current_host")
    if self._deployment.per_core:
      return self._invocation_index // self.num_of_replicas_per_host
    if self._deployment.invocations == 1:
      return 0
    return self._invocation_index

  @property
  def device_assignment(self):
    if self._call_from_input_fn:
      raise RuntimeError(
          "This TPUContext instance must not be called from input_fn "
          "(device_assignment is for model_fn).")
    return None

  def device_for_replica(self, replica_id):
    """(host device, core ordinal within its host) of a replica."""
    if not 0 <= replica_id < self.num_replicas:
      raise ValueError(f"TPUContext.device_for_replica: replica_id must be in "
                       f"[0, {self.num_replicas}); got {replica_id}.")
    return HOST_DEVICE, replica_id % self.num_of_replicas_per_host

  @property
  def tpu_host_placement_function(self):
    return lambda host_id=None, replica_id=None: HOST_DEVICE

  def _input_fn_only(self, what):
    if not self._call_from_input_fn:
      raise RuntimeError(
          f"This TPUContext instance must not be called from model_fn ({what}"
          " is for input_fn).")

  def __repr__(self):
    return (f"TPUContext(mode={self._mode!r}, num_replicas="
            f"{self.num_replicas}, num_hosts={self.num_hosts}, invocation="
            f"{self._invocation_index})")


def pipeline_name(pipeline):
  return _PIPELINE_NAMES[pipeline]


# --- the global batch from the invocations' batches --------------------------


# The features key through which a padded prediction step tells model_fn
# how many of its examples are real (TPUEstimator pops it before model_fn).
REAL_BATCH_SIZE_KEY = "estimator_spec/real_batch_size"


def combine(results, elements_per_step, pad_to=None):
  """One input_fn result (a Dataset, or features / (features, labels)) from
  the results of every invocation: each step takes `elements_per_step`
  elements of every invocation and concatenates them, invocation by
  invocation, into the global batch.

  Training and evaluation (`pad_to` None) stop at the last whole step.
  Prediction (`pad_to` = the global batch size) keeps a last, smaller step
  and pads every step to `pad_to` examples, as a TPU does, so that shapes
  are static; the number of real examples travels in the features under
  `REAL_BATCH_SIZE_KEY`.
  """
  datasets = [isinstance(r, tf.data.Dataset) for r in results]
  if pad_to is not None and not all(datasets):
    raise TypeError(
        "TPUEstimator: For mode PREDICT, `input_fn` must return `Dataset` "
        "instead of `features` and `labels` (as on a TPU, where the last "
        "batch is padded).")
  drop_remainder = pad_to is None
  if all(datasets):
    parts = [_merge_elements(ds, elements_per_step, drop_remainder)
             for ds in results]
    if len(parts) == 1:
      combined = parts[0]
    else:
      combined = tf.data.Dataset.zip(tuple(parts)).map(
          lambda *elements: _concat(list(elements)))
    if pad_to is not None:
      combined = combined.map(lambda *element: _pad_step(element, pad_to))
    return combined
  if len(results) == 1 and elements_per_step == 1:
    return results[0]
  if any(datasets) or elements_per_step > 1:
    raise TypeError(
        "TPUEstimator: with per_host_input_for_training=PER_HOST_V2 input_fn "
        "must return a tf.data.Dataset (each step takes one element per "
        "core); mixing Datasets and tensors between invocations is not "
        "supported either.")
  return _concat(list(results))


def _pad_step(element, batch_size):
  """A prediction step padded to `batch_size` examples (features and labels),
  with the real count under `REAL_BATCH_SIZE_KEY` in the features."""
  element = element[0] if len(element) == 1 else element
  features = element[0] if isinstance(element, tuple) else element
  if not isinstance(features, dict) or not features:
    return element
  real = _batch_size(next(iter(features.values())))
  missing = tf.cast(batch_size, tf.int64) - real
  check = tf.debugging.assert_non_negative(
      missing, message="The real batch size should not be greater than "
      f"batch_size ({batch_size}): batch the prediction input by "
      "params['batch_size'].")
  with tf.control_dependencies([check]):
    missing = tf.identity(missing)
  padded = tf.nest.map_structure(lambda t: _pad(t, missing, batch_size),
                                 element)
  padded_features = padded[0] if isinstance(element, tuple) else padded
  padded_features[REAL_BATCH_SIZE_KEY] = real
  return padded


def _batch_size(value):
  if isinstance(value, tf.SparseTensor):
    return value.dense_shape[0]
  if isinstance(value, tf.RaggedTensor):
    return value.nrows(out_type=tf.int64)
  return tf.shape(value, out_type=tf.int64)[0]


def _pad(value, missing, batch_size):
  """`value` with `missing` empty (zero) examples appended."""
  if isinstance(value, tf.SparseTensor):
    return _with_batch(value, batch_size)
  if isinstance(value, tf.RaggedTensor):
    empty = tf.RaggedTensor.from_row_lengths(
        value.values[:0], tf.zeros([missing], value.row_splits.dtype))
    return tf.concat([value, empty], 0)
  rank = value.shape.rank
  padding = tf.concat([[[0, missing]],
                       tf.zeros([rank - 1, 2], tf.int64)], 0)
  padded = tf.pad(value, padding)
  padded.set_shape([batch_size] + value.shape[1:].as_list())
  return padded


def _merge_elements(dataset, count, drop_remainder):
  if count == 1:
    return dataset
  return dataset.batch(count, drop_remainder=drop_remainder).map(
      lambda *element: tf.nest.map_structure(_merge_leading, (
          element[0] if len(element) == 1 else element)))


def _merge_leading(value):
  """[k, b, ...] -> [k * b, ...] (dense, sparse or ragged)."""
  if isinstance(value, tf.SparseTensor):
    shape = tf.concat([[-1], value.dense_shape[2:]], 0)
    merged = tf.sparse.reshape(value, shape)
    return _with_batch(merged, value.shape[:2].num_elements())
  if isinstance(value, tf.RaggedTensor):
    return value.merge_dims(0, 1)
  shape = tf.concat([[-1], tf.shape(value)[2:]], 0)
  merged = tf.reshape(value, shape)
  if value.shape.rank is not None:
    outer = value.shape[:2].num_elements()
    merged.set_shape(tf.TensorShape([outer]).concatenate(value.shape[2:]))
  return merged


def _with_batch(sparse, batch):
  """`sparse` with its static batch dimension known (when `batch` is)."""
  if batch is None:
    return sparse
  dense_shape = tf.concat(
      [tf.constant([batch], tf.int64), sparse.dense_shape[1:]], 0)
  return tf.SparseTensor(sparse.indices, sparse.values, dense_shape)


def _concat(elements):
  """Concatenates the batches of several invocations along the batch."""

  def concat(*values):
    first = values[0]
    if isinstance(first, tf.SparseTensor):
      batches = [tf.compat.dimension_value(v.shape[0]) for v in values]
      return _with_batch(
          tf.sparse.concat(0, list(values), expand_nonconcat_dims=True),
          None if None in batches else sum(batches))
    if isinstance(first, tf.RaggedTensor):
      return tf.concat(list(values), 0)
    if first is None:
      return None
    return tf.concat([tf.convert_to_tensor(v) for v in values], 0)

  return tf.nest.map_structure(concat, *elements)


__all__ = ["TPUContext", "Topology", "Deployment", "deployment",
           "input_pipeline", "combine", "PER_SHARD_V1", "PER_HOST_V1",
           "PER_HOST_V2", "BROADCAST"]
