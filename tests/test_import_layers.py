"""What a host run loads: TF's TPU estimator only through interop, when a
TPU run is asked for.

Each check runs in a fresh interpreter, so that nothing another test loaded
hides what the library itself imports.
"""
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The library's modules that wrap TF's TPU estimator and TF's TPU columns.
TPU_PATH_MODULES = ("estimator_spec.interop._tpu",
                    "estimator_spec.interop._tensorflow")

_HOST_TRAIN = r"""
import json, sys
import estimator_spec
after_import = sorted(m for m in sys.modules
                      if m.split(".")[0] == "tensorflow_estimator")
import numpy as np
import tensorflow as tf
import tpu_embedding_columns as tec

column = tec.embedding_column(
    tf.feature_column.categorical_column_with_identity("a", 10), 2)
spec = estimator_spec.EmbeddingConfigSpec(
    feature_columns=[column],
    optimization_parameters=estimator_spec.AdagradParameters(0.1))

def model_fn(features, labels, mode, params):
  x = tf.compat.v1.feature_column.input_layer(features, [column])
  loss = tf.reduce_mean(tf.square(tf.reduce_sum(x, 1) - labels))
  train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
      loss, tf.compat.v1.train.get_global_step())
  return estimator_spec.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)

def input_fn(params):
  ids = np.arange(16).reshape(8, 2) % 10
  labels = np.ones(8, np.float32)
  return tf.data.Dataset.from_tensor_slices(({"a": ids}, labels)).batch(
      params["batch_size"], drop_remainder=True)

estimator = estimator_spec.TPUEstimator(
    model_fn=model_fn, model_dir=sys.argv[1], use_tpu=False,
    train_batch_size=4, embedding_config_spec=spec)
estimator.train(input_fn, steps=2)
json.dump({"after_import": after_import,
           "step": int(estimator.get_variable_value("global_step")),
           "loaded": sorted(sys.modules)}, open(sys.argv[2], "w"))
"""

_TF_ESTIMATOR_ALONE = r"""
import json, sys
import tensorflow_estimator
json.dump(sorted(sys.modules), open(sys.argv[1], "w"))
"""


def _run(tmp_path, program, *args):
  result = tmp_path / "result.json"
  process = subprocess.run(
      [sys.executable, "-c", program, *map(str, args), str(result)],
      cwd=REPO, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
      capture_output=True, text=True, timeout=300, check=False)
  assert process.returncode == 0, process.stderr[-4000:]
  return json.loads(result.read_text())


def _tpu_estimator_modules(modules):
  return {m for m in modules
          if m.startswith("tensorflow_estimator.python.estimator.tpu")}


def test_a_host_run_loads_nothing_of_the_tpu_path(tmp_path):
  run = _run(tmp_path, _HOST_TRAIN, tmp_path / "model")
  assert run["step"] == 2
  # The config model, engine and columns load without TF's Estimator.
  assert run["after_import"] == []
  assert not [m for m in TPU_PATH_MODULES if m in run["loaded"]]
  # tensorflow_estimator's own package import loads its TPU estimator
  # (its v1 API names tf.compat.v1.estimator.tpu); a host run loads no
  # module of it beyond those.
  alone = _run(tmp_path, _TF_ESTIMATOR_ALONE)
  assert _tpu_estimator_modules(run["loaded"]) <= _tpu_estimator_modules(
      alone)


def test_interop_names_load_their_module_on_first_use(tmp_path):
  program = r"""
import json, sys
from estimator_spec import interop
before = [m for m in %r if m in sys.modules]
interop.DelegatedTPUEstimator
json.dump({"before": before, "after": [m for m in %r if m in sys.modules]},
          open(sys.argv[1], "w"))
""" % (TPU_PATH_MODULES, TPU_PATH_MODULES)
  run = _run(tmp_path, program)
  assert run["before"] == []
  assert run["after"] == list(TPU_PATH_MODULES)
