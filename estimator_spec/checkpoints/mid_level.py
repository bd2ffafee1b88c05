"""TPUEstimator checkpoints for TF2's mid-level TPU embedding API.

The names under which TF2's `TPUEmbedding` / `TPUEmbeddingForServing`
track tables and slots (`object_name`, `object_names`), and the writer of
`export_mid_level_checkpoint` (`estimator_spec.interop`):
`write_mid_level_checkpoint` puts the tables and slots of a checkpoint of
this library's (or TF's) TPUEstimator into row order and writes them under
the keys of the object graph it is given (the one TF2 itself saves for that
embedding, which the interop layer learns from TF2's classes). Tables and
slots are found and read through `tables`.
"""
from typing import Callable, Optional

import tensorflow as tf

from estimator_spec.checkpoints import progress
from estimator_spec.checkpoints import tables
from estimator_spec.config import model as model_lib
from estimator_spec.config import optimizers
from estimator_spec.config import sharding
from estimator_spec.tensor_types import Tensor

# (names, slices, tensors) of checkpoint entries, as `StagedCheckpoint.save`
# takes them.
Entries = tuple[list[str], list[str], list[Tensor]]
# What `write_mid_level_checkpoint`'s `object_graph()` gives: ({variable full
# name: checkpoint key}, the checkpoint's other entries).
ObjectGraph = tuple[dict[str, str], Entries]
# One slot of a table to write: (its TF2 name, `SlotSpec.mid_level`; the
# source tensor, None when the checkpoint lacks it; its initial value).
_SlotPlan = tuple[Optional[str], Optional[str], float]
# One table to write: (name, table, checkpoint tensor, its slots).
_TablePlan = tuple[str, model_lib.Table, str, list[_SlotPlan]]


def object_name(table_name: str, slot: Optional[str] = None) -> str:
  """The name under which TF2's `TPUEmbedding` / `TPUEmbeddingForServing`
  tracks a table's variable (`'<table>'`) or one of its slots
  (`'<table>/<slot>'`, `slot` being the slot's TF2 name, `SlotSpec.
  mid_level`: 'accumulators', 'momenta', ...). A `tf.train.Checkpoint`
  stores it under `<attribute>/<name, '/' escaped as '.S'>/.ATTRIBUTES/
  VARIABLE_VALUE`."""
  return table_name if slot is None else f"{table_name}/{slot}"


def object_names(
    model: model_lib.EmbeddingModel
) -> dict[str, tuple[str, Optional[optimizers.SlotSpec]]]:
  """{object name: (table name, `SlotSpec` or None for the table)}: every
  variable TF2's mid-level classes track for the tables of `model` (a
  `config.model` EmbeddingModel), tables then their slots (the slots of the
  table's optimizer; none for SGD or a table without optimizer)."""
  names: dict[str, tuple[str, Optional[optimizers.SlotSpec]]] = {}
  for table_name in model.tables:
    names[object_name(table_name)] = (table_name, None)
    parameters = model.optimizer_for(table_name)
    for slot in (parameters.slot_specs() if parameters is not None else ()):
      if slot.mid_level is None:
        raise ValueError(
            f"table {table_name!r}: {type(parameters).__name__} has no "
            "counterpart in TF2's mid-level API (slot "
            f"{slot.name!r} has no TF2 name).")
      names[object_name(table_name, slot.mid_level)] = (table_name, slot)
  return names


def write_mid_level_checkpoint(model_dir: tables.StrPath,
                               model: model_lib.EmbeddingModel,
                               output_prefix: tables.StrPath,
                               object_graph: Callable[[], ObjectGraph], *,
                               owner: str, bar: progress.ProgressFactory,
                               variable_names: Optional[dict[str, str]] = None,
                               allow_missing_slots: bool = False,
                               from_strategy: Optional[str] = None,
                               overwrite: bool = False) -> str:
  """Writes the tables and slots of a TPUEstimator checkpoint for TF2 (see
  `estimator_spec.interop.export_mid_level_checkpoint`, which checks the
  arguments and calls it); returns the written prefix (absolute).

  `model` is the spec's config model; `object_graph()` gives ({variable
  full name: checkpoint key}, (names, slices, tensors) of the checkpoint's
  other entries) of the TF2 embedding that restores the result, and is
  called once the checkpoint's tables and slots are found; `bar` is a
  `progress.factory` result. Messages start with `owner`.
  """
  with tables.open_checkpoint(model_dir, owner) as checkpoint:
    written_strategy = tables.written_strategy(checkpoint, model,
                                               from_strategy, owner)
    plans = _plans(checkpoint, model, variable_names, allow_missing_slots,
                   owner)
    keys, extra = object_graph()
    expected = set(object_names(model))
    if set(keys) != expected:
      raise RuntimeError(
          f"Internal error: TPUEmbeddingForServing checkpoints variables "
          f"{sorted(keys)}, expected {sorted(expected)}.")
    with tables.StagedCheckpoint(output_prefix, owner, overwrite) as staged:
      staged.save(*extra)
      for name, table, tensor, slots in plans:
        _write_table(staged, checkpoint, keys, bar, name, table, tensor,
                     slots, written_strategy, owner)
      return staged.commit()


def _plans(checkpoint: tables.Checkpoint, model: model_lib.EmbeddingModel,
           variable_names: Optional[dict[str, str]],
           allow_missing_slots: bool, owner: str) -> list[_TablePlan]:
  """[(table name, table, checkpoint tensor, [(TF2 slot name, source
  tensor or None, initial value)])] of every table of `model`."""
  table_tensors = tables.locate_tables(checkpoint, model, variable_names,
                                       owner)
  plans: list[_TablePlan] = []
  missing = []
  for name, tensor in table_tensors.items():
    table = model.tables[name]
    parameters = model.optimizer_for(name)
    slots: list[_SlotPlan] = []
    if parameters is not None:
      for slot in parameters.slot_specs():
        written = slot.variable_name(tensor)
        shape = [table.vocabulary_size, table.dimension]
        source: Optional[str] = written
        if checkpoint.shapes.get(written) != shape:
          missing.append(written)
          source = None
        slots.append((slot.mid_level, source, slot.initial_value))
    plans.append((name, table, tensor, slots))
  if missing and not allow_missing_slots:
    raise ValueError(
        f"{owner}: the checkpoint {checkpoint.prefix} has no slot tensors "
        f"{missing} (written by a run whose optimizer had no such slots?); "
        "pass allow_missing_slots=True (command line: --allow-missing-slots) "
        "to export them at their initial values.")
  return plans


def _write_table(staged: tables.StagedCheckpoint, checkpoint: tables.Checkpoint,
                 keys: dict[str, str], bar: progress.ProgressFactory, name: str,
                 table: model_lib.Table, tensor: str, slots: list[_SlotPlan],
                 written_strategy: str, owner: str) -> None:
  """Saves one table and its slots in row order under their keys (slots
  the checkpoint lacks at their initial values)."""
  row_order = sharding.ShardLayout(table.vocabulary_size, 1, "div")
  with bar(name, table.vocabulary_size * (1 + len(slots))) as shown:
    sources = [(keys[object_name(name)], tensor, 0.0)] + [
        (keys[object_name(name, slot)], source, initial)
        for slot, source, initial in slots
    ]
    for key, source, initial in sources:
      if source is None:
        value = tf.fill([table.vocabulary_size, table.dimension],
                        tf.constant(initial, tf.float32))
        shown.advance(table.vocabulary_size)
      else:
        layout = checkpoint.written_layout(source, table,
                                           written_strategy, owner)
        rows = checkpoint.partition(source, layout, row_order, 0,
                                    shown.advance)
        value = tables.as_tensor(rows)
        del rows
      staged.save([key], [""], [value])
      del value
