"""The packages import without tensorflow-estimator; the parts that need TF
2.15 say so.

Runs in both environments. On current TensorFlow (.venv-tf2) there is no
tensorflow-estimator and no TF 2.15 `tensorflow.python.tpu.tpu_embedding`;
in .venv (TF 2.15) the same situation is made in a fresh interpreter by
hiding tensorflow-estimator (`sys.modules[...] = None`, so importing it
fails). Either way: `import estimator_spec, tpu_embedding_columns` works, a
spec builds its configuration proto and the engine trains, and every name
of the TPUEstimator surface and of the TF 2.15 interop raises one
ImportError that names TF 2.15, tensorflow-estimator 2.15 and the install
that provides them. With TF 2.15's stack present, the names are the
TPUEstimator classes, as before.
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
      engine.tables["t"].assign_all(tf.zeros([6, 2]))
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
          "rows": engine.tables["t"].read_all().numpy().tolist(),
          "column": column.name,
      }))
  """)
  assert not found["estimator_loaded"]
  assert found["tables"] == ["t"]
  expected = [[0.0, 0.0]] * 6
  expected[1] = expected[4] = [-0.5, -0.5]
  assert found["rows"] == expected
  assert found["column"] == "f_embedding"


def _assert_names_tf215_and_the_install(message):
  assert "needs TensorFlow 2.15 and tensorflow-estimator 2.15" in message
  assert "lacks tensorflow-estimator" in message
  assert "tensorflow-cpu==2.15.* and tensorflow-estimator==2.15.*" in message
  assert "make venv" in message
  assert f"TensorFlow {'2.15' if ON_TF215 else tf.__version__}" in message


def test_the_tpu_estimator_surface_and_interop_say_they_need_tf215():
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
        attempt("from " + name, lambda: exec(
            "from estimator_spec import " + name, {{}}))
      for name in {INTEROP!r}:
        attempt("interop." + name, lambda: getattr(interop, name))
      attempt("estimator_spec.estimator",
              lambda: importlib.import_module("estimator_spec.estimator"))
      namespace = {{}}
      exec("from estimator_spec import *", namespace)
      print(json.dumps({{"errors": errors,
                        "star": sorted(n for n in namespace
                                       if not n.startswith("__")),
                        "all": estimator_spec.__all__,
                        "dir": dir(estimator_spec)}}))
  """)
  errors = found["errors"]
  assert sorted(errors) == sorted(
      SURFACE + ["from " + n for n in SURFACE] +
      ["interop." + n for n in INTEROP] + ["estimator_spec.estimator"])
  for key, message in errors.items():
    assert message is not None, f"{key} loaded without tensorflow-estimator"
    _assert_names_tf215_and_the_install(message)
  assert errors["TPUEstimator"].startswith(
      "The TPUEstimator surface (estimator_spec.TPUEstimator")
  assert errors["interop.to_tensorflow"].startswith(
      "estimator_spec.interop.to_tensorflow")
  assert errors["interop.DelegatedTPUEstimator"].startswith(
      "estimator_spec.interop.delegate_to_tensorflow")
  # `from estimator_spec import *` works and leaves the surface out; dir()
  # still shows it (using it gives the message above).
  assert "EmbeddingConfigSpec" in found["star"]
  assert not set(SURFACE) & set(found["star"])
  assert not set(SURFACE) & set(found["all"])
  assert set(SURFACE) <= set(found["dir"])


def test_the_surface_is_the_tpu_estimator_where_tf215_is():
  names = set(dir(estimator_spec))
  assert set(SURFACE) <= names
  if not ON_TF215:
    assert not set(SURFACE) & set(estimator_spec.__all__)
    with pytest.raises(ImportError, match="needs TensorFlow 2.15"):
      estimator_spec.TPUEstimator  # pylint: disable=pointless-statement
    return
  # pylint: disable=g-import-not-at-top
  from estimator_spec import ClusterTraining
  from estimator_spec import TPUEstimator
  from estimator_spec import TPUEstimatorSpec
  from estimator_spec import interop
  from estimator_spec.estimator import cluster
  from estimator_spec.estimator import spec
  from estimator_spec.estimator import tpu_estimator
  assert set(SURFACE) <= set(estimator_spec.__all__)
  assert TPUEstimator is tpu_estimator.TPUEstimator
  assert TPUEstimatorSpec is spec.TPUEstimatorSpec
  assert ClusterTraining is cluster.ClusterTraining
  assert issubclass(TPUEstimator, tf.compat.v1.estimator.Estimator)
  assert callable(interop.to_tensorflow)
