"""Where a run's tables live: the parameter-server tasks of a cluster
(TF_CONFIG with a `ps` job), else the TPU hosts the RunConfig describes.

The same placement serves the host engine (partitions and their devices)
and the TPU path (the spec is checked against the TPU's topology)."""
import math

import tensorflow as tf
from tensorflow.core.protobuf import rewriter_config_pb2

from estimator_spec.estimator import cluster as cluster_lib
from estimator_spec.estimator import tpu_context
from estimator_spec.config import embedding_config as config_lib


def table_topology(config):
  """(hosts, cores, on_tpu_layout) the tables are laid out for.

  Tables are split over the parameter-server tasks of a cluster (one "core"
  per task), or else over the TPU hosts the RunConfig's
  `tpu_config.num_shards` implies (8 cores per host), so that a checkpoint
  of a TPU run, `mod` layout included, reads back as the TPU wrote it.
  Default: one host with one core.
  """
  cluster = cluster_lib.Cluster.from_run_config(config)
  if cluster is not None:
    return cluster.num_ps, cluster.num_ps, False
  topology = tpu_context.Topology.from_run_config(config)
  return topology.num_hosts, topology.num_replicas, True


# The devices each task of a between-graph cluster talks to: the ps tasks
# and itself (the ps tasks serve every training task). Evaluators and
# other tasks get no filter.
def _device_filters(task_type, task_id):
  if task_type in ("chief", "master"):
    return ["/job:ps", f"/job:{task_type}"]
  if task_type == "worker":
    return ["/job:ps", f"/job:worker/task:{task_id}"]
  if task_type == "ps":
    return ["/job:ps", "/job:worker", "/job:chief", "/job:master"]
  return None


def cluster_session_config(config):
  """The session config a host run on a cluster needs when the RunConfig
  has none: device filters as Estimator's own RunConfig sets them, so that
  no task waits for tasks it does not talk to (TF's TPU RunConfig leaves
  them out: a TPU job runs in-graph). None when the RunConfig has a session
  config of its own, no cluster, or a task that needs no filter."""
  if config.session_config is not None or not config.cluster_spec:
    return None
  filters = _device_filters(config.task_type, config.task_id)
  if filters is None:
    return None
  rewrite = tf.compat.v1.GraphOptions(
      rewrite_options=rewriter_config_pb2.RewriterConfig(
          meta_optimizer_iterations=rewriter_config_pb2.RewriterConfig.ONE))
  return tf.compat.v1.ConfigProto(allow_soft_placement=True,
                                  graph_options=rewrite,
                                  device_filters=filters)


def shard_device_fn(config):
  """partition index -> device of the `ps` task holding it; None when the
  run has no parameter servers (every partition on the local device)."""
  cluster = cluster_lib.Cluster.from_run_config(config)
  return None if cluster is None else cluster.ps_device


def embedding_config(spec, mode, config, batch_sizes):
  """The `EmbeddingConfig` of `spec` for `mode` on this run's placement.

  Args:
    spec: the `EmbeddingConfigSpec`.
    mode: a `tf.estimator.ModeKeys` value.
    config: the RunConfig.
    batch_sizes: {mode: global batch size or None}; a mode without one uses
      the training batch size.
  """
  hosts, cores, tpu_layout = table_topology(config)
  train = tf.estimator.ModeKeys.TRAIN
  batch = batch_sizes.get(mode) or batch_sizes[train]
  if batch % cores and not (tpu_layout and mode == train):
    # Only the configuration proto splits the batch over cores; the host
    # runs it whole. Parameter-server "cores" and serving batches need
    # not divide it, so the proto's batch is rounded up there.
    batch = cores * math.ceil(batch / cores)
  return config_lib.EmbeddingConfig(
      spec, batch_size=batch, num_hosts=hosts, num_cores=cores, mode=mode)
