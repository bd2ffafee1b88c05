"""What every training task sends in a synchronous step: its entry in its
queue on each ps task (`entries`), and the record of the step it sent.
"""
from typing import Optional, Sequence

import tensorflow as tf

from estimator_spec.cluster.sync import entries
from estimator_spec.engine import backward
from estimator_spec.tensor_types import Op, Tensor


def push(channels: entries.Channels, step: Tensor,
         embedding: Optional[backward.StepGradients]
         ) -> tuple[list[Op], list[Tensor]]:
  """Sends this task's gradients of the step: one entry per ps task.
  Returns (the ops, [the step as each ps task received it]): a task
  sends its step once per ps task, in the entry.

  Args:
    channels: the step's `entries.Channels`.
    step: the global step read at the start of the step (int64).
    embedding: the step's `engine.StepGradients`, or None.
  """
  cluster = channels.cluster
  values = _unpacked_values(channels.dense)
  pushes, steps = [], []
  for ps in range(cluster.num_ps):
    components = channels.components(ps)
    entry = {name: values[name] for name in components
             if name in values}
    entry["floats"] = _floats(channels, ps, step, embedding,
                              "ids" in components)
    if "ids" in components:
      assert embedding is not None  # the step's tables come with it
      entry["ids"] = embedding.requests.ids(cluster.ps_device(ps))
    queue = channels.queue(cluster.index, ps)
    with tf.compat.v1.device(cluster.ps_device(ps)):
      pushes.append(queue.enqueue({name: entry[name]
                                   for name in components}))
      steps.append(entries.entry_step(entry))
  with tf.control_dependencies(pushes), tf.compat.v1.device(
      cluster.ps_device(0)):
    record = tf.raw_ops.LookupTableInsertV2(
        table_handle=channels.contributions(),
        keys=tf.constant([cluster.index], tf.int64),
        values=tf.reshape(steps[0], [1]))
  return pushes + [record], steps


def _unpacked_values(dense: Sequence[entries.DenseEntry]
                     ) -> dict[str, Tensor]:
  """{component name: tensor} of the dense gradients that travel as
  components of their own (sparse ones as indices and values)."""
  values: dict[str, Tensor] = {}
  for c, k, var, grad, _ in dense:
    if isinstance(grad, tf.IndexedSlices):
      values[entries.dense_key(c, k) + "/indices"] = tf.cast(grad.indices,
                                                            tf.int64)
      values[entries.dense_key(c, k)] = grad.values
    elif not entries.packs(grad, var):
      values[entries.dense_key(c, k)] = grad
  return values


def _floats(channels: entries.Channels, ps: int, step: Tensor,
            embedding: Optional[backward.StepGradients],
            has_tables: bool) -> Tensor:
  """The float32 component of this task's entry on `ps`
  (`entries.Channels.components`), built on this task."""
  pieces = [tf.bitcast(step, tf.float32)]
  for _, _, _, grad, _, _ in entries.packed_dense(ps, channels.dense)[0]:
    pieces.append(tf.reshape(grad, [-1]))
  if has_tables:
    assert embedding is not None  # the step's tables come with it
    with tf.control_dependencies([embedding.gate]):
      pieces.append(embedding.requests.gradients(
          channels.cluster.ps_device(ps), embedding.grads, embedding.rates))
  return tf.concat(pieces, axis=0)
