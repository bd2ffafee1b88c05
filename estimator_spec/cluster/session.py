"""The TF session config of a host run, and of each task of a
between-graph cluster.

A run whose RunConfig gives no session config gets Estimator's default
(`default_session_config`). On a cluster, a task also gets device filters,
so that no task waits for tasks it does not talk to (`device_filters`):
the ps tasks serve every training task, and each training task talks to
the ps tasks and itself. The library's own RunConfig adds them when it
reads TF_CONFIG, as tensorflow-estimator's does; TF's TPU RunConfig
leaves them out (a TPU job runs in-graph), so the TPUEstimator adds them
to a host run's config (`cluster_session_config`).
"""
from typing import Optional

import tensorflow as tf
from tensorflow.core.protobuf import rewriter_config_pb2

from estimator_spec.cluster import tasks


def default_session_config() -> tf.compat.v1.ConfigProto:
  """The session config an Estimator runs with when its RunConfig has
  none: soft placement, one pass of Grappler's meta optimizer."""
  rewrite = rewriter_config_pb2.RewriterConfig(
      meta_optimizer_iterations=rewriter_config_pb2.RewriterConfig.ONE)
  return tf.compat.v1.ConfigProto(
      allow_soft_placement=True,
      graph_options=tf.compat.v1.GraphOptions(rewrite_options=rewrite))


def device_filters(task_type: str, task_id: int) -> Optional[list[str]]:
  """The devices a task of a between-graph cluster talks to, or None for a
  task that gets no filter (an evaluator, an unknown job)."""
  if task_type in ("master", "chief"):
    return ["/job:ps", f"/job:{task_type}"]
  if task_type == "worker":
    return ["/job:ps", f"/job:worker/task:{task_id}"]
  if task_type == "ps":
    return ["/job:ps", "/job:worker", "/job:chief", "/job:master"]
  return None


def task_session_config(task_type: str, task_id: int
                        ) -> Optional[tf.compat.v1.ConfigProto]:
  """The default session config with the task's device filters, or None
  for a task that gets no filter."""
  filters = device_filters(task_type, task_id)
  if filters is None:
    return None
  session_config = default_session_config()
  session_config.device_filters.extend(filters)
  return session_config


def cluster_session_config(config: tasks.RunConfig
                           ) -> Optional[tf.compat.v1.ConfigProto]:
  """The session config a host run on a cluster needs when the RunConfig
  `config` (of either stack) has none: `task_session_config` of its task.
  None when the RunConfig has a session config of its own, no cluster, or
  a task that needs no filter."""
  if config.session_config is not None or not config.cluster_spec:
    return None
  return task_session_config(config.task_type, config.task_id)
