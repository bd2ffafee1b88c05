"""The packages import and work without tensorflow-estimator; the parts that
need TF 2.15 itself (the interop with TF's own TPU classes) say so.

Runs in both environments. On current TensorFlow (.venv-tf2) there is no
tensorflow-estimator and no TF 2.15 `tensorflow.python.tpu.tpu_embedding`;
in .venv (TF 2.15) the same situation is made in a fresh interpreter by
hiding tensorflow-estimator (`sys.modules[...] = None`, so importing it
fails). Either way: `import estimator_spec, tpu_embedding_columns` works, a
spec builds its configuration proto, the engine trains, the TPUEstimator
trains on the library's own Estimator framework (`estimator/stack.py`), and
every name of the TF 2.15 interop raises one ImportError that names TF
2.15, tensorflow-estimator 2.15 and the install that provides them. With
TF 2.15's stack present, the TPUEstimator stands on tensorflow-estimator's
Estimator, as before.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import tensorflow as tf

import estimator_spec

ON_TF215 = tf.__version__.startswith("2.15.")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Hides tensorflow-estimator where it is installed (.venv).
_HIDE_ESTIMATOR = 'import sys; sys.modules["tensorflow_estimator"] = None\n'

SURFACE = ["TPUEstimator", "TPUEstimatorSpec", "ExportSavedModelApiVersion",
           "ClusterTraining"]
INTEROP = ["to_tensorflow", "from_tensorflow", "columns_by_name",
           "delegate_to_tensorflow", "DelegatedTPUEstimator"]


def _run_without_estimator(body):
  """Runs `body` in a fresh interpreter without tensorflow-estimator; returns
  the JSON it printed last."""
  code = _HIDE_ESTIMATOR + textwrap.dedent(body)
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
             PYTHONPATH=os.pathsep.join(
                 [REPO] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
  result = subprocess.run([sys.executable, "-c", code], capture_output=True,
                          text=True, env=env, cwd=REPO, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  return json.loads(result.stdout.strip().splitlines()[-1])


def test_packages_import_and_work_without_tensorflow_estimator():
  found = _run_without_estimator("""
      import json, sys
      import numpy as np
      import tensorflow as tf
      import estimator_spec as es
      import tpu_embedding_columns as tec
      from estimator_spec.engine import HostEmbeddingEngine

      spec = es.EmbeddingConfigSpec(
          feature_to_config_dict={"f": es.FeatureConfig("t")},
          table_to_config_dict={"t": es.TableConfig(6, 2, combiner="sum")},
          optimization_parameters=es.StochasticGradientDescentParameters(0.5))
      config = es.EmbeddingConfig(spec, batch_size=2)
      proto = config.config_proto
      engine = HostEmbeddingEngine(config)
      engine.create_variables()
      engine.table_rows("t").assign_all(tf.zeros([6, 2]))
      ids = tf.SparseTensor([[0, 0], [1, 0]], tf.constant([1, 4], tf.int64),
                            [2, 1])
      result = engine.lookup({"f": ids})
      engine.apply_gradients(result, {"f": tf.ones([2, 2])},
                             tf.constant(0, tf.int64))
      column = tec.embedding_column(
          tf.feature_column.categorical_column_with_identity("f", 6), 2)
      print(json.dumps({
          "estimator_loaded": any(m.startswith("tensorflow_estimator")
                                  and sys.modules[m] is not None
                                  for m in sys.modules),
          "tables": [t.name for t in proto.table_descriptor],
          "rows": engine.table_rows("t").read_all().numpy().tolist(),
          "column": column.name,
      }))
  """)
  assert not found["estimator_loaded"]
  assert found["tables"] == ["t"]
  expected = [[0.0, 0.0]] * 6
  expected[1] = expected[4] = [-0.5, -0.5]
  assert found["rows"] == expected
  assert found["column"] == "f_embedding"


def test_the_tpu_estimator_trains_without_tensorflow_estimator():
  found = _run_without_estimator("""
      import json, sys, tempfile
      import tensorflow as tf
      import estimator_spec as es
      import tpu_embedding_columns as tec
      from estimator_spec.estimator import stack

      column = tec.embedding_column(
          tf.feature_column.categorical_column_with_identity("f", 6), 2)

      def model_fn(features, labels, mode, params):
        x = tf.compat.v1.feature_column.input_layer(features, [column])
        loss = tf.reduce_mean(tf.square(tf.reduce_sum(x, 1) - labels))
        step = tf.compat.v1.train.get_global_step()
        train_op = tf.compat.v1.assign_add(step, 1)
        return es.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)

      def input_fn(params):
        ids = tf.SparseTensor([[0, 0], [1, 0]],
                              tf.constant([1, 4], tf.int64), [2, 1])
        return tf.data.Dataset.from_tensors(
            ({"f": ids}, tf.ones([2]))).repeat()

      model_dir = tempfile.mkdtemp()
      estimator = es.TPUEstimator(
          model_fn=model_fn, config=es.RunConfig(model_dir=model_dir),
          use_tpu=False, train_batch_size=2,
          embedding_config_spec=es.EmbeddingConfigSpec(
              feature_columns=[column],
              optimization_parameters=es.StochasticGradientDescentParameters(
                  0.5)))
      estimator.train(input_fn, max_steps=2)
      print(json.dumps({
          "framework": stack.name(),
          "estimator_loaded": any(m.startswith("tensorflow_estimator")
                                  and sys.modules[m] is not None
                                  for m in sys.modules),
          "step": int(estimator.get_variable_value("global_step")),
      }))
  """)
  assert found == {"framework": "own", "estimator_loaded": False, "step": 2}


def _assert_names_tf215_and_the_install(message):
  assert "needs TensorFlow 2.15 and tensorflow-estimator 2.15" in message
  assert "lacks tensorflow-estimator" in message
  assert "tensorflow-cpu==2.15.* and tensorflow-estimator==2.15.*" in message
  assert "make venv" in message
  assert f"TensorFlow {'2.15' if ON_TF215 else tf.__version__}" in message


def test_the_interop_says_it_needs_tf215_and_the_surface_loads():
  found = _run_without_estimator(f"""
      import importlib, json
      import estimator_spec
      from estimator_spec import interop
      errors = {{}}

      def attempt(key, fn):
        try:
          fn()
          errors[key] = None
        except ImportError as e:
          errors[key] = str(e)

      for name in {SURFACE!r}:
        attempt(name, lambda: getattr(estimator_spec, name))
      for name in {INTEROP!r}:
        attempt("interop." + name, lambda: getattr(interop, name))
      namespace = {{}}
      exec("from estimator_spec import *", namespace)
      print(json.dumps({{"errors": errors,
                        "star": sorted(n for n in namespace
                                       if not n.startswith("__")),
                        "all": estimator_spec.__all__}}))
  """)
  errors = found["errors"]
  for name in SURFACE:
    assert errors[name] is None, f"{name}: {errors[name]}"
  for name in INTEROP:
    message = errors["interop." + name]
    assert message is not None, f"{name} loaded without tensorflow-estimator"
    _assert_names_tf215_and_the_install(message)
  assert errors["interop.to_tensorflow"].startswith(
      "estimator_spec.interop.to_tensorflow")
  assert errors["interop.DelegatedTPUEstimator"].startswith(
      "estimator_spec.interop.delegate_to_tensorflow")
  # `from estimator_spec import *` gives the whole surface.
  assert {"EmbeddingConfigSpec", *SURFACE} <= set(found["star"])
  assert set(SURFACE) <= set(found["all"])


def test_the_tpu_estimator_stands_on_the_stacks_estimator():
  # pylint: disable=g-import-not-at-top
  from estimator_spec import ClusterTraining
  from estimator_spec import TPUEstimator
  from estimator_spec import TPUEstimatorSpec
  from estimator_spec.cluster import tasks
  from estimator_spec.estimator import spec
  from estimator_spec.estimator import stack
  from estimator_spec.estimator import tpu_estimator
  from estimator_spec.estimator.framework import estimator as framework
  assert set(SURFACE) <= set(estimator_spec.__all__)
  assert TPUEstimator is tpu_estimator.TPUEstimator
  assert TPUEstimatorSpec is spec.TPUEstimatorSpec
  assert ClusterTraining is tasks.ClusterTraining
  if ON_TF215 and not stack.OWN:
    assert issubclass(TPUEstimator, tf.compat.v1.estimator.Estimator)
    assert estimator_spec.RunConfig is tf.compat.v1.estimator.tpu.RunConfig
  else:
    assert issubclass(TPUEstimator, framework.Estimator)
    assert stack.name() == "own"
