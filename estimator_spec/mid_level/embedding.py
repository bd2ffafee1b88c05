"""`HostTPUEmbedding`: TF2's `TPUEmbedding` interface over the host engine.

The TF2 configuration is converted once into the config model
(`estimator_spec.interop.convert_mid_level`); the host engine
built from it holds the tables and slots, looks features up and applies
the TPU embedding optimizers. This module only adapts TF2's calling
conventions: nested structures, weights given apart from the ids, dense
ids, `output_shape`, the enqueue/dequeue split.
"""
import collections
import collections.abc
import warnings
from typing import (Any, Callable, Mapping, Optional, Protocol, Sequence,
                    TypeAlias, TypeGuard, TypeVar, Union)

import numpy as np

import tensorflow as tf

from estimator_spec import interop
from estimator_spec.checkpoints import mid_level as checkpoint_layout
from estimator_spec.config import model as model_lib
from estimator_spec.config import modes
from estimator_spec.config import optimizers
from estimator_spec.config import spec as spec_lib
from estimator_spec.engine import engine as engine_lib
from estimator_spec.engine import inputs as inputs_lib
from estimator_spec.engine import storage
from estimator_spec.mid_level import replicas
from estimator_spec.tensor_types import Op, Tensor, Variable

_OWNER = "HostTPUEmbedding"

_T = TypeVar("_T")
_F = TypeVar("_F", bound=Callable[..., Any])
# TF2's configuration objects (`tf.tpu.experimental.embedding`).
FeatureConfig: TypeAlias = tf.tpu.experimental.embedding.FeatureConfig
TableConfig: TypeAlias = tf.tpu.experimental.embedding.TableConfig
# A nested structure (dicts, lists, tuples) of `_T`, as `tf.nest` reads it:
# the feature configurations, and the inputs, activations and gradients in
# their structure.
Nested = Union[_T, Mapping[Any, "Nested[_T]"], Sequence["Nested[_T]"]]
# A shape as `build` takes it: a `tf.TensorShape` or a list of dimensions.
ShapeLike = Union[tf.TensorShape, Sequence[Optional[int]]]
# `build`'s `per_replica_input_shapes`: the shapes in a nested structure,
# or an int, the per-replica batch size (TF's deprecated form).
InputShapes = Union[Nested[ShapeLike], int]
# A TF2 optimizer's `slot_variable_creation_fn`: (the table's variable, the
# slot names (`SlotSpec.mid_level`), one initializer per slot) -> {slot
# name: variable}, checked.
SlotCreationFn = Callable[
    [Variable, list[Optional[str]], list[Callable[..., Tensor]]], object]


class _Conversion(Protocol):
  """What `HostTPUEmbedding` reads of `interop.convert_mid_level`'s result
  (a `MidLevelConversion`)."""

  @property
  def spec(self) -> spec_lib.EmbeddingConfigSpec:
    ...

  @property
  def feature_names(self) -> list[str]:
    ...

  @property
  def feature_configs(self) -> list[FeatureConfig]:
    ...

  @property
  def table_configs(self) -> Mapping[str, TableConfig]:
    ...

  @property
  def slot_variable_creation_fns(self) -> Mapping[str, SlotCreationFn]:
    ...


# The methods a `tf.function` calls build the same graph in Python without
# AutoGraph: it would convert every function of the library they reach (each
# parsed and rewritten on the first trace, seconds for a few features), for
# no control flow of tensors (the engine builds TF1 graphs as they are). TF's
# own TPUEmbedding is not converted either: callables it is given (learning
# rates) run as written.
def _not_converted(function: _F) -> _F:
  """`function` as TF's `do_not_convert` wraps it: AutoGraph leaves it as
  written."""
  kept: _F = tf.autograph.experimental.do_not_convert(function)
  return kept


class HostTPUEmbedding(tf.__internal__.tracking.Trackable):  # type: ignore[misc]  # TF is untyped
  """TF2's `tf.tpu.experimental.embedding.TPUEmbedding`, trained on CPU/GPU
  with the TPU's semantics.

  Args:
    feature_config: a `tf.tpu.experimental.embedding.FeatureConfig` or a
      nested structure (dicts, lists, tuples) of them; activations and
      gradients use the same structure.
    optimizer: TF2's `SGD`, `Adagrad`, `AdagradMomentum`, `Adam` or `FTRL`
      for tables without their own (`TableConfig.optimizer`); None when no
      table trains (lookups only, no slot variables).
    pipeline_execution_with_tensor_core: True to apply each step's update
      after the next step's lookups, as a pipelined TPU does (ids used in
      both steps see weights one update stale); `flush()` applies the
      update still held.

  Every setting is honoured as docs/numerics.md states it or refused with a
  ValueError naming it (see `estimator_spec.interop.from_mid_level`), with
  one addition: an optimizer's `slot_variable_creation_fn` is called by
  `build`, and the variables it returns are the table's slots.
  Gradient accumulation is always on (per-id sums in float32, one update
  per touched id); `use_gradient_accumulation=False` gives the same result.
  `low_dimensional_packing_status` (TPU memory packing) and
  `validate_weights_and_indices` (TF2's CPU serving path) change no value
  and are accepted: inputs are always validated.

  Several replicas: created in a `tf.distribute.MirroredStrategy`'s scope,
  it keeps one copy of each table on the host's CPU, looks the replicas'
  inputs up as one global batch and sums their gradients per id before
  one update, as a TPU's cores do (see `estimator_spec.mid_level.replicas`);
  other strategies are refused.

  Slot variables: when a table's optimizer (its own, else the default)
  has a `slot_variable_creation_fn`, `build` calls it once for the table
  (inside `tf.init_scope`), as TF2 does: with the table's variable, the
  optimizer's slot names in TF2's order and one initializer per slot (a
  callable taking shape and dtype, giving the host's initial value). The
  float32 [vocabulary_size, dim] variables it returns are that table's
  slots: training reads and writes them, `slot_variables` gives them,
  checkpoints save them.

  Checkpoints: the object is trackable, with TF2's `TPUEmbedding` layout:
  `tf.train.Checkpoint(embedding=this)` saves each table under its name and
  each slot under `<table>/<slot>` ('accumulators', 'momenta',
  'velocities', 'linears'), as TF2's classes do, so that TF's
  `TPUEmbeddingForServing` (same configuration) restores what this object
  saves, and this object restores what TF2's classes or
  `export_mid_level_checkpoint` save. (Slots made by a
  `slot_variable_creation_fn` are saved the same way, but TF2's classes
  track those under `_variables/<table>/<slot>`: they do not carry over
  between the two.) Restoring before `build` restores
  when the variables are created. With pipelining, the held update is not
  in a checkpoint: `flush()` before saving.
  """

  def __init__(self, feature_config: Nested[FeatureConfig],
               optimizer: Optional[object],
               pipeline_execution_with_tensor_core: bool = False) -> None:
    owner = "HostTPUEmbedding"
    conversion: _Conversion = interop.convert_mid_level(
        feature_config, optimizer, pipeline_execution_with_tensor_core,
        owner=owner, slot_variable_creation_fn=True)
    self._feature_config = feature_config
    self._conversion = conversion
    self._names = conversion.feature_names
    self._features = dict(zip(self._names, conversion.feature_configs))
    for name, feature in self._features.items():
      _check_output_shape(owner, name, feature)
    # The engine takes each feature's ids and weights together
    # (`inputs.GivenIds`), so the spec names no weight keys.
    engine_spec = conversion.spec
    model = engine_spec.model
    trained = [t for t in model.tables if model.optimizer_for(t) is not None]
    if trained and len(trained) != len(model.tables):
      untrained = sorted(set(model.tables) - set(trained))
      raise ValueError(
          f"{owner}: tables {untrained} have no optimizer while tables "
          f"{trained} do; give `optimizer` (the default) or every "
          "TableConfig an optimizer, or none for lookups only.")
    # TF2 takes features of different shapes: each has its own batch.
    self._engine = engine_lib.HostEmbeddingEngine(
        spec=engine_spec, mode=modes.TRAIN if trained else modes.PREDICT,
        same_batch_size=False)
    self._strategy = replicas.strategy_at_construction(owner)
    self._input_shapes: Optional[dict[str, Optional[tf.TensorShape]]] = None
    # build's per-replica batch size, if given
    self._input_batch: Optional[int] = None
    self._built = False
    # the _Step enqueued last, until its apply_gradients
    self._step: Optional[_Step] = None

  # --- configuration --------------------------------------------------------

  @property
  def spec(self) -> spec_lib.EmbeddingConfigSpec:
    """The `EmbeddingConfigSpec` equivalent to the TF2 configuration."""
    return self._conversion.spec

  @property
  def engine(self) -> engine_lib.HostEmbeddingEngine:
    """The `HostEmbeddingEngine` that holds the tables and trains them."""
    return self._engine

  @property
  def is_training(self) -> bool:
    """Whether the tables have optimizers (else lookups only)."""
    return self._engine.is_training

  # --- variables -------------------------------------------------------------

  def build(self, per_replica_input_shapes: Optional[InputShapes] = None,
            per_replica_batch_size: Optional[int] = None) -> None:
    """Creates the tables and slot variables (the first `enqueue` or call
    does it when needed, outside any `tf.function`).

    Calls the `slot_variable_creation_fn` of each table's optimizer, if
    it has one (see the class docs).

    Args:
      per_replica_input_shapes: optional nested structure of the ids'
        shapes (`tf.TensorShape`s), one per feature: `feature_config`'s
        structure, or any structure that flattens to one shape per feature
        in `feature_config`'s flattened order (a list for a tuple of
        features, as TF accepts); later inputs must be compatible with
        them, and the activations take their static dimensions from them.
        An int here is the per-replica batch size (TF's deprecated form;
        a FutureWarning says so).
      per_replica_batch_size: optional int: the batch size of every input.

    Raises:
      ValueError: when the shapes do not flatten to one per feature (saying
        how many each holds), or a shape or batch size is not one.
      ValueError: naming the table and the slot, when a
        `slot_variable_creation_fn` returns anything but a dict of the
        optimizer's slot names (TF2's) to distinct float32 `tf.Variable`s
        of shape [vocabulary_size, dim].
    """
    if self._built:
      return
    if _is_int(per_replica_input_shapes):
      # TF's older form: the batch size as the first argument.
      warnings.warn(
          "HostTPUEmbedding.build: an int as `per_replica_input_shapes` is "
          "the per-replica batch size (a deprecated form, as in TF); give "
          "the inputs' shapes, or `per_replica_batch_size=`.",
          FutureWarning, stacklevel=2)
      if (per_replica_batch_size is not None and
          int(per_replica_batch_size) != int(per_replica_input_shapes)):
        raise ValueError(
            "HostTPUEmbedding.build: two batch sizes: "
            f"{int(per_replica_input_shapes)} (the first argument) and "
            f"per_replica_batch_size={per_replica_batch_size}; give one.")
      per_replica_batch_size = int(per_replica_input_shapes)
      per_replica_input_shapes = None
    shapes = (None if per_replica_input_shapes is None else
              self._flat_input_shapes(per_replica_input_shapes))
    if per_replica_batch_size is not None:
      shapes, self._input_batch = self._with_batch_size(
          shapes, per_replica_batch_size)
    self._input_shapes = (None if shapes is None else
                          dict(zip(self._names, shapes)))
    self._supply_slots()
    with tf.init_scope(), replicas.one_copy(self._strategy):
      self._engine.create_variables()
      self._engine.create_pipeline_variables()
    self._built = True
    for name, variable in self._checkpoint_variables().items():
      # Restores what a checkpoint restored before build holds for it.
      self._handle_deferred_dependencies(name=name, trackable=variable)

  def _supply_slots(self) -> None:
    """Has the engine take the slots of each table whose optimizer has a
    `slot_variable_creation_fn` from it (see `_slot_supplier`), when the
    tables train."""
    if not self.is_training:
      return
    # ids of the variables creation functions returned
    supplied: set[int] = set()
    for name, fn in self._conversion.slot_variable_creation_fns.items():
      if self._engine.has_variables(name):
        continue  # created by an earlier build that failed later
      self._engine.supply_slot_variables(
          name, self._slot_supplier(name, fn, supplied))

  def _with_batch_size(
      self, shapes: Optional[list[Optional[tf.TensorShape]]],
      per_replica_batch_size: object
  ) -> tuple[list[Optional[tf.TensorShape]], int]:
    """(one shape or None per feature, the batch size): build()'s `shapes`
    (None: none given) with `per_replica_batch_size` as their first
    dimension; ValueError when it is not a positive int or a shape has
    another batch size."""
    if not _is_int(per_replica_batch_size) or per_replica_batch_size < 1:
      raise ValueError(
          "HostTPUEmbedding.build: `per_replica_batch_size` must be a "
          f"positive int; got {per_replica_batch_size!r}.")
    batch = int(per_replica_batch_size)
    merged = []
    for name, s in zip(self._names, shapes or [None] * len(self._names)):
      if s is not None and s.rank:
        try:
          s = s.merge_with(tf.TensorShape([batch] + [None] * (s.rank - 1)))
        except ValueError:
          raise ValueError(
              f"HostTPUEmbedding.build: feature {name!r}: the shape {s} "
              f"has another batch size than per_replica_batch_size="
              f"{batch}.") from None
      merged.append(s)
    return merged, batch

  def _flat_input_shapes(
      self, given: Nested[ShapeLike]) -> list[Optional[tf.TensorShape]]:
    """build()'s `per_replica_input_shapes` as one `tf.TensorShape` per
    feature, in `feature_config`'s flattened order. As TF does, only the
    flattened structures must agree (a list of shapes for a tuple of
    features is accepted); a shape may be a `tf.TensorShape` or, where the
    nesting is `feature_config`'s own, a list of dimensions."""
    where = "HostTPUEmbedding.build: `per_replica_input_shapes`"
    flat = _leaves_up_to(self._feature_config, given)
    if flat is None:
      flat = tf.nest.flatten(given)
      if len(flat) != len(self._names):
        raise ValueError(
            f"{where} holds {len(flat)} shapes once flattened; "
            f"feature_config holds {len(self._names)} features "
            f"({', '.join(map(repr, self._names))}). Give one shape per "
            "feature, in feature_config's flattened order (or in its "
            "structure).") from None
    shapes = []
    for name, shape in zip(self._names, flat):
      try:
        shapes.append(None if shape is None else tf.TensorShape(shape))
      except (TypeError, ValueError):
        raise ValueError(
            f"{where}: feature {name!r}: {shape!r} is not a shape; give a "
            "tf.TensorShape per feature.") from None
    return shapes

  def _slot_supplier(self, table_name: str, fn: SlotCreationFn,
                     supplied: set[int]) -> engine_lib.SlotSupplier:
    """The engine's slot supplier for a table whose TF2 optimizer has a
    `slot_variable_creation_fn`: calls it as TF2 does (the table variable,
    the slot names in TF2's order, initializers of the values the host
    would start from) and checks what it returns."""

    def supply(table: storage.PartitionedRows,
               specs: Sequence[optimizers.SlotSpec]) -> dict[str, Variable]:
      variable = table.partitions[0]
      names = [spec.mid_level for spec in specs]
      initializers = [tf.constant_initializer(spec.initial_value)
                      for spec in specs]
      created = fn(variable, names, initializers)
      where = (f"HostTPUEmbedding: table {table_name!r}: "
               "`slot_variable_creation_fn`")
      if not isinstance(created, collections.abc.Mapping):
        raise ValueError(f"{where} must return a dict {{slot name: "
                         f"tf.Variable}} with the slots {names}; it returned "
                         f"a {type(created).__name__}.")
      missing = [n for n in names if n not in created]
      unknown = sorted(str(n) for n in created if n not in names)
      if missing or unknown:
        raise ValueError(f"{where} must return the slots {names}; "
                         f"missing {missing}, unknown {unknown}.")
      for slot in names:
        value = created[slot]
        # The table is one partition: the engine's rule for slot storage.
        problem = storage.partition_problem([value], table.layout,
                                            table.dimension)
        if problem:
          problem = problem.replace("partition 0", "the variable") + (
              " (float32 [vocabulary_size, dim])")
        elif value is variable:
          problem = "the variable is the table's own variable"
        elif id(value) in supplied:
          problem = "the variable is already given for another slot"
        if problem:
          raise ValueError(f"{where}: slot {slot!r}: {problem}.")
        supplied.add(id(value))
      return {spec.name: created[spec.mid_level] for spec in specs}

    return supply

  @property
  def embedding_tables(self) -> dict[TableConfig, Variable]:
    """{TF2 TableConfig: its tf.Variable [vocabulary_size, dim]} (one
    variable per table: the host keeps tables unpartitioned)."""
    self._require_built("embedding_tables")
    return {
        table: self._engine.table_partitions(name)[0]
        for name, table in self._conversion.table_configs.items()
    }

  @property
  def slot_variables(
      self) -> dict[TableConfig, dict[Optional[str], Variable]]:
    """{TF2 TableConfig: {slot name: tf.Variable}}, slots named as TF2
    names them ('accumulators', 'momenta', 'velocities', 'linears');
    empty dicts for SGD and when no table trains."""
    self._require_built("slot_variables")
    result = {}
    for name, table in self._conversion.table_configs.items():
      optimizer = self._engine.optimizer_for(name)
      specs = {s.name: s for s in optimizer.slot_specs()} if optimizer else {}
      result[table] = {
          specs[slot].mid_level: self._engine.slot_partitions(name, slot)[0]
          for slot in self._engine.slot_rows(name)
      }
    return result

  def _checkpoint_variables(self) -> dict[str, Variable]:
    """{name in TF2's object layout: variable}: tables and their slots."""
    variables = {}
    names = checkpoint_layout.object_names(self._engine.model)
    for name, (table, slot) in names.items():
      partitions = (self._engine.table_partitions(table) if slot is None else
                    self._engine.slot_partitions(table, slot.name))
      variables[name] = partitions[0]
    return variables

  def _trackable_children(
      self, save_type: str = "checkpoint",
      **kwargs: Any) -> dict[str, tf.__internal__.tracking.Trackable]:
    """What a checkpoint holds of this object: its tables and slots, by
    their names in TF2's layout (nothing before `build`)."""
    children: dict[str, tf.__internal__.tracking.Trackable] = (
        super()._trackable_children(save_type, **kwargs))
    if self._built:
      children.update(self._checkpoint_variables())
    return children

  def _require_built(self, what: str) -> None:
    if not self._built:
      raise RuntimeError(
          f"HostTPUEmbedding.{what}: the variables do not exist yet; call "
          "build() (or enqueue features) first.")

  # --- forward ---------------------------------------------------------------

  @_not_converted
  def enqueue(self, features: Nested[Tensor],
              weights: Optional[Nested[Optional[Tensor]]] = None,
              training: bool = True, name: Optional[str] = None,
              device: Optional[str] = None) -> None:
    """Looks up `features` for the next `dequeue`.

    Args:
      features: the nested structure of `feature_config` holding, per
        feature, integer ids: a `tf.SparseTensor` [batch, ids] or [d0, ...,
        dk, ids] (not for sequence features), or a `tf.RaggedTensor`
        [batch, (ids)], combined over the last dimension by the table's
        combiner (a sequence feature's positions past `max_sequence_length`
        are dropped); or a dense tensor [batch] or [..., 1], each id looked
        up alone. Under a
        `MirroredStrategy`: the replicas' inputs (a distributed dataset's
        element outside `strategy.run`, or each replica's own inside it).
      weights: None, or the same structure with None or float weights of
        the ids' kind (SparseTensor at the ids' positions, RaggedTensor of
        the ids' row lengths); not for dense ids or sequence features.
      training: False for lookups that no `apply_gradients` follows.
      name: a name scope for the ops.
      device: a device for the lookups (None: the current one).

    Raises:
      ValueError / TypeError: naming the feature, for inputs of the wrong
        kind, rank or structure. An id outside [0, vocabulary_size) raises
        tf.errors.InvalidArgumentError (when the lookup runs) and no table
        or slot changes in that step. Negative ids are dropped, as TF's TPU
        input path drops them.
    """
    replicas.check_strategy(_OWNER, "enqueue", self._strategy)
    if replicas.in_replica_context(self._strategy) and (
        replicas.num_replicas(self._strategy) > 1):
      # Each replica holds its part of the batch: the lookup runs once, on
      # the global batch, in cross-replica context.
      tf.distribute.get_replica_context().merge_call(
          lambda _, f, w: self._enqueue(f, w, training, name, device),
          args=(features, weights))
      return
    self._enqueue(features, weights, training, name, device)

  def _enqueue(self, features: Nested[Tensor],
               weights: Optional[Nested[Optional[Tensor]]], training: bool,
               name: Optional[str], device: Optional[str]) -> None:
    if not self._built:
      self.build()
    training = bool(training)
    if training and not self.is_training:
      training = False
    tf.nest.assert_same_structure(self._feature_config, features)
    flat = tf.nest.flatten(features)
    flat_weights = [None] * len(flat)
    if weights is not None:
      tf.nest.assert_same_structure(self._feature_config, weights)
      flat_weights = tf.nest.flatten(weights)
    # Inputs with one value per replica make one batch per replica; plain
    # tensors (outside strategy.run) one batch that no replica owns.
    count = (replicas.num_replicas(self._strategy)
             if replicas.is_distributed(flat + flat_weights) else 1)
    # engine inputs, {feature: _InputLayout}, {feature: _GradientPlan}
    per_replica: list[dict[str, inputs_lib.GivenIds]] = [
        {} for _ in range(count)]
    layouts: list[dict[str, _InputLayout]] = [{} for _ in range(count)]
    plans: list[dict[str, _GradientPlan]] = [{} for _ in range(count)]
    with _scope(name or "host_tpu_embedding_enqueue"), \
        engine_lib.device_scope(device):
      for feature_name, ids, weight in zip(self._names, flat, flat_weights):
        try:
          ids = replicas.local_values(self._strategy, ids, count)
          weight = replicas.local_values(self._strategy, weight, count)
        except ValueError as error:
          raise ValueError(
              f"{_OWNER}.enqueue: feature {feature_name!r}: {error}") from None
        for inputs, layout, plan, replica_ids, replica_weight in zip(
            per_replica, layouts, plans, ids, weight):
          (inputs[feature_name], layout[feature_name],
           plan[feature_name]) = self._engine_inputs(
               feature_name, replica_ids, replica_weight)
      result = self._engine.lookup({
          feature_name: inputs_lib.GivenIds.join(
              [inputs[feature_name] for inputs in per_replica])
          for feature_name in self._names
      })
      activations: list[dict[str, Tensor]] = [dict() for _ in range(count)]
      for feature_name in self._names:
        # Each replica's rows of the feature (its engine batch).
        activation = result.activations[feature_name]
        pieces = [activation] if count == 1 else replicas.split(
            activation, [inputs[feature_name].rows for inputs in per_replica])
        for replica, piece in zip(activations, pieces):
          replica[feature_name] = piece
    self._step = _Step(result, _current_graph(), training, activations,
                       layouts, plans)

  @_not_converted
  def dequeue(self, name: Optional[str] = None) -> Nested[Tensor]:
    """The activations of the last `enqueue`, in the structure of
    `feature_config`: per feature, the ids' shape without its last
    dimension + [dim] ([batch, dim] for ids [batch, ids] or [batch]),
    [batch, max_sequence_length, dim] for sequence features,
    `output_shape + [dim]` when the feature sets `output_shape`. Under a
    `MirroredStrategy`: call it inside `strategy.run`; each replica gets
    the activations of its inputs."""
    del name  # The activations are computed by `enqueue`.
    return self._dequeue(differentiable=False)

  def _dequeue(self, differentiable: bool) -> Nested[Tensor]:
    replicas.check_strategy(_OWNER, "dequeue", self._strategy)
    step = self._step
    replica = 0
    if step is not None:
      per_replica = len(step.activations) > 1
      inside = replicas.in_replica_context(self._strategy) and (
          replicas.num_replicas(self._strategy) > 1)
      if per_replica and not inside:
        raise RuntimeError(
            f"{_OWNER}.dequeue: the inputs were enqueued per replica; "
            "dequeue inside strategy.run: each replica gets the "
            "activations of its own inputs.")
      if inside and not per_replica:
        raise RuntimeError(
            f"{_OWNER}.dequeue: inside strategy.run, but the inputs were "
            "enqueued as one batch (plain tensors outside strategy.run); "
            "enqueue a distributed dataset's element, or enqueue inside "
            "strategy.run.")
      if per_replica:
        replica = replicas.replica_id(_OWNER, "dequeue")
    if step is None or replica in step.dequeued:
      raise RuntimeError(
          f"{_OWNER}.dequeue: nothing was enqueued; call enqueue "
          "first (once per dequeue).")
    _check_same_graph("dequeue", step.graph)
    step.dequeued.add(replica)
    if not step.training and len(step.dequeued) == len(step.activations):
      self._step = None
    outputs = []
    for feature_name in self._names:
      outputs.append(self._shape_activation(
          feature_name, step.activations[replica][feature_name],
          step.layouts[replica][feature_name]))
    if differentiable:
      outputs = self._with_table_gradients(outputs, step, replica)
    return tf.nest.pack_sequence_as(self._feature_config, outputs)

  @_not_converted
  def __call__(
      self, features: Nested[Tensor],
      weights: Optional[Nested[Optional[Tensor]]] = None) -> Nested[Tensor]:
    """`enqueue(features, weights)` then `dequeue()`: the activations.

    Unlike `dequeue`'s, these activations are differentiable with respect
    to the tables (`embedding_tables`), whatever `optimizer` the object
    has: TF's `TPUEmbeddingV0` usage, where a `tf.GradientTape` takes the
    tables' gradients and a Keras optimizer applies them (docs/mid_level.md,
    'TPUEmbeddingV0'). A table's gradient is what TF's own classes give for
    the same lookups off the TPU: one `tf.IndexedSlices` entry per id of
    each feature, as TF's lookup of that input kind makes it (sparse ids:
    each feature's distinct ids, with their summed gradients; ragged, dense
    and sequence ids: every id), features sharing a table concatenated, not
    summed per id. A tape must watch the tables
    (`tape.watch(embedding.embedding_tables.values())`, as TF's V0 program
    does): they are not trainable variables, which a tape would watch by
    itself. A step's tables are trained once: when a tape watching them
    differentiates its activations, `apply_gradients` is refused for it
    (and such a tape is refused after `apply_gradients`): RuntimeError.
    Under a `MirroredStrategy` with several replicas such a tape is
    refused (RuntimeError): there the object trains with `apply_gradients`.
    """
    self.enqueue(features, weights)
    return self._dequeue(differentiable=True)

  def _with_table_gradients(self, outputs: list[Tensor], step: "_Step",
                            replica: int) -> list[Tensor]:
    """`outputs` (the flat activations of `step` for `replica`), given the
    gradient with respect to each table's variable described in
    `__call__`."""
    model = self._engine.model
    variables = [self._engine.table_partitions(t)[0] for t in model.tables]
    plans = step.gradient_plans[replica]
    names = self._names

    def table_gradients(
        activation_grads: Sequence[Optional[Tensor]]
    ) -> list[Optional[tf.IndexedSlices]]:
      # A tape records this function only when it watches a table; it then
      # calls it for any gradient through the activations, the tables'
      # included.
      self._refuse_tape_gradients(step)
      step.tape_gradients = True
      return _table_slices(model, names, plans, activation_grads)

    def attach(
        *handles: Tensor
    ) -> tuple[list[Tensor], Callable[..., list[Optional[tf.IndexedSlices]]]]:
      del handles  # the gradient is with respect to them

      def grad(
          *activation_grads: Optional[Tensor]
      ) -> list[Optional[tf.IndexedSlices]]:
        return table_gradients(activation_grads)

      return [tf.identity(tf.stop_gradient(o)) for o in outputs], grad

    attached: list[Tensor] = tf.custom_gradient(attach)(
        *[variable.handle for variable in variables])
    return attached

  def _refuse_tape_gradients(self, step: "_Step") -> None:
    """RuntimeError when a tape may not take the tables' gradients of
    `step` (several replicas, or a step `apply_gradients` trained)."""
    if len(step.activations) > 1:
      raise RuntimeError(
          f"{_OWNER}: a GradientTape watching the tables under "
          f"{type(self._strategy).__name__} with several replicas: the "
          "V0 usage (a Keras optimizer on the tables' gradients) is not "
          "supported there, as the host keeps one copy of each table, "
          "which an optimizer under the strategy does not update. Train "
          "with enqueue, dequeue and apply_gradients under the strategy "
          "(do not watch the tables), or use the V0 usage without one.")
    if step.applied:
      raise RuntimeError(
          f"{_OWNER}: a GradientTape watching the tables differentiates "
          "the activations of a step that apply_gradients already "
          "trained with the object's own optimizer; a second update (a "
          "Keras optimizer on the tables' gradients) would train the "
          "tables twice. Train the tables one way: apply_gradients (do "
          "not watch the tables), or a Keras optimizer on the tables' "
          "gradients (the V0 usage, without apply_gradients).")

  # --- backward --------------------------------------------------------------

  @_not_converted
  def apply_gradients(self, gradients: Nested[Optional[Tensor]],
                      name: Optional[str] = None) -> Op:
    """Trains the tables from the gradients of the last dequeued
    activations (docs/numerics.md, 'The backward pass, table by table'): per-id
    sums over examples and features in float32, gradient clipping (`clipvalue`),
    weight decay, the optimizer on touched rows (non-lazy Adam: every row),
    weight clipping. Learning-rate callables are called here. Eagerly the update
    has run when this returns; in a `tf.function` it runs with it.

    Under a `MirroredStrategy`, call it inside `strategy.run` with the
    replica's gradients (or outside with per-replica values): the
    replicas' gradients are summed per id and applied once, as one
    replica would on the global batch (scale each replica's loss by the
    global batch, e.g. `tf.nn.compute_average_loss`, for a global mean).

    Args:
      gradients: the structure of `feature_config`, each entry shaped like
        its activation, or None (a zero gradient: the touched rows still
        take the optimizer's step, as on a TPU).
      name: a name scope for the ops.
    """
    replicas.check_strategy(_OWNER, "apply_gradients", self._strategy)
    if not self.is_training:
      raise RuntimeError(
          f"{_OWNER}.apply_gradients: no table has an optimizer "
          "(optimizer=None); this object only looks up.")
    if replicas.in_replica_context(self._strategy) and (
        replicas.num_replicas(self._strategy) > 1):
      return tf.distribute.get_replica_context().merge_call(
          lambda _, g: self._apply_gradients(g, name), args=(gradients,))
    return self._apply_gradients(gradients, name)

  def _apply_gradients(self, gradients: Nested[Optional[Tensor]],
                       name: Optional[str]) -> Op:
    step = self._step
    if step is None or not step.training or (
        len(step.dequeued) != len(step.activations)):
      raise RuntimeError(
          f"{_OWNER}.apply_gradients: no activations to train: call "
          "enqueue(..., training=True) and dequeue() first (in every "
          "replica), once per apply_gradients.")
    _check_same_graph("apply_gradients", step.graph)
    if step.tape_gradients:
      raise RuntimeError(
          f"{_OWNER}.apply_gradients: a GradientTape watching the tables "
          "already differentiated this step's activations (the V0 usage, "
          "where a Keras optimizer applies the tables' gradients); "
          "apply_gradients would train the tables a second time with the "
          "object's own optimizer. Train the tables one way: drop this "
          "apply_gradients, or do not watch the tables.")
    tf.nest.assert_same_structure(self._feature_config, gradients,
                                  check_types=False)
    grads: dict[str, Tensor] = {}
    for feature_name, grad in zip(self._names, tf.nest.flatten(gradients)):
      try:
        pieces = replicas.local_values(self._strategy, grad,
                                       len(step.activations))
      except ValueError as error:
        raise ValueError(f"{_OWNER}.apply_gradients: feature "
                         f"{feature_name!r}: {error}") from None
      parts = []
      for activations, layouts, piece in zip(step.activations, step.layouts,
                                             pieces):
        activation = activations[feature_name]
        parts.append(tf.zeros_like(activation) if piece is None else
                     self._engine_gradient(feature_name, piece, activation,
                                           layouts[feature_name]))
      grads[feature_name] = replicas.join(parts)
    with _scope(name or "host_tpu_embedding_apply_gradients"):
      op = self._engine.apply_gradients(step.result, grads,
                                        tf.constant(0, tf.int64))
    step.applied = True
    self._step = None
    return op

  @_not_converted
  def flush(self) -> Op:
    """With pipelining: applies the update still held (call it before
    reading or saving the tables at the end of training); otherwise
    nothing to do."""
    self._require_built("flush")
    return self._engine.flush()

  # --- inputs ----------------------------------------------------------------

  def _engine_inputs(
      self, name: str, ids: Tensor, weight: Optional[Tensor]
  ) -> tuple[inputs_lib.GivenIds, "_InputLayout", "_GradientPlan"]:
    """The engine's input for feature `name` (an `inputs.GivenIds`:
    SparseTensor ids [batch, ids] with optional weights, or dense ids
    [batch], one per example), the `_InputLayout` that shapes the
    activation back (inputs of higher rank are flattened to that batch),
    and the `_GradientPlan` of the direct call's table gradient."""
    feature = self._features[name]
    where = f"HostTPUEmbedding: feature {name!r}"
    # TF2's input forms, read by the one parser of embedding inputs.
    read = inputs_lib.read_mid_level_input(ids, weight,
                                           feature.max_sequence_length, where)
    shape = self._check_input_shape(name, ids, where)
    layout = _InputLayout(_activation_batch_shape(shape, ids, feature),
                          read.flat_batch)
    if feature.max_sequence_length > 0 and read.given.weights is not None:
      raise ValueError(f"{where}: weights were given for a sequence "
                       "feature; sequence features take no weights.")
    plan = _GradientPlan(read.kind, read.given.ids, read.given.weights,
                         feature.table.combiner, feature.max_sequence_length)
    return read.given, layout, plan

  def _check_input_shape(self, name: str, ids: Tensor,
                         where: str) -> tf.TensorShape:
    """The static shape of `ids`, completed by what `build` was given;
    ValueError when the two disagree."""
    given = ids.shape
    batch = self._input_batch
    if batch is not None and given.rank:
      first = tf.compat.dimension_value(given[0])
      if first is not None and first != batch:
        raise ValueError(f"{where}: ids of shape {given} (batch {first}); "
                         f"build() was given the per-replica batch size "
                         f"{batch}.")
      given = tf.TensorShape([batch]).concatenate(given[1:])
    if self._input_shapes is None or self._input_shapes[name] is None:
      return given
    expected = self._input_shapes[name]
    if not given.is_compatible_with(expected):
      raise ValueError(f"{where}: ids of shape {given}; build() was given "
                       f"{expected}.")
    return given.merge_with(expected)

  # --- activation shapes -----------------------------------------------------

  def _activation_shape(self, name: str, dimension: int,
                        layout: "_InputLayout") -> tf.TensorShape:
    """The static shape `dequeue` gives feature `name` for an input of
    `layout`: `output_shape + [dim]` when the feature sets it, else the
    ids' shape without its last dimension (a sequence feature's: [batch,
    max_sequence_length]; dense [batch]: itself) + [dim]."""
    output_shape = self._features[name].output_shape
    if output_shape:
      return tf.TensorShape(output_shape.as_list() + [dimension])
    return layout.batch_shape.concatenate([dimension])

  def _shape_activation(self, feature_name: str, activation: Tensor,
                        layout: "_InputLayout") -> Tensor:
    """The engine's activation of `feature_name` ([batch, dim] or [batch,
    L, dim], batch flattened for inputs of higher rank) in the shape
    `dequeue` gives, for an input of `layout`."""
    dimension = activation.shape[-1]
    if layout.flat_batch is not None:
      activation = tf.reshape(activation, _shape_vector(
          layout.batch_shape, layout.flat_batch, dimension))
    target = layout.batch_shape.concatenate([dimension])
    if activation.shape != target:
      activation = tf.ensure_shape(activation, target)
    shape = self._features[feature_name].output_shape
    if shape:
      elements = activation.shape[:-1].num_elements()
      if elements is not None and elements != shape.num_elements():
        raise ValueError(
            f"HostTPUEmbedding: feature {feature_name!r}: `output_shape` "
            f"{shape.as_list()} holds {shape.num_elements()} activations; "
            f"the lookup gives {activation.shape[:-1].as_list()}. For one "
            "activation per id, set `max_sequence_length`.")
      activation = tf.reshape(activation, shape.as_list() + [dimension])
    return activation

  def _engine_gradient(self, feature_name: str, grad: Tensor,
                       activation: Tensor, layout: "_InputLayout") -> Tensor:
    """A gradient given in the shape `dequeue` gave, shaped as the engine's
    `activation` of `feature_name` (an input of `layout`)."""
    grad = tf.convert_to_tensor(grad, tf.float32)
    expected = self._activation_shape(feature_name, activation.shape[-1],
                                      layout)
    if not grad.shape.is_compatible_with(expected):
      raise ValueError(
          f"HostTPUEmbedding: feature {feature_name!r}: the gradient has "
          f"shape {grad.shape}; the activation has shape {expected}.")
    if (self._features[feature_name].output_shape or
        layout.flat_batch is not None):
      grad = tf.reshape(grad, tf.shape(activation))
    return grad


def _table_slices(
    model: model_lib.EmbeddingModel, names: Sequence[str],
    plans: Mapping[str, "_GradientPlan"],
    activation_grads: Sequence[Optional[Tensor]]
) -> list[Optional[tf.IndexedSlices]]:
  """The gradient (`tf.IndexedSlices`, or None when no feature of the table
  has one) with respect to each table of `model`, in its order, from the
  gradients of the activations of the features `names` (their
  `_GradientPlan`s `plans`)."""
  per_table: dict[str, list[tuple[Tensor, Tensor]]] = {
      t: [] for t in model.tables}
  # Last feature first, as TF's tape concatenates the gradients of the
  # lookups of one variable (the same entries; the order only decides
  # in which order a Keras optimizer adds them up).
  for name, grad in reversed(list(zip(names, activation_grads))):
    if grad is None:
      continue
    ids, values = plans[name].slices(grad)
    per_table[model.features[name].table].append((ids, values))
  result: list[Optional[tf.IndexedSlices]] = []
  for table_name in model.tables:
    parts = per_table[table_name]
    if not parts:
      result.append(None)
      continue
    dimension = model.tables[table_name].dimension
    result.append(tf.IndexedSlices(
        tf.concat([v for _, v in parts], axis=0),
        tf.concat([i for i, _ in parts], axis=0),
        tf.constant([model.tables[table_name].vocabulary_size,
                     dimension], tf.int64)))
  return result


class _GradientPlan:
  """How the direct call's gradient of one feature's ids with respect to
  its table is laid out, as TF's lookup of that input kind off the TPU
  makes it (see `HostTPUEmbedding.__call__`): `slices(grad)` gives the
  (ids, rows of the gradient) of the feature's entries in the table's
  `tf.IndexedSlices`, from the gradient of its activation.

  `kind`: 'dense' (one id per example), 'sparse' or 'ragged' (the engine's
  SparseTensor [batch, ids] `ids` with `weights`, combined by `combiner`,
  or a sequence of `max_sequence_length` positions). Negative ids are
  dropped (the lookup gives them nothing); sparse ids of a combined feature
  give each distinct id once (their gradients summed), every other kind
  each id where it occurs; a ragged sequence's ids past
  `max_sequence_length` stay, with zero gradients."""

  def __init__(self, kind: str, ids: Union[Tensor, tf.SparseTensor],
               weights: Optional[tf.SparseTensor], combiner: Optional[str],
               max_sequence_length: int) -> None:
    self.kind = kind
    self.ids = ids
    self.weights = weights
    self.combiner = combiner
    self.max_sequence_length = max_sequence_length

  def slices(self, grad: Tensor) -> tuple[Tensor, Tensor]:
    dimension = tf.compat.dimension_value(grad.shape[-1])
    grad = tf.reshape(tf.convert_to_tensor(grad, tf.float32),
                      [-1, dimension])
    if self.kind == "dense":
      ids = tf.cast(self.ids, tf.int64)
      keep = ids >= 0
      return (tf.boolean_mask(ids, keep), tf.boolean_mask(grad, keep))
    ids = tf.cast(self.ids.values, tf.int64)
    example = self.ids.indices[:, 0]
    length = self.max_sequence_length
    keep = ids >= 0
    if length > 0:
      position = self.ids.indices[:, 1]
      inside = position < length
      if self.kind == "sparse":
        keep = keep & inside
      rows = example * length + tf.minimum(position, length - 1)
      values = tf.gather(grad, rows) * tf.expand_dims(
          tf.cast(inside, tf.float32), 1)
      return tf.boolean_mask(ids, keep), tf.boolean_mask(values, keep)
    weights = (tf.ones_like(ids, tf.float32) if self.weights is None else
               tf.cast(self.weights.values, tf.float32))
    weights = tf.where(keep, weights, tf.zeros_like(weights))
    rows = tf.cast(tf.shape(grad)[0], tf.int64)
    if self.combiner == "mean":
      total = tf.math.unsorted_segment_sum(weights, example, rows)
      weights = tf.math.divide_no_nan(weights, tf.gather(total, example))
    elif self.combiner == "sqrtn":
      total = tf.math.unsorted_segment_sum(weights * weights, example, rows)
      weights = tf.math.divide_no_nan(weights,
                                      tf.sqrt(tf.gather(total, example)))
    values = tf.gather(grad, example) * tf.expand_dims(weights, 1)
    ids, values = tf.boolean_mask(ids, keep), tf.boolean_mask(values, keep)
    if self.kind == "ragged":
      return ids, values
    distinct, index = tf.unique(ids)
    return distinct, tf.math.unsorted_segment_sum(
        values, index, tf.shape(distinct)[0])


class _InputLayout(
    collections.namedtuple("_InputLayout", ["batch_shape", "flat_batch"])):
  """How one enqueued input maps to its activation: `batch_shape` is the
  static shape of the activation without its last dimension; `flat_batch`
  the leading dimensions (int64 vector) that were flattened into the
  engine's batch, or None when the engine's batch is the activation's."""


def _activation_batch_shape(shape: tf.TensorShape, ids: Tensor,
                            feature: FeatureConfig) -> tf.TensorShape:
  """The static shape of the activation without its last dimension, from
  the ids' static `shape` (as completed by `build`)."""
  if feature.max_sequence_length > 0:
    return tf.TensorShape([shape[0] if shape.rank else None,
                           feature.max_sequence_length])
  if shape.rank is None:
    return tf.TensorShape([None])
  if shape.rank == 1:  # dense [batch]
    return shape
  return shape[:-1]


def _shape_vector(static: tf.TensorShape, dynamic: Tensor,
                  dimension: int) -> Tensor:
  """The shape `static + [dimension]` as a vector, taking the dimensions
  `static` lacks from `dynamic`."""
  if static.is_fully_defined():
    return static.as_list() + [dimension]
  dynamic = tf.cast(dynamic, tf.int32)
  return tf.stack([
      size if size is not None else dynamic[i]
      for i, size in enumerate(static.as_list())] + [dimension])


class _Step:
  """One enqueued batch: the engine's lookup of the global batch, and each
  replica's activations (one replica without a strategy)."""

  def __init__(self, result: engine_lib.LookupResult,
               graph: Optional[tf.Graph], training: bool,
               activations: list[dict[str, Tensor]],
               layouts: list[dict[str, _InputLayout]],
               gradient_plans: list[dict[str, _GradientPlan]]) -> None:
    self.result = result
    self.graph = graph
    self.training = training
    self.activations = activations  # [{feature: activation}] per replica
    self.layouts = layouts          # [{feature: _InputLayout}] per replica
    self.dequeued: set[int] = set()  # replicas that dequeued
    # [{feature: _GradientPlan}] per replica: the direct call's gradients
    # with respect to the tables.
    self.gradient_plans = gradient_plans
    self.applied = False            # apply_gradients trained from it
    self.tape_gradients = False     # a tape took the tables' gradients


def _check_output_shape(owner: str, name: str, feature: FeatureConfig) -> None:
  shape = feature.output_shape
  if shape and not shape.is_fully_defined():
    raise ValueError(
        f"{owner}: feature {name!r}: `output_shape` {shape} must be fully "
        "defined.")


def _leaves_up_to(structure: object, given: object) -> Optional[list[object]]:
  """The parts of `given` at the leaves of `structure`, in `tf.nest`'s
  flattened order, when `given` nests as `structure` does up to its leaves
  (lists and tuples alike; a leaf of `given` may itself be a list); else
  None."""
  if isinstance(structure, collections.abc.Mapping):
    if not isinstance(given, collections.abc.Mapping) or (
        sorted(structure) != sorted(given)):
      return None
    parts = [_leaves_up_to(structure[k], given[k]) for k in sorted(structure)]
  elif isinstance(structure, (list, tuple)):
    if not isinstance(given, (list, tuple)) or len(given) != len(structure):
      return None
    parts = [_leaves_up_to(s, g) for s, g in zip(structure, given)]
  else:
    return [given]
  leaves: list[object] = []
  for part in parts:
    if part is None:
      return None
    leaves.extend(part)
  return leaves


def _is_int(value: object) -> TypeGuard[Union[int, np.integer[Any]]]:
  return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _current_graph() -> Optional[tf.Graph]:
  return None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()


def _check_same_graph(what: str, graph: Optional[tf.Graph]) -> None:
  if _current_graph() is not graph:
    raise RuntimeError(
        f"HostTPUEmbedding.{what}: the features were enqueued in another "
        "function (or eagerly); enqueue, dequeue and apply_gradients of one "
        "step must run in the same tf.function (or all eagerly).")


def _scope(name: str) -> tf.name_scope:
  return tf.name_scope(name)
