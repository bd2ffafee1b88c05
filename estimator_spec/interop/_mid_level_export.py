"""`export_mid_level_checkpoint`: a TPUEstimator checkpoint for TF2's
mid-level TPU embedding API.

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

The TF2 side of the export: the spec must convert (`to_mid_level`), and the
checkpoint keys are those of the object graph TF2 itself saves for that
embedding, learnt from a small copy built with TF2's classes. Reading the
tables and slots and writing them in row order is the checkpoints layer's
(`estimator_spec.checkpoints.mid_level.write_mid_level_checkpoint`).
"""
import os
import shutil
import tempfile

import tensorflow as tf
from tensorflow.core.protobuf import trackable_object_graph_pb2

from estimator_spec.checkpoints import mid_level as checkpoint_writer
from estimator_spec.checkpoints import progress as progress_lib
from estimator_spec.checkpoints import tables
from estimator_spec.config import spec as spec_lib
from estimator_spec.interop import _mid_level
from tpu_embedding_columns import checks


def export_mid_level_checkpoint(model_dir, spec, output_prefix, *,
                                variable_names=None,
                                allow_missing_slots=False,
                                attribute="embedding", progress=False,
                                from_strategy=None, overwrite=False):
  """Writes a TPUEstimator checkpoint's tables and slots for TF2 (what
  and how: the module's doc).

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
  owner = "export_mid_level_checkpoint"
  model = spec_lib.model_of(owner, spec)
  allow_missing_slots = checks.check_bool(owner, "allow_missing_slots",
                                           allow_missing_slots)
  attribute = checks.check_str(owner, "attribute", attribute)
  if not attribute.isidentifier():
    checks.fail(owner, "attribute", "must be a Python identifier", attribute)
  tables.check_from_strategy(owner, from_strategy)
  overwrite = checks.check_bool(owner, "overwrite", overwrite)
  bar = progress_lib.factory(progress)
  # Refuses a spec TF2 cannot express before anything is read.
  _mid_level._build(spec, global_step=None, for_serving=True, owner=owner)
  return checkpoint_writer.write_mid_level_checkpoint(
      model_dir, model, output_prefix,
      lambda: _object_graph_keys(spec, attribute, owner), owner=owner,
      variable_names=variable_names, allow_missing_slots=allow_missing_slots,
      bar=bar, from_strategy=from_strategy, overwrite=overwrite)


def _object_graph_keys(spec, attribute, owner):
  """({variable full name: checkpoint key}, (names, slices, tensors) of the
  checkpoint's other entries) of `tf.train.Checkpoint(<attribute>=
  TPUEmbeddingForServing(...))`, from a one-row-per-table copy built and
  saved in a temporary directory."""
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
