"""Re-laying out the embedding tables of a checkpoint (div <-> mod, shards).

A checkpoint of the host engine (or of a TPU run) stores each table and
each of its slots as one tensor whose rows are in the order of the
partitions that wrote it (`checkpoints` module doc): row order for `div`,
for `mod` over n partitions rows r % n == 0 first, and so on.
`convert_checkpoint` rewrites those tensors for another strategy and/or
number of shards, saved as the partitions a run with that layout saves
(one slice per partition), and copies every other tensor (global step,
dense weights, the dense optimizer's state) unchanged. A plain
`tf.compat.v1.train.Saver` or `estimator_spec.TPUEstimator` configured with
the target layout then restores the result directly.

Which tensors belong to a table: the table's own tensor (found from the
config model, see `locate_tables`) and every tensor named `<table
tensor>/...` with the same [vocabulary_size, dimension] shape (its slots,
whatever optimizer wrote them).

Memory: each stored partition of a table is read once and its rows are
scattered into the target partitions, which TensorFlow then saves without
copying them again; a conversion holds one table (or slot) plus one stored
partition of it (the whole tensor if it was saved unpartitioned). Other
tensors are copied in groups no larger than the largest table. Nothing is written to `output_prefix` until every tensor is
converted: the checkpoint is staged in a temporary directory next to it and
moved into place at the end (and the staging directory is removed on
error).
"""
import os
import shutil
import tempfile

import numpy as np
import tensorflow as tf

from estimator_spec.checkpoints import restore as checkpoints
from estimator_spec.checkpoints import progress as _progress
from estimator_spec.config import sharding
from estimator_spec.config import spec as _spec
from tpu_embedding_columns import _checks

_BLOCK_BYTES = 16 << 20  # rows scattered per step (bounds temporaries)
_MIN_GROUP_BYTES = 64 << 20  # other tensors saved together up to this size


# --- finding the checkpoint and the tables -----------------------------------


def resolve_checkpoint(path, owner="checkpoint"):
  """A checkpoint prefix from a model directory (its latest checkpoint) or a
  prefix. Raises FileNotFoundError when there is none."""
  path = os.fspath(_check_path(owner, "checkpoint", path))
  if os.path.isdir(path):
    latest = tf.train.latest_checkpoint(path)
    if latest is None:
      raise FileNotFoundError(
          f"{owner}: no checkpoint in directory {path!r} (it has no "
          "`checkpoint` state file naming one); train the model first or "
          "pass a checkpoint prefix such as model_dir/model.ckpt-100.")
    path = latest
  if not tf.io.gfile.exists(path + ".index"):
    raise FileNotFoundError(
        f"{owner}: {path!r} is neither a model directory nor a checkpoint "
        f"prefix ({path}.index does not exist).")
  return path


def _check_path(owner, arg, value):
  if not isinstance(value, (str, os.PathLike)):
    _checks.fail(owner, arg, "must be a path (str or os.PathLike)", value,
                 TypeError)
  if not os.fspath(value):
    _checks.fail(owner, arg, "must not be empty", value)
  return value


def check_spec(owner, spec):
  """The config model of `spec`, an EmbeddingConfigSpec."""
  if not isinstance(spec, _spec.EmbeddingConfigSpec):
    _checks.fail(owner, "spec", "must be an estimator_spec.EmbeddingConfigSpec",
                 spec, TypeError)
  return spec.model


def _check_variable_names(owner, model, variable_names):
  if variable_names is None:
    return {}
  if not isinstance(variable_names, dict):
    _checks.fail(owner, "variable_names",
                 "must be a dict {table name: checkpoint tensor name}",
                 variable_names, TypeError)
  unknown = sorted(set(variable_names) - set(model.tables))
  if unknown:
    raise ValueError(
        f"{owner}: `variable_names` names unknown tables {unknown}; the "
        f"spec's tables are {list(model.tables)}.")
  for table, name in variable_names.items():
    _checks.check_str(owner, f"variable_names[{table!r}]", name)
  return dict(variable_names)


def _name_matches(name, table):
  """Whether `name` is a name a CPU lookup of `table` gives its variable:
  `[<scope>/]<var name>` (shared columns, dict form) or
  `[<scope>/]<var name>_embedding/embedding_weights` (a column's own)."""
  base = table.embedding_var_name
  for tail in (base, f"{base}_embedding/embedding_weights"):
    if name == tail or name.endswith("/" + tail):
      return True
  return False


def locate_tables(reader, model, variable_names=None, owner="locate_tables"):
  """{table name: checkpoint tensor name} for every table of `model`.

  A table's tensor is the float32 [vocabulary_size, dimension] tensor whose
  name is the one a CPU lookup of the table gives its variable under any
  layer scope: `<scope>/<column name>/embedding_weights` for a column's own
  table (`input_layer/...`, `dense_features/...`, `sequence_features/...`),
  `[<scope>/]<shared collection name>` for shared columns, the table name
  for the dict form. `variable_names` ({table: tensor name}) settles a table
  whose tensor is missing or ambiguous. Raises ValueError listing the
  candidates otherwise.
  """
  explicit = _check_variable_names(owner, model, variable_names)
  shapes = reader.get_variable_to_shape_map()
  dtypes = reader.get_variable_to_dtype_map()
  found = {}
  for table_name, table in model.tables.items():
    shape = [table.vocabulary_size, table.dimension]
    if table_name in explicit:
      name = explicit[table_name]
      if name not in shapes:
        raise ValueError(
            f"{owner}: `variable_names[{table_name!r}]` is {name!r}, which is "
            "not a tensor of the checkpoint; tensors of shape "
            f"{shape}: {_same_shape(shapes, shape)}.")
      if list(shapes[name]) != shape or dtypes[name] != tf.float32:
        raise ValueError(
            f"{owner}: `variable_names[{table_name!r}]` is {name!r}, a "
            f"{dtypes[name].name} tensor of shape {shapes[name]}; table "
            f"{table_name!r} needs float32 {shape}.")
      found[table_name] = name
      continue
    candidates = sorted(
        name for name, s in shapes.items()
        if list(s) == shape and dtypes[name] == tf.float32 and
        _name_matches(name, table))
    if len(candidates) != 1:
      what = "no tensor" if not candidates else "several tensors"
      raise ValueError(
          f"{owner}: {what} of the checkpoint {'is' if not candidates else 'are'}"
          f" table {table_name!r} ({shape[0]} x {shape[1]}, variable name "
          f"ending in {table.embedding_var_name!r} or "
          f"'{table.embedding_var_name}_embedding/embedding_weights')"
          + (f": {candidates}" if candidates else "") +
          f". Tensors of shape {shape}: {_same_shape(shapes, shape)}. Pass "
          f"variable_names={{{table_name!r}: '<tensor name>'}} to choose.")
    found[table_name] = candidates[0]
  tensors = list(found.values())
  twice = sorted({n for n in tensors if tensors.count(n) > 1})
  if twice:
    raise ValueError(
        f"{owner}: tables {sorted(t for t, n in found.items() if n in twice)} "
        f"all resolve to checkpoint tensor(s) {twice}; pass variable_names "
        "to tell them apart.")
  return found


def _same_shape(shapes, shape):
  return sorted(n for n, s in shapes.items() if list(s) == shape)


def table_row_tensors(reader, model, table_tensors):
  """{table name: [its tensor, then every `<tensor>/...` tensor of the same
  shape (slots), sorted]}."""
  shapes = reader.get_variable_to_shape_map()
  result = {}
  for table_name, tensor in table_tensors.items():
    table = model.tables[table_name]
    shape = [table.vocabulary_size, table.dimension]
    slots = sorted(
        name for name, s in shapes.items()
        if name.startswith(tensor + "/") and list(s) == shape)
    result[table_name] = [tensor] + slots
  return result


# --- reading stored partitions -----------------------------------------------

def axis0_sizes(slice_shapes, full_shape):
  """Row counts of slices that tile axis 0, else None."""
  if not slice_shapes or any(
      len(s) != len(full_shape) or tuple(s[1:]) != tuple(full_shape[1:])
      for s in slice_shapes):
    return None
  sizes = [s[0] for s in slice_shapes]
  return sizes if sum(sizes) == full_shape[0] else None


def source_layout(model, table_name, tensor, stored, slice_shapes, strategy,
                  owner):
  """The `ShardLayout` a table tensor was written with (its partition count
  from the checkpoint, the strategy of the run that wrote it)."""
  table = model.tables[table_name]
  count = stored.get(tensor, 1)
  layout = sharding.ShardLayout(table.vocabulary_size, count, strategy)
  if layout.num_partitions != count:
    raise ValueError(
        f"{owner}: checkpoint tensor {tensor!r} (table {table_name!r}) is "
        f"stored in {count} partitions, more than its "
        f"{table.vocabulary_size} rows; it was not written by a "
        f"{strategy!r} layout.")
  if strategy == "mod" and count > 1:
    sizes = axis0_sizes(slice_shapes.get(tensor),
                         [table.vocabulary_size, table.dimension])
    if sizes is not None and tuple(sizes) != layout.sizes:
      raise ValueError(
          f"{owner}: checkpoint tensor {tensor!r} (table {table_name!r}) is "
          f"stored in partitions of {sizes} rows, not the 'mod' layout's "
          f"{list(layout.sizes)}; was it written with another "
          "partition_strategy? Pass the strategy of the run that wrote it.")
  return layout


def _slice_spec(full_shape, start, length):
  dims = " ".join(str(d) for d in full_shape)
  rest = ["-"] * (len(full_shape) - 1)
  return f"{dims} {':'.join([f'{start},{length}'] + rest)}"


def read_relaid(prefix, tensor, full_shape, dtype, source, target,
                stored_sizes=None, advance=None):
  """Reads a stored table tensor laid out by `source` and returns its rows
  laid out by `target`: a list of one array per target partition.

  `stored_sizes` are the row counts of the tensor's stored slices (None:
  stored whole). Each stored slice is read once and scattered into the
  target partitions, so memory is the target partitions plus one stored
  slice (the whole tensor when it is not partitioned).
  """
  full_shape = [int(d) for d in full_shape]
  rest = tuple(full_shape[1:])
  row_bytes = max(1, int(np.prod(rest, dtype=np.int64)) * dtype.size)
  chunk = max(1, _BLOCK_BYTES // row_bytes)
  parts = [aligned_empty((size,) + rest, dtype.as_numpy_dtype)
           for size in target.sizes]
  if stored_sizes is None or len(stored_sizes) < 2:
    blocks = [(0, full_shape[0], "")]
  else:
    offsets = np.cumsum([0] + list(stored_sizes[:-1]))
    blocks = [(int(o), int(n), _slice_spec(full_shape, int(o), int(n)))
              for o, n in zip(offsets, stored_sizes)]
  for start, size, spec in blocks:
    stored = tf.raw_ops.RestoreV2(prefix=prefix, tensor_names=[tensor],
                                  shape_and_slices=[spec], dtypes=[dtype])[0]
    rows = numpy_view(stored)
    ids = _stored_row_ids(source, start, size)
    for lo in range(0, size, chunk):
      hi = min(size, lo + chunk)
      partition, local = target.locate(ids[lo:hi])
      if target.num_partitions == 1:
        parts[0][local] = rows[lo:hi]
      else:
        block = rows[lo:hi]
        for p in np.unique(partition):
          chosen = partition == p
          parts[p][local[chosen]] = block[chosen]
      if advance is not None:
        advance(hi - lo)
    del rows, stored
  return parts


def _stored_row_ids(layout, start, size):
  """The row ids at stored positions [start, start + size) of a tensor
  stored in `layout`'s partition order."""
  ids = []
  for j in range(layout.num_partitions):
    lo = max(start, layout.offsets[j])
    hi = min(start + size, layout.offsets[j] + layout.sizes[j])
    if lo < hi:
      ids.append(layout.row_ids(j)[lo - layout.offsets[j]:
                                   hi - layout.offsets[j]])
  return np.concatenate(ids)


# --- zero-copy hand-over between NumPy and TensorFlow -----------------------

_ALIGNMENT = 64  # TensorFlow's CPU tensors need 64-byte aligned buffers


def aligned_empty(shape, dtype):
  """An uninitialized C-contiguous array whose buffer TensorFlow can adopt
  without a copy (see `as_tensor`)."""
  dtype = np.dtype(dtype)
  nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
  raw = np.empty(nbytes + _ALIGNMENT, np.uint8)
  offset = (-raw.ctypes.data) % _ALIGNMENT
  return raw[offset:offset + nbytes].view(dtype).reshape(shape)


def as_tensor(array):
  """An eager tensor of `array`, sharing its buffer when it is aligned (no
  second copy of a table), else copied."""
  if (array.size and array.flags.c_contiguous and
      array.ctypes.data % _ALIGNMENT == 0 and
      array.dtype.kind in "fiub"):
    return tf.experimental.dlpack.from_dlpack(array.__dlpack__())
  return tf.constant(array)


class _DLPackTensor:
  """A CPU eager tensor seen through the DLPack protocol."""

  def __init__(self, tensor):
    self._tensor = tensor

  def __dlpack__(self, stream=None):
    del stream
    return tf.experimental.dlpack.to_dlpack(self._tensor)

  def __dlpack_device__(self):
    return (1, 0)  # kDLCPU, device 0


def numpy_view(tensor):
  """A read-only NumPy view of a CPU eager tensor (a copy if the tensor's
  dtype has no DLPack form)."""
  try:
    return np.from_dlpack(_DLPackTensor(tensor))
  except (TypeError, ValueError, RuntimeError, BufferError,
          tf.errors.InvalidArgumentError):
    return tensor.numpy()


# --- writing -----------------------------------------------------------------


class StagedCheckpoint:
  """A checkpoint written piece by piece in a temporary directory next to
  `output_prefix` and moved into place by `commit()`.

  Refuses (FileExistsError) an `output_prefix` that already has checkpoint
  files. As a context manager, an error removes everything it wrote
  (including the output directory if it created it).
  """

  def __init__(self, output_prefix, owner):
    output_prefix = os.fspath(_check_path(owner, "output_prefix",
                                          output_prefix))
    self.owner = owner
    self.output_prefix = os.path.abspath(output_prefix)
    directory = os.path.dirname(self.output_prefix)
    if os.path.isdir(self.output_prefix):
      raise ValueError(
          f"{owner}: `output_prefix` {output_prefix!r} is a directory; give "
          "a checkpoint prefix inside it, e.g. "
          f"{os.path.join(output_prefix, 'model.ckpt')!r}.")
    existing = tf.io.gfile.glob(self.output_prefix + ".index") + (
        tf.io.gfile.glob(self.output_prefix + ".data-*"))
    if existing:
      raise FileExistsError(
          f"{owner}: a checkpoint already exists at {output_prefix!r} "
          f"({sorted(existing)}); choose another output prefix or remove it.")
    self._created_dir = None
    if not os.path.isdir(directory):
      missing = directory
      while not os.path.isdir(os.path.dirname(missing)):
        missing = os.path.dirname(missing)
      os.makedirs(directory)
      self._created_dir = missing
    self.directory = directory
    self._staging = tempfile.mkdtemp(prefix=".staging-",
                                     dir=self.directory)
    self._prefixes = []
    self.committed = False

  def save(self, names, slices, tensors):
    """Saves tensors (with `shape_and_slices` specs, '' = whole tensor)."""
    prefix = os.path.join(self._staging, f"piece-{len(self._prefixes):05d}")
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=list(names),
                      shape_and_slices=list(slices), tensors=list(tensors))
    self._prefixes.append(prefix)

  def commit(self):
    """Merges the pieces and moves the checkpoint to `output_prefix`; writes
    a `checkpoint` state file naming it when the directory has none."""
    merged = os.path.join(self._staging, "merged")
    tf.raw_ops.MergeV2Checkpoints(checkpoint_prefixes=self._prefixes,
                                  destination_prefix=merged,
                                  delete_old_dirs=False)
    data = sorted(tf.io.gfile.glob(merged + ".data-*"))
    for path in data:  # data files first: the index makes it a checkpoint
      os.replace(path, self.output_prefix + path[len(merged):])
    os.replace(merged + ".index", self.output_prefix + ".index")
    if not os.path.exists(os.path.join(self.directory, "checkpoint")):
      tf.compat.v1.train.update_checkpoint_state(
          self.directory, os.path.basename(self.output_prefix))
    self.committed = True
    shutil.rmtree(self._staging, ignore_errors=True)
    return self.output_prefix

  def abort(self):
    shutil.rmtree(self._staging, ignore_errors=True)
    if self._created_dir is not None:
      shutil.rmtree(self._created_dir, ignore_errors=True)

  def __enter__(self):
    return self

  def __exit__(self, exc_type, exc, tb):
    if exc_type is not None or not self.committed:
      self.abort()
    return False


def copy_tensors(reader, names, staged, slice_shapes, group_bytes):
  """Copies tensors unchanged (partitioned ones keep their row slices), in
  groups of at most `group_bytes` (one tensor may exceed it)."""
  shapes = reader.get_variable_to_shape_map()
  dtypes = reader.get_variable_to_dtype_map()
  group = ([], [], [])
  size = 0
  for name in names:
    dtype = dtypes[name]
    value = reader.get_tensor(name)
    nbytes = getattr(value, "nbytes", 0)
    if group[0] and size + nbytes > group_bytes:
      staged.save(*group)
      group, size = ([], [], []), 0
    full_shape = list(shapes[name])
    sizes = axis0_sizes(slice_shapes.get(name), full_shape)
    if sizes is None or len(sizes) < 2:
      pieces = [("", value)]
    else:
      offsets = np.cumsum([0] + sizes[:-1])
      pieces = [(_slice_spec(full_shape, int(o), s), value[o:o + s])
                for o, s in zip(offsets, sizes)]
    for spec, piece in pieces:
      group[0].append(name)
      group[1].append(spec)
      group[2].append(tf.constant(piece, dtype=dtype))
    size += nbytes
  if group[0]:
    staged.save(*group)


# --- conversion ----------------------------------------------------------------


def convert_checkpoint(spec, checkpoint, output_prefix, *, to_strategy,
                       to_shards, from_strategy=None, variable_names=None,
                       progress=False):
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
      what the checkpoint records (`checkpoints.LAYOUT_TENSOR`, written by
      this library's estimator and by this function), else the spec's
      `partition_strategy`. (The partition count is read from the
      checkpoint.)
    variable_names: optional {table name: checkpoint tensor name} for tables
      `locate_tables` cannot find unambiguously.
    progress: True for a progress bar per table on stderr, a text stream
      for one there, False/None for none.

  Returns:
    The written checkpoint prefix (absolute).

  Raises:
    FileNotFoundError: no checkpoint at `checkpoint`.
    FileExistsError: `output_prefix` already holds a checkpoint.
    ValueError, TypeError: bad arguments, or tables the checkpoint does not
      hold (nothing is written then).
  """
  owner = "convert_checkpoint"
  model = check_spec(owner, spec)
  if to_strategy not in sharding.STRATEGIES:
    _checks.fail(owner, "to_strategy", "must be 'div' or 'mod'", to_strategy)
  to_shards = _checks.check_int(owner, "to_shards", to_shards, minimum=1)
  if from_strategy is not None and from_strategy not in sharding.STRATEGIES:
    _checks.fail(owner, "from_strategy", "must be 'div', 'mod' or None",
                 from_strategy)
  bar = _progress.factory(progress)
  prefix = resolve_checkpoint(checkpoint, owner)
  reader = tf.compat.v1.train.NewCheckpointReader(prefix)
  recorded = checkpoints.recorded_strategy(reader)
  if from_strategy is None:
    from_strategy = recorded or model.partition_strategy
  elif recorded is not None and recorded != from_strategy:
    raise ValueError(
        f"{owner}: `from_strategy` is {from_strategy!r}, but the checkpoint "
        f"records that its tables were written with {recorded!r}; drop "
        "from_strategy (it is read from the checkpoint).")
  table_tensors = locate_tables(reader, model, variable_names, owner)
  row_tensors = table_row_tensors(reader, model, table_tensors)
  stored = checkpoints.stored_partitions(reader)
  slice_shapes = checkpoints.stored_slice_shapes(reader)
  shapes = reader.get_variable_to_shape_map()
  dtypes = reader.get_variable_to_dtype_map()
  plans = []
  for table_name, tensors in row_tensors.items():
    table = model.tables[table_name]
    target = sharding.ShardLayout(table.vocabulary_size, to_shards,
                                  to_strategy)
    sources = [
        source_layout(model, table_name, t, stored, slice_shapes,
                      from_strategy, owner) for t in tensors
    ]
    plans.append((table_name, table, target, list(zip(tensors, sources))))
  engine_names = {t for tensors in row_tensors.values() for t in tensors}
  others = sorted(set(shapes) - engine_names - {checkpoints.LAYOUT_TENSOR})
  largest = max((4 * t.vocabulary_size * t.dimension
                 for t in model.tables.values()), default=0)

  with StagedCheckpoint(output_prefix, owner) as staged:
    copy_tensors(reader, others, staged, slice_shapes,
                 max(largest, _MIN_GROUP_BYTES))
    staged.save([checkpoints.LAYOUT_TENSOR], [""], [tf.constant(to_strategy)])
    for table_name, table, target, sources in plans:
      label = f"{table_name} ({len(sources)} tensor{'s' * (len(sources) > 1)})"
      with bar(label, table.vocabulary_size * len(sources)) as shown:
        for tensor, source in sources:
          parts = read_relaid(
              prefix, tensor, shapes[tensor], dtypes[tensor], source, target,
              axis0_sizes(slice_shapes.get(tensor), shapes[tensor]),
              shown.advance)
          full = [table.vocabulary_size, table.dimension]
          if target.num_partitions == 1:
            slices = [""]
          else:
            slices = [_slice_spec(full, o, s)
                      for o, s in zip(target.offsets, target.sizes)]
          values = []
          while parts:  # hand each part to TF and drop the NumPy copy
            values.append(as_tensor(parts.pop(0)))
          staged.save([tensor] * len(values), slices, values)
          del values
    return staged.commit()
