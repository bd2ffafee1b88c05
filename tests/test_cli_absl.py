"""A SPEC in an absl program (docs/cli.md, 'SPEC in an absl program').

The program is a TPU trainer written as public TPU code writes one: `from
absl import app, flags`, `FLAGS` at module level, a `build_spec()` that
reads `FLAGS`, a `main(argv)` that builds the estimator with the spec and
trains, `flags.mark_flag_as_required` and `app.run(main)` under
`__main__`. Without editing it:

* `describe trainer.py:build_spec` reads the flags at their defaults, and
  `-- --flag=value` at the end of any SPEC command sets them; absl's flags,
  `sys.argv` and the TPUEstimator class are as they were after every
  command, failed ones included.
* `trainer.py:main` is called as `app.run` calls it and stopped at its
  TPUEstimator, whose spec is the spec: nothing trained or written; the
  spec matches the checkpoint the program itself trained (`rows`), and
  the flags after `--` reach it.
* What cannot run (a flag read at import, a required flag without value,
  an unknown flag or a bad value, a main that returns or exits without an
  estimator, a function that needs two arguments, an estimator without a
  spec) is one line that points to the docs section; a program that
  catches `Exception` around the estimator is still stopped.
"""
import os
import re
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import flags  # pylint: disable=g-import-not-at-top
import numpy as np
import pytest
import tensorflow as tf

from estimator_spec import __main__ as cli
from estimator_spec.estimator import tpu_estimator

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = "(docs/cli.md, 'SPEC in an absl program')"
TABLE = "tbl_item_id"

TRAINER = '''
"""A TPU trainer: absl flags, a spec from them, app.run(main)."""
import os

from absl import app
from absl import flags
import tensorflow as tf

import estimator_spec
import tpu_embedding_columns

FLAGS = flags.FLAGS

flags.DEFINE_string("model_dir", None, "Where the checkpoints go.")
flags.DEFINE_integer("item_vocab_size", 40, "Rows of the item table.")
flags.DEFINE_integer("embedding_dim", 4, "Dimension of the embeddings.")
flags.DEFINE_float("embedding_learning_rate", 0.05, "Learning rate of the "
                   "embedding tables.")
flags.DEFINE_integer("train_batch_size", 8, "Global batch size.")
flags.DEFINE_integer("train_steps", 2, "Training steps.")
flags.DEFINE_bool("use_tpu", False, "Whether to run on a TPU.")


def feature_columns():
  items = tf.feature_column.categorical_column_with_identity(
      "item_id", FLAGS.item_vocab_size)
  return [tpu_embedding_columns.embedding_column(
      items, dimension=FLAGS.embedding_dim)]


def build_spec(columns=None):
  return estimator_spec.EmbeddingConfigSpec(
      feature_columns=columns or feature_columns(),
      optimization_parameters=estimator_spec.AdagradParameters(
          FLAGS.embedding_learning_rate),
      partition_strategy="mod")


def make_model_fn(columns):
  def model_fn(features, labels, mode, params):
    del params
    dense = tf.compat.v1.keras.layers.DenseFeatures(columns)(features)
    logits = tf.compat.v1.layers.dense(dense, 1)
    loss = tf.compat.v1.losses.sigmoid_cross_entropy(labels, logits)
    optimizer = tf.compat.v1.tpu.CrossShardOptimizer(
        tf.compat.v1.train.GradientDescentOptimizer(0.1))
    train_op = optimizer.minimize(loss,
                                  tf.compat.v1.train.get_global_step())
    return estimator_spec.TPUEstimatorSpec(mode, loss=loss,
                                           train_op=train_op)
  return model_fn


def input_fn(params):
  n = params["batch_size"]
  rows = tf.range(n, dtype=tf.int64)
  ids = tf.SparseTensor(tf.stack([rows, tf.zeros_like(rows)], 1),
                        (rows * 7) % FLAGS.item_vocab_size, [n, 1])
  labels = tf.cast(tf.equal(rows % 2, 0), tf.float32)[:, None]
  return tf.data.Dataset.from_tensors(({"item_id": ids}, labels)).repeat()


def main(argv):
  if len(argv) > 1:
    raise app.UsageError("Too many command-line arguments.")
  columns = feature_columns()
  run_config = estimator_spec.RunConfig(model_dir=FLAGS.model_dir)
  estimator = estimator_spec.TPUEstimator(
      model_fn=make_model_fn(columns), config=run_config,
      use_tpu=FLAGS.use_tpu, train_batch_size=FLAGS.train_batch_size,
      embedding_config_spec=build_spec(columns))
  estimator.train(input_fn, max_steps=FLAGS.train_steps)
  with open(os.path.join(FLAGS.model_dir, "main_finished"), "w") as f:
    f.write("trained")


if __name__ == "__main__":
  flags.mark_flag_as_required("model_dir")
  app.run(main)
'''

# Programs the command cannot run as far as a spec, and two it can.
OTHERS = '''
import sys

from absl import flags
import tensorflow as tf

import estimator_spec
import tpu_embedding_columns

FLAGS = flags.FLAGS
flags.DEFINE_string("others_data_dir", None, "Input files.")
WROTE = []


def build_spec():
  column = tpu_embedding_columns.embedding_column(
      tf.feature_column.categorical_column_with_identity("x", 12), 2)
  return estimator_spec.EmbeddingConfigSpec(
      feature_columns=[column],
      optimization_parameters=estimator_spec.AdagradParameters(0.1))


def main_without_estimator(argv):
  del argv


def main_that_exits(argv):
  del argv
  sys.exit(3)


def main_that_raises(argv):
  raise ValueError("no input files in " + FLAGS.others_data_dir)


def main_catching_everything(argv):
  try:
    estimator_spec.TPUEstimator(
        model_fn=lambda features, labels, mode, params: None,
        config=estimator_spec.RunConfig(), use_tpu=False,
        train_batch_size=8, embedding_config_spec=build_spec())
  except Exception:  # pylint: disable=broad-except
    pass
  WROTE.append(argv)


def main_in_graph_mode(argv):
  del argv
  tf.compat.v1.disable_v2_behavior()
  estimator_spec.TPUEstimator(
      model_fn=lambda features, labels, mode, params: None,
      config=estimator_spec.RunConfig(), use_tpu=False,
      train_batch_size=8, embedding_config_spec=build_spec())


def estimator_without_spec():
  estimator_spec.TPUEstimator(
      model_fn=lambda features, labels, mode, params: None,
      config=estimator_spec.RunConfig(), use_tpu=False, train_batch_size=8)


def needs_two(argv, more):
  del argv, more
'''

# Marks its flag required at module level, as many trainers do: absl's
# flags are one per process, so it runs in processes of its own.
REQUIRED = '''
from absl import flags
import tensorflow as tf

import estimator_spec
import tpu_embedding_columns

flags.DEFINE_string("data_dir", None, "Input files.")
flags.mark_flag_as_required("data_dir")


def build_spec():
  column = tpu_embedding_columns.embedding_column(
      tf.feature_column.categorical_column_with_identity("x", 12), 2)
  return estimator_spec.EmbeddingConfigSpec(
      feature_columns=[column],
      optimization_parameters=estimator_spec.AdagradParameters(0.1))
'''

IMPORT_TIME = '''
from absl import flags
import estimator_spec

flags.DEFINE_integer("import_time_rows", 5, "Rows.")
ROWS = flags.FLAGS.import_time_rows


def build_spec():
  raise AssertionError("not reached")
'''


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
  """The programs' directory (written once: absl's flags are defined once
  per process, by the first load)."""
  directory = tmp_path_factory.mktemp("programs")
  (directory / "trainer.py").write_text(TRAINER)
  (directory / "others.py").write_text(OTHERS)
  (directory / "import_time.py").write_text(IMPORT_TIME)
  (directory / "required.py").write_text(REQUIRED)
  return directory


@pytest.fixture
def state():
  """What every command must leave as it found: absl's flags (parsed or
  not, and their values), sys.argv, the TPUEstimator class."""

  def snapshot():
    values = flags.FLAGS
    return (values.is_parsed(),
            {name: values[name].value for name in values}, list(sys.argv),
            tpu_estimator.TPUEstimator.__dict__["__new__"],
            tpu_estimator.TPUEstimator.__dict__["__init__"])

  before = snapshot()
  yield
  after = snapshot()
  assert after[0] == before[0]
  assert {k: v for k, v in after[1].items() if k in before[1]} == before[1]
  assert after[2:] == before[2:]


def run(capsys, *argv):
  try:
    code = cli.main([str(a) for a in argv])
  except SystemExit as raised:
    code = raised.code
  out, err = capsys.readouterr()
  return code, out, err


def table_row(out, table=TABLE):
  (row,) = [line.split() for line in out.splitlines()
            if line.split()[:1] == [table]]
  return row


def assert_one_line(capsys, argv, words, docs=True):
  code, out, err = run(capsys, *argv)
  assert code == 2, (code, err)
  assert out == "" and len(err.splitlines()) == 1, err
  assert err.startswith(f"python -m estimator_spec {argv[0]}: error: "), err
  assert re.search(words, err), err
  assert (DOCS in err) == docs, err
  return err


# --- flags ----------------------------------------------------------------


def test_build_spec_reads_the_flags_at_their_defaults(programs, capsys,
                                                      state):
  del state
  code, out, err = run(capsys, "describe",
                       f"{programs}/trainer.py:build_spec")
  assert code == 0, err
  # vocabulary, dimension, combiner, optimizer, learning rate
  assert table_row(out)[1:6] == ["40", "4", "mean", "Adagrad", "0.05"]


def test_flags_after_the_double_dash_set_them(programs, capsys, state):
  del state
  argv = ["describe", f"{programs}/trainer.py:build_spec", "--batch-size",
          "16", "--", "--item_vocab_size=77", "--embedding_dim", "3",
          "--embedding_learning_rate=0.5"]
  code, out, err = run(capsys, *argv)
  assert code == 0, err
  assert table_row(out)[1:6] == ["77", "3", "mean", "Adagrad", "0.5"]
  assert "global batch 16" in out  # the command's own flags still count
  # Put back after the command: the defaults again.
  code, out, _ = run(capsys, "describe", f"{programs}/trainer.py:build_spec")
  assert table_row(out)[1:3] == ["40", "4"]


@pytest.mark.parametrize("program_args,words", [
    (["--no_such_flag=1"], r"UnrecognizedFlagError: Unknown command line "
     r"flag 'no_such_flag'"),
    (["--item_vocab_size=many"], r"IllegalFlagValueError: flag "
     r"--item_vocab_size=many"),
    (["extra"], r"build_spec takes no arguments, so the program arguments "
     r"\['extra'\] have nowhere to go"),
])
def test_flags_the_program_refuses(programs, capsys, state, program_args,
                                   words):
  del state
  assert_one_line(capsys, ["describe", f"{programs}/trainer.py:build_spec",
                           "--"] + program_args, words)


def test_a_flag_read_while_the_program_is_imported(programs, capsys, state):
  del state
  assert_one_line(
      capsys, ["describe", f"{programs}/import_time.py:build_spec"],
      r"loading .*import_time.py failed: UnparsedFlagAccessError: .*"
      r"import_time_rows.* \(at .*\); the program reads an absl flag while "
      r"it is imported: read it inside a function")


# --- main(argv) -------------------------------------------------------------


def test_main_is_stopped_at_its_estimator(programs, capsys, state, tmp_path):
  del state
  model_dir = tmp_path / "model"
  code, out, err = run(capsys, "describe", f"{programs}/trainer.py:main",
                       "--", f"--model_dir={model_dir}",
                       "--item_vocab_size=50")
  assert code == 0, err
  assert table_row(out)[1:6] == ["50", "4", "mean", "Adagrad", "0.05"]
  assert not model_dir.exists()  # nothing trained, nothing written
  assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("function,words", [
    ("main_without_estimator",
     r"main_without_estimator returned without constructing an "
     r"estimator_spec.TPUEstimator"),
    ("main_that_exits",
     r"main_that_exits exited \(SystemExit: 3\) before it constructed an "
     r"estimator_spec.TPUEstimator"),
    ("needs_two", r"needs_two needs the arguments argv, more; SPEC names"),
])
def test_functions_that_give_no_spec(programs, capsys, state, function,
                                     words):
  del state
  assert_one_line(capsys, ["describe", f"{programs}/others.py:{function}",
                           "--", "--others_data_dir=/data"], words)


def test_errors_of_the_program_itself(programs, capsys, state):
  del state
  assert_one_line(
      capsys, ["describe", f"{programs}/others.py:main_that_raises", "--",
               "--others_data_dir=/data"],
      r"main_that_raises raised ValueError: no input files in /data "
      r"\(at .*others.py:\d+\)", docs=False)
  assert_one_line(
      capsys, ["describe", f"{programs}/others.py:estimator_without_spec",
               "--", "--others_data_dir=/data"],
      r"constructed an estimator_spec.TPUEstimator without an "
      r"embedding_config_spec", docs=False)


def test_a_program_catching_exception_is_still_stopped(programs, capsys,
                                                       state):
  del state
  code, out, err = run(capsys, "describe",
                       f"{programs}/others.py:main_catching_everything",
                       "--", "--others_data_dir=/data", "positional")
  assert code == 0, err
  assert table_row(out, "tbl_x")[1:3] == ["12", "2"]
  others = [m for n, m in sys.modules.items() if n.endswith("others")]
  assert others and all(m.WROTE == [] for m in others)


def test_a_tf1_style_main_leaves_eager_execution_on(programs, capsys,
                                                    state):
  """A main that turns TF 2 behaviour off (as TF1-style trainers do) leaves
  it on for the command (export-mid-level writes a TF2 checkpoint)."""
  del state
  assert tf.executing_eagerly()
  code, out, err = run(capsys, "describe",
                       f"{programs}/others.py:main_in_graph_mode", "--",
                       "--others_data_dir=/data")
  assert code == 0, err
  assert table_row(out, "tbl_x")[1:3] == ["12", "2"]
  assert tf.executing_eagerly()
  # And TF's switches are TF's again after the command.
  assert tf.compat.v1.disable_v2_behavior.__module__.startswith(
      "tensorflow")
  assert tf.compat.v1.disable_eager_execution.__module__.startswith(
      "tensorflow")


def test_rows_of_what_the_program_trained(programs, capsys, state, tmp_path):
  """The program trains for real (`python trainer.py --model_dir=...`); the
  spec of its main, with the same flags, reads the table it wrote; other
  flags make another spec, which the checkpoint refuses."""
  del state
  model_dir = tmp_path / "model"
  env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2")
  done = subprocess.run(
      [sys.executable, str(programs / "trainer.py"),
       f"--model_dir={model_dir}"], cwd=tmp_path, env=env,
      capture_output=True, text=True, timeout=600, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  assert (model_dir / "main_finished").read_text() == "trained"
  listing = sorted(os.listdir(model_dir))
  name = "dense_features/item_id_embedding/embedding_weights"
  stored = tf.train.load_variable(str(model_dir), name)
  assert stored.shape == (40, 4)
  argv = ["rows", f"{programs}/trainer.py:main", "--model-dir", model_dir,
          "--table", TABLE, "--ids", "0-39", "--", f"--model_dir={model_dir}"]
  code, out, err = run(capsys, *argv)
  assert code == 0, err
  got = np.array([line.split("\t")[1].split() for line in out.splitlines()],
                 np.float32)
  np.testing.assert_array_equal(got, stored)  # one shard: id order
  assert_one_line(
      capsys, argv + ["--item_vocab_size=50"],
      r"table 'tbl_item_id' does not match the checkpoint.*vocabulary_size: "
      r"spec 50, checkpoint 40", docs=False)
  assert sorted(os.listdir(model_dir)) == listing


def test_real_runs_of_the_command(programs, tmp_path):
  """`python -m estimator_spec describe ...` in processes of their own,
  from another directory: main with flags; a flag the program marks
  required, missing, then given."""
  env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2")

  def describe(*argv):
    return subprocess.run(
        [sys.executable, "-m", "estimator_spec", "describe", *argv],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
        check=False)

  done = describe(f"{programs}/trainer.py:main", "--num-hosts", "2", "--",
                  f"--model_dir={tmp_path / 'model'}", "--embedding_dim=6")
  assert done.returncode == 0, done.stderr[-3000:]
  assert table_row(done.stdout)[1:3] == ["40", "6"]
  assert "over 2 host shard(s)" in done.stdout
  assert os.listdir(tmp_path) == []
  target = f"{programs}/required.py:build_spec"
  done = describe(target)
  assert done.returncode == 2 and done.stdout == ""
  assert done.stderr.splitlines() == [
      f"python -m estimator_spec describe: error: {target}: the program "
      "requires the absl flag(s) --data_dir (flags.mark_flag_as_required), "
      "which have no value; pass them at the end of the command line, after "
      f"'--': -- --data_dir=VALUE {DOCS}."]
  done = describe(target, "--", "--data_dir=/data")
  assert done.returncode == 0, done.stderr[-3000:]
  assert table_row(done.stdout, "tbl_x")[1:3] == ["12", "2"]


def test_double_dash_is_the_commands_own_for_migrate(tmp_path, capsys):
  """Only the SPEC commands take program arguments: migrate's `--` still
  ends its options (a path that starts with a dash)."""
  (tmp_path / "-odd.py").write_text("import tensorflow as tf\n")
  old = os.getcwd()
  os.chdir(tmp_path)
  try:
    code, _, err = run(capsys, "migrate", "--", "-odd.py")
  finally:
    os.chdir(old)
  assert code == 0, err
