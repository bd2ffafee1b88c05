"""TPUEstimator checkpoints for TF2's mid-level TPU embedding API.

`export_mid_level_checkpoint` writes the tables and slots of a checkpoint
of this library's (or TF's) TPUEstimator as the object-based checkpoint
that `tf.tpu.experimental.embedding.TPUEmbedding` / `TPUEmbeddingForServing`
built from `estimator_spec.interop.to_mid_level(spec)` restore. Tables and
slots are found and read through `tables`; the object graph (which key each
variable has) is the one TF2 itself saves for that embedding.
"""
import os
import shutil
import tempfile

import tensorflow as tf

from estimator_spec.checkpoints import progress as _progress
from estimator_spec.checkpoints import tables
from estimator_spec.config import spec as spec_lib
from estimator_spec.config import sharding
from tpu_embedding_columns import checks


def object_name(table_name, slot=None):
  """The name under which TF2's `TPUEmbedding` / `TPUEmbeddingForServing`
  tracks a table's variable (`'<table>'`) or one of its slots
  (`'<table>/<slot>'`, `slot` being the slot's TF2 name, `SlotSpec.
  mid_level`: 'accumulators', 'momenta', ...). A `tf.train.Checkpoint`
  stores it under `<attribute>/<name, '/' escaped as '.S'>/.ATTRIBUTES/
  VARIABLE_VALUE`."""
  return table_name if slot is None else f"{table_name}/{slot}"


def object_names(model):
  """{object name: (table name, `SlotSpec` or None for the table)}: every
  variable TF2's mid-level classes track for the tables of `model` (a
  `config.model` EmbeddingModel), tables then their slots (the slots of the
  table's optimizer; none for SGD or a table without optimizer)."""
  names = {}
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


def export_mid_level_checkpoint(model_dir, spec, output_prefix, *,
                                variable_names=None,
                                allow_missing_slots=False,
                                attribute="embedding", progress=False,
                                from_strategy=None, overwrite=False):
  """Writes a TPUEstimator checkpoint's tables and slots for TF2.

  Reads the latest checkpoint of `model_dir` (or the checkpoint prefix
  given), puts each table's and slot's rows back into row order (`mod`
  tables are stored in partition order; the partition count comes from the
  checkpoint, the strategy from what the checkpoint records, else from
  `from_strategy`, else from the spec) and writes an object-based
  checkpoint that

      config = to_mid_level(spec, for_serving=True)
      embedding = tf.tpu.experimental.embedding.TPUEmbeddingForServing(
          config.feature_config, config.optimizer)
      tf.train.Checkpoint(embedding=embedding).restore(path)

  restores completely (`assert_consumed()` holds once the embedding is
  built): the tables, and the optimizer slots TF2 creates for them
  (Adagrad `accumulators`, Adam `momenta`/`velocities`, FTRL
  `accumulators`/`linears`, AdagradMomentum `accumulators`/`momenta`).
  The checkpoint holds the same object graph a `tf.train.Checkpoint` of
  that embedding saves (with `save_counter`). Memory: one table (or slot)
  in row order plus one stored partition of it at a time.

  Args:
    model_dir: a TPUEstimator model directory or a checkpoint prefix.
    spec: the `EmbeddingConfigSpec` the model was trained with.
    output_prefix: where to write (e.g. `export/embedding`); must not hold a
      checkpoint yet. Its directory gets a `checkpoint` state file naming it
      if it has none.
    variable_names: optional {table name: checkpoint tensor name} for tables
      whose tensor cannot be found unambiguously (see
      `estimator_spec.checkpoints.tables.locate_tables`).
    allow_missing_slots: a checkpoint without a table's slots (e.g. written
      by TF's CPU path) is refused unless True; then the slots get their
      initial values.
    attribute: the name of the embedding object in the restoring
      `tf.train.Checkpoint(...)` (default 'embedding').
    progress: True for a progress bar per table on stderr, a text stream
      for one there, False/None for none.
    from_strategy: 'div' or 'mod', the strategy the checkpoint was written
      with, for a checkpoint that does not record it (TF's own); default
      the spec's `partition_strategy`. Refused when the checkpoint records
      another.
    overwrite: replace a checkpoint already at `output_prefix` (once the
      new one is complete) instead of refusing.

  Returns:
    The written checkpoint prefix (absolute).

  Raises:
    FileNotFoundError: no checkpoint in `model_dir`.
    FileExistsError: `output_prefix` already holds a checkpoint and
      `overwrite` is False.
    ValueError, TypeError: the spec does not convert (see `to_mid_level`),
      a table or slot is not in the checkpoint, or bad arguments. Nothing
      is written then.
  """
  from estimator_spec.interop import _mid_level  # pylint: disable=import-outside-toplevel
  owner = "export_mid_level_checkpoint"
  model = spec_lib.model_of(owner, spec)
  allow_missing_slots = checks.check_bool(owner, "allow_missing_slots",
                                           allow_missing_slots)
  attribute = checks.check_str(owner, "attribute", attribute)
  if not attribute.isidentifier():
    checks.fail(owner, "attribute", "must be a Python identifier",
                 attribute)
  tables.check_from_strategy(owner, from_strategy)
  overwrite = checks.check_bool(owner, "overwrite", overwrite)
  bar = _progress.factory(progress)
  _mid_level._build(spec, global_step=None, for_serving=True, owner=owner)
  with tables.open_checkpoint(model_dir, owner) as checkpoint:
    written_strategy = tables.written_strategy(checkpoint, model,
                                               from_strategy, owner)
    return _export(spec, model, checkpoint, output_prefix, variable_names,
                   allow_missing_slots, attribute, bar, owner,
                   written_strategy, overwrite)


def _export(spec, model, checkpoint, output_prefix, variable_names,
            allow_missing_slots, attribute, bar, owner, written_strategy,
            overwrite):
  table_tensors = tables.locate_tables(checkpoint, model, variable_names,
                                       owner)
  plans = []
  missing = []
  for name, tensor in table_tensors.items():
    table = model.tables[name]
    parameters = model.optimizer_for(name)
    slots = []
    if parameters is not None:
      for slot in parameters.slot_specs():
        source = slot.variable_name(tensor)
        shape = [table.vocabulary_size, table.dimension]
        if checkpoint.shapes.get(source) != shape:
          missing.append(source)
          source = None
        slots.append((slot.mid_level, source, slot.initial_value))
    plans.append((name, table, tensor, slots))
  if missing and not allow_missing_slots:
    raise ValueError(
        f"{owner}: the checkpoint {checkpoint.prefix} has no slot tensors "
        f"{missing} (written by a run whose optimizer had no such slots?); "
        "pass allow_missing_slots=True (command line: --allow-missing-slots) "
        "to export them at their initial values.")

  keys, extra = _object_graph_keys(spec, attribute, owner)
  expected = set(object_names(model))
  if set(keys) != expected:
    raise RuntimeError(
        f"Internal error: TPUEmbeddingForServing checkpoints variables "
        f"{sorted(keys)}, expected {sorted(expected)}.")

  with tables.StagedCheckpoint(output_prefix, owner, overwrite) as staged:
    staged.save(*extra)
    for name, table, tensor, slots in plans:
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
            rows, = checkpoint.relaid(source, layout, row_order,
                                      shown.advance)
            value = tables.as_tensor(rows)
            del rows
          staged.save([key], [""], [value])
          del value
    return staged.commit()


def _object_graph_keys(spec, attribute, owner):
  """({variable full name: checkpoint key}, (names, slices, tensors) of the
  checkpoint's other entries) of `tf.train.Checkpoint(<attribute>=
  TPUEmbeddingForServing(...))`, from a one-row-per-table copy built and
  saved in a temporary directory."""
  from tensorflow.core.protobuf import trackable_object_graph_pb2  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  from estimator_spec.interop import _mid_level  # pylint: disable=import-outside-toplevel
  with tf.init_scope():
    if not tf.executing_eagerly():
      raise RuntimeError(
          f"{owner} needs eager execution (TF2 behaviour); it was called "
          "with eager execution disabled.")
    small = _mid_level._build(spec, global_step=None, for_serving=True,
                              owner=owner, skeleton=True)
    embedding = tf.tpu.experimental.embedding.TPUEmbeddingForServing(
        small.feature_config, small.optimizer)
    embedding.build()
    scratch = tempfile.mkdtemp(prefix="mid_level_graph_")
    try:
      path = tf.train.Checkpoint(**{attribute: embedding}).save(
          os.path.join(scratch, "graph"))
      reader = tf.train.load_checkpoint(path)
      graph = trackable_object_graph_pb2.TrackableObjectGraph()
      graph.ParseFromString(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
      keys = {}
      for node in graph.nodes:
        for attr in node.attributes:
          if attr.checkpoint_key.startswith(attribute + "/"):
            keys[attr.full_name] = attr.checkpoint_key
      owned = set(keys.values())
      names, slices, tensors = [], [], []
      for key in sorted(reader.get_variable_to_shape_map()):
        if key not in owned:
          names.append(key)
          slices.append("")
          tensors.append(tf.constant(reader.get_tensor(key)))
      return keys, (names, slices, tensors)
    finally:
      shutil.rmtree(scratch, ignore_errors=True)
