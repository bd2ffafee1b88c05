"""`EmbeddingConfig` with what a TPU needs, the public class.

`estimator_spec.EmbeddingConfig` is this class: the config model's
`TopologyConfig` (`estimator_spec.config.topology`, plain data: the
model on a batch size, a topology and a mode) with the TPU layer's proto
(`config_proto`, built by `proto.build_proto`) and infeed (`split_inputs`,
`generate_enqueue_ops`, `enqueue`) as methods, as TF's own configuration
object offers them. The config model stays free of the TPU layer
(docs/architecture.md, 'The rules the layers keep').
"""
import functools
from typing import Any

from estimator_spec.config import topology as config_lib
from estimator_spec.tpu import enqueue
from estimator_spec.tpu import proto as proto_lib


class EmbeddingConfig(config_lib.TopologyConfig):
  """A spec's tables and features on a given topology and mode, with the
  TPU configuration proto and the infeed.

  Args:
    spec: an `EmbeddingConfigSpec`.
    batch_size: the global batch size; must divide evenly by `num_cores`.
    num_hosts: hosts (TPU) or parameter-server shards of every table.
    num_cores: cores in all; must divide evenly by `num_hosts`.
    mode: `tf.estimator.ModeKeys.TRAIN` ('train'), `EVAL` ('eval') or
      `PREDICT` ('infer').
  """

  # --- the infeed -------------------------------------------------------------

  def split_inputs(self, features: Any, labels: Any = None) -> Any:
    """One host's batch prepared for the enqueue ops: returns (features,
    labels, features_per_core); see `estimator_spec.tpu.enqueue.split_inputs`."""
    return enqueue.split_inputs(self, features, labels)

  def generate_enqueue_ops(self, features_per_core: Any,
                           mode_override: Any = None,
                           ragged: bool = False) -> Any:
    """One `EnqueueTPUEmbeddingArbitraryTensorBatch` op per core; see
    `estimator_spec.tpu.enqueue.generate_enqueue_ops`."""
    return enqueue.generate_enqueue_ops(self, features_per_core,
                                        mode_override=mode_override,
                                        ragged=ragged)

  # --- the proto ------------------------------------------------------------

  @functools.cached_property
  def _built_proto(self) -> Any:
    return proto_lib.build_proto(self)

  @property
  def config_proto(self) -> Any:
    """The `TPUEmbeddingConfiguration` proto (a fresh copy each call)."""
    proto = proto_lib.Configuration()
    proto.CopyFrom(self._built_proto)
    return proto
