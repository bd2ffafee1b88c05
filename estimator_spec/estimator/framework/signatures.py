"""The signatures and the directory of a serving export (Estimator's
`export_saved_model`), as TF 2.15's Estimator makes them.

`export_outputs_for_predictions` settles the export outputs a PREDICT
`EstimatorSpec` keeps: a `PredictOutput` of the predictions when model_fn
gives none, and a `serving_default` entry for a lone output.
`build_signature_defs` turns them into the SavedModel's SignatureDefs, one
per export output and receiver (the default receiver tensors, then each
alternative, named '<alternative>:<output>'), leaving out, with a warning,
those that cannot be served: a Classify or Regress signature not fed one
string tensor, an output that needs a placeholder the signature does not
feed, a SignatureDef TensorFlow Serving would refuse.
`timestamped_export_dir` and `temp_export_dir` name the export's directory
(`<base>/<seconds since the epoch>`) and the sibling it is written in first
(`<base>/temp-<seconds>`).
"""
import os
import time

import tensorflow as tf

from estimator_spec.estimator.framework import export

DEFAULT_SERVING_KEY = tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY

# Joins an alternative receiver's name and an export output's name.
ALTERNATIVE_SEPARATOR = ":"

# How many seconds timestamped_export_dir tries before giving up.
MAX_EXPORT_DIR_ATTEMPTS = 10


def export_outputs_for_predictions(export_outputs, predictions):
  """The export outputs of a PREDICT spec, defaulted and checked.

  Args:
    export_outputs: None, or {signature name: `export.ExportOutput`}.
    predictions: the spec's predictions (a tensor or a dict of tensors),
      served by a `PredictOutput` when `export_outputs` is None.

  Returns:
    A new dict of signature name to `ExportOutput`, holding a
    'serving_default' entry when there is one output (or none at all).

  Raises:
    TypeError: if `export_outputs` is not a dict or a value is not an
      `ExportOutput`.
    ValueError: if there are several outputs and none is 'serving_default',
      or the default `PredictOutput` refuses `predictions`.
  """
  if export_outputs is None:
    return {DEFAULT_SERVING_KEY: export.PredictOutput(predictions)}
  if not isinstance(export_outputs, dict):
    raise TypeError(
        "EstimatorSpec: `export_outputs` must be a dict of signature name to "
        "an ExportOutput (PredictOutput, ClassificationOutput or "
        f"RegressionOutput); got {export_outputs!r}.")
  for name, output in export_outputs.items():
    if not isinstance(output, export.ExportOutput):
      raise TypeError(
          f"EstimatorSpec: `export_outputs`[{name!r}] must be an ExportOutput "
          "(PredictOutput, ClassificationOutput or RegressionOutput); got "
          f"{output!r}.")
  outputs = dict(export_outputs)
  if len(outputs) == 1:
    outputs[DEFAULT_SERVING_KEY] = next(iter(export_outputs.values()))
  elif len(outputs) > 1 and DEFAULT_SERVING_KEY not in outputs:
    raise ValueError(
        f"EstimatorSpec: `export_outputs` has several outputs "
        f"({list(outputs)}) and none is the default; name the one a server "
        f"uses by default {DEFAULT_SERVING_KEY!r} "
        "(tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY).")
  return outputs


def build_signature_defs(receiver_tensors, export_outputs,
                         receiver_tensors_alternatives=None):
  """The serving SignatureDefs of an export, by signature name.

  Each export output is served from `receiver_tensors` under its own name,
  and from each alternative under '<alternative name>:<output name>'. A
  signature that cannot be served is left out, with a warning.

  Args:
    receiver_tensors: a tensor (named 'input') or {name: tensor}, fed by
      default.
    export_outputs: {name: `export.ExportOutput`}.
    receiver_tensors_alternatives: None, or {alternative name: a tensor or
      a dict of tensors}.

  Returns:
    {signature name: `SignatureDef` proto}.

  Raises:
    ValueError: if `export_outputs` is not a dict.
  """
  if not isinstance(export_outputs, dict):
    raise ValueError(
        "build_signature_defs: `export_outputs` must be a dict of name to "
        f"ExportOutput; got {export_outputs!r}.")
  receivers = [("", receiver_tensors)] + [
      (f"{name or 'None'}{ALTERNATIVE_SEPARATOR}", tensors)
      for name, tensors in (receiver_tensors_alternatives or {}).items()
  ]
  signature_defs, left_out = {}, {}
  for prefix, tensors in receivers:
    inputs = export.receiver_dict(tensors)
    for output_key, export_output in export_outputs.items():
      name = f"{prefix}{output_key or 'None'}"
      try:
        signature_defs[name] = _servable_signature(export_output, inputs)
      except ValueError as error:
        left_out[name] = str(error)
  _log_signatures(signature_defs, left_out)
  return signature_defs


def _servable_signature(export_output, inputs):
  """`export_output`'s SignatureDef fed `inputs`; ValueError when a server
  could not serve it."""
  signature = export_output.as_signature_def(inputs)
  _check_fed(inputs.values(), signature)
  if not tf.compat.v1.saved_model.is_valid_signature(signature):
    raise ValueError(
        f"TensorFlow Serving does not serve this {signature.method_name!r} "
        f"signature (its inputs {sorted(signature.inputs)}, its outputs "
        f"{sorted(signature.outputs)}, their dtypes).")
  return signature


def _check_fed(inputs, signature):
  """Raises ValueError if `signature`'s outputs depend on a placeholder
  that its `inputs` do not feed (the walk back from the outputs stops at
  the fed tensors; control dependencies are not followed)."""
  fed = tf.nest.flatten(list(inputs), expand_composites=True)
  graph = fed[0].graph if fed else tf.compat.v1.get_default_graph()
  outputs = tf.nest.flatten(
      [tf.compat.v1.saved_model.get_tensor_from_tensor_info(info, graph)
       for info in signature.outputs.values()],
      expand_composites=True)
  fed_refs = {tensor.ref() for tensor in fed}
  stack, seen = [tensor.op for tensor in outputs], set()
  while stack:
    op = stack.pop()
    if op in seen:
      continue
    seen.add(op)
    if op.type == "Placeholder" and not all(
        tensor.ref() in fed_refs for tensor in op.outputs):
      raise ValueError(
          f"its outputs {sorted(signature.outputs)} depend on the "
          f"placeholder {op.name!r}, which its inputs "
          f"{[tensor.name for tensor in fed]} do not feed.")
    stack.extend(tensor.op for tensor in op.inputs
                 if tensor.ref() not in fed_refs)


def _log_signatures(signature_defs, left_out):
  """Logs the signatures kept (info) and those left out (warnings)."""
  for name, reason in left_out.items():
    tf.compat.v1.logging.warning(
        "Export: the signature %r is left out, as it cannot be served: %s",
        name, reason)
  tf.compat.v1.logging.info(
      "Export: signatures %s.",
      ", ".join(f"{name!r} ({signature.method_name})"
                for name, signature in signature_defs.items()) or "none")
  if not signature_defs:
    tf.compat.v1.logging.warning("Export: the SavedModel has no signature.")
  elif DEFAULT_SERVING_KEY not in signature_defs:
    tf.compat.v1.logging.warning(
        "Export: the SavedModel has no default signature (%r).",
        DEFAULT_SERVING_KEY)


def timestamped_export_dir(export_dir_base):
  """A new export directory's path: `<export_dir_base>/<seconds since the
  epoch>`, as bytes (not created).

  While that directory exists (another export in the same second), waits a
  second and takes the next timestamp.

  Raises:
    RuntimeError: if every timestamp of MAX_EXPORT_DIR_ATTEMPTS seconds is
      taken.
  """
  base = tf.compat.as_bytes(os.fspath(export_dir_base))
  for attempt in range(1, MAX_EXPORT_DIR_ATTEMPTS + 1):
    export_dir = tf.io.gfile.join(base, b"%d" % int(time.time()))
    if not tf.io.gfile.exists(export_dir):
      return export_dir
    tf.compat.v1.logging.warning(
        "Export: %s exists; trying the next second (attempt %d of %d).",
        tf.compat.as_str(export_dir), attempt, MAX_EXPORT_DIR_ATTEMPTS)
    if attempt < MAX_EXPORT_DIR_ATTEMPTS:
      time.sleep(1)
  raise RuntimeError(
      f"Export: no free timestamped directory in {tf.compat.as_str(base)} "
      f"after {MAX_EXPORT_DIR_ATTEMPTS} attempts, one a second; is another "
      "process exporting there continuously?")


def temp_export_dir(export_dir):
  """The sibling `temp-<name>` of `export_dir` an export is written to
  before it is renamed, as bytes (TensorFlow Serving ignores it, its name
  not being a number)."""
  parent, name = os.path.split(tf.compat.as_bytes(os.fspath(export_dir)))
  return tf.io.gfile.join(parent, b"temp-" + name)
