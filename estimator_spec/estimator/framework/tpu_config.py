"""The TPU side of a TPUEstimator's configuration: `InputPipelineConfig`,
`TPUConfig` and the TPU `RunConfig`, the counterparts of
`tf.compat.v1.estimator.tpu`'s (tensorflow-estimator 2.15), with the same
fields, defaults and checks.

`TPUConfig` is an immutable value (a namedtuple, as TF's is): fields are
read by name, `type(tpu_config)()` gives the defaults and `_replace`
returns a changed copy (unchecked, as the namedtuple's `_replace` is).

The TPU `RunConfig` adds to `RunConfig` a `tpu_config` (a default
`TPUConfig` when None), the session targets `master` and
`evaluation_master` (given, else a cluster resolver's master, else
TF_CONFIG's; evaluation defaults to the training master outside an
evaluator task) and `cluster`, a `tf.distribute.cluster_resolver`
ClusterResolver whose cluster becomes `cluster_spec` and the session
config's `cluster_def`. A TPU job runs in-graph, so a TF_CONFIG cluster
gets no device filters here.
"""
import collections
import re

import numpy as np
import tensorflow as tf

from estimator_spec.estimator.framework import run_config as run_config_lib

_ITERATIONS = re.compile(r"^[1-9][0-9]*[smh]?$")
_CORES_PER_REPLICA = (1, 2, 4, 8, 16, 32, 64, 128)


class InputPipelineConfig:
  """How a TPUEstimator deploys input_fn over the TPU hosts and cores
  (`TPUConfig.per_host_input_for_training` and
  `eval_training_input_configuration`)."""
  PER_SHARD_V1 = 1  # once per core
  PER_HOST_V1 = 2  # once per host, split over its cores
  PER_HOST_V2 = 3  # once per host, each core dequeues its own batch
  BROADCAST = 4  # once, every replica gets the whole batch
  SLICED = 5  # once, every replica gets its slice


_FIELDS = (
    "iterations_per_loop", "num_shards", "num_cores_per_replica",
    "per_host_input_for_training", "tpu_job_name",
    "initial_infeed_sleep_secs", "input_partition_dims",
    "eval_training_input_configuration",
    "experimental_host_call_every_n_steps",
    "experimental_allow_per_host_v2_parallel_get_next",
    "experimental_feed_hook")


class TPUConfig(collections.namedtuple("TPUConfig", _FIELDS)):
  """The TPU settings of a TPUEstimator run.

  Args:
    iterations_per_loop: training steps per session run on a TPU: a
      positive int, or a time, '<N>s', '<N>m' or '<N>h'.
    num_shards: the model replicas (TPU cores without model parallelism),
      a positive int, or None.
    num_cores_per_replica: cores per replica (model parallelism): 1, 2, 4,
      ..., 128, or None (none).
    per_host_input_for_training: an `InputPipelineConfig` value; True is
      PER_HOST_V1 and False PER_SHARD_V1 (stored as those values).
    tpu_job_name: the TPU workers' job; None reads TF_CONFIG's
      `service.tpu_worker_job_name`.
    initial_infeed_sleep_secs: seconds before the first infeed (a positive
      int), or None.
    input_partition_dims: per input, how it is split over a replica's cores
      (a list of one or two entries); needs `num_cores_per_replica` and
      PER_HOST_V2.
    eval_training_input_configuration: PER_HOST_V1 or SLICED.
    experimental_host_call_every_n_steps: host calls every this many steps.
    experimental_allow_per_host_v2_parallel_get_next: parallel dequeues
      with PER_HOST_V2.
    experimental_feed_hook: a class replacing the infeed/outfeed hook.

  Raises:
    ValueError: for a value out of range or settings that do not go
      together; TypeError for a non-int `num_shards` or
      `initial_infeed_sleep_secs`.
  """
  __slots__ = ()

  def __new__(cls, iterations_per_loop=2, num_shards=None,
              num_cores_per_replica=None, per_host_input_for_training=True,
              tpu_job_name=None, initial_infeed_sleep_secs=None,
              input_partition_dims=None,
              eval_training_input_configuration=(
                  InputPipelineConfig.PER_HOST_V1),
              experimental_host_call_every_n_steps=1,
              experimental_allow_per_host_v2_parallel_get_next=False,
              experimental_feed_hook=None):
    if not _ITERATIONS.match(str(iterations_per_loop)):
      raise ValueError(
          "TPUConfig: `iterations_per_loop` must be a positive int (steps) "
          "or a time '<N>s', '<N>m' or '<N>h' with N a positive int; got "
          f"{iterations_per_loop!r}.")
    if num_shards is not None:
      _check_positive_int("num_shards", num_shards)
    _check_partition_dims(input_partition_dims, per_host_input_for_training,
                          num_cores_per_replica)
    if (num_cores_per_replica is not None and
        num_cores_per_replica not in _CORES_PER_REPLICA):
      raise ValueError(
          "TPUConfig: `num_cores_per_replica` must be one of "
          f"{list(_CORES_PER_REPLICA)} or None; got {num_cores_per_replica!r}.")
    if eval_training_input_configuration not in (
        InputPipelineConfig.PER_HOST_V1, InputPipelineConfig.SLICED):
      raise ValueError(
          "TPUConfig: `eval_training_input_configuration` must be "
          "InputPipelineConfig.PER_HOST_V1 or SLICED; got "
          f"{eval_training_input_configuration!r}.")
    if per_host_input_for_training is True:
      per_host_input_for_training = InputPipelineConfig.PER_HOST_V1
    elif per_host_input_for_training is False:
      per_host_input_for_training = InputPipelineConfig.PER_SHARD_V1
    if initial_infeed_sleep_secs:
      _check_positive_int("initial_infeed_sleep_secs",
                          initial_infeed_sleep_secs)
    return super().__new__(
        cls, iterations_per_loop, num_shards, num_cores_per_replica,
        per_host_input_for_training, tpu_job_name or _tpu_job_name(),
        initial_infeed_sleep_secs, input_partition_dims,
        eval_training_input_configuration,
        experimental_host_call_every_n_steps,
        experimental_allow_per_host_v2_parallel_get_next,
        experimental_feed_hook)


def _check_positive_int(name, value):
  if not isinstance(value, (int, np.integer)):
    raise TypeError(f"TPUConfig: `{name}` must be an int; got "
                    f"{type(value).__name__}: {value!r}.")
  if value <= 0:
    raise ValueError(f"TPUConfig: `{name}` must be positive; got {value}.")


def _check_partition_dims(dims, per_host_input, cores_per_replica):
  """`input_partition_dims`, when set: one or two entries, with PER_HOST_V2
  input and `num_cores_per_replica`."""
  if dims is None:
    return
  if len(dims) not in (1, 2):
    raise ValueError(
        "TPUConfig: `input_partition_dims` must be a list or tuple of one "
        "entry (the features') or two (features' and labels'); got "
        f"{dims!r}.")
  if (isinstance(per_host_input, bool) or
      per_host_input != InputPipelineConfig.PER_HOST_V2):
    raise ValueError(
        "TPUConfig: `input_partition_dims` needs per_host_input_for_"
        "training=InputPipelineConfig.PER_HOST_V2; got "
        f"{per_host_input!r}.")
  if cores_per_replica is None:
    raise ValueError(
        "TPUConfig: `input_partition_dims` needs `num_cores_per_replica` "
        "(the cores the inputs are split over).")


def _tpu_job_name():
  """TF_CONFIG's `service.tpu_worker_job_name`, or None."""
  service = run_config_lib.service_of(run_config_lib.read_tf_config())
  name = (service or {}).get("tpu_worker_job_name")
  if name:
    tf.compat.v1.logging.info("TPU job name from TF_CONFIG: %s", name)
  return name


class RunConfig(run_config_lib.RunConfig):
  """`RunConfig` with a TPU configuration and session targets.

  Args:
    tpu_config: a `TPUConfig`; None (or empty) for the default one.
    evaluation_master: the evaluation session's target; None for TF_CONFIG's
      or, outside an evaluator task, `master`.
    master: the training session's target; None for the cluster
      resolver's or TF_CONFIG's. Not together with `cluster`.
    cluster: a `tf.distribute.cluster_resolver.ClusterResolver`, or None.
      Its cluster becomes `cluster_spec` and the session config's
      `cluster_def` (the session config defaults to soft placement with
      isolated session state).
    **kwargs: `RunConfig`'s arguments.

  Raises:
    ValueError: `master` and `cluster` both given, or `cluster` with a
      session config that has a `cluster_def` of its own.
  """

  _REPLACEABLE = run_config_lib.REPLACEABLE + ("tpu_config",)
  _SHARED = ("_device_fn", "_cluster")

  def __init__(self, tpu_config=None, evaluation_master=None, master=None,
               cluster=None, **kwargs):
    super().__init__(**kwargs)
    if master is not None and cluster is not None:
      raise ValueError(
          "TPU RunConfig: give `master` or `cluster` (a ClusterResolver, "
          f"which names the master), not both; got master={master!r} and "
          f"cluster={cluster!r}.")
    self._tpu_config = tpu_config or TPUConfig()
    self._cluster = cluster
    if master is not None:
      self._master = master
    elif cluster:
      self._master = cluster.master()
    if evaluation_master is not None:
      self._evaluation_master = evaluation_master
    elif (not self._evaluation_master and
          self._task_type != run_config_lib.TaskType.EVALUATOR):
      self._evaluation_master = self._master
    if cluster:
      self._use_cluster(cluster)

  def _use_cluster(self, cluster):
    """The resolver's cluster as `cluster_spec` and, in a copy of the
    session config, its `cluster_def`."""
    self._cluster_spec = cluster.cluster_spec()
    if self._session_config is None:
      session_config = tf.compat.v1.ConfigProto(
          allow_soft_placement=True, isolate_session_state=True)
    elif self._session_config.HasField("cluster_def"):
      raise ValueError(
          "TPU RunConfig: the session config has a `cluster_def` and a "
          "`cluster` resolver is given too; give the cluster one way.")
    else:
      session_config = tf.compat.v1.ConfigProto()
      session_config.CopyFrom(self._session_config)
    if self._cluster_spec:
      session_config.cluster_def.CopyFrom(self._cluster_spec.as_cluster_def())
    self._session_config = session_config

  def _cluster_session_config(self):
    """None: a TPU job runs in-graph, without device filters."""
    return None

  @property
  def tpu_config(self):
    """The `TPUConfig`."""
    return self._tpu_config

  @property
  def cluster(self):
    """The ClusterResolver, or None."""
    return self._cluster
