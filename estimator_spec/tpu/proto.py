"""The TPU embedding configuration proto of an `EmbeddingConfig`.

`build_proto(config)` writes the `TPUEmbeddingConfiguration` that
`tf.compat.v1.tpu.initialize_system` takes: one table descriptor per table
(in the config model's order, with its optimizer's message, learning rate,
clipping and decay), one feature descriptor per feature, the mode, the
topology and the sharding strategy.
"""
from tensorflow.core.protobuf.tpu import optimization_parameters_pb2
from tensorflow.core.protobuf.tpu import tpu_embedding_configuration_pb2

from estimator_spec.config import topology as config_lib
from estimator_spec.config import model as model_lib
from estimator_spec.config import optimizers

Configuration = tpu_embedding_configuration_pb2.TPUEmbeddingConfiguration
_ACCUMULATION = optimization_parameters_pb2.GradientAccumulationStatus
_HOT_ID = optimization_parameters_pb2.HotIdReplicationConfiguration


def _proto_optimizer(
    config: config_lib.TopologyConfig,
    table: model_lib.Table) -> optimizers.OptimizationParameters:
  # Training: the optimizer that trains the table (`EmbeddingConfig` checks
  # that every table has one). Inference runs no optimizer
  # (`optimizer_for` is None); the TPU still wants one per table: the
  # table's own if it has one, else SGD with learning rate 1 (as TF does).
  return (config.optimizer_for(table.name) or table.table_optimizer or
          optimizers.StochasticGradientDescentParameters(1.0))


def build_proto(
    config: config_lib.TopologyConfig
) -> tpu_embedding_configuration_pb2.TPUEmbeddingConfiguration:
  """The `TPUEmbeddingConfiguration` of an `EmbeddingConfig`."""
  proto = Configuration()
  table_ids = {}
  for index, table in enumerate(config.model.tables.values()):
    table_ids[table.name] = index
    descriptor = proto.table_descriptor.add()
    descriptor.name = table.name
    descriptor.vocabulary_size = max(table.vocabulary_size, config.num_hosts)
    descriptor.dimension = table.dimension
    optimizer = _proto_optimizer(config, table)
    params = descriptor.optimization_parameters
    rate = config.model.learning_rate(table.name, optimizer)
    if rate.fn is not None:
      params.learning_rate.dynamic.tag = rate.tag
    else:
      params.learning_rate.constant = rate.constant
    params.gradient_accumulation_status = (
        _ACCUMULATION.ENABLED
        if optimizer.use_gradient_accumulation else _ACCUMULATION.DISABLED)
    lower, upper = config.model.gradient_clip_bounds(optimizer)
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
  for feature in config.model.features.values():
    descriptor = proto.feature_descriptor.add()
    descriptor.table_id = table_ids[feature.table]
    descriptor.input_shape.append(config.batch_size_per_core)
    if feature.max_sequence_length:
      descriptor.input_shape.append(feature.max_sequence_length)
  proto.mode = (Configuration.TRAINING
                if config.is_training else Configuration.INFERENCE)
  proto.num_hosts = config.num_hosts
  proto.num_tensor_cores = config.num_cores
  proto.sharding_strategy = (
      Configuration.DIV_DEFAULT
      if config.model.partition_strategy == "div" else Configuration.MOD)
  proto.pipeline_execution_with_tensor_core = (
      config.model.pipeline_execution_with_tensor_core)
  if config.model.profile_data_directory:
    proto.profile_data_directory = config.model.profile_data_directory
  return proto

