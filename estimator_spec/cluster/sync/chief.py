"""The chief's part of a synchronous step: what it gathers (every task's
entry on each ps task, dropping entries of other steps) and what it
applies there (each table partition's update from every task's ids and
gradients, the dense gradients' averages), before it replies
(`barrier.reply`).
"""
from typing import Optional, Sequence

import tensorflow as tf

from estimator_spec.cluster.sync import barrier
from estimator_spec.cluster.sync import entries as entries_lib
from estimator_spec.cluster.sync import recording
from estimator_spec.engine import backward
from estimator_spec.engine import engine as engine_lib
from estimator_spec.tensor_types import Op, Tensor


def chief_step(channels: entries_lib.Channels, recorder: recording.Recorder,
               steps: Sequence[Tensor], pushes: list[Op],
               embedding: Optional[backward.StepGradients],
               engine: Optional[engine_lib.HostEmbeddingEngine]
               ) -> tuple[Op, Optional[Op]]:
  """The chief's part of the step (`steps`: its value on each ps task,
  `pushes`: the chief's own sends, `send.push`): takes every task's entry
  on each ps, updates the table partitions there and applies the averaged
  dense gradients (`recorder`: model_fn's, `recording.Recorder`), then
  replies to the workers. Returns (the op of the step, the late replies
  or None: `barrier.reply`)."""
  cluster = channels.cluster
  updates: list[Op] = []
  averaged: dict[tuple[int, int], Tensor] = {}
  for ps in range(cluster.num_ps):
    # Each task's entry on a ps is sent after the task received the rows
    # it looked up there (`StepRequests.gradients`): once every entry
    # there is taken, pipelining may apply the previous step's held
    # update.
    with tf.control_dependencies([pushes[ps]]):
      entries = [_take(channels, task, ps, steps[ps])
                 for task in range(cluster.num_training_tasks)]
    with tf.compat.v1.device(cluster.ps_device(ps)):
      with tf.control_dependencies([entries_lib.entry_step(e)
                                    for e in entries]):
        done = _table_updates(channels, ps, entries, embedding, engine)
        # One op per ps that the others wait for.
        updates.append(tf.group(*done, name=f"table_updates_ps_{ps}"))
      averaged.update(_dense_averages(channels, ps, entries))
  applied = recorder.apply_dense(averaged)
  pipelined = (engine is not None and
               engine.model.pipeline_execution_with_tensor_core)
  # The step ends once every update and this task's record of what it
  # sent (`pushes[-1]`, which the watch hook reads) are done.
  return barrier.reply(channels, steps[0], applied + updates + pushes[-1:],
                       pipelined)


def _take(channels: entries_lib.Channels, task: int, ps: int,
          step: Tensor) -> entries_lib.Entry:
  """The entry of `step` from `task`'s queue on `ps` (dropping others)."""
  queue = channels.queue(task, ps)
  reply = channels.reply_queue(task) if task and ps == 0 else None

  def stale(entry: entries_lib.Entry) -> Tensor:
    return tf.not_equal(entries_lib.entry_step(entry), step)

  def next_entry(entry: entries_lib.Entry) -> tuple[entries_lib.Entry]:
    ops: list[Op] = []
    if reply is not None:
      # Only ps 0 answers for a dropped entry: one answer per entry.
      ops.append(reply.enqueue([tf.constant(entries_lib.DROPPED, tf.int64),
                                entries_lib.entry_step(entry)]))
    with tf.control_dependencies(ops):
      return (queue.dequeue(),)

  with tf.compat.v1.device(channels.cluster.ps_device(ps)):
    first = queue.dequeue()
    entry: entries_lib.Entry
    (entry,) = tf.while_loop(
        stale, next_entry, (first,),
        shape_invariants=(
            {name: tf.TensorShape(None) for name in first},),
        back_prop=False, name=f"take_task_{task}")
  return entry


def _table_updates(channels: entries_lib.Channels, ps: int,
                   entries: Sequence[entries_lib.Entry],
                   embedding: Optional[backward.StepGradients],
                   engine: Optional[engine_lib.HostEmbeddingEngine]
                   ) -> list[Op]:
  """The update of each table partition on `ps` from every task's ids and
  gradients (`engine.requests`: each entry's `ids` and the rest of its
  `floats`), at the chief's learning rates: the engine sums them per id,
  scaled by 1/W (see `sync`)."""
  if "ids" not in entries[0]:
    return []
  # The step's tables come with its gradients and the engine.
  assert embedding is not None and engine is not None
  scale = 1.0 / channels.cluster.num_training_tasks
  device = channels.cluster.ps_device(ps)
  _, start = entries_lib.packed_dense(ps, channels.dense)
  tasks = [embedding.requests.unpack(device, e["ids"], e["floats"][start:])
           for e in entries]
  updates: list[Op] = []
  for k, (name, p, _, _, lr) in enumerate(tasks[0]):
    ids = tf.concat([task[k][2] for task in tasks], axis=0)
    grads = tf.concat([task[k][3] for task in tasks], axis=0)
    updates.append(engine.update_partition_contributions(
        name, p, ids, grads, lr, scale=scale))
  return updates


def _dense_averages(channels: entries_lib.Channels, ps: int,
                    entries: Sequence[entries_lib.Entry]
                    ) -> dict[tuple[int, int], Tensor]:
  """{(call, position): the average over the tasks of the gradient} of
  each dense variable on `ps`."""
  scale = 1.0 / channels.cluster.num_training_tasks
  averaged: dict[tuple[int, int], Tensor] = {}
  for c, k, var, _, offset, size in entries_lib.packed_dense(
      ps, channels.dense)[0]:
    total = tf.math.add_n([
        tf.reshape(e["floats"][offset:offset + size], var.shape)
        for e in entries])
    averaged[(c, k)] = total * tf.cast(scale, total.dtype)
  for c, k, var, grad, p in channels.dense:
    if p != ps or entries_lib.packs(grad, var):
      continue
    name = entries_lib.dense_key(c, k)
    if isinstance(grad, tf.IndexedSlices):
      values = entries_lib.joined(entries, name)
      averaged[(c, k)] = tf.IndexedSlices(
          values * tf.cast(scale, values.dtype),
          entries_lib.joined(entries, name + "/indices"), grad.dense_shape)
    else:
      total = tf.math.add_n([e[name] for e in entries])
      averaged[(c, k)] = tf.ensure_shape(
          total * tf.cast(scale, total.dtype), grad.shape)
  return averaged
