"""One step's traffic with the tasks that hold table partitions (a
cluster's ps tasks): one request per task for the rows of every table, one
per task for their updates (docs/cluster.md, 'Requests per step').

Each table's distinct ids of the step are routed once (`storage.route`,
the layout's rule). For each task, the local ids of every table partition
it holds travel as one integer tensor, `[n_1 .. n_K, ids of partition 1,
.., ids of partition K]` (K partitions on the task, in the engine's table
order; int32 where every partition has fewer than 2**31 rows, else
int64): the gathers there of the rows of all of them reply with one
float32 tensor, the rows flattened and concatenated, which this task
splits into each table's rows: the step orders each table's distinct ids
by partition (`in_request_order`), so that a table's rows are its
partitions' replies one after another and the gradient rows of each
partition one block of the table's (no rows permuted). The update of the step
reuses the ids the task received for the lookup (the same tensor: TF sends
it once) and adds one float32 tensor, `[learning rate of partition 1 ..
K, gradient rows of partition 1, .., of partition K]`, in the same order;
`unpack` reads both back on the task that holds the partitions.

The gathers of the reply need every table's variables, which exist only
once model_fn's columns named them, one table after another; the
activations of the first tables are built on a stand-in for the reply,
replaced by the reply once the last table's variables exist (`finish`,
`tf_patches.op_inputs`).
"""
import collections
from typing import (Any, Callable, Dict, List, Mapping,
                    Optional, Tuple)

import tensorflow as tf

from estimator_spec.config import sharding
from estimator_spec.engine import storage
from estimator_spec.tf_patches import op_inputs


def request_dtype(layouts: Mapping[str, sharding.ShardLayout]) -> Any:
  """The type of a step's requests' ids and sizes: int32 where every
  partition has fewer than 2**31 rows, else int64."""
  return (tf.int32 if all(max(layout.sizes) < 2**31
                          for layout in layouts.values()) else tf.int64)


class StepRequests:
  """The requests of one step (see module).

  Args:
    layouts: {table: its `ShardLayout`}, in the engine's table order.
    dimensions: {table: its dimension}.
    device_of: (table, partition) -> the device holding the partition.
    unique_ids: {table: int64 [U] the step's distinct global ids}, routed
      here by TF ops; or
    routed: {table: ([local ids of partition p], [their number])}, `dtype`
      (`request_dtype`), of the distinct ids already grouped by partition
      (the compiled `kernels.route_ids`): `in_request_order` then keeps the
      order it is given.
  """

  def __init__(self, layouts: Mapping[str, sharding.ShardLayout],
               dimensions: Mapping[str, int],
               device_of: Callable[[str, int], Any],
               unique_ids: Optional[Mapping[str, Any]] = None,
               routed: Optional[Mapping[str, Tuple[List[Any], List[Any]]]]
               = None) -> None:
    if (unique_ids is None) == (routed is None):
      raise ValueError("StepRequests: give one of unique_ids and routed.")
    self._dimensions = dimensions
    # The type of the requests' ids and sizes (the update reads int64).
    self.dtype = request_dtype(layouts)
    # {table: (the order of its distinct ids in the requests or None where
    # they are in that order, [local ids of partition p], [their number])}
    self._routes: Dict[str, Tuple[Any, List[Any], List[Any]]] = (
        collections.OrderedDict())
    # device -> [(table, p)]
    self.entries: Dict[Any, List[Tuple[str, int]]] = (
        collections.OrderedDict())
    for name, layout in layouts.items():
      if routed is not None:
        locals_, sizes = routed[name]
        self._routes[name] = (None, list(locals_), list(sizes))
        for p in range(layout.num_partitions):
          self.entries.setdefault(device_of(name, p), []).append((name, p))
        continue
      assert unique_ids is not None
      partition, local = storage.route(layout, unique_ids[name])
      local = tf.cast(local, self.dtype)
      count = layout.num_partitions
      order = None
      locals_ = [local]
      if count > 1:
        order = tf.concat(tf.dynamic_partition(
            tf.range(tf.shape(partition)[0]), partition, count), axis=0)
        locals_ = tf.dynamic_partition(local, partition, count)
      sizes = [tf.size(piece, out_type=self.dtype) for piece in locals_]
      self._routes[name] = (order, locals_, sizes)
      for p in range(count):
        self.entries.setdefault(device_of(name, p), []).append((name, p))
    self._ids: Dict[Any, Any] = {}
    self._replies: Dict[Any, Tuple[Any, List[Any]]] = {}
    for device, entries in self.entries.items():
      pieces = [self._routes[name][1][p] for name, p in entries]
      sizes = tf.stack([self._routes[name][2][p] for name, p in entries])
      self._ids[device] = tf.concat([sizes] + pieces, axis=0)
      self._replies[device] = self._stand_in(device, entries, sizes)
    self._rows: Dict[str, Any] = {}
    self._grads: Dict[str, Any] = {}
    # {device: the op there that reads the rows of the step}, once
    # `finish` built them.
    self.replies: Optional[Dict[Any, Any]] = None

  def _stand_in(self, device: Any, entries: List[Tuple[str, int]],
                sizes: Any) -> Tuple[Any, List[Any]]:
    """[rows of each entry] built on a stand-in for `device`'s reply
    (replaced by `finish`), and the op reading it."""
    with tf.control_dependencies(None):
      stand_in = tf.compat.v1.placeholder(tf.float32, [None],
                                          name="reply_stand_in")
    received = tf.identity(stand_in, name="reply")
    dims = tf.constant([self._dimensions[name] for name, _ in entries],
                       self.dtype)
    flat = tf.split(received, sizes * dims, num=len(entries))
    rows = [tf.reshape(piece, [-1, self._dimensions[name]])
            for piece, (name, _) in zip(flat, entries)]
    return received.op, rows

  def ids(self, device: Any) -> Any:
    """The integer request of `device` (on this task, `dtype`): the
    sizes, then the local ids of each of its partitions."""
    return self._ids[device]

  def in_request_order(self, name: str, unique_ids: Any, index: Any
                       ) -> Tuple[Any, Any]:
    """(distinct ids, index) of table `name` in the order of its rows in
    the requests: grouped by partition, in partition order, each group in
    the order of `unique_ids` (the distinct ids given, `tf.unique`'s, with
    `index`, each id's position among them). `rows` and `gradients` use
    that order, so that no rows are permuted: per-id sums add the same
    values in the same order whatever the order of the ids."""
    order = self._routes[name][0]
    if order is None:
      return unique_ids, index
    return (tf.gather(unique_ids, order),
            tf.gather(tf.math.invert_permutation(order), index))

  def rows(self, name: str) -> Any:
    """[U, D] rows of table `name`'s distinct ids (in `in_request_order`)."""
    if name not in self._rows:
      parts: List[Any] = [None] * len(self._routes[name][1])
      for device, entries in self.entries.items():
        _, rows = self._replies[device]
        for (table, p), piece in zip(entries, rows):
          if table == name:
            parts[p] = piece
      rows = parts[0] if len(parts) == 1 else tf.concat(parts, axis=0)
      rows.set_shape([None, self._dimensions[name]])
      self._rows[name] = rows
    return self._rows[name]

  def finish(self, partition_variable: Callable[[str, int], Any]) -> None:
    """Builds each device's gather of the rows of all its partitions and
    puts it in place of the stand-in. `partition_variable(table, p)`: the
    partition's variable (every table's exists now); sets `replies`."""
    replies = {}
    for device, entries in self.entries.items():
      with tf.control_dependencies(None), storage.device_scope(device):
        local = unpack_ids(self._ids[device], len(entries))
        gathered = [
            tf.reshape(tf.gather(partition_variable(name, p), ids), [-1])
            for (name, p), ids in zip(entries, local)
        ]
        reply = tf.concat(gathered, axis=0, name="lookup_reply")
      op_inputs.replace_input(self._replies[device][0], 0, reply)
      replies[device] = reply.op
    self.replies = replies

  def gradients(self, device: Any, grads: Mapping[str, Any],
                rates: Mapping[str, Any]) -> Any:
    """The float32 update request of `device` (built on this task): the
    learning rate of each of its partitions, then their gradient rows
    flattened, made once this task has received the rows it looked up
    there (so an update there sent with it follows this task's lookup).
    `grads`: {table: [U, D] sums of the distinct ids, in
    `in_request_order`}, the same for every device of the step (routed
    once); `rates`: {table: learning rate}."""
    entries = self.entries[device]
    for name, _ in entries:
      if name not in self._grads:
        _, _, sizes = self._routes[name]
        # Each partition's rows are one block: a split along the rows.
        self._grads[name] = ([grads[name]] if len(sizes) == 1 else
                             tf.split(grads[name], tf.stack(sizes),
                                      num=len(sizes)))
    lrs = tf.stack([tf.cast(rates[name], tf.float32) for name, _ in entries])
    flat = [tf.reshape(self._grads[name][p], [-1]) for name, p in entries]
    with tf.control_dependencies([self._replies[device][0]]):
      return tf.concat([lrs] + flat, axis=0)

  def unpack(self, device: Any, ids: Any, floats: Any
             ) -> List[Tuple[str, int, Any, Any, Any]]:
    """[(table, partition, local ids, gradient rows [n, D], learning rate)]
    of each partition on `device` from its requests `ids` (`dtype`) and
    `floats` (float32: `gradients`), built where the caller's device scope
    says (the task holding the partitions)."""
    entries = self.entries[device]
    count = len(entries)
    sizes = ids[:count]
    local = tf.split(tf.cast(ids[count:], tf.int64), sizes, num=count)
    dims = tf.constant([self._dimensions[name] for name, _ in entries],
                       self.dtype)
    flat = tf.split(floats[count:], sizes * dims, num=count)
    rates = tf.unstack(floats[:count], num=count)
    return [(name, p, local[k],
             tf.reshape(flat[k], [-1, self._dimensions[name]]), rates[k])
            for k, (name, p) in enumerate(entries)]


def unpack_ids(ids: Any, count: int) -> Any:
  """The `count` local-id tensors of an integer request."""
  return tf.split(ids[count:], ids[:count], num=count)
