"""The end of a synchronous step: the chief tells every worker that the
step is applied (in the step, or with pipelining after its checkpoint
hook, `ReplyHook`); a worker's step ends when it hears so, or that its
entry was dropped (it then runs the step again).
"""
from typing import Optional

import tensorflow as tf

from estimator_spec.cluster.sync import entries
from estimator_spec.tensor_types import Op, Tensor


def reply(channels: entries.Channels, step: Tensor, done: list[Op],
          pipelined: bool) -> tuple[Op, Optional[Op]]:
  """(the op of the chief's step, the late replies or None): the op waits
  for `done` (its updates) and tells the workers that step `step` (read
  on ps 0) is done; with pipelining, the telling is left to `ReplyHook`,
  which runs the late replies."""
  cluster = channels.cluster
  workers = range(1, cluster.num_training_tasks)
  late_replies = None
  if pipelined:
    # With pipelining, the chief may apply the held update between steps
    # (before a checkpoint): the workers may start their next lookups only
    # after that, so the chief tells them after its checkpoint hook has
    # run (`ReplyHook`), not in the step.
    with tf.control_dependencies(None), tf.compat.v1.device(
        cluster.ps_device(0)):
      now = tf.cast(tf.compat.v1.train.get_global_step().read_value(),
                    tf.int64)
      late_replies = tf.group(*[
          channels.reply_queue(task).enqueue(
              [tf.constant(entries.DONE, tf.int64), now])
          for task in workers
      ], name="synchronous_step_replies")
  if pipelined or not workers:
    return tf.group(*done, name="synchronous_step_done"), late_replies
  with tf.control_dependencies(done), tf.compat.v1.device(
      cluster.ps_device(0)):
    replies = [
        channels.reply_queue(task).enqueue(
            [tf.constant(entries.DONE, tf.int64), step + 1])
        for task in workers
    ]
  # The replies wait for every update: the step's op is theirs, one op
  # on ps 0 (a group that also named the updates elsewhere would wait
  # for them there, a round trip between the ps tasks).
  with tf.compat.v1.device(cluster.ps_device(0)):
    return tf.group(*replies, name="synchronous_step_done"), late_replies


def await_chief(channels: entries.Channels, step: Tensor,
                pushes: list[Op]) -> Op:
  """A worker's part of the step after `pushes` (its sends): the op that
  waits for the chief's reply on ps 0 that step `step` is done, or that
  its entry of `step` was dropped."""
  reply_queue = channels.reply_queue(channels.cluster.index)

  def waiting(kind: Tensor, value: Tensor) -> Tensor:
    done = tf.logical_and(tf.equal(kind, entries.DONE), value > step)
    dropped = tf.logical_and(tf.equal(kind, entries.DROPPED),
                             tf.equal(value, step))
    return tf.logical_not(tf.logical_or(done, dropped))

  def next_reply(kind: Tensor, value: Tensor) -> list[Tensor]:
    del kind, value
    received: list[Tensor] = reply_queue.dequeue()
    return received

  with tf.control_dependencies(pushes), tf.compat.v1.device(
      channels.cluster.ps_device(0)):
    kind, value = reply_queue.dequeue()
    answer = tf.while_loop(waiting, next_reply, [kind, value],
                           back_prop=False, name="await_chief")
  return tf.group(*answer, name="synchronous_step_done")


class ReplyHook(tf.compat.v1.train.SessionRunHook):  # type: ignore[misc]  # TF is untyped
  """The chief's "step done" to the workers, after each step's hooks that
  come before it (Estimator runs the chief's checkpoint hook, whose
  listeners apply a held pipelined update, before the model's hooks)."""

  def __init__(self, replies: Op) -> None:
    self._replies = replies

  def after_run(self, run_context: tf.compat.v1.train.SessionRunContext,
                run_values: tf.compat.v1.train.SessionRunValues) -> None:
    del run_values
    run_context.session.run(self._replies)
