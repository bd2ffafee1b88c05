"""Writing a serving SavedModel of a trained model (Estimator's
`export_saved_model`).

The serving graph is model_fn's PREDICT graph on the tensors of the
serving input receiver; its variables are restored from a checkpoint and
saved with the graph under the `serve` tag, one signature per export output
(`signatures.build_signature_defs`). The SavedModel is written to a
temporary sibling of `<export_dir_base>/<timestamp>` and renamed there once
complete, so that a reader never sees half an export.
"""
import os

import tensorflow as tf

from estimator_spec.estimator.framework import signatures


def checkpoint_to_export(model_dir, checkpoint_path, warm_start):
  """The checkpoint an export restores: the one named, else the latest of
  `model_dir`, else the warm-start checkpoint (Estimator's order)."""
  if checkpoint_path:
    return checkpoint_path
  latest = tf.train.latest_checkpoint(model_dir)
  if latest:
    return latest
  if warm_start is not None:
    path = warm_start.ckpt_to_initialize_from
    if tf.io.gfile.isdir(path):
      path = tf.train.latest_checkpoint(path)
    if path:
      return path
  raise ValueError(
      f"export_saved_model: no checkpoint to export in {model_dir}: train "
      "the model first, or pass checkpoint_path.")


def _graph_saver(scaffold):
  """The saver that restores the variables (the scaffold's, else one over
  every saveable variable, sharded as training writes them)."""
  saver = scaffold.saver
  if isinstance(saver, tf.train.Checkpoint):
    raise ValueError(
        "export_saved_model: the scaffold's saver is an object-based "
        "tf.train.Checkpoint; a serving graph restores name-based "
        "checkpoints (tf.compat.v1.train.Saver).")
  return saver or tf.compat.v1.train.Saver(sharded=True)


def add_serving_graph(builder, spec, receiver, checkpoint_path,
                      session_config, strip_default_attrs):
  """Restores the PREDICT graph's variables and adds graph and variables
  to `builder` (in the default graph, which holds `spec`)."""
  signature_defs = signatures.build_signature_defs(
      receiver.receiver_tensors, spec.export_outputs,
      getattr(receiver, "receiver_tensors_alternatives", None))
  local_init_op = (spec.scaffold.local_init_op if
                   spec.scaffold.local_init_op is not None else
                   tf.compat.v1.train.Scaffold.default_local_init_op())
  saver = _graph_saver(spec.scaffold)
  with tf.compat.v1.Session(config=session_config) as session:
    try:
      saver.restore(session, checkpoint_path)
    except tf.errors.NotFoundError as error:
      raise ValueError(
          "export_saved_model: the serving graph has variables that the "
          f"checkpoint {checkpoint_path} lacks; model_fn in PREDICT mode "
          "must not make variables training did not save. TF said: "
          f"{error.message}") from error
    builder.add_meta_graph_and_variables(
        session, [tf.saved_model.SERVING], signature_def_map=signature_defs,
        assets_collection=tf.compat.v1.get_collection(
            tf.compat.v1.GraphKeys.ASSET_FILEPATHS),
        main_op=local_init_op, saver=saver,
        strip_default_attrs=strip_default_attrs)


def copy_assets_extra(temp_dir, assets_extra):
  """Copies {relative destination: source path} under `assets.extra`."""
  base = os.path.join(tf.compat.as_bytes(temp_dir), b"assets.extra")
  for destination, source in (assets_extra or {}).items():
    target = os.path.join(base, tf.compat.as_bytes(destination))
    tf.io.gfile.makedirs(os.path.dirname(target))
    tf.io.gfile.copy(source, target)


def write(export_dir_base, add_graph, assets_extra, as_text):
  """Writes a SavedModel whose graph `add_graph(builder)` adds, into a new
  timestamped directory of `export_dir_base`; returns its path (bytes)."""
  export_dir = signatures.timestamped_export_dir(export_dir_base)
  temp_dir = signatures.temp_export_dir(export_dir)
  builder = tf.compat.v1.saved_model.Builder(temp_dir)
  add_graph(builder)
  builder.save(as_text)
  copy_assets_extra(temp_dir, assets_extra)
  tf.io.gfile.rename(temp_dir, export_dir)
  return export_dir
