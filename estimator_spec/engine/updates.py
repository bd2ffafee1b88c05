"""The update: each table's touched rows written, now or held one step.

docs/numerics.md, 'The backward pass, table by table' (steps 4 to 7) and
'Each optimizer on a touched row', by the executor each table's plan
records (`plan.TablePlan`, `executors.py`): on the whole table in this
process, or per partition on the task holding it (`remote.py`). With
pipelining (docs/numerics.md, 'Pipelining') the update of step N is held
and applied during step N+1 after that step's lookups; `flush` applies a
held update (before a checkpoint, at the end).
"""
import collections
from typing import Any, Dict, List, Optional, Tuple, Union

import tensorflow as tf

from estimator_spec.config import model as model_lib
from estimator_spec.engine import backward
from estimator_spec.engine import executors
from estimator_spec.engine import lookup as lookup_lib
from estimator_spec.engine import plan as plan_lib
from estimator_spec.engine import remote
from estimator_spec.engine import state as state_lib
from estimator_spec.engine import storage
from estimator_spec.tensor_types import Op, Tensor

# A held update's key: a table name (global ids, held on this task) or
# (table name, partition) (local ids, held on the partition's device).
HeldKey = Union[str, Tuple[str, int]]


class Updates:
  """The updates of an engine's tables (see the module docstring).

  Args:
    model: the `EmbeddingModel`.
    state: the tables and slots (`state.EngineState`).
    plans: the plans (`plan.PlanReader`).
    local_device: the device of this task's held updates, or None.
  """

  def __init__(self, model: model_lib.EmbeddingModel,
               state: state_lib.EngineState, plans: plan_lib.PlanReader,
               local_device: Optional[str]) -> None:
    self._model = model
    self._state = state
    self._plans = plans
    self._local_device = local_device
    self._held: Dict[HeldKey, HeldUpdate] = collections.OrderedDict()

  def apply(self, result: lookup_lib.LookupResult,
            step: backward.StepGradients) -> Op:
    """The update of a step's `StepGradients` (see
    `HostEmbeddingEngine.apply_gradients`)."""
    held = self._plans.step_plan.held
    if not held and step.requests is not None:
      return remote.requested_update(self._state, self._plans, step)
    with tf.control_dependencies([step.gate]):
      if not held:
        updates = []
        for name, lookup in result.tables.items():
          # Rows written in place (the compiled updates) are written after
          # this step's lookup read them.
          with tf.control_dependencies([lookup.rows]):
            updates.append(self.update_table(
                name, step.ids[name], step.grads[name], step.rates[name],
                rows=lookup.rows))
        return tf.group(*updates, name="embedding_update")
      # Pipelining: apply the held update of the previous step now that this
      # step's lookups are done, then hold this step's update.
      with tf.control_dependencies(
          [lookup.rows for lookup in result.tables.values()]):
        applied = [self.apply_held(name) for name in result.tables]
      with tf.control_dependencies(applied):
        holds = [
            self.held(name).hold(step.ids[name], step.grads[name],
                                 step.rates[name])
            for name in result.tables
        ]
      return tf.group(*holds, name="embedding_update_pipelined")

  def update_table(self, name: str, ids: Tensor, grads: Tensor, lr: Tensor,
                   rows: Optional[Tensor] = None) -> Op:
    """The update of table `name` for its distinct global `ids`. `rows`:
    the rows as looked up in this step, when nothing can have changed them
    since (one process, no pipelining)."""
    plan = self._plans.table_plan(name)
    table = self._state.table_rows(name)
    if plan.where == plan_lib.REMOTE:
      return tf.group(*[
          remote.update_partition(self._state, plan, p, local, part_grads,
                                  lr)
          for p, (local, part_grads) in enumerate(table.split(ids, grads))
      ])
    assert plan.pipeline is not None and plan.executor is not None
    target = executors.Target(table, self._state.slot_rows(name))
    return executors.update(plan.executor, plan.pipeline, target, ids, grads,
                            lr, rows)

  def update_partition(self, name: str, partition: int, local_ids: Tensor,
                       grads: Tensor, lr: Tensor) -> Op:
    """The update of one partition of table `name` on its own task."""
    return remote.update_partition(self._state, self._plans.table_plan(name),
                                   partition, local_ids, grads, lr)

  # --- held updates (pipelining) ---------------------------------------------

  def held(self, key: HeldKey) -> "HeldUpdate":
    """The held update of `key` (see `HeldKey`), made on first use."""
    if key not in self._held:
      name = key if isinstance(key, str) else key[0]
      suffix = "" if isinstance(key, str) else f"/part_{key[1]}"
      device = (self._local_device if isinstance(key, str) else
                self._state.partition_device(*key))
      with tf.control_dependencies(None), storage.device_scope(device):
        self._held[key] = HeldUpdate(
            self._state.variable_names[name] + suffix,
            self._model.tables[name].dimension)
    return self._held[key]

  def apply_held(self, key: HeldKey) -> Tensor:
    """Applies the update held for `key`, if one is; a bool tensor."""
    pending = self.held(key)
    ids, grads, lr, valid = pending.read()

    def apply() -> Tensor:
      if isinstance(key, str):
        update = self.update_table(key, ids, grads, lr)
      else:
        update = self.update_partition(key[0], key[1], ids, grads, lr)
      with tf.control_dependencies([update]):
        with tf.control_dependencies([pending.clear()]):
          return tf.constant(True)

    return tf.cond(valid, apply, lambda: tf.constant(False))

  def flush(self) -> Op:
    """Applies every held update (a no-op without one)."""
    if not self._held:
      return tf.no_op(name="embedding_flush")
    return tf.group(*[self.apply_held(key) for key in list(self._held)],
                    name="embedding_flush")

  def partition_contributions(self, name: str, partition: int, ids: Tensor,
                              grads: Tensor, lr: Tensor,
                              scale: Any = 1.0) -> Op:
    """See `HostEmbeddingEngine.update_partition_contributions`."""
    unique, index = tf.unique(ids)
    summed = tf.math.unsorted_segment_sum(
        grads, index, tf.shape(unique)[0]) * scale
    summed = tf.ensure_shape(summed,
                             [None, self._model.tables[name].dimension])
    if self._plans.step_plan.held:
      return self.held_partition_update(name, partition, unique, summed, lr)
    return self.update_partition(name, partition, unique, summed, lr)

  def held_partition_update(self, name: str, partition: int,
                            local_ids: Tensor, grads: Tensor,
                            lr: Tensor) -> Op:
    """Pipelining for an update given per partition: applies the update
    held for (table, partition), then holds this one, both on the
    partition's device."""
    applied = self.apply_held((name, partition))
    with tf.control_dependencies([applied]), storage.device_scope(
        self._state.partition_device(name, partition)):
      return self.held((name, partition)).hold(local_ids, grads, lr)


class HeldUpdate:
  """The update of one table held for one step (pipelining)."""

  def __init__(self, var_name: str, dimension: int) -> None:
    # Declared shapes must be [None] / [None, D]: an assign would otherwise
    # pin the static shape of the assigned tensors to the initial [0].
    self.ids = _local_variable(f"{var_name}/pipelined_ids",
                               tf.zeros([0], tf.int64), [None])
    self.grads = _local_variable(f"{var_name}/pipelined_gradients",
                                 tf.zeros([0, dimension], tf.float32),
                                 [None, dimension])
    self.learning_rate = _local_variable(
        f"{var_name}/pipelined_learning_rate", tf.constant(0.0), [])
    self.valid = _local_variable(f"{var_name}/pipelined_valid",
                                 tf.constant(False), [])
    self.dimension = dimension

  def read(self) -> Tuple[Any, Any, Any, Any]:
    return (self.ids.read_value(), self.grads.read_value(),
            self.learning_rate.read_value(), self.valid.read_value())

  def hold(self, ids: Any, grads: Any, learning_rate: Any) -> Any:
    return tf.group(
        self.ids.assign(ids, read_value=False),
        self.grads.assign(grads, read_value=False),
        self.learning_rate.assign(learning_rate, read_value=False),
        self.valid.assign(True, read_value=False))

  def clear(self) -> Any:
    return self.valid.assign(False, read_value=False)


def _local_variable(name: str, initial_value: Any,
                    shape: List[Optional[int]]) -> Any:
  with tf.compat.v1.name_scope(None):
    return tf.compat.v1.Variable(
        initial_value,
        shape=tf.TensorShape(shape),
        name=name,
        trainable=False,
        use_resource=True,
        collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES])
