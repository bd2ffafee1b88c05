"""Our checkpoint as TF's `TPUEstimator(use_tpu=False)` restores it.

On its CPU path TF 2.15's TPUEstimator makes every embedding table an
ordinary variable that the model's own (dense) optimizer trains. That
optimizer therefore wants slots for the tables that our checkpoints do not
hold: ours trains the tables with the spec's embedding optimizer, whose
slots have other names (`<table>/Adagrad` where the model's AdamOptimizer
looks for `<table>/Adam` and `<table>/Adam_1`), or none (SGD). TF's restore
then stops at the first missing one (`NotFoundError: Key
.../embedding_weights/Adam not found in checkpoint`).

`convert_for_tf_cpu` writes the checkpoint TF's CPU graph restores. It does
not guess that graph: it builds it, from the very estimator that will train
(its `model_fn`, `config` and `params`) and the training `input_fn`, in a
graph of its own (nothing runs the input pipeline). In that graph:

1. every variable whose name our checkpoint holds is restored from it by
   TF's own `Saver` (so variables the model partitions get their slices,
   and tables come in row order: checkpoints whose tables are stored in
   several `mod` partitions are first put in row order with
   `convert.convert_checkpoint`, which needs the spec). These variables
   are never initialized: each takes the buffer its value is read into,
   so the graph holds the tables once (memory: the checkpoint's state);
2. every other variable gets its initial value (TF's initializers: zeros
   for Adam's and Momentum's slots, `initial_accumulator_value` for
   Adagrad's, the optimizer's own values for its other variables such as
   Adam's `beta1_power` if the checkpoint lacks them);
3. TF's `Saver` (as Estimator configures it) saves the result as
   `<model_dir>/model.ckpt-<global step>` with a `checkpoint` state file.

Every trainable variable of TF's graph and the global step must come from
the checkpoint (a missing or differently shaped one means another model:
refused, naming it); only optimizer state may start at its initial value.
Tensors of ours TF's graph does not have (the spec's slots when the model's
optimizer is another one, the recorded partition strategy) are left out.
The result says which were copied, initialized and left out. Nothing is
written to `model_dir` until the checkpoint is complete: it is saved in a
staging directory inside `model_dir` and moved into place.
"""
import collections
import inspect
import os
import re
import shutil
import tempfile
from typing import Any, Callable, Optional, TypeAlias, Union

import tensorflow as tf

from estimator_spec.checkpoints import convert as _convert
from estimator_spec.checkpoints import tables
from estimator_spec.config import spec as spec_lib
from estimator_spec.tensor_types import Tensor, Variable

_OWNER = "convert_for_tf_cpu"
_PART = re.compile(r"/part_\d+$")
# The class attribute by which an estimator class says it restores our
# checkpoints as they are (estimator_spec's TPUEstimator sets it True);
# `convert_for_tf_cpu` refuses such an estimator. This layer does not
# import the estimator layer, which sits above it.
RESTORES_HOST_CHECKPOINTS = "restores_host_embedding_checkpoints"

# What an input_fn gives as features or labels: a tensor or a dict of them.
_Batch = Union[Tensor, dict[str, Tensor]]
# A variable of TF's graph to restore: itself, or its partitions.
_Restored = Union[Variable, list[Variable]]
# TF's estimator class, named in a string: reading the attribute would load
# TF's estimator package when this module loads.
_Estimator: TypeAlias = "tf.compat.v1.estimator.Estimator"

TfCpuCheckpoint = collections.namedtuple(
    "TfCpuCheckpoint", ["prefix", "copied", "initialized", "left_out"])
TfCpuCheckpoint.__doc__ = """What `convert_for_tf_cpu` wrote.

  prefix: the checkpoint prefix written (absolute).
  copied: sorted names taken from our checkpoint.
  initialized: sorted names TF's graph has and ours lacks, saved at their
    initial values (optimizer slots and state).
  left_out: sorted names of ours that TF's graph does not have.
"""


def convert_for_tf_cpu(
    estimator: _Estimator, input_fn: Callable[..., Any],
    checkpoint: tables.StrPath, *, batch_size: Optional[int] = None,
    model_dir: Optional[tables.StrPath] = None,
    spec: Optional[spec_lib.EmbeddingConfigSpec] = None,
    overwrite: bool = False) -> TfCpuCheckpoint:
  """Writes `checkpoint` (ours) as `estimator` (TF's CPU path) restores it.

  Args:
    estimator: the TF estimator that will train from the result, typically
      `tf.compat.v1.estimator.tpu.TPUEstimator(use_tpu=False, ...)` with
      the model_fn (TF's columns, or ours converted by
      `interop.to_tensorflow`). Its TRAIN graph is built (not run) to learn
      the variables it restores.
    input_fn: its training input_fn (called once to build the graph's
      features; it may take `params`, `config`, `mode`).
    checkpoint: our checkpoint: a model directory (its latest) or a prefix.
    batch_size: `params['batch_size']` for input_fn (TPUEstimator gives its
      `train_batch_size` there); None: not set.
    model_dir: where to write; default `estimator.model_dir`.
    spec: our `EmbeddingConfigSpec`; needed only when the checkpoint stores
      tables in several `mod` partitions (to put their rows in order).
    overwrite: replace the `checkpoint` state of a model_dir that already
      has a checkpoint (default: refuse).

  Returns:
    A `TfCpuCheckpoint`.

  Raises:
    TypeError: `estimator` is not a TF estimator, or is ours.
    FileNotFoundError: no checkpoint at `checkpoint`.
    FileExistsError: `model_dir` already holds a checkpoint (and not
      `overwrite`).
    ValueError: the checkpoint lacks (or has another shape for) a variable
      TF's graph trains, `mod` tables without `spec`, model_dir is the
      checkpoint's directory. Nothing is written then.
  """
  _check_estimator(estimator)
  source = tables.resolve_checkpoint(checkpoint, _OWNER)
  model_dir = _target_dir(source, model_dir or estimator.model_dir,
                          overwrite)
  created = not os.path.isdir(model_dir)
  os.makedirs(model_dir, exist_ok=True)
  staging = tempfile.mkdtemp(prefix=".staging-", dir=model_dir)
  try:
    rows = _row_order(source, spec, staging)
    result = _write(estimator, input_fn, batch_size, rows, staging)
    prefix = _move_into(staging, result[0], model_dir)
  except BaseException:
    shutil.rmtree(staging, ignore_errors=True)
    if created:
      shutil.rmtree(model_dir, ignore_errors=True)
    raise
  shutil.rmtree(staging, ignore_errors=True)
  return TfCpuCheckpoint(prefix, *result[1:])


def _target_dir(source: str, model_dir: tables.StrPath,
                overwrite: bool) -> str:
  """`model_dir` as an absolute path, checked: not the directory of the
  checkpoint `source`, and holding no checkpoint unless `overwrite`."""
  model_dir = os.path.abspath(os.fspath(model_dir))
  if os.path.abspath(os.path.dirname(source)) == model_dir:
    raise ValueError(
        f"{_OWNER}: `model_dir` {model_dir!r} holds the checkpoint to "
        "convert; write into another directory (the estimator's model_dir "
        "should be a new one).")
  existing = (tf.train.latest_checkpoint(model_dir)
              if os.path.isdir(model_dir) else None)
  if existing is not None and not overwrite:
    raise FileExistsError(
        f"{_OWNER}: `model_dir` {model_dir!r} already holds checkpoint "
        f"{os.path.basename(existing)!r}; use a new model_dir or pass "
        "overwrite=True.")
  return model_dir


def _check_estimator(estimator: object) -> None:
  if getattr(type(estimator), RESTORES_HOST_CHECKPOINTS, False) is True:
    raise TypeError(
        f"{_OWNER}: `estimator` is estimator_spec's TPUEstimator, which "
        "restores our checkpoints as they are; pass the TF estimator that "
        "will train (tf.compat.v1.estimator.tpu.TPUEstimator with "
        "use_tpu=False).")
  if not isinstance(estimator, tf.compat.v1.estimator.Estimator):
    raise TypeError(
        f"{_OWNER}: `estimator` must be a TF estimator "
        "(tf.compat.v1.estimator.tpu.TPUEstimator with use_tpu=False); got "
        f"{type(estimator).__name__}.")


def _row_order(source: str, spec: Optional[spec_lib.EmbeddingConfigSpec],
               staging: str) -> str:
  """A prefix holding `source` with every table in row order: `source`
  itself unless some tensor is stored in several `mod` partitions."""
  with tables.open_checkpoint(source, _OWNER) as opened:
    strategy = opened.strategy
    split = sorted(name for name in opened.shapes
                   if opened.partition_count(name) > 1)
  if not split:
    return source  # one partition: stored order is row order
  if spec is None:
    if strategy == "div":
      return source
    raise ValueError(
        f"{_OWNER}: checkpoint {source!r} stores {split[0]!r} (and "
        f"{len(split) - 1} more) in several partitions "
        f"{'of the mod strategy' if strategy else 'and does not record its strategy'}"
        "; pass `spec=` (the model's EmbeddingConfigSpec) so the tables' "
        "rows can be put in order.")
  return _convert.convert_checkpoint(
      spec, source, os.path.join(staging, "rows", "model.ckpt"),
      to_strategy="div", to_shards=1)


def _input(input_fn: Callable[..., Any],
           estimator: _Estimator,
           batch_size: Optional[int]) -> tuple[_Batch, Optional[_Batch]]:
  """(features, labels) of one call of input_fn, as TPUEstimator calls it."""
  accepted = inspect.signature(input_fn).parameters
  kwargs = {}
  if "params" in accepted:
    params = dict(estimator.params)
    if batch_size is not None:
      params["batch_size"] = batch_size
    kwargs["params"] = params
  if "config" in accepted:
    kwargs["config"] = estimator.config
  if "mode" in accepted:
    kwargs["mode"] = tf.estimator.ModeKeys.TRAIN
  result = input_fn(**kwargs)
  if isinstance(result, tf.data.Dataset):
    result = tf.compat.v1.data.make_one_shot_iterator(result).get_next()
  if isinstance(result, (tuple, list)) and len(result) == 2:
    return result[0], result[1]
  return result, None


def _write(estimator: _Estimator, input_fn: Callable[..., Any],
           batch_size: Optional[int], rows_prefix: str,
           staging: str) -> tuple[str, list[str], list[str], list[str]]:
  reader = tf.compat.v1.train.NewCheckpointReader(rows_prefix)
  ours = reader.get_variable_to_shape_map()
  ours_dtypes = reader.get_variable_to_dtype_map()
  graph = tf.Graph()
  with graph.as_default():
    tf.compat.v1.train.create_global_step()
    features, labels = _input(input_fn, estimator, batch_size)
    estimator.model_fn(features, labels, tf.estimator.ModeKeys.TRAIN,
                       estimator.config)
    wanted = _wanted(ours, ours_dtypes)
    saver = tf.compat.v1.train.Saver(sharded=True, allow_empty=True,
                                     save_relative_paths=True)
    restore = tf.compat.v1.train.Saver(var_list=wanted)
    # Restored, never initialized (module doc, 1).
    restored = {id(v) for v in tf.nest.flatten(list(wanted.values()))}
    initialize = tf.group(
        tf.compat.v1.variables_initializer(
            [v for v in tf.compat.v1.global_variables()
             if id(v) not in restored]),
        tf.compat.v1.local_variables_initializer(),
        tf.compat.v1.tables_initializer())
    with tf.compat.v1.Session(graph=graph) as session:
      restore.restore(session, rows_prefix)
      session.run(initialize)
      step = int(session.run(tf.compat.v1.train.get_global_step()))
      out = os.path.join(staging, "out")
      os.makedirs(out)
      prefix = saver.save(session, os.path.join(out, "model.ckpt"),
                          global_step=step, write_meta_graph=False,
                          write_state=False)
  written = tf.compat.v1.train.NewCheckpointReader(prefix)
  names = set(written.get_variable_to_shape_map())
  copied = sorted(names & set(wanted))
  initialized = sorted(names - set(wanted))
  left_out = sorted(set(ours) - set(wanted))
  return prefix, copied, initialized, left_out


def _wanted(ours: dict[str, list[int]],
            ours_dtypes: dict[str, tf.DType]) -> dict[str, _Restored]:
  """{name: variable, or its partitions} of the current graph's variables
  that our checkpoint (`ours`: its shapes, `ours_dtypes`) holds. Raises
  ValueError for one of another shape or dtype, and for a trainable
  variable or the global step it lacks."""
  trainable = {_PART.sub("", v.op.name)
               for v in tf.compat.v1.trainable_variables()}
  groups: dict[str, list[Variable]] = collections.OrderedDict()
  for variable in tf.compat.v1.global_variables():
    groups.setdefault(_PART.sub("", variable.op.name), []).append(variable)
  step_name = tf.compat.v1.train.get_global_step().op.name
  wanted: dict[str, _Restored] = {}
  for name, parts in groups.items():
    shape = _full_shape(parts)
    dtype = parts[0].dtype.base_dtype
    if name in ours:
      if list(ours[name]) != shape or ours_dtypes[name] != dtype:
        raise ValueError(
            f"{_OWNER}: TF's graph has {name!r} as {dtype.name} "
            f"{shape}, the checkpoint as {ours_dtypes[name].name} "
            f"{list(ours[name])}; is it the same model (vocabulary sizes, "
            "dimensions, table names)?")
      wanted[name] = parts[0] if len(parts) == 1 else parts
    elif name in trainable or name == step_name:
      similar = sorted(n for n, s in ours.items() if list(s) == shape)
      raise ValueError(
          f"{_OWNER}: the checkpoint has no tensor {name!r} ({dtype.name} "
          f"{shape}), which TF's graph trains; is it this model's "
          f"checkpoint? Tensors of that shape in it: {similar[:8]}.")
  return wanted


def _full_shape(parts: list[Variable]) -> list[int]:
  """The shape of a variable, or of the variable its partitions slice."""
  if len(parts) == 1:
    whole: list[int] = parts[0].shape.as_list()
    return whole
  shapes = [p.shape.as_list() for p in parts]
  axes = [a for a in range(len(shapes[0]))
          if len({s[a] for s in shapes}) > 1]
  axis = axes[0] if axes else 0
  full = list(shapes[0])
  full[axis] = sum(s[axis] for s in shapes)
  return full


def _move_into(staging: str, prefix: str, model_dir: str) -> str:
  """Moves the staged checkpoint files into model_dir (data files first,
  the index next, the state file last) and returns the new prefix."""
  base = os.path.basename(prefix)
  target = os.path.join(model_dir, base)
  tables.move_checkpoint(prefix, target)
  tf.compat.v1.train.update_checkpoint_state(model_dir, base)
  return target
