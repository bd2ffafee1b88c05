"""The executors of an update pipeline (`pipeline.UpdatePipeline`).

Each applies docs/numerics.md, 'The backward pass, table by table' (steps 4
to 7) and 'Each optimizer on a touched row' to the distinct ids of one
step, reading the pipeline's fields; `choose` names the one a table's plan
records (`plan.TablePlan`):

* `compiled`: the compiled row update (kernels/updates.cc), one op per
  partition of a table in this process: rows and slots change in place,
  with no gather of the slots and no scatter back;
* `fused`: TF's sparse-apply kernel for the rule, on a partition of another
  task, when the pipeline is the rule alone;
* `every_row`: TF ops on the whole table or partition (non-lazy Adam);
* `rows`: TF ops on the touched rows: gather, pipeline, scatter back.

All compute the same float32 operations in the same order, so they leave
the same tables bit for bit.
"""
import dataclasses
import numbers
from typing import Any, Callable, Dict, Mapping, Optional

import tensorflow as tf

from estimator_spec.engine import kernels
from estimator_spec.engine import pipeline as pipeline_lib

Pipeline = pipeline_lib.UpdatePipeline


class PartitionRows:
  """One partition variable with the row access of `PartitionedRows`
  (gather, scatter, whole reads and writes), for updates of that partition
  alone."""

  def __init__(self, variable: Any) -> None:
    self.variable = variable

  def gather(self, ids: Any) -> Any:
    return tf.gather(self.variable, ids)

  def scatter_update(self, ids: Any, rows: Any) -> Any:
    return self.variable.scatter_update(tf.IndexedSlices(rows, ids)).op

  def read_all(self) -> Any:
    return self.variable.read_value()

  def assign_all(self, full: Any) -> Any:
    return self.variable.assign(full).op


@dataclasses.dataclass(frozen=True)
class Target:
  """What an update writes: `table` and `slots` ({slot name: rows}), each a
  `PartitionedRows` (a table in this process) or a `PartitionRows` (one
  partition, updated on its own task under `lock_name`)."""
  table: Any
  slots: Mapping[str, Any]
  lock_name: Optional[str] = None


def _float32(value: Any) -> Any:
  """`value` as a float32 tensor; a number as `kernels.free_constant`."""
  if isinstance(value, numbers.Real):
    return kernels.free_constant(value)
  return tf.cast(value, tf.float32)


def _compiled(pipeline: Pipeline, target: Target, ids: Any, grads: Any,
              lr: Any, rows: Any) -> Any:
  del rows  # Read in place by the kernel.
  assert pipeline.compiled is not None
  table = target.table
  slots = [target.slots[spec.name] for spec in pipeline.optimizer.slot_specs()]
  factor = pipeline.decay_factor(lr)
  scalars = {
      "grad_lo": pipeline.gradient_min, "grad_hi": pipeline.gradient_max,
      "factor": 0.0 if factor is None else factor,
      "weight_lo": pipeline.weight_min, "weight_hi": pipeline.weight_max}
  scalars = {k: _float32(v) for k, v in scalars.items()}
  return tf.group(*[
      kernels.row_update(
          pipeline.compiled, table.partitions[p].handle,
          [slot.partitions[p].handle for slot in slots],
          indices=local, grad=part_grads, lr=lr,
          clip_gradients=pipeline.clips_gradients, decay=pipeline.decays,
          clip_weights=pipeline.clips_weights, **scalars)
      for p, (local, part_grads) in enumerate(table.split(ids, grads))
  ])


def _fused(pipeline: Pipeline, target: Target, ids: Any, grads: Any,
           lr: Any, rows: Any) -> Any:
  del rows
  assert pipeline.fused is not None
  return pipeline.fused(target.table.variable,
                        {k: v.variable for k, v in target.slots.items()},
                        ids, grads, lr)


def _touched_rows(pipeline: Pipeline, target: Target, ids: Any, grads: Any,
                  lr: Any, rows: Any) -> Any:
  if rows is None:
    rows = target.table.gather(ids)
  slots = target.slots
  slot_rows = {k: v.gather(ids) for k, v in slots.items()}
  new_rows, new_slots = pipeline.new_rows(rows, slot_rows, grads, lr)
  writes = [target.table.scatter_update(ids, new_rows)]
  writes.extend(slots[k].scatter_update(ids, v) for k, v in new_slots.items())
  return tf.group(*writes)


def _every_row(pipeline: Pipeline, target: Target, ids: Any, grads: Any,
               lr: Any, rows: Any) -> Any:
  """Non-lazy Adam on a whole table or partition: the touched rows are
  clipped and decayed as in steps 4-5, then every row moves, untouched ones
  with a zero gradient."""
  if rows is None:
    rows = target.table.gather(ids)
  full = target.table.read_all()
  full_slots = {k: v.read_all() for k, v in target.slots.items()}
  index = tf.expand_dims(ids, 1)
  rows, grads = pipeline.clip_and_decay(rows, grads, lr)
  full = tf.tensor_scatter_nd_update(full, index, rows)
  full_grads = tf.scatter_nd(index, grads, tf.shape(full, out_type=tf.int64))
  new_rows, new_slots = pipeline.apply_rule(full, full_slots, full_grads, lr)
  writes = [target.table.assign_all(pipeline.clip_weights(new_rows))]
  writes.extend(target.slots[k].assign_all(v) for k, v in new_slots.items())
  return tf.group(*writes)


def _locked(run: "Run") -> "Run":
  """`run` under the partition's lock when the target names one (an update
  on a partition's own task: concurrent updates of the same rows, in
  asynchronous training, all count)."""

  def locked(pipeline: Pipeline, target: Target, ids: Any, grads: Any,
             lr: Any, rows: Any) -> Any:
    if target.lock_name is None:
      return run(pipeline, target, ids, grads, lr, rows)
    mutex = tf.raw_ops.MutexV2(shared_name=target.lock_name,
                               name="update_lock")
    lock = tf.raw_ops.MutexLock(mutex=mutex)
    with tf.control_dependencies([lock]):
      update = run(pipeline, target, ids, grads, lr, rows)
    with tf.control_dependencies([update]):
      return tf.raw_ops.ConsumeMutexLock(mutex_lock=lock)

  return locked


# (pipeline, target, distinct ids, their gradient sums, learning rate, the
# touched rows as looked up this step or None) -> the update op.
Run = Callable[[Pipeline, Target, Any, Any, Any, Any], Any]

# The executors by name; `choose` says which one a table's plan records.
EXECUTORS: Dict[str, Run] = {
    "compiled": _compiled,
    # TF's kernel locks the variables itself.
    "fused": _fused,
    "every_row": _locked(_every_row),
    "rows": _locked(_touched_rows),
}


def choose(pipeline: Pipeline, *, compiled: bool, locked: bool) -> str:
  """The name of the executor for `pipeline`, the first that applies:
  `compiled` where the pipeline has a compiled row update and the table's
  partitions can run it (`compiled`); `fused` on a partition updated on its
  own task (`locked`) where TF has a kernel for the rule alone;
  `every_row` for a rule that moves every row; else `rows`."""
  if pipeline.compiled is not None and compiled:
    return "compiled"
  if pipeline.fused is not None and locked:
    return "fused"
  if pipeline.every_row:
    return "every_row"
  return "rows"


def update(executor: str, pipeline: Pipeline, target: Target, ids: Any,
           grads: Any, lr: Any, rows: Any = None) -> Any:
  """The op that applies `pipeline` to `target` for the distinct `ids`, by
  the executor named `executor` (a table plan's). `rows`: the touched rows
  as looked up in this step, when nothing can have changed them since."""
  return EXECUTORS[executor](pipeline, target, ids, grads, lr, rows)
