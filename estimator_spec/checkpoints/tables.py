"""Tables and slots of a checkpoint: find them, read their rows partition by
partition, write them in a layout.

Restoring into a run of another layout (`restore`), offline conversion
(`convert`) and the TF2 mid-level export (`mid_level`) all go through here.

Stored order: a table's tensor (and each of its slots') holds the rows in
the order of the partitions that wrote it: row order for `div` and for one
partition; for `mod` over n partitions the rows r with r % n == 0 first,
then r % n == 1, and so on. A partitioned variable is saved as slices along
axis 0, one per partition. Names, shapes and dtypes come from TensorFlow's
checkpoint reader (its maps); the slices from the checkpoint's `.index`
(`bundle_index`); the strategy that wrote the tables from the string tensor
`LAYOUT_TENSOR`, which this library's checkpoints hold.

Reading: `Checkpoint.read_rows` reads stored rows [start, stop) of a
tensor. TF's `RestoreV2` (run in a private graph and session, so it works
with and without eager execution) loads a whole stored slice to give any
part of it, and checks the slice's CRC32C as it does. So a stored slice of
at most one block (`_BLOCK_BYTES`) is read through TF; from a bigger one of
a numeric dtype only the rows asked for are read, straight from the data
file where the checkpoint's index (`bundle_index`) says its bytes are.
Before the first such read, the slice's bytes are checked against the
CRC32C its index entry records, as TF's reader checks them: read one block
at a time (google_crc32c), never the whole slice at once, once per slice
and `Checkpoint` (the verdict is kept); a mismatch is a ValueError naming
the checkpoint, the tensor and the slice's rows. So every byte a table is
read from has been checked, whichever path read it.

`Checkpoint.partition` fills one partition of a target `ShardLayout`, and
`Checkpoint.rows_by_id` the rows of given ids, one block of rows at a time:
each block's rows are read in windows of at most one block, each from a row
asked for to a row asked for in one stored slice. Memory is the result plus
about two blocks. A stored slice is read once per target partition that
needs rows from it, plus once for its checksum when read from its data
file: once in all when the target keeps the stored order
(same strategy and partitions, or `div` to `div`) or is `div` and the
source `mod`, up to the target's partition count of times for a `mod`
target of a `div` source.

Writing: `StagedCheckpoint` writes a checkpoint piece by piece in a staging
directory and moves it into place once complete; `save_partition` saves one
partition of a tensor as the slice a run of a given layout saves;
`copy_tensors` copies tensors unchanged, slices included. TF's `SaveV2`
writes each tensor (or slice) it is given as one piece with one checksum,
from one buffer: each saved piece is in memory whole while it is written.
"""
import glob
import io
import os
import shutil
import stat
import sys
import tempfile
from types import TracebackType
from typing import (Any, Callable, Collection, Iterable, Iterator, Literal,
                    Mapping, Optional, Protocol, Sequence, Union)

import google_crc32c
import numpy as np
import numpy.typing as npt
import tensorflow as tf

from estimator_spec import files
from estimator_spec.checkpoints import bundle_index
from estimator_spec.config import model as model_lib
from estimator_spec.config import sharding
from estimator_spec.tensor_types import Tensor
from tpu_embedding_columns import checks

LAYOUT_TENSOR = "estimator_spec/partition_strategy"

# A path argument: a str or an `os.PathLike` of one.
StrPath = Union[str, os.PathLike[str]]
# Rows of a tensor read from (or written to) a checkpoint, in NumPy.
Rows = npt.NDArray[Any]
# A whole tensor as TF's checkpoint reader gives it: an array, or a scalar
# (NumPy's, or bytes for a string).
Value = Union[npt.NDArray[Any], np.generic, bytes]
# (start row, rows) of each slice a tensor was saved in, in row order.
RowSlices = tuple[tuple[int, int], ...]

# Rows read, and moved per NumPy step, at a time (bounds temporaries); a
# stored slice no bigger is read whole through TF.
_BLOCK_BYTES = 16 << 20
# Tensors saved together (`StagedCheckpoint.add`) up to this size.
GROUP_BYTES = 64 << 20
_ALIGNMENT = 64  # TensorFlow's CPU tensors need 64-byte aligned buffers


# --- arguments and opening -----------------------------------------------------


def _check_path(owner: str, arg: str, value: StrPath) -> StrPath:
  if not isinstance(value, (str, os.PathLike)):
    checks.fail(owner, arg, "must be a path (str or os.PathLike)", value,
                 TypeError)
  if not os.fspath(value):
    checks.fail(owner, arg, "must not be empty", value)
  return value


def resolve_checkpoint(path: StrPath, owner: str = "checkpoint") -> str:
  """A checkpoint prefix from a model directory (its latest checkpoint) or a
  prefix. Raises FileNotFoundError when there is none."""
  path = os.fspath(_check_path(owner, "checkpoint", path))
  if os.path.isdir(path):
    path = _latest_in_directory(path, owner)
  if not tf.io.gfile.exists(path + ".index"):
    raise FileNotFoundError(
        f"{owner}: {path!r} is neither a model directory nor a checkpoint "
        f"prefix ({path}.index does not exist).")
  _check_regular_files(path, owner)
  return path


def _check_regular_files(prefix: str, owner: str) -> None:
  """Raises ValueError when a local checkpoint's index or data file is
  not a regular file (a FIFO or a device, which TensorFlow's reader would
  wait on for ever)."""
  if "://" in prefix:
    return
  for name in [prefix + ".index"] + sorted(glob.glob(
      glob.escape(prefix) + ".data-*")):
    try:
      mode = os.stat(name).st_mode
    except OSError:
      continue  # TensorFlow's reader says what is wrong with it
    if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
      raise ValueError(
          f"{owner}: the checkpoint file {name} is not a regular file (a "
          "FIFO or a device), which TensorFlow would wait on; put the "
          "checkpoint's own file there.")


# The largest `checkpoint` state file read (it lists the kept checkpoints).
MAX_STATE_FILE_BYTES = 2**20


def _latest_in_directory(directory: str, owner: str) -> str:
  """The checkpoint prefix the model directory's `checkpoint` state file
  names; FileNotFoundError saying which is missing: the state file, or
  the checkpoint it names (or why the state file cannot be read)."""
  state_path = os.path.join(directory, "checkpoint")
  advice = ("train the model first or pass a checkpoint prefix such as "
            "model_dir/model.ckpt-100.")
  try:
    files.read_bytes(state_path, MAX_STATE_FILE_BYTES).decode("utf-8")
  except UnicodeDecodeError:
    raise FileNotFoundError(
        f"{owner}: the `checkpoint` state file of {directory!r} cannot be "
        f"read (it is not UTF-8 text); {advice}") from None
  except FileNotFoundError:
    raise FileNotFoundError(
        f"{owner}: no checkpoint in directory {directory!r} (it has no "
        f"`checkpoint` state file naming one); {advice}") from None
  except (files.FileRejected, OSError) as error:
    reason = error.strerror if isinstance(error, OSError) and (
        error.strerror) else str(error)
    raise FileNotFoundError(
        f"{owner}: the `checkpoint` state file of {directory!r} cannot be "
        f"read ({reason}); {advice}") from None
  try:
    state = tf.train.get_checkpoint_state(directory)
  except (ValueError, tf.errors.OpError):  # e.g. an empty state file
    state = None
  if state is None or not state.model_checkpoint_path:
    raise FileNotFoundError(
        f"{owner}: the `checkpoint` state file of {directory!r} names no "
        f"checkpoint (it is empty or not a checkpoint state); {advice}")
  prefix: str = state.model_checkpoint_path
  if not tf.io.gfile.exists(prefix + ".index"):
    raise FileNotFoundError(
        f"{owner}: the `checkpoint` state file of {directory!r} names "
        f"{prefix!r}, which does not exist ({prefix}.index is missing); "
        "restore the checkpoint's files, or pass the prefix of one that "
        "exists.")
  return prefix


def open_checkpoint(path: StrPath,
                    owner: str = "checkpoint") -> "Checkpoint":
  """A `Checkpoint` of a model directory (its latest) or a prefix."""
  return Checkpoint(resolve_checkpoint(path, owner))


class TensorReader(Protocol):
  """What `recorded_strategy` reads: TF's `NewCheckpointReader`, or a
  `Checkpoint`."""

  def has_tensor(self, name: str) -> bool:
    ...

  def get_tensor(self, name: str) -> Value:
    ...


def recorded_strategy(reader: TensorReader) -> Optional[str]:
  """The partition strategy a checkpoint records ('div'/'mod'), or None.
  `reader`: a `tf.compat.v1.train.NewCheckpointReader` or a `Checkpoint`."""
  if not reader.has_tensor(LAYOUT_TENSOR):
    return None
  stored = reader.get_tensor(LAYOUT_TENSOR)
  value = (stored.decode("utf-8") if isinstance(stored, bytes) else
           str(stored))
  if value not in sharding.STRATEGIES:
    raise ValueError(
        f"Checkpoint tensor {LAYOUT_TENSOR!r} holds {value!r}, not a "
        f"partition strategy {sharding.STRATEGIES}.")
  return value


def check_from_strategy(owner: str,
                        from_strategy: Optional[str]) -> Optional[str]:
  """`from_strategy` ('div', 'mod' or None); ValueError naming `owner`
  otherwise."""
  if from_strategy is not None and from_strategy not in sharding.STRATEGIES:
    checks.fail(owner, "from_strategy", "must be 'div', 'mod' or None",
                 from_strategy)
  return from_strategy


def written_strategy(checkpoint: "Checkpoint", model: model_lib.EmbeddingModel,
                     from_strategy: Optional[str], owner: str) -> str:
  """The partition strategy a `Checkpoint`'s tables were written with: the
  one it records, else `from_strategy` (the caller's word), else the
  model's. Raises ValueError when `from_strategy` contradicts the record."""
  recorded = checkpoint.strategy
  if from_strategy is None:
    return recorded or model.partition_strategy
  if recorded is not None and recorded != from_strategy:
    raise ValueError(
        f"{owner}: `from_strategy` is {from_strategy!r}, but the checkpoint "
        f"records that its tables were written with {recorded!r}; drop "
        "from_strategy (command line: --from-strategy): it is read from the "
        "checkpoint.")
  return from_strategy


def stored_partitions(
    checkpoint: Union["Checkpoint", StrPath]) -> dict[str, int]:
  """{tensor name: number of slices it was saved in} (1 when saved whole)
  of a `Checkpoint`, a checkpoint prefix or a model directory."""
  if isinstance(checkpoint, Checkpoint):
    return {name: checkpoint.partition_count(name)
            for name in checkpoint.shapes}
  with open_checkpoint(checkpoint, "stored_partitions") as opened:
    return stored_partitions(opened)


# --- reading -------------------------------------------------------------------


class Checkpoint:
  """A checkpoint opened for reading tables and slots.

  Attributes:
    prefix: the checkpoint prefix.
    reader: TF's `NewCheckpointReader` of it.
    shapes: {tensor name: shape as a list of ints}.
    dtypes: {tensor name: tf.DType}.

  Use it as a context manager, or call `close()`: reading rows holds a
  small TF session.
  """

  def __init__(self, prefix: StrPath) -> None:
    self.prefix = os.fspath(prefix)
    # Training's restore reads here too: a FIFO is refused, not waited on.
    _check_regular_files(self.prefix, "checkpoint")
    self.reader = tf.compat.v1.train.NewCheckpointReader(self.prefix)
    self.shapes: dict[str, list[int]] = {
        name: [int(d) for d in shape] for name, shape in
        self.reader.get_variable_to_shape_map().items()}
    self.dtypes: dict[str, tf.DType] = (
        self.reader.get_variable_to_dtype_map())
    # What the index says of the tensors, read when needed.
    self._bundle: Optional[bundle_index.Bundle] = None
    self._files: dict[str, Any] = {}  # {data file: open GFile}
    # The stored slices whose bytes had the CRC32C the index records.
    self._checked: set[bundle_index.Location] = set()
    # A private session running RestoreV2.
    self._session: Optional[tf.compat.v1.Session] = None
    # Its feeds (prefix, tensor names, slice specs), made with it by the
    # first read.
    self._feeds: tuple[Tensor, Tensor, Tensor]
    self._restores: dict[tf.DType, Tensor] = {}  # {dtype: RestoreV2 output}

  # Reader-like access (`recorded_strategy` takes either).
  def has_tensor(self, name: str) -> bool:
    return name in self.shapes

  def get_tensor(self, name: str) -> Value:
    """The whole tensor `name` (NumPy)."""
    value: Value = self.reader.get_tensor(name)
    return value

  @property
  def strategy(self) -> Optional[str]:
    """The strategy this checkpoint records for its tables, or None."""
    return recorded_strategy(self)

  def _index(self) -> bundle_index.Bundle:
    if self._bundle is None:
      self._bundle = bundle_index.read_bundle(self.prefix)
    return self._bundle

  def _saved_slices(self) -> dict[str, tuple[bundle_index.Slice, ...]]:
    return self._index().slices

  def partition_count(self, name: str) -> int:
    """How many slices tensor `name` was saved in (1: saved whole)."""
    slices = self._saved_slices().get(name)
    return 1 if slices is None else len(slices)

  def row_slices(self, name: str) -> Optional[RowSlices]:
    """((start row, rows), ...) of the slices tensor `name` was saved in,
    in row order: ((0, rows),) when saved whole; None for a scalar or when
    the slices do not split axis 0 alone."""
    shape = self.shapes[name]
    if not shape:
      return None
    slices = self._saved_slices().get(name)
    if slices is None:
      return ((0, shape[0]),)
    rest = [(0, size) for size in shape[1:]]
    start = 0
    for extents in slices:
      if extents[0][0] != start or list(extents[1:]) != rest:
        return None
      start += extents[0][1]
    if start != shape[0]:
      return None
    return tuple(extents[0] for extents in slices)

  def written_layout(self, name: str, table: model_lib.Table, strategy: str,
                     owner: str) -> sharding.ShardLayout:
    """The `ShardLayout` table tensor `name` (of `table`, a config-model
    table) was written with: its partition count from the checkpoint,
    `strategy` that of the run that wrote it. Raises ValueError when the
    stored slices cannot be that layout's."""
    count = self.partition_count(name)
    layout = sharding.ShardLayout(table.vocabulary_size, count, strategy)
    if layout.num_partitions != count:
      raise ValueError(
          f"{owner}: table {table.name!r}: checkpoint tensor {name!r} is "
          f"stored in {count} partitions, more than the spec's "
          f"vocabulary_size {table.vocabulary_size}; is this the spec the "
          "model was trained with?")
    if strategy == "mod" and count > 1:
      slices = self.row_slices(name)
      sizes = None if slices is None else [rows for _, rows in slices]
      if sizes is not None and tuple(sizes) != layout.sizes:
        raise ValueError(
            f"{owner}: table {table.name!r}: checkpoint tensor {name!r} is "
            f"stored in {count} partitions of {sizes} rows, not the 'mod' "
            f"layout's {list(layout.sizes)}; it was written with another "
            "partition_strategy: pass from_strategy='div' (command line: "
            "--from-strategy div).")
    return layout

  def read_rows(self, name: str, start: int, stop: int) -> Rows:
    """Rows [start, stop) of tensor `name` in stored order (NumPy): from
    each stored slice through TF when it is at most one block, else only
    those rows, from its data file (module doc)."""
    pieces = []
    for first, size in self._reads(name):
      lo, hi = max(start, first), min(stop, first + size)
      if lo < hi:
        pieces.append(self._read_slice_rows(name, first, size, lo, hi))
    return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)

  def _read_slice_rows(self, name: str, first: int, size: int, lo: int,
                       hi: int) -> Rows:
    """Rows [lo, hi) of tensor `name`, all in its stored slice of `size`
    rows from `first`."""
    shape = self.shapes[name]
    dtype = np.dtype(self.dtypes[name].as_numpy_dtype)
    row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
    location = self._index().locations.get(
        (name, ((first, size),) + tuple((0, d) for d in shape[1:])))
    if (location is None or size * row_bytes <= _BLOCK_BYTES or
        dtype.kind not in "fiub" or location.size != size * row_bytes or
        self._index().little_endian != (sys.byteorder == "little")):
      spec = ("" if (lo, hi) == (0, shape[0]) else
              slice_spec(shape, lo, hi - lo))
      return self._restore(name, spec)
    self._check_crc32c(name, first, size, location)
    data = self._read_bytes(location, (lo - first) * row_bytes,
                            (hi - lo) * row_bytes)
    return data.view(dtype).reshape([hi - lo] + shape[1:])

  def _check_crc32c(self, name: str, first: int, size: int,
                    location: bundle_index.Location) -> None:
    """Checks, the first time, that the stored slice of tensor `name` of
    `size` rows from `first`, at `location`, has the CRC32C its index entry
    records, reading it one block at a time; ValueError if not."""
    if location in self._checked:
      return
    data_file = self._data_file(location.path)
    data_file.seek(location.offset)
    crc = 0
    for start in range(0, location.size, _BLOCK_BYTES):
      count = min(_BLOCK_BYTES, location.size - start)
      chunk = data_file.read(count)
      if len(chunk) != count:
        raise self._truncated(location, start, count)
      crc = google_crc32c.extend(crc, chunk)
    masked = bundle_index.mask(crc)
    if masked != location.crc32c:
      raise ValueError(
          f"checkpoint {self.prefix}: tensor {name!r}, its stored slice of "
          f"rows [{first}, {first + size}): the {location.size} bytes from "
          f"{location.offset} in the data file {location.path} do not have "
          "the CRC32C the index records for them (masked: "
          f"{masked:#010x}, recorded {location.crc32c:#010x}"
          "); the checkpoint is corrupt: restore it from a good copy.")
    self._checked.add(location)

  def _data_file(self, path: str) -> Any:
    """Data file `path`, opened once: a local file unbuffered, another
    file system's through TF."""
    data_file = self._files.get(path)
    if data_file is None:
      data_file = (tf.io.gfile.GFile(path, "rb") if "://" in path else
                   open(path, "rb", buffering=0))
      self._files[path] = data_file
    return data_file

  def _truncated(self, location: bundle_index.Location, start: int,
                 size: int) -> ValueError:
    """The error for a data file ending before `size` bytes from `start`
    of the piece at `location`."""
    return ValueError(
        f"checkpoint {self.prefix}: the data file {location.path} ends "
        f"before the bytes the index puts there ({size} from "
        f"{location.offset + start}); the checkpoint is truncated.")

  def _read_bytes(self, location: bundle_index.Location, start: int,
                  size: int) -> npt.NDArray[np.uint8]:
    """`size` bytes from `start` of the piece at `location`: a local file's
    read into the array itself, another file system's through TF."""
    data_file = self._data_file(location.path)
    data_file.seek(location.offset + start)
    if isinstance(data_file, io.RawIOBase):
      data = np.empty(size, np.uint8)
      view, filled, count = data.data, 0, 1
      while filled < size and count:
        count = data_file.readinto(view[filled:]) or 0
        filled += count
    else:
      data = np.frombuffer(data_file.read(size), np.uint8)
      filled = len(data)
    if filled != size:
      raise self._truncated(location, start, size)
    return data

  def _restore(self, name: str, spec: str) -> Rows:
    dtype = self.dtypes[name]
    if self._session is None:
      graph = tf.Graph()
      with graph.as_default():
        self._feeds = (tf.compat.v1.placeholder(tf.string, []),
                       tf.compat.v1.placeholder(tf.string, [1]),
                       tf.compat.v1.placeholder(tf.string, [1]))
      self._session = tf.compat.v1.Session(graph=graph)
    prefix, names, specs = self._feeds
    if dtype not in self._restores:
      with self._session.graph.as_default():
        self._restores[dtype] = tf.raw_ops.RestoreV2(
            prefix=prefix, tensor_names=names, shape_and_slices=specs,
            dtypes=[dtype])[0]
    rows: Rows = self._session.run(self._restores[dtype], {
        prefix: self.prefix, names: [name], specs: [spec]})
    return rows

  def _reads(self, name: str) -> RowSlices:
    """(start, rows) of the pieces to read `name` in: its stored slices."""
    return self.row_slices(name) or ((0, self.shapes[name][0]),)

  def partition(self, name: str, source: sharding.ShardLayout,
                target: sharding.ShardLayout, index: int,
                advance: Optional[Callable[[int], None]] = None) -> Rows:
    """Partition `index` of `target` of tensor `name`, stored in `source`'s
    partition order, filled one block of rows at a time (module doc);
    `advance(n)` is called as rows are placed."""
    size = target.sizes[index]
    result = self._empty(name, size)
    block = self._block_rows(name)
    for lo in range(0, size, block):
      hi = min(size, lo + block)
      self._fill(name, source, target.row_ids(index, lo, hi), result[lo:hi])
      if advance is not None:
        advance(hi - lo)
    return result

  def rows_by_id(self, name: str, source: sharding.ShardLayout,
                 ids: npt.ArrayLike) -> Rows:
    """The rows with global ids `ids` (any order, repeats allowed) of tensor
    `name`, stored in `source`'s partition order, as an array [len(ids),
    ...], filled one block of rows at a time (module doc)."""
    ids = np.asarray(ids, np.int64).reshape([-1])
    result = self._empty(name, len(ids))
    block = self._block_rows(name)
    for lo in range(0, len(ids), block):
      self._fill(name, source, ids[lo:lo + block], result[lo:lo + block])
    return result

  def _fill(self, name: str, source: sharding.ShardLayout,
            ids: npt.NDArray[np.int64], out: Rows) -> None:
    """Puts the rows with global ids `ids` into `out`, reading windows of
    at most one block of rows, each from an asked row to an asked row of
    one stored slice."""
    where, local = source.locate(ids)
    positions = np.asarray(source.offsets, np.int64)[where] + local
    stride = _stride(positions)  # rows in stored order: no sorting
    order = None
    if stride is None:
      order = np.argsort(positions, kind="stable")
      positions = positions[order]
    ends = np.cumsum([size for _, size in self._reads(name)])
    block = self._block_rows(name)
    i = 0
    while i < len(positions):
      first = int(positions[i])
      slice_end = int(ends[np.searchsorted(ends, first, side="right")])
      j = int(np.searchsorted(positions, min(first + block, slice_end)))
      rows = self.read_rows(name, first, int(positions[j - 1]) + 1)
      if order is None:
        out[i:j] = rows[::stride]
      else:
        out[order[i:j]] = rows[positions[i:j] - first]
      del rows
      i = j

  def _empty(self, name: str, rows: int) -> Rows:
    return aligned_empty([rows] + self.shapes[name][1:],
                         self.dtypes[name].as_numpy_dtype)

  def _block_rows(self, name: str) -> int:
    """The rows of tensor `name` read, or moved, at a time (one block)."""
    row_bytes: int = int(np.prod(self.shapes[name][1:], dtype=np.int64)) * (
        self.dtypes[name].size)
    return max(1, _BLOCK_BYTES // max(1, row_bytes))

  def close(self) -> None:
    while self._files:
      self._files.popitem()[1].close()
    if self._session is not None:
      self._session.close()
      self._session = None
      self._restores = {}

  def __enter__(self) -> "Checkpoint":
    return self

  def __exit__(self, exc_type: Optional[type[BaseException]],
               exc: Optional[BaseException],
               tb: Optional[TracebackType]) -> Literal[False]:
    self.close()
    return False


def _stride(positions: npt.NDArray[np.int64]) -> Optional[int]:
  """k when `positions` go up by the same k >= 1 at every step (1 for
  fewer than two), else None."""
  if len(positions) < 2:
    return 1
  step = int(positions[1] - positions[0])
  return step if step >= 1 and bool(np.all(np.diff(positions) == step)) else (
      None)


# --- finding tables and slots ----------------------------------------------------


def _check_variable_names(
    owner: str, model: model_lib.EmbeddingModel,
    variable_names: Optional[dict[str, str]]) -> dict[str, str]:
  if variable_names is None:
    return {}
  if not isinstance(variable_names, dict):
    checks.fail(owner, "variable_names",
                 "must be a dict {table name: checkpoint tensor name}",
                 variable_names, TypeError)
  unknown = sorted(set(variable_names) - set(model.tables))
  if unknown:
    raise ValueError(
        f"{owner}: `variable_names` names unknown tables {unknown}; the "
        f"spec's tables are {list(model.tables)}.")
  for table, name in variable_names.items():
    checks.check_str(owner, f"variable_names[{table!r}]", name)
  return dict(variable_names)


def _name_matches(name: str, table: model_lib.Table) -> bool:
  """Whether `name` is a name a CPU lookup of `table` gives its variable:
  `[<scope>/]<var name>` (shared columns, dict form) or
  `[<scope>/]<var name>_embedding/embedding_weights` (a column's own)."""
  base = table.embedding_var_name
  for tail in (base, f"{base}_embedding/embedding_weights"):
    if name == tail or name.endswith("/" + tail):
      return True
  return False


def _same_shape(shapes: Mapping[str, list[int]],
                shape: list[int]) -> list[str]:
  return sorted(n for n, s in shapes.items() if s == shape)


def locate_tables(checkpoint: Checkpoint, model: model_lib.EmbeddingModel,
                  variable_names: Optional[dict[str, str]] = None,
                  owner: str = "locate_tables",
                  only: Optional[Collection[str]] = None) -> dict[str, str]:
  """{table name: checkpoint tensor name} for every table of `model`, in a
  `Checkpoint`.

  A table's tensor is the float32 [vocabulary_size, dimension] tensor whose
  name is the one a CPU lookup of the table gives its variable under any
  layer scope: `<scope>/<column name>/embedding_weights` for a column's own
  table (`input_layer/...`, `dense_features/...`, `sequence_features/...`),
  `[<scope>/]<shared collection name>` for shared columns, the table name
  for the dict form. `variable_names` ({table: tensor name}) settles a table
  whose tensor is missing or ambiguous. Raises ValueError listing the
  candidates otherwise. `only`: the names of the tables to locate (default
  all).
  """
  explicit = _check_variable_names(owner, model, variable_names)
  shapes, dtypes = checkpoint.shapes, checkpoint.dtypes
  found = {}
  for table_name, table in model.tables.items():
    if only is not None and table_name not in only:
      continue
    shape = [table.vocabulary_size, table.dimension]
    if table_name in explicit:
      name = explicit[table_name]
      if name not in shapes:
        raise ValueError(
            f"{owner}: table {table_name!r}: `variable_names[{table_name!r}]`"
            f" (command line: --variable-name {table_name}=TENSOR) is "
            f"{name!r}, which is not a tensor of the checkpoint; tensors of "
            f"shape {shape}: {_same_shape(shapes, shape)}.")
      if shapes[name] != shape or dtypes[name] != tf.float32:
        raise ValueError(
            f"{owner}: table {table_name!r}: `variable_names[{table_name!r}]`"
            f" (command line: --variable-name {table_name}=TENSOR) is "
            f"{name!r}, a {dtypes[name].name} tensor of shape {shapes[name]}"
            f"; the table needs float32 {shape} "
            f"({_differences(shape, shapes[name])}).")
      found[table_name] = name
      continue
    candidates = sorted(
        name for name, s in shapes.items()
        if s == shape and dtypes[name] == tf.float32 and
        _name_matches(name, table))
    if len(candidates) != 1:
      raise ValueError(_not_located(owner, table, candidates, shapes, dtypes))
    found[table_name] = candidates[0]
  tensors = list(found.values())
  twice = sorted({n for n in tensors if tensors.count(n) > 1})
  if twice:
    raise ValueError(
        f"{owner}: tables {sorted(t for t, n in found.items() if n in twice)} "
        f"all resolve to checkpoint tensor(s) {twice}; pass variable_names "
        "(command line: --variable-name TABLE=TENSOR) to tell them apart.")
  return found


def _differences(expected: list[int], found: list[int]) -> str:
  """'vocabulary_size: spec 20, checkpoint 21; ...' of a table's
  [vocabulary_size, dimension] against a tensor's shape."""
  if len(found) != 2:
    return f"the tensor has {len(found)} dimensions, not 2"
  parts = [f"{what}: spec {e}, checkpoint {f}" for what, e, f in zip(
      ("vocabulary_size", "dimension"), expected, found) if e != f]
  return "; ".join(parts) or "dtype differs"


def _not_located(owner: str, table: model_lib.Table, candidates: list[str],
                 shapes: Mapping[str, list[int]],
                 dtypes: Mapping[str, tf.DType]) -> str:
  """The message when table `table`'s tensor is missing or ambiguous."""
  shape = [table.vocabulary_size, table.dimension]
  flag = (f"variable_names={{{table.name!r}: '<tensor name>'}} (command "
          f"line: --variable-name {table.name}=TENSOR)")
  if candidates:
    return (f"{owner}: table {table.name!r} ({shape[0]} x {shape[1]}): "
            f"several tensors of the checkpoint could be it: {candidates}; "
            f"pass {flag} to choose.")
  named = sorted(n for n in shapes if _name_matches(n, table))
  if named:
    found = ", ".join(
        f"{n!r} is {dtypes[n].name} {shapes[n]} "
        f"({_differences(shape, shapes[n])})" for n in named)
    return (f"{owner}: table {table.name!r} does not match the checkpoint: "
            f"the spec's table is float32 {shape} but {found}; is this the "
            "spec the model was trained with? If another tensor holds the "
            f"table, pass {flag}.")
  return (f"{owner}: no tensor of the checkpoint is table {table.name!r} "
          f"({shape[0]} x {shape[1]}): none is named like it (ending in "
          f"{table.embedding_var_name!r} or "
          f"'{table.embedding_var_name}_embedding/embedding_weights'); "
          f"tensors of shape {shape}: {_same_shape(shapes, shape)}. Pass "
          f"{flag} to choose one.")


def table_row_tensors(
    checkpoint: Checkpoint, model: model_lib.EmbeddingModel,
    table_tensors: Mapping[str, str]) -> dict[str, list[str]]:
  """{table name: [its tensor, then every `<tensor>/...` tensor of the same
  shape (slots), sorted]} in a `Checkpoint`."""
  result = {}
  for table_name, tensor in table_tensors.items():
    table = model.tables[table_name]
    shape = [table.vocabulary_size, table.dimension]
    slots = sorted(
        name for name, s in checkpoint.shapes.items()
        if name.startswith(tensor + "/") and s == shape)
    result[table_name] = [tensor] + slots
  return result


# --- zero-copy hand-over between NumPy and TensorFlow -----------------------


def aligned_empty(shape: Sequence[int], dtype: npt.DTypeLike) -> Rows:
  """An uninitialized C-contiguous array whose buffer TensorFlow can adopt
  without a copy (see `as_tensor`)."""
  dtype = np.dtype(dtype)
  nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
  raw = np.empty(nbytes + _ALIGNMENT, np.uint8)
  offset = (-raw.ctypes.data) % _ALIGNMENT
  return raw[offset:offset + nbytes].view(dtype).reshape(shape)


def as_tensor(array: Rows) -> Tensor:
  """An eager tensor of `array`, sharing its buffer when it is aligned (no
  second copy of a table), else copied."""
  if (array.size and array.flags.c_contiguous and array.flags.writeable and
      array.ctypes.data % _ALIGNMENT == 0 and
      array.dtype.kind in "fiub"):
    return tf.experimental.dlpack.from_dlpack(array.__dlpack__())
  return tf.constant(array)


# --- writing -------------------------------------------------------------------


def slice_spec(full_shape: Sequence[int], start: int, length: int) -> str:
  """The `shape_and_slices` spec of rows [start, start + length) of a
  tensor of `full_shape` (SaveV2 / RestoreV2)."""
  dims = " ".join(str(d) for d in full_shape)
  rest = ["-"] * (len(full_shape) - 1)
  return f"{dims} {':'.join([f'{start},{length}'] + rest)}"


def move_checkpoint(prefix: str, target: str) -> None:
  """Renames the checkpoint files of `prefix` to `target` (same file
  system): the data files first, the index last, since the index is what
  makes the files a checkpoint."""
  for path in sorted(tf.io.gfile.glob(prefix + ".data-*")):
    os.replace(path, target + path[len(prefix):])
  os.replace(prefix + ".index", target + ".index")


class StagedCheckpoint:
  """A checkpoint written piece by piece in a temporary directory next to
  `output_prefix` and moved into place by `commit()`.

  Refuses (FileExistsError) an `output_prefix` that already has checkpoint
  files (`<prefix>.index`, `<prefix>.data-*`) unless `overwrite`; then
  `commit()` replaces them (the old index first, so that no mix of old and
  new files is ever a checkpoint). As a context manager, an error removes
  everything it wrote (including the output directory if it created it)
  and leaves existing files alone.
  """

  def __init__(self, output_prefix: StrPath, owner: str,
               overwrite: bool = False) -> None:
    overwrite = checks.check_bool(owner, "overwrite", overwrite)
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
    if existing and not overwrite:
      names = [os.path.basename(p) for p in sorted(existing)]
      if len(names) > 3:
        names = names[:2] + [f"... {len(names) - 3} more ..."] + names[-1:]
      raise FileExistsError(
          f"{owner}: a checkpoint already exists at {output_prefix!r} "
          f"({', '.join(names)}); "
          "choose another output prefix, or pass overwrite=True (command "
          "line: --force) to replace it.")
    self._overwrite = overwrite
    ancestor = directory
    while not os.path.exists(ancestor):
      ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
      raise ValueError(
          f"{owner}: `output_prefix` {output_prefix!r} is inside "
          f"{ancestor!r}, which is a file, not a directory; choose another "
          "output prefix.")
    self._created_dir = None
    if not os.path.isdir(directory):
      missing = directory
      while not os.path.isdir(os.path.dirname(missing)):
        missing = os.path.dirname(missing)
      os.makedirs(directory)
      self._created_dir = missing
    self.directory = directory
    try:
      self._staging = tempfile.mkdtemp(prefix=".staging-",
                                       dir=self.directory)
    except OSError:
      if self._created_dir is not None:
        shutil.rmtree(self._created_dir, ignore_errors=True)
      raise
    self._prefixes: list[str] = []
    # Tensors `add`ed and not saved yet: (names, slices, tensors), bytes.
    self._group: tuple[list[str], list[str], list[Tensor]] = ([], [], [])
    self._group_bytes = 0
    self.committed = False

  def save(self, names: Sequence[str], slices: Sequence[str],
           tensors: Sequence[Tensor]) -> None:
    """Saves tensors (with `shape_and_slices` specs, '' = whole tensor)."""
    prefix = os.path.join(self._staging, f"piece-{len(self._prefixes):05d}")
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=list(names),
                      shape_and_slices=list(slices), tensors=list(tensors))
    self._prefixes.append(prefix)

  def add(self, name: str, spec: str, value: Union[Value, Rows]) -> None:
    """Saves `value` as tensor `name` (slice spec `spec`, '' = whole)
    together with the tensors added next to it, in pieces of at most
    `GROUP_BYTES`: a bigger value is saved at once, on its own. Arrays are
    handed to TensorFlow without a copy where they can be."""
    nbytes = getattr(value, "nbytes", 0)
    if self._group_bytes + nbytes > GROUP_BYTES:
      self.flush()
    self._group[0].append(name)
    self._group[1].append(spec)
    self._group[2].append(as_tensor(value) if isinstance(
        value, np.ndarray) else tf.constant(value))
    self._group_bytes += nbytes
    if self._group_bytes >= GROUP_BYTES:
      self.flush()

  def flush(self) -> None:
    """Saves the tensors `add`ed so far."""
    if self._group[0]:
      self.save(*self._group)
    self._group, self._group_bytes = ([], [], []), 0

  def add_partition(self, name: str, full_shape: Sequence[int],
                    target: sharding.ShardLayout, index: int,
                    rows: Rows) -> None:
    """`add`s partition `index` of layout `target` of tensor `name`
    (`rows`) as the slice a run with that layout saves (the whole tensor
    when it has one partition)."""
    spec = "" if target.num_partitions == 1 else slice_spec(
        full_shape, target.offsets[index], target.sizes[index])
    self.add(name, spec, rows)

  def commit(self) -> str:
    """Merges the pieces and moves the checkpoint to `output_prefix`; writes
    a `checkpoint` state file naming it when the directory has none."""
    self.flush()
    merged = os.path.join(self._staging, "merged")
    tf.raw_ops.MergeV2Checkpoints(checkpoint_prefixes=self._prefixes,
                                  destination_prefix=merged,
                                  delete_old_dirs=False)
    if self._overwrite:  # the old index first: then no checkpoint is there
      for path in tf.io.gfile.glob(self.output_prefix + ".index") + (
          tf.io.gfile.glob(self.output_prefix + ".data-*")):
        os.remove(path)
    move_checkpoint(merged, self.output_prefix)
    if not os.path.exists(os.path.join(self.directory, "checkpoint")):
      tf.compat.v1.train.update_checkpoint_state(
          self.directory, os.path.basename(self.output_prefix))
    self.committed = True
    shutil.rmtree(self._staging, ignore_errors=True)
    return self.output_prefix

  def abort(self) -> None:
    shutil.rmtree(self._staging, ignore_errors=True)
    if self._created_dir is not None:
      shutil.rmtree(self._created_dir, ignore_errors=True)

  def __enter__(self) -> "StagedCheckpoint":
    return self

  def __exit__(self, exc_type: Optional[type[BaseException]],
               exc: Optional[BaseException],
               tb: Optional[TracebackType]) -> Literal[False]:
    if exc_type is not None or not self.committed:
      self.abort()
    return False


def copy_tensors(checkpoint: Checkpoint, names: Iterable[str],
                 staged: StagedCheckpoint) -> None:
  """Copies tensors of a `Checkpoint` unchanged (partitioned ones keep their
  row slices, each read on its own) into `staged` (`StagedCheckpoint.add`).
  """
  for name in names:
    for spec, value in _stored_pieces(checkpoint, name):
      if not isinstance(value, np.ndarray):  # a scalar keeps its dtype
        value = np.asarray(value, checkpoint.dtypes[name].as_numpy_dtype)
      staged.add(name, spec, value)


def _stored_pieces(checkpoint: Checkpoint,
                   name: str) -> Iterator[tuple[str, Value]]:
  """(slice spec, value) of each row slice tensor `name` was saved in, read
  one at a time; ('', the whole tensor) when it was saved whole or not in
  row slices."""
  slices = checkpoint.row_slices(name)
  if slices is None or len(slices) < 2:
    yield "", checkpoint.get_tensor(name)
    return
  for start, rows in slices:
    yield (slice_spec(checkpoint.shapes[name], start, rows),
           checkpoint.read_rows(name, start, start + rows))
