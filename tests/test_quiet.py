"""quiet.silence_deprecation_notices drops TF's deprecation notices and
nothing else."""
import logging
import os
import pathlib
import re
import subprocess
import sys
import warnings

import pytest
import tensorflow as tf

from estimator_spec import quiet

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _passes(message):
  record = logging.LogRecord("tensorflow", logging.WARNING, __file__, 1,
                             message, None, None)
  return all(f.filter(record) for f in tf.get_logger().filters)


def test_deprecation_log_notices_are_dropped_and_others_kept():
  quiet.silence_deprecation_notices()
  assert not _passes("From x.py:3: RunConfig.__init__ (from y) is deprecated "
                     "and will be removed in a future version.")
  assert not _passes("From x.py:3: The name tf.estimator.tpu.TPUConfig is "
                     "deprecated. Please use tf.compat.v1.estimator.tpu."
                     "TPUConfig instead.")
  assert _passes("TPUEstimator on the host: these settings concern TPU "
                 "hardware and have no effect here")
  assert _passes("The name of the table is deprecated in our docs")


def test_layers_deprecation_warning_is_dropped_and_other_warnings_kept():
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    quiet.silence_deprecation_notices()
    with tf.Graph().as_default():
      x = tf.compat.v1.placeholder(tf.float32, [None, 3])
      tf.compat.v1.layers.dense(x, 2)
    warnings.warn("a real problem", UserWarning)
  messages = [str(w.message) for w in caught]
  assert not [m for m in messages if "tf.layers" in m], messages
  assert "a real problem" in messages


_PROGRAM = r"""
import logging, sys
import numpy as np
import tensorflow as tf
import estimator_spec, tpu_embedding_columns

column = tpu_embedding_columns.embedding_column(
    tf.feature_column.categorical_column_with_identity("a", 10), 2)

def model_fn(features, labels, mode, params):
  x = tf.compat.v1.feature_column.input_layer(features, [column])
  logits = tf.compat.v1.layers.Dense(1)(x)[:, 0]
  if mode == estimator_spec.estimator.ModeKeys.PREDICT:
    return estimator_spec.TPUEstimatorSpec(mode, predictions={"x": x})
  loss = tf.reduce_mean(tf.square(logits - labels))
  train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
      loss, tf.compat.v1.train.get_global_step())
  return estimator_spec.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)

def input_fn(params):
  ids = np.arange(16).reshape(8, 2) % 10
  return tf.data.Dataset.from_tensor_slices(
      ({"a": ids}, np.ones(8, np.float32))).batch(params["batch_size"],
                                                  drop_remainder=True)

estimator = estimator_spec.TPUEstimator(
    model_fn=model_fn, model_dir=sys.argv[1], use_tpu=False,
    train_batch_size=4, eval_batch_size=4, predict_batch_size=4,
    embedding_config_spec=estimator_spec.EmbeddingConfigSpec(
        feature_columns=[column],
        optimization_parameters=estimator_spec.AdagradParameters(0.1)))
estimator.train(input_fn, max_steps=2)
estimator.evaluate(input_fn, steps=1)
next(estimator.predict(input_fn))
"""


def test_the_librarys_own_deprecated_calls_are_quiet_and_the_users_not(
    tmp_path):
  program = tmp_path / "user_program.py"
  program.write_text(_PROGRAM)
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  run = subprocess.run([sys.executable, str(program), str(tmp_path / "m")],
                       cwd=REPO, env=dict(env, PYTHONPATH=REPO),
                       capture_output=True, text=True, timeout=300,
                       check=False)
  assert run.returncode == 0, run.stderr[-3000:]
  notices = [line for line in run.stderr.splitlines()
             if "is deprecated and will be removed" in line]
  # The user's own deprecated calls keep their notice ...
  users = [line for line in notices if "user_program.py" in line]
  assert any("input_layer" in line for line in users), notices
  assert any("categorical_column_with_identity" in line for line in users)
  # ... and the library's (and TF's Estimator internals it runs) have none.
  others = [line for line in notices if "user_program.py" not in line]
  assert not others, others


def test_tfs_deprecation_flag_is_what_the_quiet_calls_turn():
  from tensorflow.python.util import deprecation

  @deprecation.deprecated(None, "for this test")
  def old():
    return 1

  with quiet.library_call():
    assert deprecation._PRINT_DEPRECATION_WARNINGS is False
    old()  # not printed, so not recorded as warned
    with quiet.user_call():
      assert deprecation._PRINT_DEPRECATION_WARNINGS is True
    assert deprecation._PRINT_DEPRECATION_WARNINGS is False
  assert deprecation._PRINT_DEPRECATION_WARNINGS is True
  assert not [f for f in deprecation._PRINTED_WARNING
              if getattr(f, "__wrapped__", None) is getattr(old, "__wrapped__",
                                                             old)]


# --- TensorFlow's import, when the library imports it (tf_import) -----------


def test_only_the_gpu_builds_import_notices_are_dropped():
  from estimator_spec import tf_import  # pylint: disable=import-outside-toplevel
  absl = (b"WARNING: All log messages before absl::InitializeLog() is called "
          b"are written to STDERR\n")
  cuda = (b"I0000 00:00:1795930399.665123   16545 cudart_stub.cc:31] Could "
          b"not find cuda drivers on your machine, GPU will not be used.\n")
  real = b"E0000 00:00:1.2   7 something.cc:9] a real problem\n"
  python = b"UserWarning: something of the user's\n"
  assert tf_import.kept(absl + cuda + real + absl + cuda + python) == (
      real + python)
  assert tf_import.kept(real) == real
  # Only whole lines of those forms go.
  assert tf_import.kept(b"see: " + cuda) == b"see: " + cuda


def test_importing_the_library_first_writes_nothing_to_stderr():
  """`import estimator_spec` before TensorFlow (as the command line and the
  examples do) prints nothing on either stack; a warning written during
  TensorFlow's import would still come through."""
  env = {k: v for k, v in os.environ.items()
         if k not in ("TF_CPP_MIN_LOG_LEVEL",
                      "ESTIMATOR_SPEC_KEEP_TF_IMPORT_LINES")}
  env["PYTHONPATH"] = REPO
  env["TF_CPP_MIN_LOG_LEVEL"] = "2"
  run = subprocess.run(
      [sys.executable, "-c", "import estimator_spec, tensorflow"],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
      check=False)
  assert run.returncode == 0, run.stderr[-3000:]
  assert run.stderr == ""


# --- The README's program at TF's default verbosity ---------------------------

# A line of the library's own: one that names a file of its packages (TF's
# notices say where the call they are about was made).
_LIBRARY_FILE = re.compile(
    r"(^|[\s\"'(/\\])(estimator_spec|tpu_embedding_columns)[/\\]\S*\.py")


def test_a_line_naming_a_library_file_is_recognised():
  assert _LIBRARY_FILE.search(
      "W1129 11:31:02.1 From /work/main/estimator_spec/estimator/"
      "run_config.py:10: The name tf.estimator.tpu.TPUConfig is deprecated.")
  assert _LIBRARY_FILE.search(
      "WARNING:tensorflow:From tpu_embedding_columns/api.py:3: x is "
      "deprecated")
  assert not _LIBRARY_FILE.search(
      "WARNING:tensorflow:From /tmp/x/user_program.py:12: "
      "categorical_column_with_identity (from tensorflow.python."
      "feature_column.feature_column_v2) is deprecated")


def test_the_librarys_lines_are_told_from_the_users():
  users = [
      "WARNING:tensorflow:From /tmp/x/user_program.py:8: categorical_column"
      "_with_identity (from tensorflow.python.feature_column.feature_column"
      "_v2) is deprecated and will be removed in a future version.",
      "Instructions for updating:",
      "/tmp/x/user_program.py:19: UserWarning: `tf.layers.dense` is "
      "deprecated and will be removed in a future version.",
      "2026-11-29 11:30:28.892489: I tensorflow/compiler/mlir/mlir_graph_"
      "optimization_pass.cc:388] MLIR V1 optimization pass is not enabled"]
  librarys = [
      "WARNING:tensorflow:TPUEstimator on the host: these settings concern "
      "TPU hardware and have no effect here:",
      "  * tpu_config.iterations_per_loop=2: a TPU runs that many steps per "
      "session run; the host runs one step per run.",
      "WARNING:tensorflow:Input graph does not use tf.data.Dataset or "
      "contain a QueueRunner. That means predict yields forever. This is "
      "probably a mistake."]
  assert _librarys_lines("\n".join(users + librarys)) == librarys


@pytest.mark.slow
def test_the_readme_program_prints_nothing_of_the_librarys_own(tmp_path):
  """The README's program (as tests/test_readme.py runs it), with TF's
  log level unset: what it writes to stderr is TensorFlow's about the
  program's own code and nothing of the library's: no line from the
  library's files (its own use of deprecated TF names), no notice of
  TPU-only settings the program never set (TF's defaults)."""
  from tests import test_readme  # pylint: disable=import-outside-toplevel
  readme = pathlib.Path(REPO) / "README.md"
  # The README's TPUEstimator program (its first block today).
  setup, source = next((setup, source) for _, _, setup, source in
                       test_readme.python_programs(readme)
                       if "estimator_spec.TPUEstimator(" in source)
  assert setup is None
  program = tmp_path / "user_program.py"
  program.write_text(source)
  env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
  env["PYTHONPATH"] = REPO
  run = subprocess.run([sys.executable, str(program)], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=600,
                       check=False)
  assert run.returncode == 0, run.stderr[-3000:]
  assert not _librarys_lines(run.stderr), run.stderr


def _librarys_lines(stderr):
  """The lines of `stderr` that are the library's: from its files, about
  TPU-only settings, or a TF log warning other than a deprecation notice
  (the library's own warnings, or the Estimator's about what the library
  built)."""
  return [line for line in stderr.splitlines()
          if _LIBRARY_FILE.search(line) or "no effect here" in line or
          "iterations_per_loop" in line or (
              line.startswith("WARNING:tensorflow:") and
              "is deprecated and will be removed" not in line)]
