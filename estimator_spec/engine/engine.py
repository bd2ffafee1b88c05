"""The host embedding engine: TPU embedding semantics as a CPU/GPU graph.

One engine serves one `EmbeddingConfig`. Per step:

  result = engine.lookup(features)            # activations per feature
  ... the dense model computes d loss / d activation ...
  train_op = engine.apply_gradients(result, gradients, global_step)

`lookup` de-duplicates the ids of all features sharing a table and gathers
each table once. `apply_gradients` runs docs/numerics.md, 'The backward pass,
table by table' for every table: gradient multiplier, combiner backward, float32
accumulation per id across examples and features, gradient clipping (with
`clipping_limit`), decoupled weight decay, the optimizer on touched rows only
(non-lazy Adam: every row), weight clipping. Every input and gradient check runs
before the first write, so a failed step changes no table and no slot.

`HostEmbeddingEngine` is the front of the engine's rooms (docs/architecture.md,
'The engine'): the state (`state.py`: the variables, read through one narrow
API), the plans (`plan.py`: how each table's step runs, decided once when its
variables are made), the forward pass (`lookup.py`), the backward pass
(`backward.py`), the updates now or held for pipelining (`updates.py`), and
the partitions that live on other tasks (`remote.py`: a cluster's ps tasks,
given by `shard_device_fn`). `table_gradients` is the first half of
`apply_gradients` alone: a synchronous cluster step sends it to the chief,
which calls `update_partition_contributions` with every task's sums.
"""
import collections
from typing import Any, Dict, List, Mapping, Optional, Tuple

import tensorflow as tf

from tpu_embedding_columns import checks

from estimator_spec.config import model as model_lib
from estimator_spec.config import modes
from estimator_spec.config import sharding
from estimator_spec.config import spec as spec_lib
from estimator_spec.engine import backward
from estimator_spec.engine import inputs as inputs_lib
from estimator_spec.engine import kernels
from estimator_spec.engine import lookup as lookup_lib
from estimator_spec.engine import pipeline as pipeline_lib
from estimator_spec.engine import plan as plan_lib
from estimator_spec.engine import remote
from estimator_spec.engine import state as state_lib
from estimator_spec.engine import storage
from estimator_spec.engine import updates as updates_lib
from estimator_spec.tensor_types import Op, Tensor, Variable

# The names other layers use from this module.
LookupResult = lookup_lib.LookupResult
LookupStep = lookup_lib.LookupStep
TableLookup = lookup_lib.TableLookup
StepGradients = backward.StepGradients
SlotSupplier = state_lib.SlotSupplier
device_scope = storage.device_scope


def _spec_and_mode(config: Any, spec: Any,
                   mode: Optional[str]) -> Tuple[Any, Optional[str]]:
  """(spec, mode) of the engine: `config`'s, or `spec` and `mode` checked."""
  owner = "HostEmbeddingEngine"
  if config is not None:
    if spec is not None or mode is not None:
      raise ValueError(
          f"{owner}: give an EmbeddingConfig, or `spec` and `mode`; not "
          "both.")
    return config.spec, config.mode
  model = spec_lib.model_of(owner, spec)
  if mode not in modes.MODES:
    checks.fail(owner, "mode",
                "must be tf.estimator.ModeKeys.TRAIN, EVAL or PREDICT", mode)
  if mode == modes.TRAIN:
    missing = [name for name in model.tables
               if model.optimizer_for(name) is None]
    if missing:
      raise ValueError(
          f"{owner}: training needs an optimizer for every table; tables "
          f"{missing} have none.")
  return spec, mode


class HostEmbeddingEngine:
  """Tables, lookups and sparse optimizer updates of a config model in a
  mode.

  Args:
    config: an `estimator_spec.EmbeddingConfig`: the engine takes its spec
      and mode (its batch size and topology are not used); or None, with
      `spec` and `mode`.
    spec: an `EmbeddingConfigSpec` (its config model, and the columns that
      turn raw inputs into ids), with `mode`, instead of `config`.
    mode: `tf.estimator.ModeKeys.TRAIN` ('train'), `EVAL` ('eval') or
      `PREDICT` ('infer'), with `spec`: whether slot variables exist and
      updates are possible (training needs an optimizer for every table).
    variable_names: optional {table name: variable name}; default: each
      table's `embedding_var_name`. Slots are named `<variable>/<suffix>`.
    num_shards: partitions per table (1 on one machine; parameter-server
      tasks in a cluster). Defaults to 1.
    shard_device_fn: optional callable (table name, partition index) ->
      device string; with it, the partitions live on other tasks (a
      cluster's ps tasks) and updates run per partition there (see
      `update_partition`).
    local_device: the device of this task's own state (updates held by
      pipelining); None: the default device.
    same_batch_size: True (the TPU estimator's rule): every feature of a
      step has the same batch size, checked. False: each feature has its
      own (TF2's TPUEmbedding takes features of different shapes); each
      activation then has its feature's own batch.
  """

  def __init__(self, config: Any = None, *, spec: Any = None,
               mode: Optional[str] = None,
               variable_names: Optional[Dict[str, str]] = None,
               num_shards: int = 1, shard_device_fn: Any = None,
               local_device: Optional[str] = None,
               same_batch_size: bool = True) -> None:
    # The `EmbeddingConfig` given, else None (the engine reads `spec`,
    # `model` and `mode`, never the topology).
    self.config = config
    self.spec, self.mode = _spec_and_mode(config, spec, mode)
    self.model = self.spec.model
    names = dict(variable_names or {})
    unknown = sorted(set(names) - set(self.model.tables))
    if unknown:
      raise ValueError(
          f"HostEmbeddingEngine: `variable_names` names unknown tables "
          f"{unknown}; tables are {list(self.model.tables)}.")
    if num_shards < 1:
      raise ValueError(
          f"HostEmbeddingEngine: `num_shards` must be >= 1; got {num_shards}.")
    self.shard_device_fn = shard_device_fn
    self.local_device = local_device
    self.same_batch_size = bool(same_batch_size)
    self._state = state_lib.EngineState(
        self.model,
        collections.OrderedDict(
            (t, names.get(t, table.embedding_var_name))
            for t, table in self.model.tables.items()),
        self.optimizer_for, num_shards, shard_device_fn)
    self._plans: Dict[str, plan_lib.TablePlan] = {}
    self._step_plan: Optional[plan_lib.StepPlan] = None
    self._updates = updates_lib.Updates(self.model, self._state, self,
                                        local_device)

  @property
  def is_training(self) -> bool:
    """Whether the engine trains (mode TRAIN): slots exist, updates run."""
    return self.mode == modes.TRAIN

  def optimizer_for(self, table_name: str) -> Any:
    """The optimizer that trains table `table_name` in this mode (the
    config model's); None when not training."""
    return self.model.optimizer_for(table_name) if self.is_training else None

  @property
  def variable_names(self) -> Dict[str, str]:
    """{table name: the name of its variable} (slots: `<variable>/<suffix>`)."""
    return self._state.variable_names

  @property
  def num_shards(self) -> int:
    """Partitions per table."""
    return self._state.num_shards

  # --- plans ----------------------------------------------------------------

  @property
  def step_plan(self) -> plan_lib.StepPlan:
    """What holds for every table (`plan.StepPlan`), decided on first use."""
    if self._step_plan is None:
      self._step_plan = plan_lib.StepPlan.of(
          self.is_training, self.shard_device_fn is not None,
          self.model.pipeline_execution_with_tensor_core)
    return self._step_plan

  def table_plan(self, table_name: str) -> plan_lib.TablePlan:
    """How table `table_name`'s step runs (`plan.TablePlan`), decided when
    its variables were made."""
    self._state.table_rows(table_name)  # Its variables must exist.
    return self._plans[table_name]

  def update_pipeline(self, name: str) -> pipeline_lib.UpdatePipeline:
    """The `UpdatePipeline` of table `name` (docs/numerics.md, 'The backward
    pass, table by table'): its plan's, in training."""
    pipeline = self.table_plan(name).pipeline
    if pipeline is None:
      raise RuntimeError(
          f"HostEmbeddingEngine: table {name!r} is not trained in mode "
          f"{self.mode!r}; it has no update pipeline.")
    return pipeline

  # --- variables -------------------------------------------------------------

  def set_variable_name(self, table_name: str, variable_name: str) -> None:
    """Names a table's variable before it exists (columns register the name
    their plain CPU lookup would use, so checkpoints match TF's CPU path).
    Once the variable exists, later names are ignored."""
    self._state.set_variable_name(table_name, variable_name)

  def supply_slot_variables(self, table_name: str,
                            supplier: state_lib.SlotSupplier) -> None:
    """Has the slots of table `table_name` live in variables made by
    `supplier` instead of new ones; before the table's variables exist.

    When the table is created, `supplier(table, slot_specs)` is called once
    with its `PartitionedRows` and its optimizer's `SlotSpec`s, and returns
    {spec.name: a tf.Variable, or a list of one per partition}: float32,
    shaped as the table's partitions. Training reads and writes those
    variables; `slot_rows` and `variables()` give them.
    """
    self._state.supply_slots(table_name, supplier)

  def create_variables(self) -> None:
    """Creates every table's (and, when training, slot) variables once."""
    for name in self.model.tables:
      self._table_variables(name)

  def _table_variables(self, name: str) -> storage.PartitionedRows:
    """The variables of one table, made on first use with its plan."""
    if self._state.has_variables(name):
      return self._state.table_rows(name)
    # The pipeline first: an optimizer the engine cannot run is refused
    # before any variable exists.
    pipeline = (pipeline_lib.UpdatePipeline.of(self.model, name)
                if self.is_training else None)
    # Initialized by the kernels where this task's own step runs them.
    rows = self._state.create(name,
                              compiled=self.step_plan.compiles_partitions)
    self._plans[name] = plan_lib.TablePlan.of(self.step_plan, name, pipeline,
                                              rows)
    return rows

  def create_pipeline_variables(self) -> None:
    """With pipelining in training, creates the variables that hold one
    step's update of each table now (they are otherwise created by the
    first `apply_gradients`): TF2 code calls this outside `tf.function`,
    which cannot create variables on later traces."""
    self.create_variables()
    if self.step_plan.held:
      for name in self.model.tables:
        self._updates.held(name)

  def variables(self) -> List[Variable]:
    """All partition variables (tables then slots), for savers and tests."""
    self.create_variables()
    return self._state.variables()

  def share_on_read(self) -> Optional[Op]:
    """An op for a checkpoint's save to run before it reads the variables
    made so far: whole reads then share their buffers instead of copying
    them (kernels.share_on_read). None where this task's own step does not
    run the kernels (they are not loaded here, or the partitions live on
    other tasks) or no variable exists yet."""
    variables = self._state.variables()
    if not self.step_plan.compiles_partitions or not variables:
      return None
    with tf.control_dependencies(None), tf.name_scope("share_on_read"):
      return kernels.share_on_read([v.handle for v in variables])

  # --- state: the narrow API of the tables and slots (`state.TableState`) ----

  def has_variables(self, table_name: str) -> bool:
    """Whether the variables of table `table_name` exist (they are made by
    `create_variables` or the first lookup of the table)."""
    return self._state.has_variables(table_name)

  def created_tables(self) -> List[str]:
    """The names of the tables whose variables exist, in the order they
    were created."""
    return self._state.created_tables()

  def table_rows(self, table_name: str) -> storage.PartitionedRows:
    """The `PartitionedRows` of table `table_name` (its partition variables,
    layout and routed access); its variables must exist."""
    return self._state.table_rows(table_name)

  def slot_rows(self, table_name: str) -> Dict[str, storage.PartitionedRows]:
    """{slot name (`SlotSpec.name`): `PartitionedRows`} of table
    `table_name`'s slots, in the optimizer's order (empty when the table
    has no slots); its variables must exist."""
    return self._state.slot_rows(table_name)

  def table_partitions(self, table_name: str) -> List[Variable]:
    """The partition variables of table `table_name`, in partition order
    (one per partition of `table_layout`)."""
    return self._state.table_partitions(table_name)

  def slot_partitions(self, table_name: str,
                      slot_name: str) -> List[Variable]:
    """The partition variables of slot `slot_name` (`SlotSpec.name`) of
    table `table_name`, in partition order."""
    return self._state.slot_partitions(table_name, slot_name)

  def table_layout(self, table_name: str) -> sharding.ShardLayout:
    """The `ShardLayout` of table `table_name` (and of its slots)."""
    return self._state.table_layout(table_name)

  def split_by_partition(self, table_name: str, ids: Tensor,
                         values: Tensor) -> List[Tuple[Tensor, Tensor]]:
    """[(local ids, values)] per partition of table `table_name`: global
    `ids` and their `values` routed to the partitions holding them
    (`ShardLayout.route`)."""
    return self._state.split_by_partition(table_name, ids, values)

  # --- forward ---------------------------------------------------------------

  def lookup(self, features: Dict[str, Any]) -> lookup_lib.LookupResult:
    """Looks up every feature of the config in `features` (a dict).

    Returns a `LookupResult` whose `activations` map each feature to
    [batch, dimension] or, for sequence features, [batch, L, dimension]
    (static L and dimension); `sequence_lengths` map sequence features to
    min(length, L).
    """
    return self.begin_lookup(features).result()

  def begin_lookup(self, features: Dict[str, Any]) -> lookup_lib.LookupStep:
    """Parses and checks every feature now; gathers each table on demand.

    Returns a `LookupStep`: `activation(feature)` looks up the feature's
    table (creating its variables, under the name registered so far) the
    first time one of its features is asked for; `result()` looks up the
    rest and returns the `LookupResult`. `LookupStep.add_checks` adds
    checks that gate the lookups and every write of the step like the
    engine's own input checks.
    """
    if not isinstance(features, dict):
      raise TypeError(
          "HostEmbeddingEngine.lookup: `features` must be a dict; got "
          f"{type(features).__name__}.")
    step = self.step_plan
    # The ids are checked and their negative ones dropped by compiled ops
    # where this task compiles its ops, else by TF ops.
    parsed = inputs_lib.parse_features(
        self.model, self.spec, features,
        compiled_ops=kernels if step.compiles_here else None)
    requests = (self._step_requests if step.packs_requests else None)
    if not self.same_batch_size:
      return lookup_lib.LookupStep(self.model, self._lookup_table, requests,
                                   parsed, [], None)
    batch_size, input_checks = inputs_lib.check_batch_sizes(parsed)
    return lookup_lib.LookupStep(self.model, self._lookup_table, requests,
                                 parsed, input_checks, batch_size)

  def _step_requests(self, parsed: Mapping[str, inputs_lib.FeatureIds]
                     ) -> remote.Requests:
    return remote.step_requests(self.model, self._state, self.step_plan,
                                parsed)

  def _lookup_table(self, table: model_lib.Table,
                    items: List[inputs_lib.FeatureIds],
                    requests: Optional[remote.Requests]
                    ) -> lookup_lib.TableLookup:
    rows = self._table_variables(table.name)
    if requests is not None:
      return remote.requested_lookup(table, items, requests, self._state,
                                     self.step_plan)
    return lookup_lib.local_lookup(table, items, rows,
                                   self._plans[table.name])

  # --- backward and update ---------------------------------------------------

  def apply_gradients(self, result: lookup_lib.LookupResult,
                      gradients: Mapping[str, Any], global_step: Any) -> Op:
    """Returns the op that trains every table from activation gradients.

    In a graph (or a `tf.function`) the op runs the update; eagerly the
    update has run when this returns (None), every check first: a failed
    check raises before any table or slot is written.

    Args:
      result: the `LookupResult` of this step's `lookup`.
      gradients: {feature: d loss / d activation}, shaped like activations.
      global_step: the global step at the start of this step (learning-rate
        functions and the gradient multiplier are evaluated on it).
    """
    step = self.table_gradients(result, gradients, global_step)
    return self._updates.apply(result, step)

  def table_gradients(self, result: lookup_lib.LookupResult,
                      gradients: Mapping[str, Any],
                      global_step: Any) -> backward.StepGradients:
    """docs/numerics.md, 'The backward pass, table by table' for every table:
    the step's `StepGradients` (distinct ids, their float32 gradient sums after
    the multiplier, the learning rate at `global_step`, and the gate of every
    check)."""
    if not self.is_training:
      raise RuntimeError(
          "HostEmbeddingEngine.apply_gradients: the EmbeddingConfig is in "
          f"mode {self.mode!r}; only TRAIN updates tables.")
    return backward.table_gradients(
        self.model, result, gradients, global_step, self.update_pipeline,
        self.step_plan.compiles_here)

  def flush(self) -> Op:
    """Applies the update held by pipelining (a no-op without pipelining)."""
    self.create_variables()
    return self._updates.flush()

  def update_partition_contributions(self, name: str, partition: int,
                                     ids: Tensor, grads: Tensor, lr: Tensor,
                                     scale: Any = 1.0) -> Op:
    """The update of partition `partition` of table `name` from contributions
    that may repeat ids (several tasks' `ids` [N] local ids and `grads`
    [N, D] float32, concatenated): sums them per distinct id, times `scale`,
    then applies the sum (docs/numerics.md, 'The backward pass, table by
    table'), held for a step when pipelining. Returns the op."""
    return self._updates.partition_contributions(name, partition, ids, grads,
                                                 lr, scale)

  def pipelined_partition_update(self, name: str, partition: int,
                                 local_ids: Tensor, grads: Tensor,
                                 lr: Tensor) -> Op:
    """Pipelining for an update given per partition (a synchronous cluster
    step): applies the update held for (table, partition), then holds this
    one, both on the partition's device."""
    return self._updates.held_partition_update(name, partition, local_ids,
                                               grads, lr)

  def update_partition(self, name: str, partition: int, local_ids: Tensor,
                       grads: Tensor, lr: Tensor) -> Op:
    """docs/numerics.md, 'The backward pass, table by table' and 'Each
    optimizer on a touched row' on partition `partition` of table `name`,
    which lives on another task (`shard_device_fn`), on that task (see
    `remote.update_partition`)."""
    return self._updates.update_partition(name, partition, local_ids, grads,
                                          lr)
