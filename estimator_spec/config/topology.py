"""`TopologyConfig`: the config model placed on a topology and a mode.

`TopologyConfig(spec, batch_size=..., num_hosts=..., num_cores=..., mode=...)`
binds a spec's config model to a batch size, a number of hosts and cores and
a mode (TRAIN, or EVAL/PREDICT which give the INFERENCE mode without an
optimizer). Everything downstream takes it: the host engine, and the TPU
layer. It is plain data and imports no other layer: the public
`estimator_spec.EmbeddingConfig` (`estimator_spec.tpu.embedding_config`)
is this class, under the name TF gives the concept, with the TPU layer's proto (`config_proto`) and infeed
(`split_inputs`, `generate_enqueue_ops`) as methods.
"""
import collections
from typing import Optional

from tpu_embedding_columns import checks

from estimator_spec.config import model as model_lib
from estimator_spec.config import optimizers
from estimator_spec.config import sharding
from estimator_spec.config import spec as spec_lib
from estimator_spec.config.modes import BATCH_NAMES, MODES, TRAIN


class TopologyConfig:
  """A spec's tables and features on a given topology and mode.

  Args:
    spec: an `EmbeddingConfigSpec`.
    batch_size: the global batch size; must divide evenly by `num_cores`.
    num_hosts: hosts (TPU) or parameter-server shards of every table.
    num_cores: cores in all; must divide evenly by `num_hosts`.
    mode: `tf.estimator.ModeKeys.TRAIN` ('train'), `EVAL` ('eval') or
      `PREDICT` ('infer').
  """

  def __init__(self, spec: spec_lib.EmbeddingConfigSpec, *, batch_size: int,
               num_hosts: int = 1, num_cores: int = 1,
               mode: str = TRAIN) -> None:
    # Users build the public subclass: errors name it.
    owner = "EmbeddingConfig"
    self.model = spec_lib.model_of(owner, spec)
    self.spec = spec
    self.batch_size: int = checks.check_int(owner, "batch_size", batch_size,
                                        minimum=1)
    self.num_hosts: int = checks.check_int(owner, "num_hosts", num_hosts,
                                       minimum=1)
    self.num_cores: int = checks.check_int(owner, "num_cores", num_cores,
                                       minimum=1)
    if self.num_cores % self.num_hosts:
      raise ValueError(
          f"{owner}: `num_cores` ({self.num_cores}) must be a multiple of "
          f"`num_hosts` ({self.num_hosts}).")
    if mode not in MODES:
      checks.fail(owner, "mode",
                   "must be tf.estimator.ModeKeys.TRAIN, EVAL or PREDICT",
                   mode)
    if self.batch_size % self.num_cores:
      # TF's words first (callers match them), then ours.
      raise ValueError(
          f"{owner}: {BATCH_NAMES[mode]} batch size {self.batch_size} must "
          f"be divisible by number of replicas {self.num_cores} (`batch_size` "
          f"must be a multiple of `num_cores`: each core takes an equal "
          "share).")
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

  # --- topology -------------------------------------------------------------

  @property
  def is_training(self) -> bool:
    return self.mode == TRAIN

  @property
  def num_cores_per_host(self) -> int:
    return self.num_cores // self.num_hosts

  @property
  def batch_size_per_core(self) -> int:
    return self.batch_size // self.num_cores

  # --- the model, as TF's dicts ----------------------------------------------

  @property
  def tables(self) -> dict[str, model_lib.Table]:
    return self.model.tables

  @property
  def features(self) -> dict[str, model_lib.Feature]:
    return self.model.features

  def optimizer_for(
      self, table_name: str) -> Optional[optimizers.OptimizationParameters]:
    """The optimizer of a table in this mode: None when not training."""
    return self.model.optimizer_for(table_name) if self.is_training else None

  @property
  def table_to_config_dict(
      self) -> collections.OrderedDict[str, spec_lib.TableConfig]:
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
  def feature_to_config_dict(
      self) -> collections.OrderedDict[str, spec_lib.FeatureConfig]:
    """{feature name: FeatureConfig}, in proto order."""
    return collections.OrderedDict(
        (f.name,
         spec_lib.FeatureConfig(
             table_id=f.table,
             max_sequence_length=f.max_sequence_length,
             weight_key=f.weight_key)) for f in self.model.features.values())

  def shard_layouts(
      self, num_shards: Optional[int] = None
  ) -> collections.OrderedDict[str, sharding.ShardLayout]:
    """{table name: ShardLayout}; `num_shards` defaults to `num_hosts`."""
    num_shards = self.num_hosts if num_shards is None else num_shards
    return collections.OrderedDict(
        (name, self.model.shard_layout(name, num_shards))
        for name in self.model.tables)

  def __repr__(self) -> str:
    return (f"{type(self).__name__}(tables={len(self.model.tables)}, features="
            f"{len(self.model.features)}, batch_size={self.batch_size}, "
            f"num_hosts={self.num_hosts}, num_cores={self.num_cores}, "
            f"mode={self.mode!r})")
