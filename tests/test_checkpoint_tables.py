"""The slices checkpoint tensors were saved in (`checkpoints.bundle_index`).

* The slices each tensor was saved in, read from the checkpoint's `.index`,
  are the partitions `tf.compat.v1.train.Saver` saved: every TF partitioner
  (fixed size with 1..5 partitions, vocabularies smaller than the partition
  count, min/max and axis-size partitioners with uneven sizes, axis 1) and
  the engine's own `div` and `mod` tables; reading each listed slice back
  through TF's RestoreV2 gives that partition's values. Indexes spread over
  several blocks are read whole; a V1 checkpoint, a compressed block and a
  file that is no index are refused by name.
"""
import os
import shutil

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # pylint: disable=g-import-not-at-top
import pytest
import tensorflow as tf

from estimator_spec.checkpoints import bundle_index
from estimator_spec.config import sharding
from estimator_spec.engine import storage

v1 = tf.compat.v1


# ---------------------------------------------------------------------------
# Slices from the index, against what the Saver saved.

PARTITIONERS = {
    **{f"fixed_{k}": (lambda k=k: v1.fixed_size_partitioner(k))
       for k in range(1, 6)},
    # 11 rows of 12 bytes: at most 4 partitions of >= 24 bytes -> 3 of
    # 4, 4, 3 rows.
    "min_max": lambda: v1.min_max_variable_partitioner(
        max_partitions=4, min_slice_size=24),
    "axis_size": lambda: v1.variable_axis_size_partitioner(
        max_shard_bytes=40),
    "axis_1": lambda: v1.fixed_size_partitioner(2, axis=1),
}


def saved_by_saver(directory, partitioner, vocab):
  """Saves [vocab, 3] float32 variables `t` (partitioned) and `plain` (not)
  with a Saver; returns (prefix, [(offsets, value) of each partition])."""
  with tf.Graph().as_default():
    partitioned = v1.get_variable(
        "t", [vocab, 3], initializer=v1.random_normal_initializer(seed=1),
        partitioner=partitioner())
    v1.get_variable("plain", [4, 2])
    parts = (list(partitioned) if hasattr(partitioned, "_get_variable_list")
             else [partitioned])
    with v1.Session() as sess:
      sess.run(v1.global_variables_initializer())
      prefix = v1.train.Saver().save(sess, os.path.join(directory, "ckpt"))
      values = sess.run(parts)
  return prefix, values


def offsets_of(values, shape, axis):
  """Each partition's (start, length) per dimension, from the partition
  shapes (partitions follow each other along `axis`)."""
  result, start = [], 0
  for value in values:
    result.append(tuple(
        (start, value.shape[a]) if a == axis else (0, shape[a])
        for a in range(len(shape))))
    start += value.shape[axis]
  return tuple(result)


@pytest.mark.parametrize("name", sorted(PARTITIONERS))
@pytest.mark.parametrize("vocab", [3, 11])
def test_index_slices_are_the_saved_partitions(tmp_path, name, vocab):
  prefix, values = saved_by_saver(str(tmp_path), PARTITIONERS[name], vocab)
  slices = bundle_index.tensor_slices(prefix)
  assert "plain" not in slices  # saved whole
  if len(values) == 1:  # one partition is saved as a whole tensor
    assert "t" not in slices
  else:
    assert slices["t"] == offsets_of(values, [vocab, 3],
                                     1 if name == "axis_1" else 0)
  if name == "fixed_5":  # more partitions than rows: one per row
    assert len(values) == min(vocab, 5)
  # TF's own restore of each listed slice gives the partition saved there.
  for extents, value in zip(slices.get("t", ()), values):
    spec = " ".join(str(d) for d in (vocab, 3)) + " " + ":".join(
        f"{start},{length}" for start, length in extents)
    restored = tf.raw_ops.RestoreV2(prefix=prefix, tensor_names=["t"],
                                    shape_and_slices=[spec],
                                    dtypes=[tf.float32])[0]
    np.testing.assert_array_equal(restored.numpy(), value)


@pytest.mark.parametrize("strategy", ["div", "mod"])
@pytest.mark.parametrize("shards", [1, 2, 4, 9])
def test_index_slices_of_engine_tables(tmp_path, strategy, shards):
  vocab = 7
  with tf.Graph().as_default():
    table = storage.create_table("emb/t", vocab, 2,
                                 v1.random_uniform_initializer(seed=2),
                                 shards, strategy)
    with v1.Session() as sess:
      sess.run(v1.global_variables_initializer())
      prefix = v1.train.Saver(sharded=True).save(
          sess, os.path.join(str(tmp_path), "ckpt"))
  layout = sharding.ShardLayout(vocab, shards, strategy)
  assert len(table.partitions) == layout.num_partitions
  slices = bundle_index.tensor_slices(prefix).get("emb/t")
  if layout.num_partitions == 1:
    assert slices is None
  else:
    assert slices == tuple(((o, s), (0, 2))
                           for o, s in zip(layout.offsets, layout.sizes))

def test_index_over_several_blocks(tmp_path):
  prefix = str(tmp_path / "c")
  names, specs, values = [], [], []
  for i in range(3000):
    name = f"scope_{i:05d}/" + "long_variable_name_" * 4
    for start, rows in ((0, 2), (2, 1)):
      names.append(name)
      specs.append(f"3 2 {start},{rows}:-")
      values.append(np.full((rows, 2), i, np.float32))
  tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names,
                    shape_and_slices=specs, tensors=values)
  # TF writes index blocks of 256 KiB: this index has several.
  assert os.path.getsize(prefix + ".index") > 2 * (256 << 10)
  slices = bundle_index.tensor_slices(prefix)
  assert len(slices) == 3000
  assert set(slices.values()) == {(((0, 2), (0, 2)), ((2, 1), (0, 2)))}


def test_index_refusals(tmp_path):
  # A V1 checkpoint has no .index.
  with tf.Graph().as_default():
    v1.get_variable("a", [4, 2], partitioner=v1.fixed_size_partitioner(2))
    saver = v1.train.Saver(write_version=tf.compat.v1.train.SaverDef.V1)
    with v1.Session() as sess:
      sess.run(v1.global_variables_initializer())
      (tmp_path / "v1").mkdir()
      old = saver.save(sess, str(tmp_path / "v1" / "ckpt"))
  with pytest.raises(bundle_index.IndexFormatError, match="not a TF 2"):
    bundle_index.tensor_slices(old)

  prefix, _ = saved_by_saver(str(tmp_path / "v2"), PARTITIONERS["fixed_2"],
                             5)
  data = bytearray(open(prefix + ".index", "rb").read())
  # The first data block starts the file; the first byte of its trailer
  # names its compression. Mark it as Snappy-compressed.
  first_block_size = _first_block_size(data)
  assert data[first_block_size] == 0  # TF wrote it uncompressed
  compressed = str(tmp_path / "compressed")
  shutil.copy(prefix + ".data-00000-of-00001",
              compressed + ".data-00000-of-00001")
  data[first_block_size] = 1
  with open(compressed + ".index", "wb") as f:
    f.write(bytes(data))
  with pytest.raises(bundle_index.IndexFormatError, match="compressed"):
    bundle_index.tensor_slices(compressed)

  garbage = str(tmp_path / "garbage")
  with open(garbage + ".index", "wb") as f:
    f.write(b"not an index" * 10)
  with pytest.raises(bundle_index.IndexFormatError, match="magic"):
    bundle_index.tensor_slices(garbage)


def _varint(buffer, position):
  value = shift = 0
  while True:
    byte = buffer[position]
    position += 1
    value |= (byte & 0x7f) << shift
    if not byte & 0x80:
      return value, position
    shift += 7


def _first_block_size(data):
  """The size of the first data block of an index (which starts at 0),
  from the first entry of the index block the footer points to."""
  position = len(data) - 48
  for _ in range(2):  # the meta-index block's offset and size
    _, position = _varint(data, position)
  position, _ = _varint(data, position)  # the index block's offset
  _, position = _varint(data, position)  # shared key bytes (0)
  unshared, position = _varint(data, position)
  _, position = _varint(data, position)  # value size
  offset, position = _varint(data, position + unshared)
  assert offset == 0
  return _varint(data, position)[0]


@pytest.mark.parametrize("vocab", [1, 3, 11, 40])
def test_same_slices_as_the_debug_string_listing(tmp_path, vocab):
  """Until the regex over `reader.debug_string()` goes: both give the same
  slices for every partitioner."""
  from estimator_spec.checkpoints import restore  # pylint: disable=import-outside-toplevel
  for name, partitioner in PARTITIONERS.items():
    prefix, _ = saved_by_saver(str(tmp_path / name), partitioner, vocab)
    old = restore.stored_slice_shapes(
        tf.compat.v1.train.NewCheckpointReader(prefix))
    new = {tensor: [tuple(length for _, length in extents)
                    for extents in slices]
           for tensor, slices in bundle_index.tensor_slices(prefix).items()}
    assert new == old, name
