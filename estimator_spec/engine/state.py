"""The engine's state: every table's and slot's partition variables.

`EngineState` makes a table's variables once (its rows by the table's
initializer, its slots by the optimizer's `SlotSpec`s or by a supplier),
records them, and is the one door through which the other rooms of the
engine and the other layers read them (`TableState`): nothing outside this
module holds the dicts of variables (docs/architecture.md, 'The engine').
"""
import collections
from typing import (Any, Callable, Dict, List, Mapping, Optional, Protocol,
                    Sequence, Tuple)

import tensorflow as tf

from estimator_spec.config import model as model_lib
from estimator_spec.config import optimizers
from estimator_spec.config import sharding
from estimator_spec.engine import storage
from estimator_spec.tensor_types import Tensor, Variable

# A slot supplier (`HostEmbeddingEngine.supply_slot_variables`): (the table's
# rows, its optimizer's slot specs) -> {slot name: variable or variables}.
SlotSupplier = Callable[
    [storage.PartitionedRows, Sequence[optimizers.SlotSpec]], Any]
# (table name, partition) -> the device of that partition, or None.
DeviceFn = Callable[[str, int], Any]

OWNER = "HostEmbeddingEngine"


class TableState(Protocol):
  """What one room reads of the tables and slots: their rows by name."""

  def has_variables(self, table_name: str) -> bool:
    """Whether the variables of table `table_name` exist."""

  def table_rows(self, table_name: str) -> storage.PartitionedRows:
    """The `PartitionedRows` of table `table_name`."""

  def slot_rows(self, table_name: str) -> Dict[str, storage.PartitionedRows]:
    """{slot name: `PartitionedRows`} of table `table_name`'s slots."""


class EngineState:
  """The variables of a config model's tables (and, where `optimizer_for`
  gives an optimizer, their slots), made on first use.

  Args:
    model: the `EmbeddingModel`.
    variable_names: {table name: variable name}, every table.
    optimizer_for: table name -> the optimizer training it, or None (no
      slots).
    num_shards: partitions per table.
    device_fn: optional (table name, partition) -> device of the partition.
  """

  def __init__(self, model: model_lib.EmbeddingModel,
               variable_names: Dict[str, str],
               optimizer_for: Callable[[str], Any], num_shards: int,
               device_fn: Optional[DeviceFn]) -> None:
    self.model = model
    self.variable_names = variable_names
    self._optimizer_for = optimizer_for
    self.num_shards = num_shards
    self.device_fn = device_fn
    self._tables: Dict[str, storage.PartitionedRows] = (
        collections.OrderedDict())
    self._slots: Dict[str, Dict[str, storage.PartitionedRows]] = (
        collections.OrderedDict())
    self._suppliers: Dict[str, SlotSupplier] = {}

  # --- making the variables --------------------------------------------------

  def set_variable_name(self, table_name: str, variable_name: str) -> None:
    """Names a table's variable before it exists; later names are ignored
    (a shared table is made once, where it is first used)."""
    self._check_table(table_name)
    if table_name in self._tables:
      return
    self.variable_names[table_name] = variable_name

  def supply_slots(self, table_name: str, supplier: SlotSupplier) -> None:
    """Has the slots of `table_name` made by `supplier` (see
    `HostEmbeddingEngine.supply_slot_variables`)."""
    self._check_table(table_name)
    if self._optimizer_for(table_name) is None:
      raise ValueError(
          f"{OWNER}: table {table_name!r} has no slots (it is "
          "not trained in this config's mode).")
    if table_name in self._tables:
      raise RuntimeError(
          f"{OWNER}: the variables of table {table_name!r} "
          "exist already; supply its slot variables before they are "
          "created.")
    self._suppliers[table_name] = supplier

  def create(self, name: str, compiled: bool) -> storage.PartitionedRows:
    """The rows of table `name`: its variables, made on first use; with
    `compiled`, initialized through the engine's kernels (see
    `storage.create_table`)."""
    if name in self._tables:
      return self._tables[name]
    # Variables are created on first use, possibly inside the step's
    # control dependencies; their initializers must not inherit them.
    with tf.control_dependencies(None):
      return self._create(name, compiled)

  def _create(self, name: str, compiled: bool) -> storage.PartitionedRows:
    table = self.model.tables[name]
    var_name = self.variable_names[name]
    device_fn = self._partition_device_fn(name)
    rows = storage.create_table(
        var_name, table.vocabulary_size, table.dimension, table.initializer,
        self.num_shards, self.model.partition_strategy, device_fn, compiled)
    optimizer = self._optimizer_for(name)
    supplier = self._suppliers.get(name)
    slots: Dict[str, storage.PartitionedRows] = collections.OrderedDict()
    if optimizer is not None and supplier is not None:
      slots.update(self._supplied_slots(name, rows, supplier,
                                        optimizer.slot_specs()))
    elif optimizer is not None:
      for spec in optimizer.slot_specs():
        slots[spec.name] = storage.create_table(
            spec.variable_name(var_name), table.vocabulary_size,
            table.dimension,
            storage.FillInitializer(spec.initial_value, compiled),
            self.num_shards, self.model.partition_strategy, device_fn)
    # Recorded only once complete (a supplier that raises leaves the table
    # to be created again).
    self._tables[name] = rows
    self._slots[name] = slots
    return rows

  def _partition_device_fn(self, name: str) -> Optional[Callable[[int], Any]]:
    device_fn = self.device_fn
    if device_fn is None:
      return None
    return lambda partition: device_fn(name, partition)

  def _supplied_slots(
      self, name: str, table: storage.PartitionedRows, supplier: SlotSupplier,
      specs: Sequence[optimizers.SlotSpec]
  ) -> Dict[str, storage.PartitionedRows]:
    supplied = supplier(table, specs)
    names = [spec.name for spec in specs]
    if not isinstance(supplied, dict) or sorted(supplied) != sorted(names):
      raise ValueError(
          f"{OWNER}: table {name!r}: the slot supplier must "
          f"return a dict with the slots {names}; got {supplied!r}.")
    slots: Dict[str, storage.PartitionedRows] = collections.OrderedDict()
    for spec in specs:
      variables = supplied[spec.name]
      if not isinstance(variables, (list, tuple)):
        variables = [variables]
      slots[spec.name] = storage.PartitionedRows.from_variables(
          spec.variable_name(self.variable_names[name]), table.layout,
          table.dimension, variables)
    return slots

  def partition_device(self, name: str, partition: int) -> Any:
    """The device of partition `partition` of table `name`, or None (this
    process's default)."""
    return (self.device_fn(name, partition)
            if self.device_fn is not None else None)

  # --- reading them: the narrow API (`TableState`) ---------------------------

  def variables(self) -> List[Variable]:
    """All partition variables made so far, tables then slots, table by
    table in the model's order."""
    result: List[Variable] = []
    for name in self.model.tables:
      if name in self._tables:
        result.extend(self._tables[name].partitions)
        for slot in self._slots[name].values():
          result.extend(slot.partitions)
    return result

  def has_variables(self, table_name: str) -> bool:
    """Whether the variables of table `table_name` exist."""
    self._check_table(table_name)
    return table_name in self._tables

  def created_tables(self) -> List[str]:
    """The tables whose variables exist, in the order they were made."""
    return list(self._tables)

  def table_rows(self, table_name: str) -> storage.PartitionedRows:
    """The `PartitionedRows` of table `table_name`; its variables must
    exist."""
    self._require_variables(table_name)
    return self._tables[table_name]

  def slot_rows(self, table_name: str) -> Dict[str, storage.PartitionedRows]:
    """{slot name: `PartitionedRows`} of table `table_name`'s slots, in the
    optimizer's order; its variables must exist."""
    self._require_variables(table_name)
    return collections.OrderedDict(self._slots[table_name])

  def table_partitions(self, table_name: str) -> List[Variable]:
    """The partition variables of table `table_name`, in order."""
    return list(self.table_rows(table_name).partitions)

  def slot_partitions(self, table_name: str,
                      slot_name: str) -> List[Variable]:
    """The partition variables of slot `slot_name` of `table_name`."""
    slots = self.slot_rows(table_name)
    if slot_name not in slots:
      raise ValueError(
          f"{OWNER}: table {table_name!r} has no slot "
          f"{slot_name!r}; its slots are {list(slots)}.")
    return list(slots[slot_name].partitions)

  def table_layout(self, table_name: str) -> sharding.ShardLayout:
    """The `ShardLayout` of table `table_name` (and of its slots)."""
    return self.table_rows(table_name).layout

  def split_by_partition(self, table_name: str, ids: Tensor,
                         values: Tensor) -> List[Tuple[Tensor, Tensor]]:
    """[(local ids, values)] per partition of table `table_name`."""
    return self.table_rows(table_name).split(ids, values)

  def partition_slots(self, table_name: str,
                      partition: int) -> Mapping[str, Variable]:
    """{slot name: the variable of partition `partition`} of a table."""
    return {name: rows.partitions[partition]
            for name, rows in self.slot_rows(table_name).items()}

  def _check_table(self, table_name: str) -> None:
    if table_name not in self.model.tables:
      raise ValueError(
          f"{OWNER}: unknown table {table_name!r}; tables are "
          f"{list(self.model.tables)}.")

  def _require_variables(self, table_name: str) -> None:
    if not self.has_variables(table_name):
      raise RuntimeError(
          f"{OWNER}: the variables of table {table_name!r} do "
          "not exist yet; create them first (`create_variables`, or a "
          "lookup of the table).")
