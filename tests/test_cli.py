"""The command line (`python -m estimator_spec`), docs/cli.md.

* Every user error exits with 2 and one line on stderr,
  `python -m estimator_spec COMMAND: error: ...`, without a traceback, and
  writes nothing: bad SPEC (module, file, attribute, raising, wrong type),
  topology flags out of bounds, missing checkpoints, outputs that exist
  (unless --force), specs that do not match the checkpoint (naming the
  table, what differs and the flag to use), bad or out-of-range ids.
* `--model-dir` with its aliases on every command reading a checkpoint.
* `rows` / `read_rows` return rows by id from a `mod` checkpoint written by
  our TPUEstimator over 2 shards, equal to the rows computed by hand from
  the stored partitions (where `tf.train.load_variable` gives them in
  partition order).
* A real `python -m estimator_spec` run from another directory with a
  FILE.py:FUNCTION spec.
* `describe` says which shards are the hosts' (the tables' partitions)
  and which the TPU cores' (lookup statistics).
* `--help`, `--version` and a bad command line load no TensorFlow; the
  package loads its names (and TensorFlow, without TF 2.21's import
  notices) on first use, `from estimator_spec import *` included.
"""
import json
import os
import re
import subprocess
import sys
import textwrap

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # pylint: disable=g-import-not-at-top
import pytest
import tensorflow as tf

from estimator_spec import __main__ as cli
from estimator_spec import checkpoints
from estimator_spec.checkpoints import rows as rows_lib
from tests import test_mid_level as ml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPEC = "tests.test_mid_level:build_mod_spec"
H = "sequence_features_1/h_embedding/embedding_weights"  # tbl_h: 17 x 2


def run(capsys, *argv):
  """(exit code, stdout, stderr) of cli.main(argv), argparse's exit too."""
  try:
    code = cli.main([str(a) for a in argv])
  except SystemExit as raised:
    code = raised.code
  out, err = capsys.readouterr()
  return code, out, err


def assert_user_error(capsys, argv, words, command=None):
  """Exit code 2, exactly one line on stderr matching `words`, no
  traceback, nothing on stdout."""
  code, out, err = run(capsys, *argv)
  assert code == 2, (code, err)
  assert len(err.splitlines()) == 1, err
  assert "Traceback" not in err
  command = command or argv[0]
  assert err.startswith(f"python -m estimator_spec {command}: error: "), err
  assert re.search(words, err), err
  assert out == ""
  return err.strip()


@pytest.fixture(scope="module")
def mod_model(tmp_path_factory):
  """A model_dir our TPUEstimator trained with `mod` over 16 cores: 2
  hosts, so every table stored in 2 partitions."""
  model_dir = tmp_path_factory.mktemp("mod2")
  ml.train(model_dir, "mod", steps=1, num_shards=16)
  assert checkpoints.restore.stored_partitions(str(model_dir))[H] == 2
  return str(model_dir)


def by_hand(stored, partitions):
  """Rows in id order from a tensor stored in `mod` partition order:
  partition p holds ids p, p + n, p + 2n, ... one after the other."""
  vocab = len(stored)
  sizes = [len(range(p, vocab, partitions)) for p in range(partitions)]
  rows = np.empty_like(stored)
  position = 0
  for p in range(partitions):
    for k in range(sizes[p]):
      rows[p + k * partitions] = stored[position]
      position += 1
  return rows


# --- rows: reading by id -------------------------------------------------------


def test_read_rows_gives_id_order_where_load_variable_gives_partition_order(
    mod_model):
  stored = tf.train.load_variable(mod_model, H)
  expected = by_hand(stored, 2)
  ids = [0, 1, 2, 16, 9, 9, 8]
  got = checkpoints.read_rows(mod_model, ml.build_mod_spec(), "tbl_h", ids)
  assert got.shape == (7, 2) and got.dtype == np.float32
  np.testing.assert_array_equal(got, expected[ids])
  # load_variable's rows are in partition order: id 1 is at position 9.
  assert not np.array_equal(stored[1], expected[1])
  np.testing.assert_array_equal(stored[9], expected[1])
  # Every id, and a slot by its checkpoint suffix or optimizer name.
  np.testing.assert_array_equal(
      rows_lib.read_rows(mod_model, ml.build_mod_spec(), "tbl_h",
                         np.arange(17)), expected)
  slot = by_hand(tf.train.load_variable(mod_model, H + "/Adagrad"), 2)
  for name in ("Adagrad", "accumulators", "accumulator"):
    np.testing.assert_array_equal(
        rows_lib.read_rows(mod_model, ml.build_mod_spec(), "tbl_h", [3, 4],
                           slot=name), slot[[3, 4]])


def test_read_rows_refusals(mod_model):
  spec = ml.build_mod_spec()
  with pytest.raises(ValueError, match=r"ids \[17, -1\] are out of range for "
                     r"table 'tbl_h', whose vocabulary_size is 17"):
    rows_lib.read_rows(mod_model, spec, "tbl_h", [0, 17, -1])
  with pytest.raises(ValueError, match=r"no table 'tbl_x'; its tables are "
                     r"\['tbl_a'"):
    rows_lib.read_rows(mod_model, spec, "tbl_x", [0])
  with pytest.raises(ValueError, match=r"no slot 'momenta'.*\['Adagrad'\]"):
    rows_lib.read_rows(mod_model, spec, "tbl_h", [0], slot="momenta")
  with pytest.raises(TypeError, match="1-D sequence of integers"):
    rows_lib.read_rows(mod_model, spec, "tbl_h", [0.5])


def test_rows_command_prints_one_line_per_id(mod_model, capsys):
  expected = by_hand(tf.train.load_variable(mod_model, H), 2)
  code, out, err = run(capsys, "rows", SPEC, "--model-dir", mod_model,
                       "--table", "tbl_h", "--ids", "5,1-3,1")
  assert code == 0, err
  lines = out.splitlines()
  assert [line.split("\t")[0] for line in lines] == ["5", "1", "2", "3", "1"]
  for line in lines:
    row_id, values = line.split("\t")
    np.testing.assert_array_equal(
        np.array(values.split(" "), np.float32), expected[int(row_id)])
  # The aliases read the same checkpoint.
  for flag in ("--model_dir", "--checkpoint"):
    assert run(capsys, "rows", SPEC, flag, mod_model, "--table", "tbl_h",
               "--ids", "5,1-3,1")[1] == out


def test_rows_npy_output_and_force(mod_model, capsys, tmp_path):
  expected = by_hand(tf.train.load_variable(mod_model, H + "/Adagrad"), 2)
  target = tmp_path / "rows.npy"
  argv = ["rows", SPEC, "--model-dir", mod_model, "--table", "tbl_h", "--ids",
          "0-16", "--slot", "Adagrad", "--format", "npy", "--output", target]
  code, out, err = run(capsys, *argv)
  assert code == 0, err
  assert out.strip() == str(target)
  np.testing.assert_array_equal(np.load(target), expected)
  target.write_bytes(b"keep")
  assert_user_error(capsys, argv, r"--output .*rows.npy exists; pass --force")
  assert target.read_bytes() == b"keep"
  assert run(capsys, *argv, "--force")[0] == 0
  np.testing.assert_array_equal(np.load(target), expected)
  assert sorted(os.listdir(tmp_path)) == ["rows.npy"]  # no staging left


@pytest.mark.parametrize("extra,words", [
    (["--ids", "0,17"], r"ids \[17\] are out of range for table 'tbl_h', "
     r"whose vocabulary_size is 17 \(ids 0 to 16\)"),
    (["--ids", "0-99999999999"], r"ids \[99999999999\] are out of range"),
    (["--ids", "3-1"], r"argument --ids: expected ids such as 1,2,3 or 0-9"),
    (["--ids", "a"], r"'a' in 'a' is not"),
    (["--ids", "1", "--slot", "momenta"],
     r"table 'tbl_h' has no slot 'momenta'.*\['Adagrad'\]"),
    (["--ids", "1", "--format", "npy"], r"--format npy .* give --output"),
])
def test_rows_command_refusals(mod_model, capsys, extra, words):
  argv = ["rows", SPEC, "--model-dir", mod_model, "--table", "tbl_h"] + extra
  assert_user_error(capsys, argv, words)


# --- every user error: exit 2, one line, nothing written --------------------


@pytest.fixture
def small_model(tmp_path):
  ml.small_checkpoint(tmp_path / "model")
  return tmp_path / "model"


SPEC_ERRORS = [
    ("examples.dlrm", r"SPEC must be MODULE:FUNCTION .* or FILE.py:FUNCTION"),
    ("no_such_module_xyz:build",
     r"cannot import module 'no_such_module_xyz' \(No module named "
     r"'no_such_module_xyz'\); run from the directory that holds it"),
    ("examples.dlrm:no_such_function",
     r"'examples.dlrm' has no attribute 'no_such_function'"),
    ("{dir}/missing.py:build_spec",
     r"spec file .*missing.py does not exist"),
    ("{dir}/raising.py:build_spec",
     r"raising.py:build_spec raised RuntimeError: no spec today "
     r"\(at .*raising.py:3\)"),
    ("{dir}/broken.py:build_spec",
     r"loading .*broken.py failed: SyntaxError"),
    ("{dir}/raising.py:NOT_A_SPEC",
     r"raising.py:NOT_A_SPEC returned a list, not an "
     r"estimator_spec.EmbeddingConfigSpec"),
]


@pytest.mark.parametrize("target,words", SPEC_ERRORS)
@pytest.mark.parametrize("command", ["describe", "rows"])
def test_spec_errors(tmp_path, capsys, small_model, target, words, command):
  (tmp_path / "raising.py").write_text(
      "NOT_A_SPEC = [1]\ndef build_spec():\n"
      "  raise RuntimeError('no spec today')\n")
  (tmp_path / "broken.py").write_text("def build_spec(:\n")
  target = target.format(dir=tmp_path)
  argv = {"describe": ["describe", target],
          "rows": ["rows", target, "--model-dir", small_model, "--table",
                   "tbl_a", "--ids", "1"]}[command]
  before = ml.listing(tmp_path)
  assert_user_error(capsys, argv, words)
  assert ml.listing(tmp_path) == before


def test_file_spec_imports_its_sibling_modules(tmp_path, capsys):
  (tmp_path / "sibling_columns.py").write_text(
      "from tests import test_mid_level as ml\n"
      "def spec():\n  return ml.small_spec()\n")
  (tmp_path / "model.py").write_text(
      "import sibling_columns\nbuild_spec = sibling_columns.spec\n")
  code, out, _ = run(capsys, "describe", f"{tmp_path}/model.py:build_spec")
  assert code == 0 and "tbl_a" in out and "tbl_b" in out


@pytest.mark.parametrize("argv,words", [
    (["convert", SPEC, "--model-dir", "{model}", "--output", "{out}",
      "--to-strategy", "mod", "--to-shards", "2000000"],
     r"argument --to-shards/--to_shards: expected an integer from 1 to "
     r"4,096 \(shards per table.*got '2000000'"),
    (["describe", SPEC, "--num-hosts", "0"],
     r"--num-hosts/--num_hosts: expected an integer from 1 to 4,096"),
    (["describe", SPEC, "--cores-per-host", "9"],
     r"--cores-per-host/--cores_per_host: expected an integer from 1 to 8 "
     r"\(no TPU host has more TensorCores\)"),
    (["describe", SPEC, "--batch-size", "-8"],
     r"--batch-size/--batch_size: expected an integer from 1 to "
     r"2,147,483,647"),
    (["describe", SPEC, "--num-shards", "5000"],
     r"--num-shards/--num_shards: expected an integer from 1 to 4,096"),
    (["describe", SPEC, "--batch-size", "10", "--num-hosts", "2",
      "--cores-per-host", "2"],
     r"train batch size 10 must be divisible by number of replicas 4"),
    (["describe", SPEC, "--profile-dir", "{tmp}/nowhere"],
     r"--profile-dir .*nowhere is not a directory"),
    (["convert", SPEC, "--output", "{out}", "--to-strategy", "mod",
      "--to-shards", "2"],
     r"the following arguments are required: --model-dir"),
    (["convert", "tests.test_mid_level:small_spec", "--model-dir",
      "{tmp}/nowhere", "--output", "{out}", "--to-strategy", "mod",
      "--to-shards", "2"],
     r"'.*nowhere' is neither a model directory nor a checkpoint prefix"),
    (["export-mid-level", "tests.test_mid_level:small_spec", "--model-dir",
      "{model}", "--output", "{tmp}/a_file/emb"],
     r"`output_prefix` .*a_file/emb' is inside .*a_file', which is a file,"
     r" not a directory; choose another output prefix"),
    (["convert", "tests.test_mid_level:small_spec", "--model-dir",
      "{model}", "--output", "/proc/no_such_dir/c", "--to-strategy", "mod",
      "--to-shards", "2"],
     r"cannot access /proc/no_such_dir: No such file or directory; check "
     r"the path and its permissions"),
    (["rows", "tests.test_mid_level:small_spec", "--model-dir", "{model}",
      "--table", "tbl_a", "--ids", "1", "--output", "{tmp}/a_file"],
     r"--output .*a_file exists; pass --force"),
    (["profile", "{tmp}/nowhere"], r"nowhere does not exist"),
])
def test_bad_arguments(tmp_path, capsys, small_model, argv, words):
  (tmp_path / "a_file").write_text("keep")
  argv = [a.format(model=small_model, out=tmp_path / "out" / "c",
                   tmp=tmp_path) for a in argv]
  before = ml.listing(tmp_path)
  assert_user_error(capsys, argv, words)
  assert ml.listing(tmp_path) == before


def test_spec_that_does_not_match_the_checkpoint(tmp_path, capsys,
                                                 small_model):
  """The table, what differs, expected vs found, and the flag to use."""
  (tmp_path / "other.py").write_text(
      "from tests import test_mid_level as ml\n"
      "import estimator_spec as es, tpu_embedding_columns as tec\n"
      "import tensorflow as tf\n"
      "def build_spec():\n"
      "  ident = tf.feature_column.categorical_column_with_identity\n"
      "  return es.EmbeddingConfigSpec(feature_columns=[\n"
      "      tec.embedding_column(ident('a', 30), 3),\n"
      "      tec.embedding_column(ident('b', 20), 4)],\n"
      "      optimization_parameters=es.AdagradParameters(0.1))\n")
  before = ml.listing(tmp_path)
  for command, more in [
      ("convert", ["--to-strategy", "mod", "--to-shards", "2", "--output",
                   tmp_path / "out" / "c"]),
      ("export-mid-level", ["--output", tmp_path / "out" / "c"]),
      ("rows", ["--table", "tbl_a", "--ids", "0"])]:
    err = assert_user_error(
        capsys, [command, f"{tmp_path}/other.py:build_spec", "--model-dir",
                 small_model] + more,
        r"table 'tbl_a' does not match the checkpoint: the spec's table is "
        r"float32 \[30, 3\] but 'dense_features/a_embedding/embedding_weights'"
        r" is float32 \[20, 3\] \(vocabulary_size: spec 30, checkpoint 20\);"
        r" .* pass variable_names=.* \(command line: --variable-name "
        r"tbl_a=TENSOR\)")
  assert_user_error(
      capsys, ["rows", f"{tmp_path}/other.py:build_spec", "--model-dir",
               small_model, "--table", "tbl_b", "--ids", "0"],
      r"table 'tbl_b' .* \(dimension: spec 4, checkpoint 3\)")
  assert ml.listing(tmp_path) == before
  print(err)


def test_layout_messages_name_from_strategy(tmp_path, capsys):
  # 21 rows stored as [9, 12]: no 'mod' layout of 2 partitions.
  table = "dense_features/a_embedding/embedding_weights"
  rows = np.zeros((21, 3), np.float32)
  ml.write_checkpoint(str(tmp_path / "odd" / "c"), {table: [rows[:9],
                                                            rows[9:]]})
  (tmp_path / "spec21.py").write_text(
      "import estimator_spec as es, tpu_embedding_columns as tec\n"
      "import tensorflow as tf\n"
      "def build_spec():\n"
      "  return es.EmbeddingConfigSpec(feature_columns=[\n"
      "      tec.embedding_column(\n"
      "          tf.feature_column.categorical_column_with_identity("
      "'a', 21), 3)],\n"
      "      optimization_parameters=es.AdagradParameters(0.1),\n"
      "      partition_strategy='mod')\n")
  argv = ["rows", f"{tmp_path}/spec21.py:build_spec", "--model-dir",
          tmp_path / "odd", "--table", "tbl_a", "--ids", "0"]
  assert_user_error(
      capsys, argv,
      r"table 'tbl_a': checkpoint tensor .* is stored in 2 partitions of "
      r"\[9, 12\] rows, not the 'mod' layout's \[11, 10\]; .* "
      r"\(command line: --from-strategy div\)")
  assert run(capsys, *argv, "--from-strategy", "div")[0] == 0


def test_from_strategy_contradicting_the_checkpoint(mod_model, tmp_path,
                                                    capsys):
  assert_user_error(
      capsys, ["convert", SPEC, "--model-dir", mod_model, "--output",
               tmp_path / "c", "--to-strategy", "div", "--to-shards", "1",
               "--from-strategy", "div"],
      r"records that its tables were written with 'mod'; drop from_strategy "
      r"\(command line: --from-strategy\)")
  assert not os.listdir(tmp_path)


# --- --force -------------------------------------------------------------------


def test_convert_and_export_refuse_an_existing_output_unless_forced(
    tmp_path, capsys, mod_model):
  out = tmp_path / "out" / "model.ckpt-1"
  argv = ["convert", SPEC, "--model-dir", mod_model, "--output", out,
          "--to-strategy", "mod", "--to-shards", "3"]
  assert run(capsys, *argv)[0] == 0
  first = ml.listing(tmp_path)
  # Old data files the new checkpoint does not have must go too.
  stale = tmp_path / "out" / "model.ckpt-1.data-00001-of-00002"
  stale.write_text("old")
  (tmp_path / "out" / "model.ckpt-1.data-00002-of-00003").write_text("old")
  assert_user_error(
      capsys, argv, r"a checkpoint already exists at .*model.ckpt-1' "
      r"\(model.ckpt-1.data-00000-of-000\d\d, .* more .*, "
      r"model.ckpt-1.index\); choose "
      r"another output prefix, or pass overwrite=True \(command line: "
      r"--force\)")
  assert stale.read_text() == "old"
  code, out_text, err = run(capsys, *argv[:-1], "2", "--force")
  assert code == 0, err
  assert ml.listing(tmp_path) == first
  assert checkpoints.restore.stored_partitions(str(out))[H] == 2
  expected = by_hand(tf.train.load_variable(mod_model, H), 2)
  np.testing.assert_array_equal(
      by_hand(tf.train.load_variable(str(out), H), 2), expected)
  assert out_text.strip() == str(out)

  emb = tmp_path / "tf2" / "emb"
  argv = ["export-mid-level", SPEC, "--model-dir", mod_model, "--output",
          emb]
  assert run(capsys, *argv)[0] == 0
  assert_user_error(capsys, argv, r"already exists .*--force")
  assert run(capsys, *argv, "--force")[0] == 0
  np.testing.assert_array_equal(
      tf.train.load_variable(str(emb),
                             "embedding/tbl_h/.ATTRIBUTES/VARIABLE_VALUE"),
      expected)


def test_profile_output_that_exists_needs_force(tmp_path, capsys):
  from estimator_spec.profiling import statistics as st
  from estimator_spec.profiling import store
  model = ml.small_spec().model
  stats = st.TableStatistics(st.table_settings(model, "tbl_a", 2), 1.0)
  stats.observe(np.arange(40) % 7, np.ones(40, np.int64))
  store.save(str(tmp_path), stats)
  page = tmp_path / "page.html"
  page.write_text("mine")
  assert_user_error(capsys, ["profile", tmp_path, "--output", page],
                    r"--output .*page.html exists; pass --force")
  assert page.read_text() == "mine"
  assert run(capsys, "profile", tmp_path, "--output", page, "--force")[0] == 0
  assert "<html" in page.read_text().lower()
  # The default page is the command's own: rewritten without --force.
  assert run(capsys, "profile", tmp_path)[0] == 0
  assert run(capsys, "profile", tmp_path)[0] == 0


# --- a real process, from another directory ---------------------------------


def test_subprocess_from_another_directory_with_a_file_spec(tmp_path,
                                                            mod_model):
  work = tmp_path / "elsewhere"
  work.mkdir()
  (tmp_path / "my_model.py").write_text(
      "from tests import test_mid_level as ml\n"
      "def build_spec():\n  return ml.build_spec('mod')\n")
  env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2")

  def run_cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "estimator_spec", *map(str, args)], cwd=work,
        capture_output=True, text=True, check=False, env=env, timeout=300)

  done = run_cli("rows", "../my_model.py:build_spec", "--model_dir",
                 mod_model, "--table", "tbl_h", "--ids", "1,2")
  assert done.returncode == 0, done.stderr
  expected = by_hand(tf.train.load_variable(mod_model, H), 2)
  got = np.array([line.split("\t")[1].split(" ")
                  for line in done.stdout.splitlines()], np.float32)
  np.testing.assert_array_equal(got, expected[[1, 2]])

  # A module name only resolves from the current directory (and
  # PYTHONPATH): from here, my_model is not importable.
  done = run_cli("describe", "my_model:build_spec")
  assert done.returncode == 2
  assert done.stderr.strip() == (
      "python -m estimator_spec describe: error: cannot import module "
      "'my_model' (No module named 'my_model'); run from the directory that "
      "holds it, add that directory to PYTHONPATH, or give the file: "
      "path/to/my_model.py:build_spec.")
  done = run_cli("rows", "../my_model.py:build_spec", "--model-dir",
                 mod_model, "--table", "tbl_h", "--ids", "40")
  assert done.returncode == 2 and "Traceback" not in done.stderr
  assert done.stderr.splitlines() == [
      "python -m estimator_spec rows: error: read_rows: ids [40] are out of "
      "range for table 'tbl_h', whose vocabulary_size is 17 (ids 0 to 16)."]


def test_version_is_the_package_version(capsys):
  import estimator_spec
  code, out, err = run(capsys, "--version")
  assert code == 0 and err == ""
  assert out == f"tpu-embedding-estimator {estimator_spec.__version__}\n"
  assert re.fullmatch(r"\d+\.\d+\.\d+(\.dev\d+)?", estimator_spec.__version__)


def test_every_option_of_every_command_says_what_it_is():
  import argparse
  parser = cli._parser()
  commands = next(a for a in parser._actions
                  if isinstance(a, argparse._SubParsersAction))
  undocumented = [
      (name, action.dest) for name, sub in commands.choices.items()
      for action in sub._actions
      if action.dest != "help" and not action.help]
  assert not undocumented


def test_describe_says_each_unreadable_statistics_file_in_one_line(
    tmp_path, capsys):
  from estimator_spec.profiling import statistics
  from estimator_spec.profiling import store
  spec = ml.build_mod_spec()
  table = sorted(spec.model.tables)[0]
  name = store.file_name(statistics.table_settings(spec.model, table, 1))
  (tmp_path / name).write_text('{"lookups": Infinity, "nested": [[[[')
  code, out, err = run(capsys, "describe", SPEC, "--profile-dir", tmp_path)
  assert code == 0 and "tbl_" in out
  lines = err.splitlines()
  assert len(lines) == 1, err
  assert lines[0].startswith(
      "python -m estimator_spec describe: warning: Lookup statistics file ")
  assert name in lines[0] and "Infinity" in lines[0]


# --- answering without TensorFlow -------------------------------------------


def _in_a_fresh_process(code):
  """(exit code, stdout, stderr) of `code` run by this interpreter."""
  env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2")
  done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=300,
                        check=False)
  return done.returncode, done.stdout, done.stderr


@pytest.mark.parametrize("argv,code,words", [
    (["--help"], 0, r"usage: python -m estimator_spec .*COMMAND"),
    (["--version"], 0, r"^tpu-embedding-estimator \d"),
    (["describe", "--help"], 0,
     r"--\s+ARGS\.\.\.'\s+are\s+the\s+program's"),
    (["describe"], 2, r"the following arguments are required: SPEC"),
    (["no-such-command"], 2, r"invalid choice: 'no-such-command'"),
])
def test_help_version_and_usage_errors_load_no_tensorflow(argv, code, words):
  """`python -m estimator_spec` as runpy runs it: the package, then its
  __main__; TensorFlow (and absl) stay unloaded."""
  program = (
      "import json, runpy, sys\n"
      f"sys.argv = ['estimator_spec'] + {argv!r}\n"
      "try:\n"
      "  runpy.run_module('estimator_spec', run_name='__main__',"
      " alter_sys=True)\n"
      "except SystemExit as exit:\n"
      "  code = exit.code\n"
      "print(json.dumps([code, sorted(m for m in sys.modules if m.split('.')"
      "[0] in ('tensorflow', 'absl', 'numpy'))]))\n")
  returncode, out, err = _in_a_fresh_process(program)
  assert returncode == 0, err
  lines = out.splitlines()
  exit_code, loaded = json.loads(lines[-1])
  assert exit_code == code
  assert loaded == []
  assert re.search(words, "\n".join(lines[:-1]) + err, re.M)


def test_the_package_loads_its_names_and_tensorflow_on_first_use():
  """`import estimator_spec` loads no TensorFlow; every public name is
  there (`from estimator_spec import *` too) and loads it; TensorFlow's
  module keeps its own loader and the import hook is gone."""
  program = textwrap.dedent("""
      import importlib, json, sys
      import estimator_spec
      first = sorted(m for m in sys.modules if m.startswith("tensorflow"))
      scope = {}
      exec("from estimator_spec import *", scope)
      import tensorflow as tf
      from estimator_spec.config import spec as spec_lib
      from estimator_spec.estimator import tpu_estimator
      print(json.dumps({
          "first": first,
          "star": sorted(set(estimator_spec.__all__) - set(scope)),
          "dir": sorted(set(estimator_spec.__all__) -
                        set(dir(estimator_spec))),
          "same": [scope["EmbeddingConfigSpec"] is
                   spec_lib.EmbeddingConfigSpec,
                   estimator_spec.TPUEstimator is tpu_estimator.TPUEstimator,
                   estimator_spec.config is
                   importlib.import_module("estimator_spec.config")],
          "loader": type(tf.__loader__).__module__,
          "spec_loader": type(tf.__spec__.loader).__module__,
          "hooks": [type(f).__module__ for f in sys.meta_path
                    if type(f).__module__.startswith("estimator_spec")],
      }))
      """)
  returncode, out, err = _in_a_fresh_process(program)
  assert returncode == 0, err
  found = json.loads(out.splitlines()[-1])
  assert found["first"] == []
  assert found["star"] == [] and found["dir"] == []
  assert found["same"] == [True, True, True]
  assert not found["loader"].startswith("estimator_spec")
  assert not found["spec_loader"].startswith("estimator_spec")
  assert found["hooks"] == []
  import estimator_spec  # pylint: disable=g-import-not-at-top
  with pytest.raises(AttributeError, match="has no attribute 'NoSuchName'"):
    getattr(estimator_spec, "NoSuchName")


def test_a_name_first_used_loads_tensorflow_without_notices():
  """The package's first name loads TensorFlow through the package's
  import hook: nothing on stderr (TF 2.21's GPU build would print its
  import notices there)."""
  returncode, out, err = _in_a_fresh_process(
      "import estimator_spec, sys\n"
      "print('tensorflow' in sys.modules)\n"
      "estimator_spec.EmbeddingConfigSpec\n"
      "print('tensorflow' in sys.modules)\n")
  assert returncode == 0, err
  assert out.split() == ["False", "True"]
  assert err == ""


# --- describe: which shards ------------------------------------------------


def test_describe_says_host_shards_and_core_shards(tmp_path, capsys):
  """The tables' shards are the hosts' (checkpoint partitions, memory);
  lookup statistics are per TPU core: the report says which is which."""
  from estimator_spec.profiling import statistics
  from estimator_spec.profiling import store
  spec = ml.build_mod_spec()
  table = sorted(spec.model.tables)[0]
  stats = statistics.TableStatistics(
      statistics.table_settings(spec.model, table, 16), 1.0)
  stats.observe(np.arange(64) % 9, np.ones(64, np.int64))
  store.save(str(tmp_path), stats)
  code, out, err = run(capsys, "describe", SPEC, "--num-hosts", "2",
                       "--cores-per-host", "8", "--batch-size", "64",
                       "--profile-dir", tmp_path)
  assert code == 0, err
  assert "2 host(s) x 8 core(s) = 16 cores" in out
  assert "tables partitioned 'mod' over 2 host shard(s);" in out
  assert "\nMemory per host shard (tables + optimizer slots" in out
  assert ("Lookup statistics (sampled while training), kept per TPU core, "
          "not per host shard:") in out
  assert "\n  16 core shard(s); tables use 'mod'.\n" in out
  assert "  Per core shard, the tables above together" in out
  assert "shard(s)" not in out.replace("host shard(s)", "").replace(
      "core shard(s)", "")
  # --num-shards other than the hosts: no longer "host" shards.
  code, out, err = run(capsys, "describe", SPEC, "--num-hosts", "2",
                       "--cores-per-host", "8", "--batch-size", "64",
                       "--num-shards", "3")
  assert code == 0, err
  assert "tables partitioned 'mod' over 3 shard(s);" in out
  assert "\nMemory per shard (tables" in out
  assert "host shard" not in out and "Lookup statistics" not in out
