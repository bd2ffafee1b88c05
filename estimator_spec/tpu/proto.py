"""`EmbeddingConfig`: the config model placed on a topology, and its proto.

`EmbeddingConfig(spec, batch_size=..., num_hosts=..., num_cores=..., mode=...)`
binds a spec's config model to a batch size, a number of hosts and cores and
a mode (TRAIN, or EVAL/PREDICT which give the INFERENCE mode without an
optimizer), and emits the `TPUEmbeddingConfiguration` proto that
`tf.compat.v1.tpu.initialize_system` takes (`../shared/SEMANTICS.md` s. 7).
Its `split_inputs` and `generate_enqueue_ops` build the TPU infeed
(`enqueue.py`).
"""
import collections

from tensorflow.core.protobuf.tpu import optimization_parameters_pb2
from tensorflow.core.protobuf.tpu import tpu_embedding_configuration_pb2

from tpu_embedding_columns import _checks

from estimator_spec.config.modes import EVAL, MODES, PREDICT, TRAIN
from estimator_spec.tpu import enqueue
from estimator_spec.config import optimizers
from estimator_spec.config import spec as spec_lib


_Configuration = tpu_embedding_configuration_pb2.TPUEmbeddingConfiguration
_ACCUMULATION = optimization_parameters_pb2.GradientAccumulationStatus
_HOT_ID = optimization_parameters_pb2.HotIdReplicationConfiguration


class EmbeddingConfig:
  """A spec's tables and features on a given topology and mode.

  Args:
    spec: an `EmbeddingConfigSpec`.
    batch_size: the global batch size; must divide evenly by `num_cores`.
    num_hosts: hosts (TPU) or parameter-server shards of every table.
    num_cores: cores in all; must divide evenly by `num_hosts`.
    mode: `tf.estimator.ModeKeys.TRAIN` ('train'), `EVAL` ('eval') or
      `PREDICT` ('infer').
  """

  def __init__(self, spec, *, batch_size, num_hosts=1, num_cores=1,
               mode=TRAIN):
    owner = "EmbeddingConfig"
    if not isinstance(spec, spec_lib.EmbeddingConfigSpec):
      _checks.fail(owner, "spec", "must be an estimator_spec "
                   "EmbeddingConfigSpec", spec, TypeError)
    self.spec = spec
    self.model = spec.model
    self.batch_size = _checks.check_int(owner, "batch_size", batch_size,
                                        minimum=1)
    self.num_hosts = _checks.check_int(owner, "num_hosts", num_hosts,
                                       minimum=1)
    self.num_cores = _checks.check_int(owner, "num_cores", num_cores,
                                       minimum=1)
    if self.num_cores % self.num_hosts:
      raise ValueError(
          f"{owner}: `num_cores` ({self.num_cores}) must be a multiple of "
          f"`num_hosts` ({self.num_hosts}).")
    if self.batch_size % self.num_cores:
      raise ValueError(
          f"{owner}: `batch_size` ({self.batch_size}) must be a multiple of "
          f"`num_cores` ({self.num_cores}); each core takes an equal share.")
    if mode not in MODES:
      _checks.fail(owner, "mode",
                   "must be tf.estimator.ModeKeys.TRAIN, EVAL or PREDICT",
                   mode)
    self.mode = mode
    if self.is_training:
      missing = [
          name for name in self.model.tables
          if self.model.optimizer_for(name) is None
      ]
      if missing:
        raise ValueError(
            f"{owner}: training needs an optimizer for every table; tables "
            f"{missing} have none. Set the spec's `optimization_parameters` "
            "or each TableConfig's `optimization_parameters`.")
    self._proto = None

  # --- topology -------------------------------------------------------------

  @property
  def is_training(self):
    return self.mode == TRAIN

  @property
  def num_cores_per_host(self):
    return self.num_cores // self.num_hosts

  @property
  def batch_size_per_core(self):
    return self.batch_size // self.num_cores

  # --- the model, as TF's dicts ----------------------------------------------

  @property
  def tables(self):
    return self.model.tables

  @property
  def features(self):
    return self.model.features

  def optimizer_for(self, table_name):
    """The optimizer of a table in this mode: None when not training."""
    return self.model.optimizer_for(table_name) if self.is_training else None

  @property
  def table_to_config_dict(self):
    """{table name: TableConfig}, tables sorted by name."""
    return collections.OrderedDict(
        (t.name,
         spec_lib.TableConfig(
             vocabulary_size=t.vocabulary_size,
             dimension=t.dimension,
             initializer=t.initializer,
             combiner=t.combiner,
             hot_id_replication=t.hot_id_replication,
             learning_rate=t.learning_rate,
             learning_rate_fn=t.learning_rate_fn,
             optimization_parameters=t.table_optimizer))
        for t in self.model.tables.values())

  @property
  def feature_to_config_dict(self):
    """{feature name: FeatureConfig}, in proto order."""
    return collections.OrderedDict(
        (f.name,
         spec_lib.FeatureConfig(
             table_id=f.table,
             max_sequence_length=f.max_sequence_length,
             weight_key=f.weight_key)) for f in self.model.features.values())

  def shard_layouts(self, num_shards=None):
    """{table name: ShardLayout}; `num_shards` defaults to `num_hosts`."""
    num_shards = self.num_hosts if num_shards is None else num_shards
    return collections.OrderedDict(
        (name, self.model.shard_layout(name, num_shards))
        for name in self.model.tables)

  # --- the infeed -------------------------------------------------------------

  def split_inputs(self, features, labels=None):
    """One host's batch prepared for the enqueue ops: returns (features,
    labels, features_per_core); see `estimator_spec.tpu.enqueue.split_inputs`."""
    return enqueue.split_inputs(self, features, labels)

  def generate_enqueue_ops(self, features_per_core, mode_override=None,
                           ragged=False):
    """One `EnqueueTPUEmbeddingArbitraryTensorBatch` op per core; see
    `estimator_spec.tpu.enqueue.generate_enqueue_ops`."""
    return enqueue.generate_enqueue_ops(self, features_per_core,
                                        mode_override=mode_override,
                                        ragged=ragged)

  # --- the proto ------------------------------------------------------------

  @property
  def config_proto(self):
    """The `TPUEmbeddingConfiguration` proto (a fresh copy each call)."""
    if self._proto is None:
      self._proto = self._build_proto()
    proto = _Configuration()
    proto.CopyFrom(self._proto)
    return proto

  def _proto_optimizer(self, table):
    if self.is_training:
      return self.model.optimizer_for(table.name)
    # Inference runs no optimizer; the TPU still wants one per table: the
    # table's own if it has one, else SGD with learning rate 1 (as TF does).
    return table.table_optimizer or optimizers.StochasticGradientDescentParameters(
        1.0)

  def _build_proto(self):
    proto = _Configuration()
    table_ids = {}
    for index, table in enumerate(self.model.tables.values()):
      table_ids[table.name] = index
      descriptor = proto.table_descriptor.add()
      descriptor.name = table.name
      descriptor.vocabulary_size = max(table.vocabulary_size, self.num_hosts)
      descriptor.dimension = table.dimension
      optimizer = self._proto_optimizer(table)
      params = descriptor.optimization_parameters
      rate = self.model.learning_rate(table.name, optimizer)
      if rate.fn is not None:
        params.learning_rate.dynamic.tag = rate.tag
      else:
        params.learning_rate.constant = rate.constant
      params.gradient_accumulation_status = (
          _ACCUMULATION.ENABLED
          if optimizer.use_gradient_accumulation else _ACCUMULATION.DISABLED)
      lower, upper = self.model.gradient_clip_bounds(optimizer)
      if lower is not None:
        params.gradient_clipping_limits.lower.value = lower
      if upper is not None:
        params.gradient_clipping_limits.upper.value = upper
      if optimizer.clip_weight_min is not None:
        params.clipping_limits.lower.value = optimizer.clip_weight_min
      if optimizer.clip_weight_max is not None:
        params.clipping_limits.upper.value = optimizer.clip_weight_max
      if optimizer.weight_decay_factor:
        params.weight_decay_factor = optimizer.weight_decay_factor
        if optimizer.multiply_weight_decay_factor_by_learning_rate:
          params.multiply_weight_decay_factor_by_learning_rate = True
      if table.hot_id_replication:
        params.hot_id_replication_configuration.status = _HOT_ID.ENABLED
      optimizer.fill_proto(params)
    for feature in self.model.features.values():
      descriptor = proto.feature_descriptor.add()
      descriptor.table_id = table_ids[feature.table]
      descriptor.input_shape.append(self.batch_size_per_core)
      if feature.max_sequence_length:
        descriptor.input_shape.append(feature.max_sequence_length)
    proto.mode = (_Configuration.TRAINING
                  if self.is_training else _Configuration.INFERENCE)
    proto.num_hosts = self.num_hosts
    proto.num_tensor_cores = self.num_cores
    proto.sharding_strategy = (
        _Configuration.DIV_DEFAULT
        if self.model.partition_strategy == "div" else _Configuration.MOD)
    proto.pipeline_execution_with_tensor_core = (
        self.model.pipeline_execution_with_tensor_core)
    if self.model.profile_data_directory:
      proto.profile_data_directory = self.model.profile_data_directory
    return proto

  def __repr__(self):
    return (f"EmbeddingConfig(tables={len(self.model.tables)}, features="
            f"{len(self.model.features)}, batch_size={self.batch_size}, "
            f"num_hosts={self.num_hosts}, num_cores={self.num_cores}, "
            f"mode={self.mode!r})")
