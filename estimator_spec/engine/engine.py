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

With `pipeline_execution_with_tensor_core`, the update of step N is held and
applied during step N+1 after that step's lookups (docs/numerics.md,
'Pipelining'); `flush()` applies a held update (before a checkpoint, at the
end).

When the partitions live on other tasks (`shard_device_fn`: a cluster's ps
tasks), each partition is updated on its own task (`update_partition`),
reading its rows and slots at update time under a lock (or inside one of
TF's sparse-apply kernels, which lock the variables), so that concurrent
updates of the same rows from several tasks all count. `table_gradients`
is the first half of `apply_gradients` alone (docs/numerics.md, 'The
backward pass, table by table', steps 1 to 3): a synchronous cluster step
sends it to the chief, which calls `update_partition_contributions` with
every task's sums.
"""
import collections
import contextlib
import functools
import weakref
from typing import (Any, Callable, ContextManager, Dict, Iterable, List,
                    Mapping, Optional, Sequence, Tuple, Union)

import tensorflow as tf

from tpu_embedding_columns import checks
from tpu_embedding_columns import columns
from tpu_embedding_columns import lookup as column_lookup

from estimator_spec.config import model as model_lib
from estimator_spec.config import modes
from estimator_spec.config import optimizers
from estimator_spec.config import sharding
from estimator_spec.config import spec as spec_lib
from estimator_spec.engine import executors
from estimator_spec.engine import inputs as inputs_lib
from estimator_spec.engine import kernels
from estimator_spec.engine import pipeline as pipeline_lib
from estimator_spec.engine import requests as requests_lib
from estimator_spec.engine import storage
from estimator_spec.tf_patches import gradient_gates

# A slot supplier (`HostEmbeddingEngine.supply_slot_variables`): (the table's
# rows, its optimizer's slot specs) -> {slot name: variable or variables}.
SlotSupplier = Callable[
    [storage.PartitionedRows, Sequence[optimizers.SlotSpec]], Any]


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


class TableLookup:
  """What the backward pass of one table needs from its forward pass.

  `rows` is what the forward pass read from the table: the rows of
  `unique_ids` (empty [0, D] where the compiled lookup reads the table
  itself and the update does not need them). Writes of the step wait for
  it. `index` maps every id, in feature order, to its place in
  `unique_ids`; `sizes` [features] counts each feature's ids (None where the
  compiled kernels combine and differentiate: `compiled`).

  `read`, for a table in one partition with the compiled kernels: (the
  partition's resource handle, whether the update needs `rows`). Then one
  op finds the distinct ids and computes the activations when
  `activations()` runs, which sets `unique_ids`, `index`, `rows` and
  `num_ids` (the number of distinct ids)."""

  def __init__(self, table: model_lib.Table, unique_ids: Any, rows: Any,
               features: List[inputs_lib.FeatureIds], plans: Dict[str, Any],
               index: Any, sizes: Any, compiled: bool = False,
               read: Optional[Tuple[Any, bool]] = None) -> None:
    self.table = table
    self.unique_ids = unique_ids
    self.rows = rows
    self.compiled = compiled
    self.features = features      # [FeatureIds]
    self.plans = plans            # {feature: Plan}
    self.index = index
    self.sizes = sizes
    self._read = read
    # The number of distinct ids, where the compiled lookup counts them
    # (else None: the gradient sums take it from `unique_ids`).
    self.num_ids: Any = None
    # The combiners' scales per feature from the compiled combine (an empty
    # tensor for 'sum'), which its gradient sums reuse.
    self.scales: Any = None

  def activations(self) -> Dict[str, Any]:
    """{feature: activation} of every feature of the table, in order."""
    plans = [self.plans[item.name] for item in self.features]
    if not self.compiled:
      parts = ([self.index] if len(plans) == 1 else
               tf.split(self.index, self.sizes, num=len(plans)))
      return {
          item.name: plan.combine(tf.gather(self.rows, part))
          for item, plan, part in zip(self.features, plans, parts)
      }
    checks = [check for plan in plans for check in plan.checks]
    combine = dict(
        segments=[plan.segment for plan in plans],
        weights=kernels.or_empty([plan.weights for plan in plans]),
        num_segments=[plan.num_segments for plan in plans],
        combiners=[plan.combiner for plan in plans])
    with tf.control_dependencies(checks):
      if self._read is None:
        outputs, self.scales = kernels.combine(
            self.rows, self.index, **combine)
      else:
        handle, keep_rows = self._read
        (self.unique_ids, self.index, self.rows, self.num_ids, outputs,
         self.scales) = kernels.lookup(
             handle, [item.flat.ids for item in self.features],
             keep_rows=keep_rows, **combine)
        self.rows.set_shape([None, self.table.dimension])
    result = {}
    for item, plan, out in zip(self.features, plans, outputs):
      if len(plan.output_shape) > 1:
        out = tf.reshape(out, [-1] + plan.output_shape)
      out.set_shape([None] + plan.output_shape)
      result[item.name] = out
    return result


class LookupResult:
  """Activations of one step, and the state its backward pass needs
  (`requests`: the step's `requests.StepRequests` where the partitions live
  on other tasks in training, else None)."""

  def __init__(self, activations: Dict[str, Any],
               sequence_lengths: Dict[str, Any],
               tables: Dict[str, TableLookup], checks: List[Any],
               requests: Any = None) -> None:
    self.activations = activations
    self.sequence_lengths = sequence_lengths
    self.tables = tables
    self.checks = checks
    self.requests = requests

  @property
  def length_features(self) -> Dict[str, Any]:
    """{'<feature>_seq_length_': lengths} for sequence features (the keys
    TF's sequence columns read)."""
    return {columns.sequence_length_key(name): value
            for name, value in self.sequence_lengths.items()}


class LookupStep:
  """The lookups of one step, table by table on demand (see
  `HostEmbeddingEngine.begin_lookup`)."""

  def __init__(self, engine: "HostEmbeddingEngine",
               parsed: Dict[str, inputs_lib.FeatureIds], checks: List[Any],
               batch_size: Any) -> None:
    self._engine = engine
    # int64 scalar tensor; None when features have batch sizes of their own
    # (`HostEmbeddingEngine(same_batch_size=False)`).
    self.batch_size = batch_size
    # The static batch dimension of the activations: the inputs' when they
    # have one; a caller that knows better (a TPU step's fixed batch) sets it
    # before the first lookup. Unused when features have batch sizes of
    # their own: each activation has its feature's.
    self.static_batch_size = next(
        (item.flat.static_batch_size for item in parsed.values()
         if item.flat.static_batch_size is not None), None)
    self._parsed = parsed
    self._checks = checks
    # Every write of the step waits for every input check of every table:
    # the validated ids and weights carry their range/position checks.
    self._validated = [item.flat.ids for item in parsed.values()]
    self._validated += [item.flat.weights for item in parsed.values()
                        if item.flat.weights is not None]
    self.activations: Dict[str, Any] = collections.OrderedDict()
    self.sequence_lengths: Dict[str, Any] = collections.OrderedDict()
    self.tables: Dict[str, TableLookup] = collections.OrderedDict()
    self._gate: Any = None
    # (StepRequests, {table: (unique ids, index)})
    self._requests: Any = None

  @property
  def feature_ids(self) -> List[inputs_lib.FeatureIds]:
    """[inputs.FeatureIds] of the step's features (validated ids)."""
    return list(self._parsed.values())

  def add_checks(self, checks: Iterable[Any]) -> None:
    """More check ops that gate the lookups and every write of the step;
    only before the first table is looked up."""
    if self.tables:
      raise RuntimeError(
          "LookupStep.add_checks: tables were already looked up.")
    self._checks = self._checks + list(checks)
    self._gate = None

  def table(self, name: str) -> TableLookup:
    """Gathers table `name` for all its features (once); returns its
    `TableLookup`."""
    if name not in self.tables:
      model = self._engine.model
      table = model.tables[name]
      if self._gate is None:
        self._gate = column_lookup.gate(self._checks)
      with tf.control_dependencies([self._gate] if self._gate else []):
        lookup = self._engine._lookup_table(
            table, [self._parsed[f] for f in table.features],
            self._step_requests())
        activations = lookup.activations()
        for item in lookup.features:
          activation = activations[item.name]
          static_batch = (self.static_batch_size if self.batch_size is not None
                          else item.flat.static_batch_size)
          activation.set_shape([static_batch] +
                               activation.shape[1:].as_list())
          self.activations[item.name] = activation
          if item.lengths is not None:
            item.lengths.set_shape([static_batch])
            self.sequence_lengths[item.name] = item.lengths
      self.tables[name] = lookup
    return self.tables[name]

  def _step_requests(self) -> Any:
    """(the step's `requests.StepRequests`, {table: (distinct ids, index of
    each id)}), made on the first lookup, where the engine sends one
    request per task holding partitions; else None."""
    if self._requests is None and self._engine.packs_requests:
      self._requests = self._engine._step_requests(self._parsed)
    return self._requests

  def activation(self, feature: str) -> Any:
    """The activation of `feature` ([B, D], or [B, L, D] for sequences)."""
    self.table(self._engine.model.features[feature].table)
    return self.activations[feature]

  def sequence_length(self, feature: str) -> Any:
    """min(length, L) per example of sequence feature `feature`."""
    self.table(self._engine.model.features[feature].table)
    return self.sequence_lengths[feature]

  def result(self) -> LookupResult:
    """Looks up the remaining tables; returns the step's `LookupResult`."""
    for name in self._engine.model.tables:
      self.table(name)
    tables = collections.OrderedDict(
        (name, self.tables[name]) for name in self._engine.model.tables)
    plan_checks = [
        check for lookup in tables.values() for plan in lookup.plans.values()
        for check in plan.checks
    ]
    return LookupResult(self.activations, self.sequence_lengths, tables,
                        self._checks + self._validated + plan_checks,
                        self._requests[0] if self._requests else None)


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
    self.variable_names = collections.OrderedDict(
        (t, names.get(t, table.embedding_var_name))
        for t, table in self.model.tables.items())
    if num_shards < 1:
      raise ValueError(
          f"HostEmbeddingEngine: `num_shards` must be >= 1; got {num_shards}.")
    self.num_shards = num_shards
    self.shard_device_fn = shard_device_fn
    self.local_device = local_device
    self.same_batch_size = bool(same_batch_size)
    # None until the first table's variables are made (`_table_variables`),
    # and read only after; `_pending` stays None without pipelining. The
    # declared types are what they hold once set.
    self.tables: Dict[str, storage.PartitionedRows]
    self.slots: Dict[str, Dict[str, storage.PartitionedRows]]
    self._pending: Dict[Union[str, Tuple[str, int]], _PendingUpdate]
    self.tables = None  # type: ignore[assignment]  # None until created.
    self.slots = None  # type: ignore[assignment]  # None until created.
    self._pending = None  # type: ignore[assignment]  # None until created.
    self._slot_suppliers: Dict[str, SlotSupplier] = {}

  @property
  def is_training(self) -> bool:
    """Whether the engine trains (mode TRAIN): slots exist, updates run."""
    return self.mode == modes.TRAIN

  def optimizer_for(self, table_name: str) -> Any:
    """The optimizer that trains table `table_name` in this mode (the
    config model's); None when not training."""
    return self.model.optimizer_for(table_name) if self.is_training else None

  # --- variables -------------------------------------------------------------

  def set_variable_name(self, table_name: str, variable_name: str) -> None:
    """Names a table's variable before it exists (columns register the name
    their plain CPU lookup would use, so checkpoints match TF's CPU path).
    Once the variable exists, later names are ignored."""
    if table_name not in self.variable_names:
      raise ValueError(
          f"HostEmbeddingEngine: unknown table {table_name!r}; tables are "
          f"{list(self.model.tables)}.")
    if self.tables is not None and table_name in self.tables:
      # A shared table is created once, where it is first used, and reused
      # from other layers and scopes (as TF's shared columns do).
      return
    self.variable_names[table_name] = variable_name

  def supply_slot_variables(self, table_name: str,
                            supplier: SlotSupplier) -> None:
    """Has the slots of table `table_name` live in variables made by
    `supplier` instead of new ones; before the table's variables exist.

    When the table is created, `supplier(table, slot_specs)` is called once
    with its `PartitionedRows` and its optimizer's `SlotSpec`s, and returns
    {spec.name: a tf.Variable, or a list of one per partition}: float32,
    shaped as the table's partitions. Training reads and writes those
    variables; `slots` and `variables()` give them.
    """
    if table_name not in self.model.tables:
      raise ValueError(
          f"HostEmbeddingEngine: unknown table {table_name!r}; tables are "
          f"{list(self.model.tables)}.")
    if self.optimizer_for(table_name) is None:
      raise ValueError(
          f"HostEmbeddingEngine: table {table_name!r} has no slots (it is "
          "not trained in this config's mode).")
    if self.tables is not None and table_name in self.tables:
      raise RuntimeError(
          f"HostEmbeddingEngine: the variables of table {table_name!r} "
          "exist already; supply its slot variables before they are "
          "created.")
    self._slot_suppliers[table_name] = supplier

  def create_variables(self) -> None:
    """Creates every table's (and, when training, slot) variables once."""
    for name in self.model.tables:
      self._table_variables(name)

  def _table_variables(self, name: str) -> storage.PartitionedRows:
    """Creates the variables of one table on first use; returns the table."""
    if self.tables is None:
      self.tables = collections.OrderedDict()
      self.slots = collections.OrderedDict()
      if self.model.pipeline_execution_with_tensor_core and (
          self.is_training):
        self._pending = collections.OrderedDict()
    if name in self.tables:
      return self.tables[name]
    # Variables are created on first use, possibly inside the step's
    # control dependencies; their initializers must not inherit them.
    with tf.control_dependencies(None):
      return self._create_table_variables(name)

  def _create_table_variables(self, name: str) -> storage.PartitionedRows:
    strategy = self.model.partition_strategy
    table = self.model.tables[name]
    var_name = self.variable_names[name]
    device_fn = None
    if self.shard_device_fn is not None:
      device_fn = lambda partition: self.shard_device_fn(name, partition)
    rows = storage.create_table(
        var_name, table.vocabulary_size, table.dimension, table.initializer,
        self.num_shards, strategy, device_fn)
    optimizer = self.optimizer_for(name)
    supplier = self._slot_suppliers.get(name)
    slots = collections.OrderedDict()
    if optimizer is not None and supplier is not None:
      slots.update(self._supplied_slots(name, rows, supplier,
                                        optimizer.slot_specs()))
    elif optimizer is not None:
      for spec in optimizer.slot_specs():
        slots[spec.name] = storage.create_table(
            spec.variable_name(var_name), table.vocabulary_size,
            table.dimension, storage.FillInitializer(spec.initial_value),
            self.num_shards, strategy, device_fn)
    # Recorded only once complete (a supplier that raises leaves the table
    # to be created again).
    self.tables[name] = rows
    self.slots[name] = slots
    return rows

  def _supplied_slots(
      self, name: str, table: storage.PartitionedRows, supplier: SlotSupplier,
      specs: Sequence[optimizers.SlotSpec]
  ) -> Dict[str, storage.PartitionedRows]:
    supplied = supplier(table, specs)
    names = [spec.name for spec in specs]
    if not isinstance(supplied, dict) or sorted(supplied) != sorted(names):
      raise ValueError(
          f"HostEmbeddingEngine: table {name!r}: the slot supplier must "
          f"return a dict with the slots {names}; got {supplied!r}.")
    slots = collections.OrderedDict()
    for spec in specs:
      variables = supplied[spec.name]
      if not isinstance(variables, (list, tuple)):
        variables = [variables]
      slots[spec.name] = storage.PartitionedRows.from_variables(
          spec.variable_name(self.variable_names[name]), table.layout,
          table.dimension, variables)
    return slots

  def create_pipeline_variables(self) -> None:
    """With pipelining in training, creates the variables that hold one
    step's update of each table now (they are otherwise created by the
    first `apply_gradients`): TF2 code calls this outside `tf.function`,
    which cannot create variables on later traces."""
    self.create_variables()
    if self._pending is not None:
      for name in self.model.tables:
        self._pending_update(name)

  def variables(self) -> List[Any]:
    """All partition variables (tables then slots), for savers and tests."""
    self.create_variables()
    result: List[Any] = []
    for name in self.model.tables:
      result.extend(self.tables[name].partitions)
      for slot in self.slots[name].values():
        result.extend(slot.partitions)
    return result

  # --- state: the narrow public API of the tables and slots -----------------
  # What other layers (mid_level, checkpoints, a cluster's sync step) read
  # of the engine's storage: none of them reaches into `tables`/`slots`.

  def has_variables(self, table_name: str) -> bool:
    """Whether the variables of table `table_name` exist (they are made by
    `create_variables` or the first lookup of the table)."""
    self._check_table(table_name)
    return self.tables is not None and table_name in self.tables

  def created_tables(self) -> List[str]:
    """The names of the tables whose variables exist, in the order they
    were created."""
    return list(self.tables or ())

  def table_rows(self, table_name: str) -> storage.PartitionedRows:
    """The `PartitionedRows` of table `table_name` (its partition variables,
    layout and routed access); its variables must exist."""
    self._require_variables(table_name)
    return self.tables[table_name]

  def slot_rows(self, table_name: str) -> Dict[str, storage.PartitionedRows]:
    """{slot name (`SlotSpec.name`): `PartitionedRows`} of table
    `table_name`'s slots, in the optimizer's order (empty when the table
    has no slots); its variables must exist."""
    self._require_variables(table_name)
    return collections.OrderedDict(self.slots[table_name])

  def table_partitions(self, table_name: str) -> List[tf.Variable]:
    """The partition variables of table `table_name`, in partition order
    (one per partition of `table_layout`)."""
    return list(self.table_rows(table_name).partitions)

  def slot_partitions(self, table_name: str,
                      slot_name: str) -> List[tf.Variable]:
    """The partition variables of slot `slot_name` (`SlotSpec.name`) of
    table `table_name`, in partition order."""
    slots = self.slot_rows(table_name)
    if slot_name not in slots:
      raise ValueError(
          f"HostEmbeddingEngine: table {table_name!r} has no slot "
          f"{slot_name!r}; its slots are {list(slots)}.")
    return list(slots[slot_name].partitions)

  def table_layout(self, table_name: str) -> sharding.ShardLayout:
    """The `ShardLayout` of table `table_name` (and of its slots)."""
    return self.table_rows(table_name).layout

  def split_by_partition(self, table_name: str, ids: tf.Tensor,
                         values: tf.Tensor) -> List[Tuple[tf.Tensor,
                                                          tf.Tensor]]:
    """[(local ids, values)] per partition of table `table_name`: global
    `ids` and their `values` routed to the partitions holding them
    (`ShardLayout.route`)."""
    return self.table_rows(table_name).split(ids, values)

  def _check_table(self, table_name: str) -> None:
    if table_name not in self.model.tables:
      raise ValueError(
          f"HostEmbeddingEngine: unknown table {table_name!r}; tables are "
          f"{list(self.model.tables)}.")

  def _require_variables(self, table_name: str) -> None:
    if not self.has_variables(table_name):
      raise RuntimeError(
          f"HostEmbeddingEngine: the variables of table {table_name!r} do "
          "not exist yet; create them first (`create_variables`, or a "
          "lookup of the table).")

  # --- forward ---------------------------------------------------------------

  def lookup(self, features: Dict[str, Any]) -> LookupResult:
    """Looks up every feature of the config in `features` (a dict).

    Returns a `LookupResult` whose `activations` map each feature to
    [batch, dimension] or, for sequence features, [batch, L, dimension]
    (static L and dimension); `sequence_lengths` map sequence features to
    min(length, L).
    """
    return self.begin_lookup(features).result()

  def begin_lookup(self, features: Dict[str, Any]) -> LookupStep:
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
    # The ids are checked and their negative ones dropped by compiled ops
    # where they exist (in the graphs of `_compiles_here`), else by TF ops.
    compiled = self._compiles_here
    parsed = inputs_lib.parse_features(
        self.model, self.spec, features,
        compiled_ops=kernels if compiled else None)
    if not self.same_batch_size:
      return LookupStep(self, parsed, [], None)
    batch_size, checks = inputs_lib.check_batch_sizes(parsed)
    return LookupStep(self, parsed, checks, batch_size)

  def _step_requests(self, parsed: Mapping[str, inputs_lib.FeatureIds]
                     ) -> Tuple[Any, Dict[str, Any]]:
    """(`requests.StepRequests` of a step's `parsed` features, {table:
    (distinct ids, index of each id)}): every table's distinct ids routed
    once, one request per task holding partitions (docs/cluster.md); by
    one compiled op per table where this task compiles its ops."""
    layouts = collections.OrderedDict(
        (name, self.model.shard_layout(name, self.num_shards))
        for name in self.model.tables)
    dimensions = {name: t.dimension for name, t in self.model.tables.items()}
    uniques = collections.OrderedDict()
    if self._compiles_here:
      dtype = requests_lib.request_dtype(layouts)
      routed = collections.OrderedDict()
      for name, table in self.model.tables.items():
        unique, index, locals_, sizes = kernels.route_ids(
            [parsed[f].flat.ids for f in table.features], layouts[name],
            dtype)
        uniques[name] = (unique, index)
        routed[name] = (locals_, sizes)
      requests = requests_lib.StepRequests(
          layouts, dimensions, self._partition_device, routed=routed)
      return requests, uniques
    for name, table in self.model.tables.items():
      ids = [parsed[f].flat.ids for f in table.features]
      uniques[name] = tf.unique(tf.concat(ids, axis=0))
    requests = requests_lib.StepRequests(
        layouts, dimensions, self._partition_device,
        {name: unique for name, (unique, _) in uniques.items()})
    return requests, collections.OrderedDict(
        (name, requests.in_request_order(name, unique, index))
        for name, (unique, index) in uniques.items())

  def _requested_lookup(self, table: model_lib.Table,
                        items: List[inputs_lib.FeatureIds],
                        plans: Dict[str, Any], requests: Any) -> TableLookup:
    """The `TableLookup` of `table` from the step's requests; once every
    table's variables exist, builds the requests' replies."""
    step_requests, uniques = requests
    unique_ids, index = uniques[table.name]
    ids = [item.flat.ids for item in items]
    rows = step_requests.rows(table.name)
    if step_requests.replies is None and all(
        name in self.tables for name in self.model.tables):
      step_requests.finish(lambda name, p: self.tables[name].partitions[p])
    # This task combines the rows it received and sums their gradients by
    # the compiled kernels where they build (`_compiles_here`).
    if self._compiles_here:
      return TableLookup(table, unique_ids, rows, items, plans, index, None,
                         compiled=True)
    return TableLookup(table, unique_ids, rows, items, plans, index,
                       tf.concat(tf.shape_n(ids), axis=0))

  def _lookup_table(self, table: model_lib.Table,
                    items: List[inputs_lib.FeatureIds],
                    requests: Any = None) -> TableLookup:
    variables = self._table_variables(table.name)
    # In the graphs of `_compiles`, compiled kernels find the distinct ids
    # and combine their rows (one op for a table in one partition; else
    # Unique, a compiled gather per partition and a compiled combine), and
    # differentiate.
    ops = (kernels.ops_for(variables.partitions) if self._compiles else None)
    plans = {
        item.name: column_lookup.make_plan(
            item.flat, item.combiner, table.dimension,
            item.max_sequence_length, feature=item.name, table=table.name)
        for item in items
    }
    if requests is not None:
      return self._requested_lookup(table, items, plans, requests)
    if ops is not None and len(variables.partitions) == 1:
      # The update reads the looked-up rows only where it is not compiled.
      keep_rows = _row_kernel(self.optimizer_for(table.name),
                              variables) is None
      return TableLookup(table, None, None, items, plans, None, None,
                         compiled=True,
                         read=(variables.partitions[0].handle, keep_rows))
    ids = [item.flat.ids for item in items]
    unique_ids, index = tf.unique(tf.concat(ids, axis=0))
    rows = variables.gather(unique_ids, compiled=ops is not None)
    sizes = None if ops is not None else tf.concat(tf.shape_n(ids), axis=0)
    return TableLookup(table, unique_ids, rows, items, plans, index, sizes,
                       compiled=ops is not None)

  # --- backward --------------------------------------------------------------

  def apply_gradients(self, result: LookupResult, gradients: Mapping[str, Any],
                      global_step: Any) -> Any:
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
    if self._pending is None and step.requests is not None:
      return self._requested_update(step)
    with tf.control_dependencies([step.gate]):
      if self._pending is None:
        updates = []
        for name, lookup in result.tables.items():
          # Rows written in place (the compiled updates) are written after
          # this step's lookup read them.
          with tf.control_dependencies([lookup.rows]):
            updates.append(self._update_table(
                name, step.ids[name], step.grads[name], step.rates[name],
                rows=lookup.rows))
        return tf.group(*updates, name="embedding_update")
      # Pipelining: apply the held update of the previous step now that this
      # step's lookups are done, then hold this step's update.
      with tf.control_dependencies(
          [lookup.rows for lookup in result.tables.values()]):
        applied = [self._apply_pending(name) for name in result.tables]
      with tf.control_dependencies(applied):
        held = [
            self._pending_update(name).hold(step.ids[name], step.grads[name],
                                            step.rates[name])
            for name in result.tables
        ]
      return tf.group(*held, name="embedding_update_pipelined")

  def table_gradients(self, result: LookupResult,
                      gradients: Mapping[str, Any],
                      global_step: Any) -> "StepGradients":
    """docs/numerics.md, 'The backward pass, table by table' for every table:
    the step's `StepGradients` (distinct ids, their float32 gradient sums after
    the multiplier, the learning rate at `global_step`, and the gate of every
    check)."""
    if not self.is_training:
      raise RuntimeError(
          "HostEmbeddingEngine.apply_gradients: the EmbeddingConfig is in "
          f"mode {self.mode!r}; only TRAIN updates tables.")
    missing = [
        f"{f!r} (table {feature.table!r})"
        for f, feature in self.model.features.items()
        if gradients.get(f) is None
    ]
    if missing:
      raise ValueError(
          "HostEmbeddingEngine.apply_gradients: no gradient for features "
          f"{', '.join(missing)}; every configured feature needs one (the "
          "model must use every embedding activation).")
    step = tf.convert_to_tensor(global_step)
    checks = list(result.checks)
    multiplier = None
    if self.model.gradient_multiplier_fn is not None:
      multiplier = _finite(
          tf.cast(self.model.gradient_multiplier_fn(step), tf.float32),
          "experimental_gradient_multiplier_fn", step, checks)
    rates = collections.OrderedDict(
        (name, self._learning_rate(name, step, checks))
        for name in result.tables)
    # A non-finite multiplier is reported as such, not as the non-finite
    # gradients it makes.
    scalar_checks = checks[len(result.checks):]
    accumulated = collections.OrderedDict()
    finite, messages = [], []
    for name, lookup in result.tables.items():
      grads = []
      for item in lookup.features:
        grad = tf.convert_to_tensor(gradients[item.name], tf.float32)
        expected = result.activations[item.name].shape
        if not grad.shape.is_compatible_with(expected):
          raise ValueError(
              f"Gradient of feature {item.name!r} (table {name!r}) has shape "
              f"{grad.shape}; the activation has shape {expected}.")
        grads.append(grad)
      # Checked per table, on what would be written: a non-finite gradient
      # of any feature that reaches the table shows up here.
      summed, all_finite = self._id_gradients(lookup, grads, multiplier)
      finite.append(all_finite)
      names = ", ".join(repr(i.name) for i in lookup.features)
      messages.append(f"Gradient of features {names} (table {name!r}) is "
                      "not finite; no table was updated.")
      accumulated[name] = summed
    if finite:
      # One Assert for all tables, naming each table at fault.
      with tf.control_dependencies(scalar_checks):
        if self._compiles_here:
          # One op between the last sum and the first update.
          checks.append(kernels.check_all(finite, messages))
        else:
          checks.append(column_lookup.check_each(tf.stack(finite), messages))
    ids = collections.OrderedDict(
        (name, lookup.unique_ids) for name, lookup in result.tables.items())
    return StepGradients(ids, accumulated, rates, column_lookup.gate(checks),
                         result.requests)

  def _id_gradients(self, lookup: TableLookup, grads: List[Any],
                    multiplier: Any) -> Tuple[Any, Any]:
    """docs/numerics.md, 'The backward pass, table by table' for one table: the
    float32 sum of every contribution to each of `lookup.unique_ids` [U, D],
    from the activation gradients `grads` of its features (in feature order),
    times `multiplier` (if not None), and whether all of it is finite (a bool
    scalar): by the compiled kernel where the lookup was compiled, else by
    TF ops (the same operations in the same order)."""
    plans = [lookup.plans[item.name] for item in lookup.features]
    num_ids = (lookup.num_ids if lookup.num_ids is not None else
               tf.shape(lookup.unique_ids)[0])
    if not lookup.compiled:
      summed = tf.math.unsorted_segment_sum(
          tf.concat([plan.backprop(g) for plan, g in zip(plans, grads)],
                    axis=0), lookup.index, num_ids)
      if multiplier is not None:
        summed = summed * multiplier
      return summed, tf.reduce_all(tf.math.is_finite(summed))
    # A feature's gradient that is a column window of a wider one (the
    # gradient of the concatenated activations, split) is read in place:
    # the split is then not needed.
    # Read before TF's gradient gate: the sums need not wait for the dense
    # weights' gradients (tf_patches.gradient_gates).
    grads = [gradient_gates.ungated(grad) for grad in grads]
    dimension = lookup.table.dimension
    windows = [_split_window(grad, dimension) for grad in grads]
    window_attrs = {}
    if any(window is not None for window in windows):
      grads = [grad if window is None else window[0]
               for grad, window in zip(grads, windows)]
      window_attrs = {"offsets": [0 if window is None else window[1]
                                  for window in windows],
                      "dim": dimension}
    summed, finite = kernels.id_gradients(
        grads=grads,
        segments=[plan.segment for plan in plans],
        weights=kernels.or_empty([plan.weights for plan in plans]),
        scales=lookup.scales, index=lookup.index, num_ids=num_ids,
        multiplier=kernels.or_empty([multiplier])[0], **window_attrs)
    summed.set_shape([None, dimension])
    return summed, finite

  def flush(self) -> Any:
    """Applies the update held by pipelining (a no-op without pipelining)."""
    self.create_variables()
    if not self._pending:
      return tf.no_op(name="embedding_flush")
    return tf.group(*[self._apply_pending(key) for key in list(self._pending)],
                    name="embedding_flush")

  def _learning_rate(self, name: str, step: Any, checks: List[Any]) -> Any:
    """The table's learning rate at `step`; a `learning_rate_fn` value is
    checked to be finite (the check joins `checks`, which gate writes)."""
    rate = self.update_pipeline(name).learning_rate
    if rate.fn is not None:
      return _finite(
          tf.cast(rate.fn(step), tf.float32),
          f"learning_rate_fn of table {name!r}", step, checks)
    return tf.constant(rate.constant, tf.float32)

  # --- held updates (pipelining) ---------------------------------------------

  def _pending_update(
      self, key: Union[str, Tuple[str, int]]) -> "_PendingUpdate":
    """The held update of `key`: a table name (global ids, held on this
    task) or (table name, partition) (local ids, held on the partition's
    device); created on first use."""
    if key not in self._pending:
      name = key if isinstance(key, str) else key[0]
      suffix = "" if isinstance(key, str) else f"/part_{key[1]}"
      device = (self.local_device if isinstance(key, str) else
                self._partition_device(*key))
      with tf.control_dependencies(None), device_scope(device):
        self._pending[key] = _PendingUpdate(
            self.variable_names[name] + suffix,
            self.model.tables[name].dimension)
    return self._pending[key]

  def _apply_pending(self, key: Union[str, Tuple[str, int]]) -> Any:
    pending = self._pending_update(key)
    ids, grads, lr, valid = pending.read()

    def apply() -> Any:
      if isinstance(key, str):
        update = self._update_table(key, ids, grads, lr)
      else:
        update = self.update_partition(key[0], key[1], ids, grads, lr)
      with tf.control_dependencies([update]):
        with tf.control_dependencies([pending.clear()]):
          return tf.constant(True)

    return tf.cond(valid, apply, lambda: tf.constant(False))

  def _requested_update(self, step: "StepGradients") -> Any:
    """The update of a step whose partitions live on other tasks: one
    request per task (`requests.StepRequests.gradients`, after every check
    of the step), unpacked there into `update_partition` of each partition,
    after the step's lookup there read the rows."""
    requests = step.requests
    updates = []
    for device, reply in requests.replies.items():
      with tf.control_dependencies([step.gate]):
        floats = requests.gradients(device, step.grads, step.rates)
      with tf.control_dependencies(None), device_scope(device):
        with tf.control_dependencies([reply]):
          for name, p, ids, grads, lr in requests.unpack(
              device, requests.ids(device), floats):
            updates.append(self.update_partition(name, p, ids, grads, lr))
    return tf.group(*updates, name="embedding_update")

  def update_partition_contributions(self, name: str, partition: int,
                                     ids: Any, grads: Any, lr: Any,
                                     scale: Any = 1.0) -> Any:
    """The update of partition `partition` of table `name` from contributions
    that may repeat ids (several tasks' `ids` [N] local ids and `grads`
    [N, D] float32, concatenated): sums them per distinct id, times `scale`,
    then applies the sum (docs/numerics.md, 'The backward pass, table by
    table'), held for a step when pipelining. Returns the op."""
    unique, index = tf.unique(ids)
    summed = tf.math.unsorted_segment_sum(
        grads, index, tf.shape(unique)[0]) * scale
    summed = tf.ensure_shape(summed,
                             [None, self.model.tables[name].dimension])
    if self.model.pipeline_execution_with_tensor_core:
      return self.pipelined_partition_update(name, partition, unique, summed,
                                             lr)
    return self.update_partition(name, partition, unique, summed, lr)

  def pipelined_partition_update(self, name: str, partition: int,
                                 local_ids: Any, grads: Any, lr: Any) -> Any:
    """Pipelining for an update given per partition (a synchronous cluster
    step): applies the update held for (table, partition), then holds this
    one, both on the partition's device."""
    applied = self._apply_pending((name, partition))
    with tf.control_dependencies([applied]), device_scope(
        self._partition_device(name, partition)):
      return self._pending_update((name, partition)).hold(local_ids, grads,
                                                          lr)

  # --- updates ----------------------------------------------------------------

  @property
  def _compiles(self) -> bool:
    """Whether this engine's graphs use the compiled kernels (where they
    are available): training graphs, for partitions in this process. Other
    graphs (evaluation, prediction, export) and other tasks' partitions
    (whose processes need not have loaded the kernels) get plain TensorFlow
    ops."""
    return self.is_training and not self.remote_partitions

  @property
  def _compiles_here(self) -> bool:
    """Whether this task's own ops of a training step (the input checks,
    the combiners, the per-id gradient sums) are the compiled kernels:
    training graphs where the kernels build, also when the partitions live
    on other tasks (their gathers and updates there stay TensorFlow ops,
    `_compiles`)."""
    return self.is_training and kernels.row_updates() is not None

  @property
  def packs_requests(self) -> bool:
    """Whether a step's lookups and updates go as one request per task
    holding partitions (`requests.StepRequests`): training graphs whose
    partitions live on other tasks."""
    return self.is_training and self.remote_partitions

  @property
  def remote_partitions(self) -> bool:
    """Whether the partitions live on other tasks (a cluster's ps tasks):
    updates then run per partition on its task, reading rows and slots at
    update time under the partition's lock."""
    return self.shard_device_fn is not None

  def _partition_device(self, name: str, partition: int) -> Any:
    return (self.shard_device_fn(name, partition)
            if self.shard_device_fn is not None else None)

  def update_pipeline(self, name: str) -> pipeline_lib.UpdatePipeline:
    """The `UpdatePipeline` of table `name` (docs/numerics.md, 'The backward
    pass, table by table'), built once from the model."""
    pipelines = self._update_pipelines
    if name not in pipelines:
      pipelines[name] = pipeline_lib.UpdatePipeline.of(self.model, name)
    return pipelines[name]

  @functools.cached_property
  def _update_pipelines(self) -> Dict[str, pipeline_lib.UpdatePipeline]:
    return {}

  def _update_table(self, name: str, ids: Any, grads: Any, lr: Any,
                    rows: Any = None) -> Any:
    """docs/numerics.md, 'The backward pass, table by table' and 'Each optimizer
    on a touched row' on the distinct global `ids` of one table. `rows`: the
    rows as looked up in this step, when nothing can have changed them since
    (one process, no pipelining)."""
    table = self.tables[name]
    if self.remote_partitions:
      return tf.group(*[
          self.update_partition(name, p, local, part_grads, lr)
          for p, (local, part_grads) in enumerate(table.split(ids, grads))
      ])
    pipeline = self.update_pipeline(name)
    target = executors.Target(
        table, self.slots[name],
        ops=executors.compiled_ops(pipeline.compiled, table.partitions))
    return executors.update(pipeline, target, ids, grads, lr, rows)

  def update_partition(self, name: str, partition: int, local_ids: Any,
                       grads: Any, lr: Any) -> Any:
    """docs/numerics.md, 'The backward pass, table by table' and 'Each optimizer
    on a touched row' on partition `partition` of table `name`, which lives on
    another task (`remote_partitions`), on that task: reads the touched rows and
    slots there, at update time, and writes them back under the partition's lock
    (or in one of TF's sparse-apply kernels, which lock the variables), so
    concurrent updates of the same rows (asynchronous training) all count."""
    table = self.tables[name].partitions[partition]
    target = executors.Target(
        executors.PartitionRows(table),
        {k: executors.PartitionRows(v.partitions[partition])
         for k, v in self.slots[name].items()},
        lock_name=f"{table.op.name}/update_lock")
    with device_scope(self._partition_device(name, partition)):
      return executors.update(self.update_pipeline(name), target, local_ids,
                              grads, lr)


class StepGradients:
  """A step's embedding gradients, per table: `ids` (distinct ids), `grads`
  (their float32 sums after the gradient multiplier), `rates` (learning
  rate at the step), `gate` (every input and gradient check; writes wait
  for it), `requests` (the lookup's `requests.StepRequests`, or None)."""

  def __init__(self, ids: Dict[str, Any], grads: Dict[str, Any],
               rates: Dict[str, Any], gate: Any, requests: Any = None) -> None:
    self.ids = ids
    self.grads = grads
    self.rates = rates
    self.gate = gate
    self.requests = requests


def _row_kernel(optimizer: Any, table: storage.PartitionedRows) -> Any:
  """The compiled op module that updates `table` (partitions in this
  process, on CPU) with `optimizer`'s pipeline, or None: then TF ops compute
  the update (`executors.EXECUTORS`)."""
  return executors.compiled_ops(pipeline_lib.compiled_rule(optimizer),
                                table.partitions)


def _split_window(grad: Any, dimension: int) -> Optional[Tuple[Any, int]]:
  """(matrix, column) when `grad`, a graph tensor [rows, dimension], is
  columns [column, column + dimension) of `matrix` [rows, width] as a
  SplitV along the columns gives them (TF's gradient of a concatenation of
  more than 16 tensors: DenseFeatures' of its columns' activations), up to
  identities and reshapes that keep the shape; else None. The values are
  the same bits either way."""
  if not isinstance(grad, tf.Tensor) or tf.executing_eagerly():
    return None
  tensor = grad
  while (tensor.op.type in ("Identity", "Reshape") and
         _is_rows_of(tensor, dimension) and
         _is_rows_of(tensor.op.inputs[0], dimension)):
    tensor = tensor.op.inputs[0]
  if tensor.op.type != "SplitV" or not _is_rows_of(tensor, dimension):
    return None
  split = _column_split(tensor.op)
  if split is None:
    return None
  matrix, offsets = split
  return matrix, offsets[tensor.value_index]


# {SplitV op: its `_column_split`}: the pieces of one split are the
# gradients of many features (up to every feature of the model), each of
# which asks; the split is read once, not once per piece.
_ColumnSplit = Optional[Tuple[Any, List[int]]]
_COLUMN_SPLITS: "weakref.WeakKeyDictionary[Any, _ColumnSplit]" = (
    weakref.WeakKeyDictionary())


def _column_split(op: Any) -> _ColumnSplit:
  """(matrix, the first column of each piece) when the SplitV `op` splits a
  float32 matrix along its columns, else None."""
  if op not in _COLUMN_SPLITS:
    _COLUMN_SPLITS[op] = _read_column_split(op)
  return _COLUMN_SPLITS[op]


def _read_column_split(op: Any) -> _ColumnSplit:
  matrix = gradient_gates.ungated(op.inputs[0])
  pieces = op.outputs
  width = (tf.compat.dimension_value(matrix.shape[1])
           if matrix.shape.rank == 2 else None)
  widths: List[Any] = [tf.compat.dimension_value(piece.shape[1])
                       if piece.shape.rank == 2 else None
                       for piece in pieces]
  # Pieces narrower than the matrix that add up to its width: a split of
  # its columns (a split of its rows gives pieces as wide as the matrix).
  if (matrix.dtype != tf.float32 or width is None or len(pieces) < 2 or
      None in widths or sum(widths) != width or max(widths) >= width or
      any(not piece.shape[:1].is_compatible_with(matrix.shape[:1])
          for piece in pieces)):
    return None
  offsets = [0]
  for piece_width in widths[:-1]:
    offsets.append(offsets[-1] + piece_width)
  return matrix, offsets


def _is_rows_of(tensor: Any, dimension: int) -> bool:
  """Whether `tensor` is a float32 [rows, dimension] (rows may be unknown)."""
  rows_of: bool = (tensor.dtype == tf.float32 and tensor.shape.rank == 2 and
                   tf.compat.dimension_value(tensor.shape[1]) == dimension)
  return rows_of


def device_scope(device: Any) -> ContextManager[Any]:
  """A device scope, or none when `device` is None (the caller's scope
  stays; `tf.device(None)` would clear it)."""
  return tf.compat.v1.device(device) if device else contextlib.nullcontext()


def _finite(value: Any, what: str, step: Any, checks: List[Any]) -> Any:
  """`value` (a scalar), with a check that it is finite added to `checks`."""
  if value.shape.rank not in (0, None):
    raise ValueError(f"{what} must return a scalar; got shape {value.shape}.")
  checks.append(
      column_lookup.check(
          tf.math.is_finite(value),
          f"{what} returned a value that is not finite at this global step; "
          "no table was updated. Global step and value:", [step, value]))
  return value


class _PendingUpdate:
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
