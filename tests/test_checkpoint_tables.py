"""Reading table partitions from checkpoints (`checkpoints.tables`,
`checkpoints.bundle_index`) and restoring them streamed (`restore`).

* The slices each tensor was saved in, read from the checkpoint's `.index`,
  are the partitions `tf.compat.v1.train.Saver` saved: every TF partitioner
  (fixed size with 1..5 partitions, vocabularies smaller than the partition
  count, min/max and axis-size partitioners with uneven sizes, axis 1) and
  the engine's own `div` and `mod` tables; reading each listed slice back
  through TF's RestoreV2 gives that partition's values. Indexes spread over
  several blocks are read whole; a V1 checkpoint, a compressed block, a
  block whose checksum differs and a file that is no index are refused by
  name.
* Reading in blocks: a stored slice bigger than one block is read only
  where asked, from its data file, and gives what TF's reader gives; its
  CRC32C is checked first, once per slice, against what TF's Saver wrote,
  and a flipped byte is refused as TF's reader refuses it.
* `LayoutAwareSaver` restores tables and slots written in any (strategy,
  partitions) into any other, row for row (an independent NumPy oracle of
  the stored order), one target partition at a time, reading from each
  stored slice only the range that covers that partition's rows; it keeps
  its refusals (a missing table) and its allowances (missing slots start
  from their initial value, with a warning), and training on writes the
  run's own strategy.
"""
import os
import shutil
import struct
import types

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import google_crc32c
import hypothesis
from hypothesis import strategies as st
import numpy as np
import pytest
import tensorflow as tf

from estimator_spec.checkpoints import bundle_index
from estimator_spec.checkpoints import restore
from estimator_spec.checkpoints import tables
from estimator_spec.config import sharding
from estimator_spec.engine import storage
from tests import test_convert_cli as cli_tests
from tests import test_mid_level as ml

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
  with tables.Checkpoint(prefix) as checkpoint:
    assert checkpoint.partition_count("t") == len(slices.get("t", [()]))
    assert checkpoint.partition_count("plain") == 1
    assert checkpoint.row_slices("plain") == ((0, 4),)
    if name == "axis_1":
      assert checkpoint.row_slices("t") is None  # not split along rows
    else:
      assert checkpoint.row_slices("t") == tuple(
          (start, len(value)) for start, value in zip(
              np.cumsum([0] + [len(v) for v in values[:-1]]), values))
  assert restore.stored_partitions(prefix) == {
      "t": len(values), "plain": 1}


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
  with tables.Checkpoint(prefix) as checkpoint:
    assert checkpoint.partition_count("emb/t") == layout.num_partitions
    assert checkpoint.row_slices("emb/t") == tuple(
        zip(layout.offsets, layout.sizes))
    assert len(table.partitions) == layout.num_partitions


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
  # names its compression, the next four its checksum. Mark it as
  # Snappy-compressed, with the checksum that goes with that.
  first_block_size = _first_block_size(data)
  assert data[first_block_size] == 0  # TF wrote it uncompressed
  compressed = str(tmp_path / "compressed")
  shutil.copy(prefix + ".data-00000-of-00001",
              compressed + ".data-00000-of-00001")
  data[first_block_size] = 1
  struct.pack_into("<I", data, first_block_size + 1, bundle_index.mask(
      google_crc32c.value(bytes(data[:first_block_size + 1]))))
  with open(compressed + ".index", "wb") as f:
    f.write(bytes(data))
  with pytest.raises(bundle_index.IndexFormatError, match="compressed"):
    bundle_index.tensor_slices(compressed)

  # A flipped byte inside a block: its checksum differs; TF refuses it too.
  data = bytearray(open(prefix + ".index", "rb").read())
  data[first_block_size // 2] ^= 0x10
  with open(prefix + ".index", "wb") as f:
    f.write(bytes(data))
  with pytest.raises(bundle_index.IndexFormatError,
                     match="block at byte 0 does not have the CRC32C"):
    bundle_index.tensor_slices(prefix)
  with pytest.raises(tf.errors.OpError, match="checksum mismatch"):
    v1.train.NewCheckpointReader(prefix)

  garbage = str(tmp_path / "garbage")
  with open(garbage + ".index", "wb") as f:
    f.write(b"not an index" * 10)
  with pytest.raises(bundle_index.IndexFormatError, match="magic"):
    bundle_index.tensor_slices(garbage)


def _first_block_size(data):
  """The size of the first data block of an index (which starts at 0),
  from the first entry of the index block the footer points to."""
  def varint(buffer, position):  # LEB128, written here independently
    value = shift = 0
    while True:
      byte = buffer[position]
      position += 1
      value |= (byte & 0x7F) << shift
      shift += 7
      if byte < 0x80:
        return value, position
  position = len(data) - 48
  for _ in range(2):  # the meta-index block's offset and size
    _, position = varint(data, position)
  position, _ = varint(data, position)  # the index block's offset
  _, position = varint(data, position)  # shared key bytes (0)
  unshared, position = varint(data, position)
  _, position = varint(data, position)  # value size
  offset, position = varint(data, position + unshared)
  assert offset == 0
  return varint(data, position)[0]


# ---------------------------------------------------------------------------
# Streaming restore into another layout.

TABLE = cli_tests.TABLE
SLOT = TABLE + "/Adagrad"


def engine_graph(vocab, dim, shards, strategy, with_slot=True):
  """The engine's variables of one table (and its Adagrad slot) in the
  current graph, as the estimator's engine has them."""
  init = v1.constant_initializer(-1.0)
  table = storage.create_table(TABLE, vocab, dim, init, shards, strategy)
  slots = {}
  if with_slot:
    slots["accumulator"] = storage.create_table(
        SLOT, vocab, dim, v1.constant_initializer(0.1), shards, strategy)
  # What the saver reads of an engine: its public state API.
  engine = types.SimpleNamespace(
      created_tables=lambda: ["tbl_a"],
      table_rows={"tbl_a": table}.__getitem__,
      slot_rows={"tbl_a": slots}.__getitem__,
      model=types.SimpleNamespace(partition_strategy=strategy))
  return engine, table, slots.get("accumulator")


def restored(prefix, vocab, dim, shards, strategy, allow_missing_slots=True,
             save_to=None):
  """(table rows, slot rows) in row order after a LayoutAwareSaver restore
  into a (strategy, shards) run; saves again to `save_to` if given."""
  with tf.Graph().as_default():
    engine, table, slot = engine_graph(vocab, dim, shards, strategy)
    step = v1.train.get_or_create_global_step()
    saver = restore.LayoutAwareSaver(
        engine, allow_missing_slots=allow_missing_slots, record_layout=True,
        sharded=True)
    with v1.Session() as sess:
      sess.run(v1.global_variables_initializer())
      saver.restore(sess, prefix)
      rows, slot_rows, _ = sess.run([table.read_all(), slot.read_all(), step])
      if save_to is not None:
        os.makedirs(os.path.dirname(save_to))
        saver.save(sess, save_to)
  return rows, slot_rows


@hypothesis.settings(max_examples=30, deadline=None,
                     suppress_health_check=[
                         hypothesis.HealthCheck.function_scoped_fixture])
@hypothesis.given(vocab=st.integers(1, 13), dim=st.integers(1, 3),
                  from_shards=st.integers(1, 5),
                  from_strategy=cli_tests.STRATEGY,
                  to_shards=st.integers(1, 5),
                  to_strategy=cli_tests.STRATEGY,
                  record=st.booleans())
def test_restore_into_another_layout_gives_the_rows(
    tmp_path_factory, vocab, dim, from_shards, from_strategy, to_shards,
    to_strategy, record):
  # Without the recorded strategy the checkpoint is taken to be in the
  # run's strategy.
  from_strategy = from_strategy if record else to_strategy
  directory = str(tmp_path_factory.mktemp("restore"))
  prefix, rows, slot, _ = cli_tests.source_checkpoint(
      directory, vocab, dim, from_shards, from_strategy, record=record)
  got_rows, got_slot = restored(prefix, vocab, dim, to_shards, to_strategy)
  np.testing.assert_array_equal(got_rows, rows)
  np.testing.assert_array_equal(got_slot, slot)


def test_restore_reads_each_partition_from_its_own_rows(tmp_path,
                                                         monkeypatch):
  # 12 rows stored `mod` over 3 partitions, restored into `div` over 2: each
  # target partition (6 rows) reads 2 rows from each stored partition, as
  # three ranges of 2 rows, and nothing else.
  prefix, rows, slot, _ = cli_tests.source_checkpoint(
      str(tmp_path), 12, 2, 3, "mod", record=True)
  reads = []
  original = tables.Checkpoint.read_rows

  def read_rows(self, name, start, stop):
    reads.append((name, start, stop))
    return original(self, name, start, stop)

  monkeypatch.setattr(tables.Checkpoint, "read_rows", read_rows)
  got_rows, got_slot = restored(prefix, 12, 2, 2, "div")
  np.testing.assert_array_equal(got_rows, rows)
  np.testing.assert_array_equal(got_slot, slot)
  # Stored order: rows 0 3 6 9 | 1 4 7 10 | 2 5 8 11 (positions 0..11).
  # div partition 0 is rows 0..5: positions 0-1, 4-5, 8-9.
  table_reads = [(start, stop) for name, start, stop in reads
                 if name == TABLE]
  assert table_reads == [(0, 2), (4, 6), (8, 10), (2, 4), (6, 8), (10, 12)]


def test_restore_without_relayout_is_a_plain_restore(tmp_path, monkeypatch):
  prefix, rows, slot, _ = cli_tests.source_checkpoint(
      str(tmp_path), 9, 2, 3, "mod", record=True)
  monkeypatch.setattr(tables.Checkpoint, "read_rows",
                      lambda *args: pytest.fail("read rows itself"))
  got_rows, got_slot = restored(prefix, 9, 2, 3, "mod")
  np.testing.assert_array_equal(got_rows, rows)
  np.testing.assert_array_equal(got_slot, slot)


def test_restore_missing_slot_and_missing_table(tmp_path, monkeypatch):
  rng = np.random.RandomState(5)
  rows = rng.randn(8, 2).astype(np.float32)
  prefix = ml.write_checkpoint(str(tmp_path / "noslot" / "ckpt"), {
      TABLE: rows, "global_step": np.int64(3)})
  warnings = []
  monkeypatch.setattr(tf.compat.v1.logging, "warning",
                      lambda *args: warnings.append(args[0] % args[1:]))
  got_rows, got_slot = restored(prefix, 8, 2, 3, "mod",
                                save_to=str(tmp_path / "again" / "ckpt"))
  np.testing.assert_array_equal(got_rows, rows)
  np.testing.assert_array_equal(got_slot, np.full((8, 2), 0.1, np.float32))
  assert len(warnings) == 1 and SLOT in warnings[0], warnings
  # Saved again: this run's strategy and partitions.
  with tables.open_checkpoint(str(tmp_path / "again")) as again:
    assert again.strategy == "mod"
    assert again.partition_count(TABLE) == 3
    np.testing.assert_array_equal(
        again.get_tensor(TABLE), np.concatenate(
            sharding.ShardLayout(8, 3, "mod").split(rows)))

  with pytest.raises(tf.errors.NotFoundError, match="no tensor .*Adagrad"):
    restored(prefix, 8, 2, 3, "mod", allow_missing_slots=False)
  other = ml.write_checkpoint(str(tmp_path / "other" / "ckpt"), {
      "other/table": rows, "global_step": np.int64(3)})
  with pytest.raises(tf.errors.NotFoundError,
                     match=r"no tensor .*embedding_weights.*\(embedding "
                     r"table\)"):
    restored(other, 8, 2, 3, "mod")


# ---------------------------------------------------------------------------
# Reading in blocks: a stored slice bigger than one block is read only where
# asked, from its data file, and every result is what TF's reader gives.


def test_slice_keys_decode_and_locate_the_saved_bytes(tmp_path):
  # Slices of a tensor declared 2^45 rows long, starting where the signed
  # numbers of their keys take 1 to 7 bytes, a slice of a 2-D split, and
  # tensors saved whole: each location holds the bytes saved.
  prefix = str(tmp_path / "c")
  big = 2**45
  starts = [0, 1, 63, 64, 100, 8191, 8192, 2**20 + 3, 2**34, big - 3]
  names = ["a/t"] * len(starts) + ["two", "whole", "step"]
  specs = [f"{big} 2 {s},3:-" for s in starts] + ["5 7 1,2:3,4", "", ""]
  values = [np.full((3, 2), i, np.float32) for i in range(len(starts))] + [
      np.arange(8, dtype=np.float32).reshape(2, 4),
      np.arange(6, dtype=np.int64).reshape(3, 2), np.int64(7)]
  tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names,
                    shape_and_slices=specs, tensors=values)
  bundle = bundle_index.read_bundle(prefix)
  assert bundle.slices == {
      "a/t": tuple(((s, 3), (0, 2)) for s in starts),
      "two": (((1, 2), (3, 4)),)}
  expected = {("a/t", ((s, 3), (0, 2))): v for s, v in zip(starts, values)}
  expected.update({("two", ((1, 2), (3, 4))): values[-3],
                   ("whole", ((0, 3), (0, 2))): values[-2],
                   ("step", ()): values[-1]})
  assert set(bundle.locations) == set(expected)
  for key, location in bundle.locations.items():
    assert location.path == prefix + ".data-00000-of-00001"
    with open(location.path, "rb") as data:
      data.seek(location.offset)
      assert data.read(location.size) == np.asarray(expected[key]).tobytes()
  assert bundle.little_endian


def block_of(monkeypatch, rows, dim):
  """Makes one block `rows` rows of a float32 table of `dim` columns."""
  monkeypatch.setattr(tables, "_BLOCK_BYTES", rows * dim * 4)


def spy_reads(monkeypatch):
  """Records (name, start, stop) of every `read_rows` call and the size of
  every read straight from a data file."""
  reads, file_reads = [], []
  read_rows, read_bytes = tables.Checkpoint.read_rows, (
      tables.Checkpoint._read_bytes)

  def spied_rows(self, name, start, stop):
    reads.append((name, start, stop))
    return read_rows(self, name, start, stop)

  def spied_bytes(self, location, start, size):
    file_reads.append(size)
    return read_bytes(self, location, start, size)

  monkeypatch.setattr(tables.Checkpoint, "read_rows", spied_rows)
  monkeypatch.setattr(tables.Checkpoint, "_read_bytes", spied_bytes)
  return reads, file_reads


@hypothesis.settings(max_examples=30, deadline=None,
                     suppress_health_check=[
                         hypothesis.HealthCheck.function_scoped_fixture])
@hypothesis.given(vocab=st.integers(1, 40), dim=st.integers(1, 3),
                  shards=st.integers(1, 5), strategy=cli_tests.STRATEGY,
                  block=st.integers(1, 7), to_shards=st.integers(1, 5),
                  to_strategy=cli_tests.STRATEGY, data=st.data())
def test_blocks_read_what_tf_reads(tmp_path_factory, monkeypatch, vocab, dim,
                                   shards, strategy, block, to_shards,
                                   to_strategy, data):
  directory = str(tmp_path_factory.mktemp("blocks"))
  prefix, rows, _, _ = cli_tests.source_checkpoint(directory, vocab, dim,
                                                   shards, strategy)
  stored = tf.compat.v1.train.NewCheckpointReader(prefix).get_tensor(TABLE)
  source = sharding.ShardLayout(vocab, shards, strategy)
  target = sharding.ShardLayout(vocab, to_shards, to_strategy)
  ids = data.draw(st.lists(st.integers(0, vocab - 1), max_size=30))
  start = data.draw(st.integers(0, vocab - 1))
  stop = data.draw(st.integers(start + 1, vocab))
  block_of(monkeypatch, block, dim)
  reads, file_reads = spy_reads(monkeypatch)
  with tables.Checkpoint(prefix) as checkpoint:
    np.testing.assert_array_equal(checkpoint.read_rows(TABLE, start, stop),
                                  stored[start:stop])
    del reads[:], file_reads[:]
    np.testing.assert_array_equal(
        checkpoint.rows_by_id(TABLE, source, ids),
        rows[ids].reshape([-1, dim]))
    for index in range(target.num_partitions):
      np.testing.assert_array_equal(
          checkpoint.partition(TABLE, source, target, index),
          rows[target.row_ids(index)])
    slices = checkpoint.row_slices(TABLE)
  # Every read is at most one block, inside one stored slice; a slice
  # bigger than a block is read from its file, never whole through TF.
  assert all(hi - lo <= block for _, lo, hi in reads), reads
  assert all(size <= block * dim * 4 for size in file_reads)
  assert all(any(s <= lo and hi <= s + n for s, n in slices)
             for _, lo, hi in reads)
  if max(n for _, n in slices) > block:
    assert file_reads


def test_commands_give_the_same_checkpoints_read_in_blocks(tmp_path,
                                                           monkeypatch):
  # convert (to several layouts), the mid-level export and read_rows, with
  # blocks of 4 rows and with the default (every slice read through TF):
  # the same tensors, slices and rows, and no read of more than 4 rows.
  from estimator_spec import interop
  from estimator_spec.checkpoints import convert
  from estimator_spec.checkpoints import rows as rows_lib
  prefix, rows, slot, _ = cli_tests.source_checkpoint(
      str(tmp_path / "in"), 50, 2, 3, "mod", record=True)
  spec = cli_tests.one_table_spec(50, 2)
  table_name, = spec.model.tables
  ids = [49, 0, 7, 7, 31]

  def commands(out):
    written = [convert.convert_checkpoint(
        spec, prefix, os.path.join(out, f"{s}{n}", "ckpt"), to_strategy=s,
        to_shards=n) for s, n in (("div", 2), ("mod", 4), ("div", 1))]
    written.append(interop.export_mid_level_checkpoint(
        prefix, spec, os.path.join(out, "tf2", "emb")))
    return written, rows_lib.read_rows(prefix, spec, table_name, ids,
                                       slot="Adagrad")

  expected, expected_rows = commands(str(tmp_path / "tf"))
  block_of(monkeypatch, 4, 2)
  reads, file_reads = spy_reads(monkeypatch)
  got, got_rows = commands(str(tmp_path / "blocks"))
  np.testing.assert_array_equal(got_rows, slot[ids])
  np.testing.assert_array_equal(got_rows, expected_rows)
  for ours, theirs in zip(got, expected):
    assert restore.stored_partitions(ours) == restore.stored_partitions(
        theirs)
    a = tf.compat.v1.train.NewCheckpointReader(ours)
    b = tf.compat.v1.train.NewCheckpointReader(theirs)
    assert a.get_variable_to_shape_map() == b.get_variable_to_shape_map()
    for name in a.get_variable_to_shape_map():
      np.testing.assert_array_equal(a.get_tensor(name), b.get_tensor(name))
  table_reads = [(lo, hi) for name, lo, hi in reads
                 if name in (TABLE, SLOT)]
  assert table_reads and all(hi - lo <= 4 for lo, hi in table_reads)
  assert file_reads and max(file_reads) <= 4 * 2 * 4


def test_a_truncated_data_file_is_refused(tmp_path, monkeypatch):
  prefix, _, _, _ = cli_tests.source_checkpoint(str(tmp_path), 40, 2, 1,
                                                "div")
  location = bundle_index.read_bundle(prefix).locations[
      (TABLE, ((0, 40), (0, 2)))]
  with open(location.path, "r+b") as f:  # the table's last row is cut
    f.truncate(location.offset + location.size - 4)
  block_of(monkeypatch, 4, 2)
  layout = sharding.ShardLayout(40, 1, "div")
  with tables.Checkpoint(prefix) as checkpoint:
    with pytest.raises(ValueError, match="ends before.*truncated"):
      checkpoint.partition(TABLE, layout, layout, 0)


@pytest.mark.parametrize("first,second", [
    ((3, "mod"), (2, "mod")), ((2, "div"), (5, "mod")),
    ((4, "mod"), (1, "div")), ((1, "div"), (3, "div")),
    ((5, "mod"), (3, "div"))])
def test_a_run_restores_what_a_run_of_other_partitions_saved(
    tmp_path, monkeypatch, first, second):
  # An engine of N partitions restores a checkpoint and saves it (as a run
  # with N ps tasks, or N TPU hosts, writes it); an engine of M restores
  # that, tables and slots row for row, reading blocks of 2 rows.
  prefix, rows, slot, _ = cli_tests.source_checkpoint(
      str(tmp_path / "in"), 11, 2, 2, "mod", record=True)
  block_of(monkeypatch, 2, 2)
  saved = str(tmp_path / "first" / "model.ckpt")
  restored(prefix, 11, 2, *first, save_to=saved)
  with tables.open_checkpoint(saved) as checkpoint:
    assert checkpoint.strategy == first[1]
    assert checkpoint.partition_count(TABLE) == first[0]
  reads, _ = spy_reads(monkeypatch)
  got_rows, got_slot = restored(saved, 11, 2, *second)
  np.testing.assert_array_equal(got_rows, rows)
  np.testing.assert_array_equal(got_slot, slot)
  assert all(hi - lo <= 2 for _, lo, hi in reads)


def big_slices(directory):
  """A Saver's checkpoint of [3000, 3] float32 `t` in 3 partitions of 1000
  rows (and `plain`), with (its prefix, TF's reader's `t`, the locations of
  `t`'s slices in row order)."""
  prefix, _ = saved_by_saver(directory, PARTITIONERS["fixed_3"], 3000)
  locations = bundle_index.read_bundle(prefix).locations
  return prefix, v1.train.NewCheckpointReader(prefix).get_tensor("t"), [
      locations[("t", ((start, 1000), (0, 3)))] for start in (0, 1000, 2000)]


def spy_checksums(monkeypatch):
  """Records the size of every chunk given to google_crc32c.extend."""
  sizes = []
  extend = google_crc32c.extend

  def spied(crc, chunk):
    sizes.append(len(chunk))
    return extend(crc, chunk)

  monkeypatch.setattr(google_crc32c, "extend", spied)
  return sizes


def test_checksums_of_slices_read_from_their_files(tmp_path, monkeypatch):
  # Every piece's recorded checksum is the one computed here from its
  # bytes. Read with blocks of 64 rows, each slice of `t` is checked once
  # (in chunks of at most one block) though a 'mod' target of its 'div'
  # layout reads each slice in every partition, and the rows are TF's.
  prefix, stored, _ = big_slices(str(tmp_path))
  for location in bundle_index.read_bundle(prefix).locations.values():
    with open(location.path, "rb") as f:
      f.seek(location.offset)
      computed = google_crc32c.value(f.read(location.size))
    assert bundle_index.mask(computed) == location.crc32c
  block_of(monkeypatch, 64, 3)
  sizes = spy_checksums(monkeypatch)
  _, file_reads = spy_reads(monkeypatch)
  source = sharding.ShardLayout(3000, 3, "div")
  target = sharding.ShardLayout(3000, 4, "mod")
  with tables.Checkpoint(prefix) as checkpoint:
    for index in range(4):
      np.testing.assert_array_equal(
          checkpoint.partition("t", source, target, index),
          stored[target.row_ids(index)])
  assert file_reads  # the rows were read from the data file
  assert sum(sizes) == 3 * 1000 * 3 * 4 and max(sizes) <= 64 * 3 * 4


@pytest.mark.parametrize("where", [0, 6000, 11999])
def test_a_flipped_byte_in_a_slice_read_from_its_file_is_refused(
    tmp_path, monkeypatch, where):
  # One byte of `t`'s second slice flipped (its first, a middle or its last
  # byte): reading any row of that slice is refused, naming the checkpoint,
  # the tensor and the slice, every time; the other slices still read.
  # TF's own reader refuses the tensor too.
  prefix, stored, locations = big_slices(str(tmp_path))
  with open(locations[1].path, "r+b") as f:
    f.seek(locations[1].offset + where)
    byte = f.read(1)[0]
    f.seek(locations[1].offset + where)
    f.write(bytes([byte ^ 0x04]))
  with pytest.raises(tf.errors.OpError, match="Checksum does not match"):
    v1.train.NewCheckpointReader(prefix).get_tensor("t")
  block_of(monkeypatch, 64, 3)
  with tables.Checkpoint(prefix) as checkpoint:
    np.testing.assert_array_equal(checkpoint.read_rows("t", 2990, 3000),
                                  stored[2990:])
    for _ in range(2):
      with pytest.raises(ValueError) as error:
        checkpoint.read_rows("t", 1000, 1001)
      message = str(error.value)
      assert message.startswith(f"checkpoint {prefix}: tensor 't', its stored "
                                "slice of rows [1000, 2000): ")
      assert "do not have the CRC32C the index records" in message
      assert "the checkpoint is corrupt" in message
    np.testing.assert_array_equal(checkpoint.read_rows("t", 0, 10),
                                  stored[:10])
