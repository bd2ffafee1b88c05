"""model_fn's optimizer updates in a synchronous step: recorded while
model_fn runs (`tf_patches.apply_gradients`), built once the step's
gradients are averaged; and what a synchronous step refuses of model_fn.
"""
import contextlib
from typing import (Callable, Iterable, Iterator, Mapping, NamedTuple,
                    Optional, Sequence)

import tensorflow as tf

from estimator_spec.cluster import tasks
from estimator_spec.cluster.sync import entries
from estimator_spec.tensor_types import Op, Tensor, Variable
from estimator_spec.tf_patches import apply_gradients as apply_gradients_patch
from estimator_spec.tf_patches import control_inputs

SUM_REDUCTION_REFUSED = (
    "TPUEstimator: CrossShardOptimizer(reduction=SUM) in synchronous "
    "training on a cluster: the training tasks' gradients are averaged (the "
    "MEAN reduction, CrossShardOptimizer's default); summing them is not "
    "supported. Use the default reduction (and scale the learning rate if "
    "you relied on the sum).")


# (gradient or None, variable) pairs, as `apply_gradients` takes them.
_GradsAndVars = Sequence[tuple[Optional[Tensor], Variable]]
# `tf.compat.v1.train.Optimizer.apply_gradients` as the class has it:
# (optimizer, grads_and_vars, global_step, name) -> the update.
_ApplyGradients = Callable[
    [tf.compat.v1.train.Optimizer, _GradsAndVars, Optional[Variable],
     Optional[str]], Op]


class _Call(NamedTuple):
  """One call of `Optimizer.apply_gradients` made by model_fn (`scope`: the
  name scope it was made in)."""
  optimizer: tf.compat.v1.train.Optimizer
  grads_and_vars: tuple[tuple[Optional[Tensor], Variable], ...]
  global_step: Optional[Variable]
  name: Optional[str]
  op: Op
  scope: str

  def apply(self, original: _ApplyGradients,
            grads_and_vars: _GradsAndVars) -> Op:
    """The optimizer's own update with `grads_and_vars`, built in the name
    scope of the call (non-slot variables such as Adam's `beta1_power` are
    named by it, as in one process)."""
    with tf.compat.v1.name_scope(self.scope + "/" if self.scope else None):
      return original(self.optimizer, grads_and_vars, self.global_step,
                      self.name)


class Recorder:
  """The `apply_gradients` calls of one model_fn call, and the variables
  of this task only (never sent, applied by the chief as model_fn's
  optimizer gives them).

  Args:
    cluster: the `tasks.Cluster` (the updates are built under ps 0).
  """

  def __init__(self, cluster: tasks.Cluster) -> None:
    self._cluster = cluster
    self._local: set[int] = set()  # id() of each local variable
    self._calls: list[_Call] = []
    self._original_apply: Optional[_ApplyGradients] = None

  def add_local_variables(self, variables: Iterable[Variable]) -> None:
    """Variables of this task only (never sent)."""
    self._local.update(id(v) for v in variables)

  @contextlib.contextmanager
  def recording(self) -> Iterator[None]:
    """Inside: model_fn's `apply_gradients` calls are recorded, not run
    (`tf_patches.apply_gradients`)."""
    calls = self._calls

    def apply_gradients(optimizer: tf.compat.v1.train.Optimizer,
                        grads_and_vars: Iterable[tuple[Optional[Tensor],
                                                       Variable]],
                        global_step: Optional[Variable] = None,
                        name: Optional[str] = None) -> Op:
      grads_and_vars = tuple(grads_and_vars)
      scope = tf.compat.v1.get_default_graph().get_name_scope()
      op = tf.no_op(name="synchronous_apply_gradients")
      calls.append(_Call(optimizer, grads_and_vars, global_step, name, op,
                         scope))
      return op

    graph = tf.compat.v1.get_default_graph()
    first = len(graph.get_operations())
    with apply_gradients_patch.replaced(apply_gradients) as original:
      self._original_apply = original
      yield
    _refuse_own_step_increments(graph.get_operations()[first:])

  def check_called(self) -> None:
    """Refuses a model_fn that applied no gradients through a
    tf.compat.v1.train optimizer: there is nothing to average."""
    if not self._calls:
      raise ValueError(
          "TPUEstimator: synchronous training on a cluster averages the dense "
          "gradients where model_fn's optimizer applies them, but model_fn "
          "did not call `apply_gradients` (or `minimize`) of a "
          "tf.compat.v1.train optimizer. Train the dense model with one "
          "(wrapping it in tf.compat.v1.tpu.CrossShardOptimizer is fine), or "
          "pass cluster_training=estimator_spec.ClusterTraining("
          "asynchronous=True).")

  def dense_entries(self) -> list[entries.DenseEntry]:
    """[(call index, position, variable, gradient, ps index)] of every
    gradient model_fn's optimizer would apply to a shared variable."""
    dense: list[entries.DenseEntry] = []
    for c, call in enumerate(self._calls):
      for position, (grad, var) in enumerate(call.grads_and_vars):
        if grad is None or id(var) in self._local:
          continue
        dense.append((c, position, var, grad, _ps_of_variable(var)))
    return dense

  def apply_dense(self, averaged: Mapping[tuple[int, int], Tensor]
                  ) -> list[Op]:
    """model_fn's optimizer updates with the `averaged` gradients of the
    shared variables ({(call, position): gradient}) and this task's own of
    its local ones. They run beside the table updates: the step's replies
    wait for both."""
    applied = []
    for c, call in enumerate(self._calls):
      grads_and_vars = [
          (averaged[(c, k)] if (c, k) in averaged else grad, var)
          for k, (grad, var) in enumerate(call.grads_and_vars)
          if (c, k) in averaged or (grad is not None and
                                   id(var) in self._local)
      ]
      applied.append(self._update(call, grads_and_vars))
    return applied

  def build_unrun_updates(self) -> None:
    """A worker builds (never runs) the updates too, so that it creates the
    optimizer's slot variables as the chief does: a replica device setter
    places variables round-robin in creation order, so every task's graph
    must create the same variables in the same order."""
    for call in self._calls:
      self._update(call, call.grads_and_vars)

  def hold_until(self, done: Op) -> None:
    """Makes the ops model_fn's `apply_gradients` calls returned wait for
    `done`, the step's op: model_fn's train op holds these stand-ins,
    built before `done`."""
    for call in self._calls:
      control_inputs.add_control_input(call.op, done)

  def _update(self, call: _Call, grads_and_vars: _GradsAndVars) -> Op:
    """model_fn's optimizer update of `call` with `grads_and_vars`, built
    under ps 0's device (the same on every task, so that every task's graph
    places the optimizer's variables alike): the op that joins its
    per-device updates then runs on ps 0, beside the global step it
    advances and the replies that wait for it, not on this task."""
    # Set when the recording starts, before any call is recorded.
    assert self._original_apply is not None
    with tf.compat.v1.device(self._cluster.ps_device(0)):
      return call.apply(self._original_apply, grads_and_vars)


def _ps_of_variable(variable: Variable) -> int:
  """The ps task of a dense variable: its device, which Estimator's replica
  device setter chose (the placement decides table partitions only)."""
  spec = tf.DeviceSpec.from_string(variable.device or "")
  if spec.job == "ps" and spec.task is not None:
    return int(spec.task)
  return 0


def _refuse_own_step_increments(ops: Sequence[Op]) -> None:
  """In a synchronous step only the chief's update advances the global step
  (through the optimizer's `global_step` argument); model_fn writing it
  itself would advance it once per task."""
  step = tf.compat.v1.train.get_global_step()
  if step is None:
    return
  handle = (step.handle if hasattr(step, "handle") else step.op.outputs[0])
  writes = [
      op.name for op in ops
      if op.type in ("AssignAddVariableOp", "AssignVariableOp", "AssignAdd",
                     "Assign") and op.inputs and op.inputs[0].name == handle.name
  ]
  if writes:
    raise ValueError(
        "TPUEstimator: model_fn writes the global step itself (ops "
        f"{writes}); in synchronous training on a cluster every task runs "
        "model_fn's train op, so the step would advance once per task. Pass "
        "it to the optimizer instead (`minimize(loss, global_step=...)`), "
        "which advances it once per synchronous step, or use "
        "ClusterTraining(asynchronous=True).")
