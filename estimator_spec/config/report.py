"""Human-readable report of an `EmbeddingConfig`: tables, features, shards.

Everything printed is read from the config model and its shard layouts, the
same data the proto and the engine use.
"""
import io
from typing import Any, Mapping, Optional

import numpy as np

from estimator_spec.config import topology
from estimator_spec.config import model as model_lib
from estimator_spec.config import optimizers
from estimator_spec.config import sharding

_Config = topology.TopologyConfig

_FLOAT_BYTES = 4


def mib(num_bytes: float) -> str:
  """`num_bytes` in MiB, as the reports print memory."""
  return f"{num_bytes / 2**20:,.1f} MiB"


def _optimizer_label(
    optimizer: Optional[optimizers.OptimizationParameters]) -> str:
  if optimizer is None:
    return "- (inference)"
  return f"{type(optimizer).__name__.replace('Parameters', '')}"


def _learning_rate_label(config: _Config, table: model_lib.Table) -> str:
  optimizer = config.optimizer_for(table.name)
  if optimizer is None:  # inference: no optimizer, no learning rate
    return "-"
  return config.model.learning_rate(table.name, optimizer).label()


def shard_bytes(config: _Config,
                num_shards: Optional[int] = None) -> dict[str, list[int]]:
  """{table: [bytes of partition i (table + optimizer slots)]}."""
  return {name: partition_bytes(config, name, layout)
          for name, layout in config.shard_layouts(num_shards).items()}


def partition_bytes(config: _Config, table_name: str,
                    layout: sharding.ShardLayout) -> list[int]:
  """[bytes of partition i of `layout`]: its rows of the table and of its
  optimizer's slots, float32."""
  optimizer = config.optimizer_for(table_name)
  copies = 1 + (len(optimizer.slot_specs()) if optimizer is not None else 0)
  dimension = config.model.tables[table_name].dimension
  return [rows * dimension * _FLOAT_BYTES * copies for rows in layout.sizes]


def shard_unit(config: _Config, num_shards: Optional[int] = None) -> str:
  """What `describe` calls a shard of `config`'s tables on `num_shards`
  shards: the tables' shards are the checkpoint's partitions, one per host
  ("host shard") unless `num_shards` says otherwise ("shard")."""
  if num_shards is None or num_shards == config.num_hosts:
    return "host shard"
  return "shard"


def describe(config: _Config, num_shards: Optional[int] = None,
             include_proto: bool = False, statistics_text: str = "") -> str:
  """Returns a multi-line report of `config` (an `EmbeddingConfig`);
  with `statistics_text`, also that part on saved lookup statistics
  (the profiling layer writes it: `profiling.shards.describe_section`),
  after the memory; with `include_proto`, also the TPU configuration
  proto, which the TPU layer's `estimator_spec.EmbeddingConfig` builds
  (`config_proto`)."""
  model = config.model
  out = io.StringIO()
  num_shards = config.num_hosts if num_shards is None else num_shards
  unit = shard_unit(config, num_shards)
  out.write(
      f"Topology: {config.num_hosts} host(s) x {config.num_cores_per_host} "
      f"core(s) = {config.num_cores} cores; global batch {config.batch_size} "
      f"({config.batch_size_per_core} per core); mode "
      f"{'TRAINING' if config.is_training else 'INFERENCE'}; tables "
      f"partitioned '{model.partition_strategy}' over {num_shards} "
      f"{unit}(s); pipelining "
      f"{'on' if model.pipeline_execution_with_tensor_core else 'off'}; "
      f"clipping_limit {model.clipping_limit}\n\n")

  sizes = shard_bytes(config, num_shards)
  out.write(_tables_section(config, num_shards, sizes))
  out.write(_features_section(config))
  out.write(_memory_section(sizes, num_shards, unit))
  out.write(statistics_text)
  if include_proto:
    out.write("\nTPUEmbeddingConfiguration:\n")
    out.write(str(_proto_of(config)))
  return out.getvalue()


def _tables_section(config: _Config, num_shards: int,
                    sizes: Mapping[str, list[int]]) -> str:
  """`describe`'s table of tables (rows per shard and bytes from `sizes`)."""
  model = config.model
  out = io.StringIO()
  layouts = config.shard_layouts(num_shards)
  tw = max([5] + [len(name) for name in model.tables])
  out.write(f"Tables ({len(model.tables)}):\n")
  header = (f"  {'table':<{tw}} {'vocab':>10} {'dim':>4} {'combiner':>8} "
            f"{'optimizer':>16} {'lr':>8} {'feats':>5} {'rows/shard':>16} "
            f"{'bytes':>12}\n")
  out.write(header)
  for table in model.tables.values():
    rows = layouts[table.name].sizes
    row_text = (f"{rows[0]}" if len(set(rows)) == 1 else
                f"{min(rows)}..{max(rows)}")
    out.write(
        f"  {table.name:<{tw}} {table.vocabulary_size:>10,} "
        f"{table.dimension:>4} {str(table.combiner):>8} "
        f"{_optimizer_label(config.optimizer_for(table.name)):>16} "
        f"{_learning_rate_label(config, table):>8} {len(table.features):>5} "
        f"{row_text:>16} {mib(sum(sizes[table.name])):>12}\n")
  return out.getvalue()


def _features_section(config: _Config) -> str:
  """`describe`'s table of features, in enqueue order, and the tensor-core
  columns."""
  model = config.model
  out = io.StringIO()
  tw = max([5] + [len(name) for name in model.tables])
  fw = max([7] + [len(name) for name in model.features])
  out.write(f"\nFeatures ({len(model.features)}), in enqueue order:\n")
  out.write(f"  {'feature':<{fw}} {'table':<{tw}} {'seq_len':>7} "
            f"{'weight_key':<14} input_shape\n")
  for feature in model.features.values():
    shape = [config.batch_size_per_core]
    if feature.max_sequence_length:
      shape.append(feature.max_sequence_length)
    out.write(f"  {feature.name:<{fw}} {feature.table:<{tw}} "
              f"{feature.max_sequence_length:>7} "
              f"{str(feature.weight_key or '-'):<14} {shape}\n")
  if model.tensor_core_features:
    out.write("\nTensor-core columns (looked up by the dense model):\n")
    for core_feature in model.tensor_core_features:
      out.write(f"  {core_feature.column_name}: tensor_core_shape="
                f"{list(core_feature.shape)}, mask feature "
                f"{core_feature.mask_key!r}\n")
  return out.getvalue()


def _memory_section(sizes: Mapping[str, list[int]], num_shards: int,
                    unit: str = "shard") -> str:
  """Memory per shard (a `unit`) of all tables together, from
  `shard_bytes`."""
  out = io.StringIO()
  per_shard = np.zeros(num_shards, dtype=np.int64)
  for table_sizes in sizes.values():
    per_shard[:len(table_sizes)] += np.asarray(table_sizes, dtype=np.int64)
  out.write(f"\nMemory per {unit} (tables + optimizer slots, float32):\n")
  for shard, num_bytes in enumerate(per_shard):
    out.write(f"  shard {shard}: {mib(int(num_bytes))}\n")
  out.write(f"  total:   {mib(int(per_shard.sum()))}\n")
  return out.getvalue()


def _proto_of(config: _Config) -> Any:
  """The TPU configuration proto of `config`; the config model does not
  build it (docs/architecture.md, 'The rules the layers keep')."""
  if not hasattr(config, "config_proto"):
    raise TypeError(
        "describe: `include_proto=True` needs an estimator_spec."
        f"EmbeddingConfig, which builds the TPU configuration proto; got "
        f"{type(config)}.")
  return getattr(config, "config_proto")
