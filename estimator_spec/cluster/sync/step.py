"""`SyncStep`: the synchronous machinery of one TRAIN model_fn call on a
cluster (the protocol: `cluster/sync/__init__.py`).
"""
from typing import ContextManager, Iterable, Optional

import tensorflow as tf

from estimator_spec.cluster import placement as placement_lib
from estimator_spec.cluster import tasks
from estimator_spec.cluster.sync import barrier
from estimator_spec.cluster.sync import chief
from estimator_spec.cluster.sync import entries
from estimator_spec.cluster.sync import recording
from estimator_spec.cluster.sync import send
from estimator_spec.cluster.sync import watch
from estimator_spec.engine import backward
from estimator_spec.engine import engine as engine_lib
from estimator_spec.tensor_types import Op, Tensor, Variable


class SyncStep:
  """The synchronous machinery of one TRAIN model_fn call on a cluster.

  Use: `with step.recording(): <model_fn>`, then
  `train_op, hooks = step.finish(train_op, step_value, embedding, engine)`
  and give model_fn's EstimatorSpec that train op and these hooks after
  its own.

  Args:
    placement: the estimator's `placement.Placement` (the cluster, and
      which ps task holds each table partition).
    options: the `ClusterTraining`.
    reports: the list where the watch hook leaves its last report.
  """

  def __init__(self, placement: placement_lib.Placement,
               options: tasks.ClusterTraining,
               reports: list[watch.Report]) -> None:
    assert placement.cluster is not None  # a synchronous step's cluster
    self._placement = placement
    self._cluster = placement.cluster
    self._options = options
    self._reports = reports
    self._recorder = recording.Recorder(placement.cluster)

  def add_local_variables(self, variables: Iterable[Variable]) -> None:
    """Variables of this task only (never sent, applied by the chief as
    model_fn's optimizer gives them)."""
    self._recorder.add_local_variables(variables)

  def recording(self) -> ContextManager[None]:
    """Inside: model_fn's `apply_gradients` calls are recorded, not run
    (`recording.Recorder.recording`)."""
    return self._recorder.recording()

  def finish(self, train_op: Op, step_value: Tensor,
             embedding: Optional[backward.StepGradients] = None,
             engine: Optional[engine_lib.HostEmbeddingEngine] = None
             ) -> tuple[Op, list[tf.compat.v1.train.SessionRunHook]]:
    """(model_fn's `train_op` grouped with the synchronous step, [its
    hooks: a `watch.SyncWatchHook`, and the chief's `barrier.ReplyHook`
    with pipelining]).

    Args:
      train_op: model_fn's train op (TRAIN).
      step_value: the global step read at the start of the step.
      embedding: the step's `engine.StepGradients`, or None.
      engine: the `HostEmbeddingEngine` (with `embedding`).
    """
    self._recorder.check_called()
    step = tf.cast(step_value, tf.int64)
    cluster = self._cluster
    tables: list[tuple[str, int, int]] = []
    if embedding is not None:
      assert engine is not None  # given with the step's gradients
      tables = self._placement.partitions(engine.model)
    channels = entries.Channels(
        cluster, self._recorder.dense_entries(), tables,
        embedding.requests.dtype if embedding is not None else None)
    late_replies = None
    with tf.compat.v1.name_scope("synchronous_step"):
      pushes, steps = send.push(channels, step, embedding)
      if cluster.is_chief:
        done, late_replies = chief.chief_step(
            channels, self._recorder, steps, pushes, embedding, engine)
      else:
        done = barrier.await_chief(channels, steps[0], pushes)
    if not cluster.is_chief:
      self._recorder.build_unrun_updates()
    self._recorder.hold_until(done)
    hooks = [watch.SyncWatchHook(cluster, self._options,
                                 channels.contributions(), self._reports)]
    if late_replies is not None:
      hooks.append(barrier.ReplyHook(late_replies))
    return tf.group(train_op, done), hooks
