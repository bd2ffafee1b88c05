"""Re-laying out the embedding tables of a checkpoint (div <-> mod, shards).

`convert_checkpoint` rewrites the tensors of each table and of its slots
(stored in the partition order of the run that wrote them, see `tables`)
for another strategy and/or number of shards, saved as the partitions a
run with that layout saves (one slice per partition), and copies every
other tensor (global step, dense weights, the dense optimizer's state)
unchanged. A plain `tf.compat.v1.train.Saver` or
`estimator_spec.TPUEstimator` configured with the target layout then
restores the result directly.

Which tensors belong to a table: the table's own tensor (found from the
config model, `tables.locate_tables`) and every tensor named `<table
tensor>/...` with the same [vocabulary_size, dimension] shape (its slots,
whatever optimizer wrote them).

Memory: each target partition of a table (or slot) is filled from the
rows it needs, read one block at a time (`tables.Checkpoint.partition`),
saved by TensorFlow without another copy and dropped before the next: a
conversion holds one target partition plus about two blocks (the whole
table when the target has one partition, which TF's writer takes whole).
Other tensors are copied a stored slice at a time. Pieces are saved
together up to 64 MB (`tables.GROUP_BYTES`), a bigger one on its own (and a
bigger tensor saved whole is held whole). Nothing is written to
`output_prefix` until every tensor is converted: the checkpoint is staged
in a temporary directory next to it and moved into place at the end (and
the staging directory is removed on error).
"""
from typing import Optional, TextIO, Union

from estimator_spec.checkpoints import progress as _progress
from estimator_spec.checkpoints import tables
from estimator_spec.config import model as model_lib
from estimator_spec.config import spec as spec_lib
from estimator_spec.config import sharding
from tpu_embedding_columns import checks


def convert_checkpoint(spec: spec_lib.EmbeddingConfigSpec,
                       checkpoint: tables.StrPath,
                       output_prefix: tables.StrPath, *, to_strategy: str,
                       to_shards: int, from_strategy: Optional[str] = None,
                       variable_names: Optional[dict[str, str]] = None,
                       progress: Union[bool, None, TextIO] = False,
                       overwrite: bool = False) -> str:
  """Writes `checkpoint` with the spec's tables laid out for another run.

  Args:
    spec: the `EmbeddingConfigSpec` of the model that wrote the checkpoint.
    checkpoint: a model directory (its latest checkpoint) or a prefix.
    output_prefix: where to write (e.g. `new_dir/model.ckpt-1000`); must
      not hold a checkpoint yet. Its directory gets a `checkpoint` state
      file naming it if it has none, so an estimator with that model_dir
      restores it.
    to_strategy: 'div' or 'mod', the target run's `partition_strategy`.
    to_shards: the target run's shards per table (TPU hosts, or
      parameter-server tasks on CPU).
    from_strategy: the strategy the checkpoint was written with; default
      what the checkpoint records (`tables.LAYOUT_TENSOR`, written by
      this library's estimator and by this function), else the spec's
      `partition_strategy`. (The partition count is read from the
      checkpoint.)
    variable_names: optional {table name: checkpoint tensor name} for tables
      `locate_tables` cannot find unambiguously.
    progress: True for a progress bar per table on stderr, a text stream
      for one there, False/None for none.
    overwrite: replace a checkpoint already at `output_prefix` (once the
      new one is complete) instead of refusing.

  A table with fewer rows than `to_shards` is written in one partition per
  row, as a run with that many shards lays it out (`ShardLayout`).

  Returns:
    The written checkpoint prefix (absolute).

  Raises:
    FileNotFoundError: no checkpoint at `checkpoint`.
    FileExistsError: `output_prefix` already holds a checkpoint and
      `overwrite` is False.
    ValueError, TypeError: bad arguments, or tables the checkpoint does not
      hold (nothing is written then).
  """
  owner = "convert_checkpoint"
  model = spec_lib.model_of(owner, spec)
  if to_strategy not in sharding.STRATEGIES:
    checks.fail(owner, "to_strategy", "must be 'div' or 'mod'", to_strategy)
  to_shards = checks.check_int(owner, "to_shards", to_shards, minimum=1)
  overwrite = checks.check_bool(owner, "overwrite", overwrite)
  tables.check_from_strategy(owner, from_strategy)
  bar = _progress.factory(progress)
  with tables.open_checkpoint(checkpoint, owner) as opened:
    return _convert(model, opened, output_prefix, to_strategy, to_shards,
                    from_strategy, variable_names, bar, owner, overwrite)


def _convert(model: model_lib.EmbeddingModel, checkpoint: tables.Checkpoint,
             output_prefix: tables.StrPath, to_strategy: str, to_shards: int,
             from_strategy: Optional[str],
             variable_names: Optional[dict[str, str]],
             bar: _progress.ProgressFactory, owner: str,
             overwrite: bool) -> str:
  from_strategy = tables.written_strategy(checkpoint, model, from_strategy,
                                         owner)
  table_tensors = tables.locate_tables(checkpoint, model, variable_names,
                                       owner)
  row_tensors = tables.table_row_tensors(checkpoint, model, table_tensors)
  plans = []
  for table_name, tensors in row_tensors.items():
    table = model.tables[table_name]
    target = sharding.ShardLayout(table.vocabulary_size, to_shards,
                                  to_strategy)
    layouts = [checkpoint.written_layout(t, table, from_strategy, owner)
               for t in tensors]
    plans.append((table_name, table, target, list(zip(tensors, layouts))))
  engine_names = {t for tensors in row_tensors.values() for t in tensors}
  others = sorted(set(checkpoint.shapes) - engine_names -
                  {tables.LAYOUT_TENSOR})

  with tables.StagedCheckpoint(output_prefix, owner, overwrite) as staged:
    tables.copy_tensors(checkpoint, others, staged)
    staged.add(tables.LAYOUT_TENSOR, "", to_strategy.encode())
    for table_name, table, target, sources in plans:
      label = f"{table_name} ({len(sources)} tensor{'s' * (len(sources) > 1)})"
      with bar(label, table.vocabulary_size * len(sources)) as shown:
        for tensor, source in sources:
          for index in range(target.num_partitions):
            rows = checkpoint.partition(tensor, source, target, index,
                                        shown.advance)
            staged.add_partition(tensor, checkpoint.shapes[tensor], target,
                                 index, rows)
            del rows
    return staged.commit()
