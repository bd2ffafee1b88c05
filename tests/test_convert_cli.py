"""Checkpoint conversion between table layouts, and the command line.

* `convert_checkpoint` re-lays out tables and slots for any (strategy,
  shards) -> (strategy, shards) (property test against an independent NumPy
  permutation), saves them as the target run's partitions, and copies
  everything else unchanged (partitioned dense variables keep their slices).
* The result restores with a plain `tf.compat.v1.train.Saver` into the
  engine's partitioned variables of the target layout, and (slow) into our
  TPUEstimator configured with the target layout, which predicts what the
  original predicted and, trained one more step, reaches the same tables,
  slots and dense weights as the original trained one more step.
* `python -m estimator_spec convert / export-mid-level`: progress on stderr,
  exit code 2 and one line on error, nothing written; `describe` still
  works (tests/test_cli.py has the rest of the command line).
"""
import io
import os
import re
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import hypothesis  # pylint: disable=g-import-not-at-top
from hypothesis import strategies as st
import numpy as np
import pytest
import tensorflow as tf

import estimator_spec as es
import tpu_embedding_columns as tec
from estimator_spec import __main__ as cli
from estimator_spec.checkpoints import restore as checkpoints
from estimator_spec.checkpoints import convert
from estimator_spec.checkpoints import progress
from estimator_spec.checkpoints import tables
from estimator_spec.engine import storage
from tests import test_mid_level as ml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TABLE = "dense_features/a_embedding/embedding_weights"


def stored_order(vocab, shards, strategy):
  """Row ids in the order a (strategy, shards) run stores them (NumPy twin
  of docs/numerics.md, 'Where a row lives', independent of ShardLayout)."""
  n = min(vocab, shards)
  if strategy == "div" or n == 1:
    return np.arange(vocab), [vocab]
  order = [np.arange(p, vocab, n) for p in range(n)]
  return np.concatenate(order), [len(o) for o in order]


def div_sizes(vocab, shards):
  n = min(vocab, shards)
  return [vocab // n + (1 if i < vocab % n else 0) for i in range(n)]


def as_stored(rows, shards, strategy):
  """A table in stored order, as a list of partitions (or one array)."""
  order, sizes = stored_order(len(rows), shards, strategy)
  if strategy == "div":
    sizes = div_sizes(len(rows), shards)
  stored = rows[order]
  if len(sizes) == 1:
    return stored
  return np.split(stored, np.cumsum(sizes)[:-1])


def source_checkpoint(directory, vocab, dim, shards, strategy, seed=0,
                      record=False):
  """A checkpoint with one table and slot stored in (strategy, shards)
  order; `record` adds the strategy as our estimator records it."""
  rng = np.random.RandomState(seed)
  rows = rng.randn(vocab, dim).astype(np.float32)
  slot = rng.uniform(0.1, 1.0, (vocab, dim)).astype(np.float32)
  dense = rng.randn(7, 2).astype(np.float32)
  tensors = {
      TABLE: as_stored(rows, shards, strategy),
      TABLE + "/Adagrad": as_stored(slot, shards, strategy),
      "global_step": np.int64(42),
      "out/kernel": rng.randn(dim, 1).astype(np.float32),
      "out/kernel/Momentum": rng.randn(dim, 1).astype(np.float32),
      "partitioned/dense": [dense[:4], dense[4:]],
      "vocabulary_name": np.array(b"words"),
  }
  if record:
    tensors[checkpoints.LAYOUT_TENSOR] = np.array(strategy.encode())
  os.makedirs(directory, exist_ok=True)
  prefix = ml.write_checkpoint(os.path.join(directory, "model.ckpt-42"),
                               tensors)
  return prefix, rows, slot, dense


def one_table_spec(vocab, dim, strategy="div"):
  return es.EmbeddingConfigSpec(
      feature_columns=[tec.embedding_column(
          tf.feature_column.categorical_column_with_identity("a", vocab),
          dim)],
      optimization_parameters=es.AdagradParameters(0.1),
      partition_strategy=strategy)


def rows_of(reader, name, shards, strategy):
  stored = reader.get_tensor(name)
  order, _ = stored_order(len(stored), shards, strategy)
  rows = np.empty_like(stored)
  rows[order] = stored
  return rows


STRATEGY = st.sampled_from(["div", "mod"])


@hypothesis.settings(max_examples=25, deadline=None,
                     suppress_health_check=[
                         hypothesis.HealthCheck.function_scoped_fixture])
@hypothesis.given(vocab=st.integers(1, 23), dim=st.integers(1, 3),
                  from_shards=st.integers(1, 5), from_strategy=STRATEGY,
                  to_shards=st.integers(1, 5), to_strategy=STRATEGY)
def test_conversion_relays_out_tables_and_copies_the_rest(
    tmp_path_factory, vocab, dim, from_shards, from_strategy, to_shards,
    to_strategy):
  directory = str(tmp_path_factory.mktemp("convert"))
  prefix, rows, slot, dense = source_checkpoint(
      os.path.join(directory, "in"), vocab, dim, from_shards, from_strategy)
  out = convert.convert_checkpoint(
      one_table_spec(vocab, dim), prefix, os.path.join(directory, "out",
                                                       "ckpt"),
      to_strategy=to_strategy, to_shards=to_shards,
      from_strategy=from_strategy)
  reader = tf.compat.v1.train.NewCheckpointReader(out)
  source = tf.compat.v1.train.NewCheckpointReader(prefix)
  # Everything is copied, and the output records the target's strategy.
  assert sorted(reader.get_variable_to_shape_map()) == sorted(
      list(source.get_variable_to_shape_map()) + [checkpoints.LAYOUT_TENSOR])
  assert checkpoints.recorded_strategy(reader) == to_strategy
  np.testing.assert_array_equal(rows_of(reader, TABLE, to_shards,
                                        to_strategy), rows)
  np.testing.assert_array_equal(
      rows_of(reader, TABLE + "/Adagrad", to_shards, to_strategy), slot)
  stored = checkpoints.stored_partitions(out)
  assert stored[TABLE] == stored[TABLE + "/Adagrad"] == min(vocab, to_shards)
  with tables.Checkpoint(out) as written:
    if min(vocab, to_shards) > 1:
      _, sizes = stored_order(vocab, to_shards, to_strategy)
      if to_strategy == "div":
        sizes = div_sizes(vocab, to_shards)
      assert [rows for _, rows in written.row_slices(TABLE)] == sizes
    assert written.row_slices("partitioned/dense") == ((0, 4), (4, 3))
  for name in ("global_step", "out/kernel", "out/kernel/Momentum",
               "vocabulary_name", "partitioned/dense"):
    assert reader.get_variable_to_dtype_map()[name] == (
        source.get_variable_to_dtype_map()[name])
    np.testing.assert_array_equal(reader.get_tensor(name),
                                  source.get_tensor(name))
  np.testing.assert_array_equal(reader.get_tensor("partitioned/dense"), dense)
  assert tf.train.latest_checkpoint(os.path.join(directory, "out")) == out


def test_recorded_strategy_is_the_default_source_strategy(tmp_path):
  # The spec says 'div'; the checkpoint records that 'mod' wrote it.
  prefix, rows, _, _ = source_checkpoint(str(tmp_path / "in"), 11, 2, 3,
                                         "mod", record=True)
  spec = one_table_spec(11, 2, "div")
  out = convert.convert_checkpoint(spec, prefix, tmp_path / "out" / "c",
                                   to_strategy="div", to_shards=2)
  reader = tf.compat.v1.train.NewCheckpointReader(out)
  np.testing.assert_array_equal(reader.get_tensor(TABLE), rows)
  with pytest.raises(ValueError, match="records that its tables were "
                     "written with 'mod'"):
    convert.convert_checkpoint(spec, prefix, tmp_path / "out2" / "c",
                               to_strategy="div", to_shards=2,
                               from_strategy="div")
  assert not (tmp_path / "out2").exists()


@pytest.mark.parametrize("strategy,shards", [("mod", 3), ("div", 2),
                                             ("mod", 1)])
def test_plain_saver_restores_into_the_target_layout(tmp_path, strategy,
                                                      shards):
  vocab, dim = 11, 2
  prefix, rows, slot, _ = source_checkpoint(str(tmp_path / "in"), vocab,
                                            dim, 2, "mod")
  out = convert.convert_checkpoint(
      one_table_spec(vocab, dim, "mod"), prefix, tmp_path / "out" / "c",
      to_strategy=strategy, to_shards=shards)
  with tf.Graph().as_default():
    zeros = tf.compat.v1.zeros_initializer()
    table = storage.create_table(TABLE, vocab, dim, zeros, shards, strategy)
    adagrad = storage.create_table(TABLE + "/Adagrad", vocab, dim, zeros,
                                   shards, strategy)
    assert len(table.partitions) == min(shards, vocab)
    step = tf.compat.v1.train.get_or_create_global_step()
    saver = tf.compat.v1.train.Saver(
        var_list=table.partitions + adagrad.partitions + [step])
    with tf.compat.v1.Session() as sess:
      saver.restore(sess, out)
      got_rows, got_slot, got_step = sess.run(
          [table.read_all(), adagrad.read_all(), step])
  np.testing.assert_array_equal(got_rows, rows)
  np.testing.assert_array_equal(got_slot, slot)
  assert got_step == 42


@pytest.mark.parametrize("case", ["to_strategy", "to_shards", "spec",
                                  "not_mod", "exists", "missing"])
def test_conversion_refusals_write_nothing(tmp_path, case):
  vocab, dim = 21, 2
  prefix, *_ = source_checkpoint(str(tmp_path / "in"), vocab, dim, 2, "div")
  spec = one_table_spec(vocab, dim)
  kwargs = dict(to_strategy="mod", to_shards=2)
  error, words = ValueError, None
  out = tmp_path / "out" / "ckpt"
  if case == "to_strategy":
    kwargs["to_strategy"] = "round_robin"
    words = "to_strategy"
  elif case == "to_shards":
    kwargs["to_shards"] = 0
    words = "to_shards"
  elif case == "spec":
    spec = "tests.test_mid_level:small_spec"
    error, words = TypeError, "EmbeddingConfigSpec"
  elif case == "not_mod":
    # Slices that are no layout of 21 rows in 2 partitions.
    kwargs["from_strategy"] = "mod"
    rows = np.zeros((vocab, dim), np.float32)
    prefix = ml.write_checkpoint(str(tmp_path / "odd" / "c"), {
        TABLE: [rows[:9], rows[9:]], TABLE + "/Adagrad": rows})
    words = r"partitions of \[9, 12\] rows, not the 'mod' layout's \[11, 10\]"
  elif case == "exists":
    out.parent.mkdir()
    out.with_name("ckpt.data-00000-of-00001").write_text("keep")
    error, words = FileExistsError, "already exists"
  elif case == "missing":
    prefix = str(tmp_path / "in" / "model.ckpt-7")
    error, words = FileNotFoundError, "model.ckpt-7"
  before = ml.listing(tmp_path)
  with pytest.raises(error, match=words):
    convert.convert_checkpoint(spec, prefix, out, **kwargs)
  assert ml.listing(tmp_path) == before


def test_progress_bar_lines():
  plain = io.StringIO()
  with progress.RowProgress("tbl", 1000, stream=plain) as bar:
    for _ in range(4):
      bar.advance(250)
  assert plain.getvalue() == "tbl [" + "#" * 30 + "] 1,000/1,000 rows\n"

  class Terminal(io.StringIO):

    def isatty(self):
      return True

  live = Terminal()
  with pytest.raises(RuntimeError):
    with progress.RowProgress("big", 10, stream=live) as bar:
      bar.advance(5)
      raise RuntimeError("stop")
  text = live.getvalue()
  assert text.startswith("\rbig [" + "." * 30 + "] 0/10 rows")
  assert text.endswith("\rbig [" + "#" * 15 + "." * 15 +
                       "] 5/10 rows (stopped)\n")


# ---------------------------------------------------------------------------
# The command line.


def run_cli(*args):
  return subprocess.run(
      [sys.executable, "-m", "estimator_spec", *args], cwd=REPO,
      capture_output=True, text=True, check=False,
      env=dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2"))


def test_cli_convert_and_export_mid_level(tmp_path):
  model = tmp_path / "model"
  ml.small_checkpoint(model)
  result = run_cli("convert", "tests.test_mid_level:small_spec",
                   "--checkpoint", str(model), "--output",
                   str(tmp_path / "mod3" / "model.ckpt-5"),
                   "--to-strategy", "mod", "--to-shards", "3")
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip() == str(tmp_path / "mod3" / "model.ckpt-5")
  for table in ("tbl_a", "tbl_b"):
    assert f"{table} (2 tensors) [{'#' * 30}] 40/40 rows" in result.stderr
  source = tf.train.load_checkpoint(str(model))
  reader = tf.train.load_checkpoint(str(tmp_path / "mod3"))
  np.testing.assert_array_equal(rows_of(reader, TABLE, 3, "mod"),
                                source.get_tensor(TABLE))

  result = run_cli("export-mid-level", "tests.test_mid_level:small_spec",
                   "--model-dir", str(model), "--output",
                   str(tmp_path / "tf2" / "emb"))
  assert result.returncode == 0, result.stderr
  assert "tbl_b [" in result.stderr
  exported = tf.train.load_checkpoint(str(tmp_path / "tf2" / "emb"))
  np.testing.assert_array_equal(
      exported.get_tensor("embedding/tbl_a/.ATTRIBUTES/VARIABLE_VALUE"),
      source.get_tensor(TABLE))

  result = run_cli("describe", "tests.test_mid_level:small_spec")
  assert result.returncode == 0 and "tbl_a" in result.stdout


@pytest.mark.parametrize("args,words", [
    (["convert", "tests.test_mid_level:small_spec", "--checkpoint", "{empty}",
      "--output", "{out}", "--to-strategy", "mod", "--to-shards", "2"],
     "convert: error: convert_checkpoint: no checkpoint in directory"),
    (["convert", "tests.test_mid_level:small_spec", "--checkpoint", "{model}",
      "--output", "{model}/model.ckpt-5", "--to-strategy", "mod",
      "--to-shards", "2"], "already exists.*--force"),
    (["convert", "tests.test_mid_level:small_spec", "--checkpoint", "{model}",
      "--output", "{out}", "--to-strategy", "mod", "--to-shards", "0"],
     "expected an integer from 1 to 4,096"),
    (["convert", "tests.test_mid_level:small_spec", "--checkpoint", "{model}",
      "--output", "{out}", "--to-strategy", "mod", "--to-shards", "2",
      "--variable-name", "tbl_a"], "TABLE=TENSOR"),
    (["convert", "tests.test_mid_level:small_spec", "--checkpoint", "{model}",
      "--output", "{out}", "--to-strategy", "mod", "--to-shards", "2",
      "--variable-name", "tbl_q=x"], r"unknown tables \['tbl_q'\]"),
    (["export-mid-level", "tests.test_mid_level:momentum_spec",
      "--model-dir", "{model}", "--output", "{out}"], "MomentumParameters"),
    (["export-mid-level", "tests.no_such_module:spec", "--model-dir",
      "{model}", "--output", "{out}"],
     "export-mid-level: error: cannot import module 'tests.no_such_module'"),
])
def test_cli_errors(tmp_path, capsys, args, words):
  """Every refusal: exit code 2, one line on stderr, nothing written."""
  ml.small_checkpoint(tmp_path / "model")
  (tmp_path / "empty").mkdir()
  args = [a.format(model=tmp_path / "model", empty=tmp_path / "empty",
                   out=tmp_path / "out" / "c") for a in args]
  before = ml.listing(tmp_path)
  try:
    code = cli.main(args)
  except SystemExit as raised:  # argparse
    code = raised.code
  assert code == 2
  err = capsys.readouterr().err
  assert len(err.splitlines()) == 1, err
  assert err.startswith(f"python -m estimator_spec {args[0]}: error:"), err
  assert re.search(words, err), err
  assert ml.listing(tmp_path) == before


# ---------------------------------------------------------------------------
# Our TPUEstimator restores a converted checkpoint (slow).


def table_rows(model_dir, spec, shards, strategy):
  """{tensor: rows in row order} of every table and slot tensor."""
  with tables.open_checkpoint(model_dir) as checkpoint:
    names = tables.locate_tables(checkpoint, spec.model)
    result = {}
    for tensors in tables.table_row_tensors(checkpoint, spec.model,
                                            names).values():
      for name in tensors:
        result[name] = rows_of(checkpoint, name, shards, strategy)
    result["out/kernel"] = checkpoint.get_tensor("out/kernel")
    result["global_step"] = checkpoint.get_tensor("global_step")
  return result


@pytest.mark.slow
def test_estimator_trains_on_from_a_converted_checkpoint(tmp_path, capsys):
  original_dir = tmp_path / "div3"
  original = ml.train(original_dir, "div", steps=2)  # 24 cores: 3 shards
  converted_dir = tmp_path / "mod2"
  code = cli.main(["convert", "tests.test_mid_level:build_spec",
                   "--checkpoint", str(original_dir), "--output",
                   str(converted_dir / "model.ckpt-2"), "--to-strategy",
                   "mod", "--to-shards", "2"])
  assert code == 0
  err = capsys.readouterr().err
  assert "tbl_b_s_shared_embedding (2 tensors) [" in err
  spec = ml.build_spec("div")
  assert checkpoints.stored_partitions(str(converted_dir / "model.ckpt-2"))[
      "input_layer/a_embedding/embedding_weights"] == 2

  # 16 cores: 2 hosts, so 2 mod shards: restored directly (no re-layout).
  converted = ml.estimator(converted_dir, "mod", num_shards=16)
  features, _ = ml.model_data(16, seed=9)
  expected = ml.predict_all(original, features)
  got = ml.predict_all(converted, features)
  for key in expected:
    np.testing.assert_array_equal(got[key], expected[key], err_msg=key)

  # One more step on each side: same tables, slots and dense weights.
  ml.train(original_dir, "div", steps=3)
  ml.train(converted_dir, "mod", steps=3, num_shards=16)
  before = table_rows(original_dir, spec, 3, "div")
  after = table_rows(converted_dir, spec, 2, "mod")
  assert sorted(before) == sorted(after)
  assert int(after["global_step"]) == 3
  for name in before:
    np.testing.assert_allclose(after[name], before[name], rtol=1e-6,
                               atol=1e-7, err_msg=name)
