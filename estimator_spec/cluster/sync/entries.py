"""What travels between the tasks in a synchronous step: each task's entry
in its gradient queue on every ps task, the chief's replies to the
workers, and the record of the step each task sent last; and `Channels`,
the queues and the table on the ps tasks that hold them.

An entry's float32 component starts with the step (int64, its bits as two
float32 values: a queue, a concat and a slice copy bits unchanged), then
the float32 dense gradients of the variables on that ps (`packed_dense`),
then the update request of the table partitions there.
"""
from typing import Hashable, Mapping, Optional, Sequence, Union

import tensorflow as tf

from estimator_spec.cluster import tasks
from estimator_spec.tensor_types import Tensor, Variable

DONE = 0      # reply: step (value - 1) is applied
DROPPED = 1   # reply: the entry of step `value` was dropped; run it again
_PREFIX = "estimator_spec_sync"
_QUEUE_CAPACITY = 8
_REPLY_CAPACITY = 64
_STEP_FLOATS = 2

# (call index, position, variable, gradient, ps index) of a dense gradient
# that is sent (`recording.Recorder.dense_entries`).
DenseEntry = tuple[int, int, Variable, Tensor, int]
# (call, position, variable, gradient, offset, size) of one travelling in
# the float32 component (`packed_dense`).
PackedEntry = tuple[int, int, Variable, Tensor, int, int]
# A task's entry as a queue gives it: {component name: tensor}.
Entry = Mapping[str, Tensor]


def entry_step(entry: Entry) -> Tensor:
  """The step of an entry (read where the entry is)."""
  return tf.bitcast(entry["floats"][:_STEP_FLOATS], tf.int64)


def packs(grad: Tensor, var: Variable) -> bool:
  """Whether a dense gradient travels in its entry's float32 component: a
  float32 tensor of its variable's static shape."""
  return (not isinstance(grad, tf.IndexedSlices) and
          grad.dtype == tf.float32 and var.shape.is_fully_defined())


def dense_key(call: int, position: int) -> str:
  """The name of a dense gradient in an entry (sparse: also
  `<name>/indices`): model_fn's `call`-th apply_gradients, `position`-th
  pair."""
  return f"dense/{call}/{position}"


def packed_dense(ps: int, dense: Sequence[DenseEntry]
                 ) -> tuple[list[PackedEntry], int]:
  """[(call, position, variable, gradient, offset, size)] of the dense
  gradients on `ps` that travel in the float32 component (after the step),
  and where the rest of that component starts."""
  packed: list[PackedEntry] = []
  offset = _STEP_FLOATS
  for c, k, var, grad, p in dense:
    if p == ps and packs(grad, var):
      size = var.shape.num_elements()
      packed.append((c, k, var, grad, offset, size))
      offset += size
  return packed, offset


def joined(entries: Sequence[Entry], name: str) -> Tensor:
  """Component `name` of every task's entry, concatenated."""
  return tf.concat([e[name] for e in entries], axis=0)


class Channels:
  """The queues and the table of one step's graph, each built on first
  use (one op per graph), and the one description of an entry.

  Args:
    cluster: the `tasks.Cluster`.
    dense: [(call index, position, variable, gradient, ps index)] of every
      dense gradient that is sent (`recording.Recorder.dense_entries`).
    tables: [(table, partition, ps task)] of the table partitions the step
      updates (`placement.Placement.partitions`; empty without tables).
    ids_dtype: the dtype of the lookup's requests (`engine.requests`), or
      None without tables.
  """

  def __init__(self, cluster: tasks.Cluster, dense: Sequence[DenseEntry],
               tables: Sequence[tuple[str, int, int]],
               ids_dtype: Optional[tf.DType]) -> None:
    self.cluster = cluster
    self.dense = dense
    self._tables = tables
    self._ids_dtype = ids_dtype
    # {key: a queue, or the contributions table's handle}
    self._resources: dict[Hashable,
                          Union[tf.compat.v1.FIFOQueue, Tensor]] = {}

  def components(self, ps: int) -> dict[str, tf.DType]:
    """{component name: dtype} of an entry in a queue on `ps`: `ids`, the
    lookup's request of the table partitions there (`engine.requests`),
    `floats`: the step, the float32 dense gradients of the variables there
    (`packed_dense`) and the update request of the table partitions
    there; the other dense gradients there (indices and values when
    sparse). The one description of an entry: the queue, the sender and
    the chief use it."""
    components = {}
    if any(where == ps for _, _, where in self._tables):
      components["ids"] = self._ids_dtype
    components["floats"] = tf.float32
    for c, k, var, grad, p in self.dense:
      if p == ps and not packs(grad, var):
        if isinstance(grad, tf.IndexedSlices):
          components[dense_key(c, k) + "/indices"] = tf.int64
          components[dense_key(c, k)] = grad.values.dtype
        else:
          components[dense_key(c, k)] = grad.dtype
    return components

  def queue(self, task: int, ps: int) -> tf.compat.v1.FIFOQueue:
    """`task`'s gradient queue on `ps`."""
    key = ("gradients", task, ps)
    if key not in self._resources:
      components = self.components(ps)
      with tf.compat.v1.device(self.cluster.ps_device(ps)):
        self._resources[key] = tf.compat.v1.FIFOQueue(
            _QUEUE_CAPACITY, list(components.values()),
            names=list(components),
            shared_name=f"{_PREFIX}/gradients/task_{task}/ps_{ps}",
            name=f"gradients_task_{task}_ps_{ps}")
    return self._resources[key]

  def reply_queue(self, task: int) -> tf.compat.v1.FIFOQueue:
    """The chief's replies to `task` (on ps 0)."""
    key = ("replies", task)
    if key not in self._resources:
      with tf.compat.v1.device(self.cluster.ps_device(0)):
        self._resources[key] = tf.compat.v1.FIFOQueue(
            _REPLY_CAPACITY, [tf.int64, tf.int64], shapes=[[], []],
            shared_name=f"{_PREFIX}/replies/task_{task}",
            name=f"replies_task_{task}")
    return self._resources[key]

  def contributions(self) -> Tensor:
    """{training task index: last step it sent} (a hash table on ps 0)."""
    if "contributions" not in self._resources:
      with tf.compat.v1.device(self.cluster.ps_device(0)):
        self._resources["contributions"] = tf.raw_ops.MutableHashTableV2(
            key_dtype=tf.int64, value_dtype=tf.int64,
            shared_name=f"{_PREFIX}/contributions", name="contributions")
    return self._resources["contributions"]
