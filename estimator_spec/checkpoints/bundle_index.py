"""Which slices each tensor of a checkpoint was saved in, from its `.index`.

TensorFlow's checkpoint reader gives names, shapes and dtypes
(`get_variable_to_shape_map`, `get_variable_to_dtype_map`) but not how a
partitioned variable was split when it was saved. That is written in the
checkpoint's `<prefix>.index` file, read here without TensorFlow's help
(TF 2.15 has no public call for it).

The index of a TF 2 ("V2", TensorBundle) checkpoint is an immutable sorted
key/value file in LevelDB's table layout:

* The last 48 bytes are the footer: the position (offset, size, each a
  base-128 varint) of the meta-index block and of the index block, zero
  padding, then the 8-byte magic number 0xdb4775248b80fb57 (little-endian).
* Every block is followed by a 5-byte trailer: one byte naming its
  compression (0: none) and a CRC32C of the block. TF 2.15 writes index
  blocks uncompressed (checked on its own checkpoints: tests/
  test_checkpoint_tables.py); anything else is refused with a message.
  The CRC is not checked here: TensorFlow's reader has opened the same file.
* A block holds entries, then a list of uint32 restart offsets and their
  count (uint32). An entry is three varints (bytes of key shared with the
  previous key, bytes not shared, value size), the unshared key bytes and
  the value.
* The index block has one entry per data block; its value is that block's
  position (two varints).
* In the data blocks, the key "" holds the bundle header, a key equal to a
  tensor's name holds that tensor's `BundleEntryProto`, and keys starting
  with a zero byte describe single slices. A tensor saved in slices has the
  list of them (`TensorSliceProto`s) in the `slices` field of its own entry;
  only those entries are used.
"""
import struct
from typing import Iterator, Union

import tensorflow as tf
from tensorflow.core.protobuf import tensor_bundle_pb2

_FOOTER_BYTES = 48
_MAGIC = 0xdb4775248b80fb57
_TRAILER_BYTES = 5
_UNCOMPRESSED = 0

# One saved slice: a (start, length) pair per dimension of the tensor.
Slice = tuple[tuple[int, int], ...]
# A block's (offset, size) in the file.
_Handle = tuple[int, int]
# What the parsing reads: the file, or one block of it.
_Buffer = Union[bytes, memoryview]


class IndexFormatError(ValueError):
  """The `.index` file is not in the format TF 2.15 writes."""


def tensor_slices(prefix: str) -> dict[str, tuple[Slice, ...]]:
  """{tensor name: its saved slices} for the tensors of checkpoint `prefix`
  that were saved as slices of one tensor (partitioned variables).

  Each slice is a tuple with one (start, length) pair per dimension, a
  dimension the slice covers whole given as (0, its size). Slices are
  sorted (by start along the first dimension, then the next, ...). Tensors
  saved whole are absent.

  Raises:
    IndexFormatError: `<prefix>.index` is missing (e.g. a V1 checkpoint) or
      is not an index TF 2.15 writes.
  """
  path = prefix + ".index"
  if not tf.io.gfile.exists(path):
    raise IndexFormatError(
        f"Checkpoint {prefix!r} has no {path!r}: it is not a TF 2 "
        "(TensorBundle) checkpoint, the only format whose partitions are "
        "read here. Re-save it with tf.compat.v1.train.Saver() (V2 format).")
  with tf.io.gfile.GFile(path, "rb") as f:
    data = f.read()
  result: dict[str, tuple[Slice, ...]] = {}
  for key, value in _entries(data, path):
    if not key or key[0] == 0:  # the header, or one slice's own entry
      continue
    entry = tensor_bundle_pb2.BundleEntryProto.FromString(value)
    if not entry.slices:
      continue
    dims = [d.size for d in entry.shape.dim]
    slices: list[Slice] = []
    for proto in entry.slices:
      if len(proto.extent) != len(dims):
        raise IndexFormatError(
            f"{path}: a slice of {key!r} has {len(proto.extent)} "
            f"dimensions, the tensor {len(dims)}.")
      slices.append(tuple(
          (e.start, e.length) if e.HasField("length") else (0, size)
          for e, size in zip(proto.extent, dims)))
    result[key.decode("utf-8")] = tuple(sorted(slices))
  return result


def _entries(data: bytes, path: str) -> Iterator[tuple[bytes, bytes]]:
  """(key, value) of every entry of the data blocks, in key order."""
  if len(data) < _FOOTER_BYTES or struct.unpack_from(
      "<Q", data, len(data) - 8)[0] != _MAGIC:
    raise IndexFormatError(
        f"{path} does not end with the table magic number of a checkpoint "
        "index (truncated, or not a checkpoint index).")
  footer = len(data) - _FOOTER_BYTES
  _, position = _handle(data, footer)  # the meta-index block: not needed
  index_block, _ = _handle(data, position)
  for _, value in _block_entries(_block(data, index_block, path)):
    data_block, _ = _handle(value, 0)
    yield from _block_entries(_block(data, data_block, path))


def _varint(buffer: _Buffer, position: int) -> tuple[int, int]:
  value = shift = 0
  while True:
    byte = buffer[position]
    position += 1
    value |= (byte & 0x7f) << shift
    if not byte & 0x80:
      return value, position
    shift += 7


def _handle(buffer: _Buffer, position: int) -> tuple[_Handle, int]:
  """((offset, size) of a block, position after it)."""
  offset, position = _varint(buffer, position)
  size, position = _varint(buffer, position)
  return (offset, size), position


def _block(data: bytes, handle: _Handle, path: str) -> memoryview:
  offset, size = handle
  if offset + size + _TRAILER_BYTES > len(data):
    raise IndexFormatError(f"{path}: a block lies beyond the end of the file.")
  compression = data[offset + size]
  if compression != _UNCOMPRESSED:
    raise IndexFormatError(
        f"{path}: a block is compressed (type {compression}); TF 2.15 "
        "writes checkpoint indexes uncompressed, and only those are read "
        "here.")
  return memoryview(data)[offset:offset + size]


def _block_entries(
    block: memoryview) -> Iterator[tuple[bytes, bytes]]:
  restarts = struct.unpack_from("<I", block, len(block) - 4)[0]
  end = len(block) - 4 - 4 * restarts
  position, key = 0, b""
  while position < end:
    shared, position = _varint(block, position)
    unshared, position = _varint(block, position)
    size, position = _varint(block, position)
    key = key[:shared] + bytes(block[position:position + unshared])
    position += unshared
    yield key, bytes(block[position:position + size])
    position += size
