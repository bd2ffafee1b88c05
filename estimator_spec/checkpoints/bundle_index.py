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
  compression (0: none) and the masked CRC32C (below) of the block and
  that byte, a little-endian uint32. TF 2.15 writes index blocks
  uncompressed (checked on its own checkpoints: tests/
  test_checkpoint_tables.py); anything else is refused with a message, and
  so is a block whose checksum differs.
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
  each slice has an entry of its own, whose key is the tensor's name and the
  slice in TF's order-preserving encoding (below).
* An entry saved with its data (a whole tensor, or one slice) says where
  its bytes are: data file `shard_id` (`<prefix>.data-<shard_id>-of-
  <num_shards>`, five digits each, `num_shards` from the header), `offset`
  and `size` there. A numeric tensor's bytes are its values in C order, in
  the byte order the header's `endianness` names. Its `crc32c` is the
  masked CRC32C of those bytes.

A checksum is stored masked: the CRC32C (Castagnoli) rotated right by 15
bits, plus 0xa282ead8, in uint32 arithmetic (`mask`).

A slice's key: a zero byte (the number 0), the tensor's name (each 0x00
byte written 0x00 0xff, each 0xff byte 0xff 0x00, then 0x00 0x01), the
number of dimensions (one byte holding its length n, then n big-endian
bytes), then (start, length) of each dimension as signed numbers, a length
of -1 meaning the whole dimension. A signed number of n bytes (n from 1 to
10) is its two's complement in 8n bits with the top n bits flipped: a
non-negative number begins with n one bits then a zero, a negative one
with n zero bits then a one.
"""
import struct
from typing import Iterator, NamedTuple, Union

import google_crc32c
import tensorflow as tf
from tensorflow.core.protobuf import tensor_bundle_pb2

_FOOTER_BYTES = 48
_MAGIC = 0xdb4775248b80fb57
_TRAILER_BYTES = 5
_UNCOMPRESSED = 0
_MASK_DELTA = 0xa282ead8

# One saved slice: a (start, length) pair per dimension of the tensor.
Slice = tuple[tuple[int, int], ...]
# A block's (offset, size) in the file.
_Handle = tuple[int, int]
# What the parsing reads: the file, or one block of it.
_Buffer = Union[bytes, memoryview]


class IndexFormatError(ValueError):
  """The `.index` file is not in the format TF 2.15 writes."""


class Location(NamedTuple):
  """Where the bytes of a tensor saved whole, or of one saved slice, are,
  and the masked CRC32C the index records of them (`mask`)."""
  path: str  # the data file
  offset: int
  size: int
  crc32c: int


class Bundle(NamedTuple):
  """What a checkpoint's `.index` says of its tensors.

  slices: {tensor name: its saved slices} of the tensors saved in slices
    (see `tensor_slices`).
  locations: {(tensor name, slice): `Location`} of every saved piece; a
    tensor saved whole has its full slice, (0, size) in each dimension.
  little_endian: whether the data files hold numbers little-endian.
  """
  slices: dict[str, tuple[Slice, ...]]
  locations: dict[tuple[str, Slice], Location]
  little_endian: bool


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
  return read_bundle(prefix).slices


def read_bundle(prefix: str) -> Bundle:
  """The `Bundle` of checkpoint `prefix`: its tensors' slices and where the
  bytes of each saved piece are. Raises IndexFormatError as
  `tensor_slices` does, and when a slice's key cannot be read."""
  path = prefix + ".index"
  if not tf.io.gfile.exists(path):
    raise IndexFormatError(
        f"Checkpoint {prefix!r} has no {path!r}: it is not a TF 2 "
        "(TensorBundle) checkpoint, the only format whose partitions are "
        "read here. Re-save it with tf.compat.v1.train.Saver() (V2 format).")
  with tf.io.gfile.GFile(path, "rb") as f:
    data = f.read()
  header = tensor_bundle_pb2.BundleHeaderProto()
  slices: dict[str, tuple[Slice, ...]] = {}
  shapes: dict[str, list[int]] = {}
  # {(name, ((start, length or -1), ...)): entry} of each saved piece
  pieces: dict[tuple[str, Slice], tensor_bundle_pb2.BundleEntryProto] = {}
  for key, value in _entries(data, path):
    if not key:
      header = tensor_bundle_pb2.BundleHeaderProto.FromString(value)
      continue
    entry = tensor_bundle_pb2.BundleEntryProto.FromString(value)
    if key[0] == 0:
      pieces[_slice_key(key, path)] = entry
      continue
    name = key.decode("utf-8")
    shapes[name] = [d.size for d in entry.shape.dim]
    if entry.slices:
      slices[name] = _slices_of(entry, shapes[name], name, path)
    else:
      pieces[(name, tuple((0, -1) for _ in shapes[name]))] = entry
  return Bundle(slices, _locations(prefix, header.num_shards, pieces, shapes,
                                   path),
                header.endianness == tensor_bundle_pb2.BundleHeaderProto.LITTLE)


def _locations(
    prefix: str, num_shards: int,
    pieces: dict[tuple[str, Slice], tensor_bundle_pb2.BundleEntryProto],
    shapes: dict[str, list[int]],
    path: str) -> dict[tuple[str, Slice], Location]:
  """`Bundle.locations` of the pieces, whole dimensions as (0, size)."""
  locations = {}
  for (name, extents), entry in pieces.items():
    if len(extents) != len(shapes.get(name, ())):
      raise IndexFormatError(
          f"{path}: a slice entry names {name!r}, which has no entry of "
          f"rank {len(extents)}.")
    full = tuple((start, size if length == -1 else length)
                 for (start, length), size in zip(extents, shapes[name]))
    locations[(name, full)] = Location(
        f"{prefix}.data-{entry.shard_id:05d}-of-{num_shards:05d}",
        entry.offset, entry.size, entry.crc32c)
  return locations


def mask(crc: int) -> int:
  """The masked form (module doc) in which TF records CRC32C `crc`."""
  rotated = (crc >> 15) | ((crc << 17) & 0xffffffff)
  return (rotated + _MASK_DELTA) & 0xffffffff


def _slices_of(entry: tensor_bundle_pb2.BundleEntryProto, dims: list[int],
               name: str, path: str) -> tuple[Slice, ...]:
  """The sorted slices an entry lists, (0, size) for a whole dimension."""
  result: list[Slice] = []
  for proto in entry.slices:
    if len(proto.extent) != len(dims):
      raise IndexFormatError(
          f"{path}: a slice of {name!r} has {len(proto.extent)} "
          f"dimensions, the tensor {len(dims)}.")
    result.append(tuple(
        (e.start, e.length) if e.HasField("length") else (0, size)
        for e, size in zip(proto.extent, dims)))
  return tuple(sorted(result))


def _slice_key(key: bytes, path: str) -> tuple[str, Slice]:
  """(tensor name, ((start, length), ...)) of a slice's key (module doc),
  a length of -1 for a whole dimension."""
  try:
    name, position = _ordered_string(key, 1)
    count, position = _ordered_unsigned(key, position)
    numbers = []
    for _ in range(2 * count):
      number, position = _ordered_signed(key, position)
      numbers.append(number)
    text = name.decode("utf-8")
  except (IndexError, UnicodeDecodeError):
    position = -1
  if position != len(key):
    raise IndexFormatError(f"{path}: a slice key {key!r} cannot be read.")
  return text, tuple(zip(numbers[::2], numbers[1::2]))


def _ordered_string(key: bytes, position: int) -> tuple[bytes, int]:
  """(a string of the key, the position after its terminator)."""
  result = bytearray()
  while True:
    pair = key[position:position + 2]
    if pair == b"\x00\x01":
      return bytes(result), position + 2
    if pair in (b"\x00\xff", b"\xff\x00"):
      position += 1  # the escaped byte is the pair's first
    elif key[position] in (0x00, 0xff):
      raise IndexError("an unescaped 0x00 or 0xff")
    result.append(key[position])
    position += 1


def _ordered_unsigned(key: bytes, position: int) -> tuple[int, int]:
  """(a non-negative number of the key, the position after it)."""
  end = position + 1 + key[position]
  if end > len(key):
    raise IndexError("past the key")
  return int.from_bytes(key[position + 1:end], "big"), end


def _ordered_signed(key: bytes, position: int) -> tuple[int, int]:
  """(a signed number of the key, the position after it)."""
  negative = not key[position] & 0x80
  flip = 0xff if negative else 0x00
  second = key[position + 1] ^ flip if position + 1 < len(key) else 0
  leading = ((key[position] ^ flip) << 8) | second
  length = 16 - (leading ^ 0xffff).bit_length()  # its leading one bits
  if not 1 <= length <= 10 or position + length > len(key):
    raise IndexError("not a signed number")
  raw = int.from_bytes(key[position:position + length], "big")
  header = ((1 << length) - 1) << (7 * length)
  value = (raw | header) - (1 << (8 * length)) if negative else raw ^ header
  return value, position + length


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
  recorded = struct.unpack_from("<I", data, offset + size + 1)[0]
  if mask(google_crc32c.value(data[offset:offset + size + 1])) != recorded:
    raise IndexFormatError(
        f"{path}: the block at byte {offset} does not have the CRC32C its "
        "trailer records; the index is corrupt.")
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
