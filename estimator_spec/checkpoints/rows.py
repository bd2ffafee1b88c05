"""Reading a few rows of a table (or of one of its slots) by id.

`read_rows(model_dir, spec, table, ids)` returns the rows with those ids,
whatever layout wrote the checkpoint. `tf.train.load_variable` returns a
table's tensor in stored order, which for a `mod` table over n partitions
is not row order (row r sits in partition r % n, see `tables`): indexing
its result with an id gives another id's row without any warning. Here the
stored position of each id comes from the layout that wrote the tensor
(`ShardLayout.locate`, the routing rule the engine uses) and only the
stored ranges covering the asked ids are read (`Checkpoint.rows_by_id`).
"""
from typing import Any, Iterable, Optional

import numpy as np
import numpy.typing as npt

from estimator_spec.checkpoints import tables
from estimator_spec.config import model as model_lib
from estimator_spec.config import spec as spec_lib
from tpu_embedding_columns import checks


def read_rows(model_dir: tables.StrPath, spec: spec_lib.EmbeddingConfigSpec,
              table: str, ids: npt.ArrayLike, *, slot: Optional[str] = None,
              from_strategy: Optional[str] = None,
              variable_names: Optional[dict[str, str]] = None) -> tables.Rows:
  """The rows of table `table` with ids `ids`, as stored in a checkpoint.

  Args:
    model_dir: a model directory (its latest checkpoint) or a checkpoint
      prefix.
    spec: the `EmbeddingConfigSpec` the model was trained with.
    table: the table's name (a key of `spec.model.tables`, as
      `python -m estimator_spec describe` lists them).
    ids: row ids (ints in [0, vocabulary_size)), in any order, repeats
      allowed.
    slot: read this optimizer slot of the table instead of the table: the
      suffix of its checkpoint tensor (`Adagrad` for
      `<table tensor>/Adagrad`) or, equivalently, the slot's name in the
      optimizer (e.g. `accumulators`).
    from_strategy: the strategy the checkpoint was written with, for one
      that does not record it (TF's own); default the spec's.
    variable_names: optional {table name: checkpoint tensor name} for a
      table whose tensor cannot be found unambiguously.

  Returns:
    A float32 NumPy array [len(ids), dimension]: row i is row `ids[i]`.

  Raises:
    FileNotFoundError: no checkpoint at `model_dir`.
    ValueError, TypeError: an unknown table or slot, ids out of range, or a
      checkpoint that does not match the spec.
  """
  owner = "read_rows"
  model = spec_lib.model_of(owner, spec)
  config = table_of(owner, model, table)
  table = config.name
  ids = check_ids(owner, ids, config)
  if slot is not None:
    slot = checks.check_str(owner, "slot", slot)
  tables.check_from_strategy(owner, from_strategy)
  with tables.open_checkpoint(model_dir, owner) as checkpoint:
    located = tables.locate_tables(checkpoint, model, variable_names, owner,
                                   only=[table])
    tensor = located[table]
    if slot is not None:
      tensor = _slot_tensor(owner, checkpoint, model, config, tensor, slot)
    strategy = tables.written_strategy(checkpoint, model, from_strategy,
                                       owner)
    layout = checkpoint.written_layout(tensor, config, strategy, owner)
    return checkpoint.rows_by_id(tensor, layout, ids)


def table_of(owner: str, model: model_lib.EmbeddingModel,
             name: str) -> model_lib.Table:
  """The config-model table `name` of `model`; ValueError naming the
  model's tables when it has none of that name."""
  name = checks.check_str(owner, "table", name)
  if name not in model.tables:
    raise ValueError(
        f"{owner}: the spec has no table {name!r}; its tables are "
        f"{sorted(model.tables)}.")
  return model.tables[name]


def check_ids(owner: str, ids: npt.ArrayLike,
              table: model_lib.Table) -> npt.NDArray[np.int64]:
  """`ids` as an int64 array; ValueError naming the ids out of range of
  `table` (a config-model table) and its vocabulary size."""
  ids = np.asarray(ids)
  if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
    raise TypeError(
        f"{owner}: `ids` must be a 1-D sequence of integers; got "
        f"{ids.dtype} of shape {list(ids.shape)}.")
  ids = ids.astype(np.int64)
  bad = ids[(ids < 0) | (ids >= table.vocabulary_size)]
  if bad.size:
    raise ValueError(
        f"{owner}: ids {_some(bad)} are out of range for table "
        f"{table.name!r}, whose vocabulary_size is {table.vocabulary_size} "
        f"(ids 0 to {table.vocabulary_size - 1}).")
  return ids


def _some(values: Iterable[Any], limit: int = 5) -> str:
  values = list(dict.fromkeys(int(v) for v in values))  # once each
  shown = ", ".join(str(int(v)) for v in values[:limit])
  return f"[{shown}{', ...' if len(values) > limit else ''}]"


def _slot_tensor(owner: str, checkpoint: tables.Checkpoint,
                 model: model_lib.EmbeddingModel, table: model_lib.Table,
                 tensor: str, slot: str) -> str:
  # {suffix: tensor name} of the table's slot tensors (`<tensor>/<suffix>`).
  found = {name[len(tensor) + 1:]: name for name in tables.table_row_tensors(
      checkpoint, model, {table.name: tensor})[table.name][1:]}
  if slot in found:
    return found[slot]
  parameters = model.optimizer_for(table.name)
  for spec in parameters.slot_specs() if parameters is not None else ():
    if slot in (spec.name, spec.mid_level) and spec.suffix in found:
      return found[spec.suffix]
  raise ValueError(
      f"{owner}: table {table.name!r} has no slot {slot!r} in the "
      f"checkpoint; its slots there are {sorted(found) or 'none'} "
      f"(tensors {tensor!r}/<slot>).")
