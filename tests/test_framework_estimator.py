"""The library's own Estimator run loop (estimator/framework/estimator.py).

One small program (a linear model with a random initializer, a summary of
its own, metrics, two export outputs) runs through every method. On both
stacks the results are checked against what the run must leave: the
checkpoint steps, the summaries' steps, the metrics recomputed from the
checkpoint's variables with NumPy, the predictions, the SavedModel loaded
by TF. On TF 2.15 (`tf215`) the same program also runs on
tensorflow-estimator's Estimator in the same process, and the two runs
must agree: the same checkpoints holding the same values (a graph-level
seed: the same ops built in the same order), the same events at the same
steps, the same metrics, predictions and signatures.
"""
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from estimator_spec.estimator.framework import estimator as estimator_lib
from estimator_spec.estimator.framework import export as export_lib
from estimator_spec.estimator.framework import keras2
from estimator_spec.estimator.framework import model_fn as model_fn_lib
from estimator_spec.estimator.framework import run_config as run_config_lib

v1 = tf.compat.v1

FEATURES = np.arange(24, dtype=np.float32).reshape(12, 2) / 10.0
LABELS = (FEATURES @ np.array([[0.5], [-1.0]], np.float32) + 0.25)
BATCH = 4


class _Ours:
  """This library's framework, as a program sees it."""
  Estimator = estimator_lib.Estimator
  EstimatorSpec = model_fn_lib.EstimatorSpec
  ModeKeys = model_fn_lib.ModeKeys
  RunConfig = run_config_lib.RunConfig
  export = export_lib


def _tensorflow_estimator():
  """tensorflow-estimator's framework (TF 2.15 only)."""
  from tensorflow_estimator.python.estimator import estimator  # pylint: disable=import-outside-toplevel
  from tensorflow_estimator.python.estimator import model_fn  # pylint: disable=import-outside-toplevel
  from tensorflow_estimator.python.estimator import run_config  # pylint: disable=import-outside-toplevel
  from tensorflow_estimator.python.estimator.export import export_lib as export  # pylint: disable=import-outside-toplevel

  class Theirs:
    Estimator = estimator.Estimator
    EstimatorSpec = model_fn.EstimatorSpec
    ModeKeys = model_fn.ModeKeys
    RunConfig = run_config.RunConfig

  Theirs.export = export
  return Theirs


def _model_fn_for(framework):
  def model_fn(features, labels, mode, params):
    x = features["x"]
    weights = v1.get_variable(
        "weights", [2, 1], initializer=v1.glorot_uniform_initializer())
    bias = v1.get_variable("bias", [1], initializer=v1.zeros_initializer())
    prediction = tf.matmul(x, weights) + bias
    predictions = {"y": prediction, "double": 2.0 * prediction}
    if mode == framework.ModeKeys.PREDICT:
      outputs = {
          "serving_default": framework.export.PredictOutput(predictions),
          "regress": framework.export.RegressionOutput(prediction)}
      return framework.EstimatorSpec(mode, predictions=predictions,
                                     export_outputs=outputs)
    loss = v1.losses.mean_squared_error(labels, prediction)
    v1.summary.scalar("bias_value", bias[0])
    optimizer = v1.train.GradientDescentOptimizer(params["learning_rate"])
    train_op = optimizer.minimize(loss, v1.train.get_global_step())
    metrics = {"mae": v1.metrics.mean_absolute_error(labels, prediction)}
    return framework.EstimatorSpec(mode, loss=loss, train_op=train_op,
                                   eval_metric_ops=metrics,
                                   predictions=predictions)
  return model_fn


def _input_fn(repeat=None):
  def input_fn():
    data = tf.data.Dataset.from_tensor_slices(
        ({"x": FEATURES}, LABELS)).repeat(repeat)
    return data.batch(BATCH, drop_remainder=True)
  return input_fn


def _predict_input_fn():
  return tf.data.Dataset.from_tensor_slices({"x": FEATURES}).batch(5)


def _serving_input_receiver_fn_for(framework):
  def serving_input_receiver_fn():
    x = v1.placeholder(tf.float32, [None, 2], name="x")
    return framework.export.ServingInputReceiver({"x": x}, {"x": x})
  return serving_input_receiver_fn


def _estimator(framework, model_dir, **config):
  settings = dict(tf_random_seed=7, save_checkpoints_steps=3,
                  save_summary_steps=2, log_step_count_steps=2,
                  keep_checkpoint_max=3)
  settings.update(config)
  return framework.Estimator(
      _model_fn_for(framework), model_dir=str(model_dir),
      config=framework.RunConfig(**settings), params={"learning_rate": 0.1})


def _checkpoint_steps(model_dir):
  state = tf.train.get_checkpoint_state(str(model_dir))
  return [int(path.rsplit("-", 1)[1])
          for path in state.all_model_checkpoint_paths]


def _events(directory):
  """{(tag, step)} of the scalar and tensor summaries in `directory`."""
  found = set()
  for name in os.listdir(directory):
    if not name.startswith("events.out"):
      continue
    for event in v1.train.summary_iterator(os.path.join(directory, name)):
      for value in event.summary.value:
        found.add((value.tag, event.step))
  return found


def _variables(model_dir):
  return {name: tf.train.load_variable(str(model_dir), name)
          for name, _ in tf.train.list_variables(str(model_dir))}


def _run_program(framework, model_dir):
  """Runs every method once; returns what a program can see of the run."""
  estimator = _estimator(framework, model_dir)
  estimator.train(_input_fn(), steps=7)
  metrics = estimator.evaluate(_input_fn(repeat=1), steps=2)
  whole = estimator.evaluate(_input_fn(repeat=1), name="whole")
  predictions = list(estimator.predict(_predict_input_fn))
  batches = list(estimator.predict(_predict_input_fn, predict_keys=["y"],
                                   yield_single_examples=False))
  exported = estimator.export_saved_model(
      str(model_dir / "export"), _serving_input_receiver_fn_for(framework))
  return dict(estimator=estimator, metrics=metrics, whole=whole,
              predictions=predictions, batches=batches, exported=exported)


@pytest.fixture(scope="module")
def ours(tmp_path_factory):
  model_dir = tmp_path_factory.mktemp("ours")
  return model_dir, _run_program(_Ours, model_dir)


def _numpy_prediction(model_dir, x):
  variables = _variables(model_dir)
  return x @ variables["weights"] + variables["bias"]


def test_training_saves_at_start_every_n_steps_and_at_the_end(ours):
  model_dir, _ = ours
  # Steps 0 (session start), 3, 6 and 7 (end); keep_checkpoint_max=3.
  assert _checkpoint_steps(model_dir) == [3, 6, 7]
  assert _variables(model_dir)["global_step"] == 7


def test_summaries_and_step_rate_are_written_at_tfs_steps(ours):
  model_dir, _ = ours
  events = _events(model_dir)
  # SummarySaverHook: the first step (global step 1) and every 2 steps.
  assert {step for tag, step in events if tag == "loss"} == {1, 3, 5, 7}
  assert {step for tag, step in events if tag == "bias_value"} == {1, 3, 5, 7}
  rates = {step for tag, step in events if tag == "global_step/sec"}
  assert rates and rates <= {3, 5, 7}


def test_evaluate_reports_metrics_from_the_checkpoint(ours):
  model_dir, run = ours
  metrics, whole = run["metrics"], run["whole"]
  assert set(metrics) == {"loss", "mae", "global_step"}
  assert metrics["global_step"] == 7
  prediction = _numpy_prediction(model_dir, FEATURES)
  errors = prediction - LABELS
  # Two batches of 4 examples: the mean loss of the two batch losses.
  first = errors[:8].reshape(2, BATCH)
  np.testing.assert_allclose(metrics["loss"], np.mean(np.mean(first ** 2, 1)),
                             rtol=1e-5)
  np.testing.assert_allclose(metrics["mae"], np.mean(np.abs(errors[:8])),
                             rtol=1e-5)
  np.testing.assert_allclose(whole["mae"], np.mean(np.abs(errors)),
                             rtol=1e-5)


def test_evaluate_writes_its_results_to_the_eval_directory(ours):
  model_dir, _ = ours
  assert _events(model_dir / "eval") >= {("loss", 7), ("mae", 7),
                                         ("checkpoint_path", 7)}
  assert ("mae", 7) in _events(model_dir / "eval_whole")


def test_predict_yields_examples_and_batches(ours):
  model_dir, run = ours
  expected = _numpy_prediction(model_dir, FEATURES)
  predictions = run["predictions"]
  assert len(predictions) == 12
  assert set(predictions[0]) == {"y", "double"}
  np.testing.assert_allclose([p["y"][0] for p in predictions], expected[:, 0],
                             rtol=1e-6)
  batches = run["batches"]
  assert [sorted(b) for b in batches] == [["y"]] * 3
  assert [len(b["y"]) for b in batches] == [5, 5, 2]


def test_the_saved_model_serves_the_checkpoints_predictions(ours):
  model_dir, run = ours
  exported = run["exported"]
  assert isinstance(exported, bytes)
  assert os.path.dirname(exported) == os.fsencode(model_dir / "export")
  loaded = tf.saved_model.load(exported.decode())
  # A regress signature needs one string input (serialized tf.Examples);
  # this receiver has a float placeholder, so it is left out, as TF does.
  assert set(loaded.signatures) == {"serving_default"}
  out = loaded.signatures["serving_default"](x=tf.constant(FEATURES))
  np.testing.assert_allclose(out["y"].numpy(),
                             _numpy_prediction(model_dir, FEATURES),
                             rtol=1e-6)


def test_train_counts_steps_from_the_checkpoint_and_max_steps_is_absolute(
    tmp_path):
  estimator = _estimator(_Ours, tmp_path)
  estimator.train(_input_fn(), steps=2)
  estimator.train(_input_fn(), steps=2)
  assert estimator.get_variable_value("global_step") == 4
  estimator.train(_input_fn(), max_steps=3)  # already beyond: no step
  assert estimator.get_variable_value("global_step") == 4
  estimator.train(_input_fn(), max_steps=5)
  assert estimator.get_variable_value("global_step") == 5
  assert estimator_lib.load_global_step_from_checkpoint_dir(
      str(tmp_path)) == 5
  assert "weights" in estimator.get_variable_names()


def test_training_stops_at_the_end_of_the_input(tmp_path):
  estimator = _estimator(_Ours, tmp_path)
  estimator.train(_input_fn(repeat=2))  # 24 examples, batches of 4
  assert estimator.get_variable_value("global_step") == 6


def test_a_nan_loss_stops_training_before_its_update_is_saved(tmp_path):
  estimator = _estimator(_Ours, tmp_path)

  def nan_input_fn():
    x = np.full((BATCH, 2), np.nan, np.float32)
    return tf.data.Dataset.from_tensors(({"x": x}, LABELS[:BATCH])).repeat()

  with pytest.raises(v1.train.NanLossDuringTrainingError):
    estimator.train(nan_input_fn, steps=3)
  assert _checkpoint_steps(tmp_path) == [0]


def test_warm_start_copies_the_variables_of_another_run(ours, tmp_path):
  source, _ = ours
  estimator = _Ours.Estimator(
      _model_fn_for(_Ours), model_dir=str(tmp_path),
      config=_Ours.RunConfig(tf_random_seed=3),
      params={"learning_rate": 0.0}, warm_start_from=str(source))
  estimator.train(_input_fn(), steps=1)
  np.testing.assert_array_equal(estimator.get_variable_value("weights"),
                                _variables(source)["weights"])


@pytest.mark.parametrize("call, error", [
    (lambda e: e.train(_input_fn(), steps=1, max_steps=2), ValueError),
    (lambda e: e.train(_input_fn(), steps=0), ValueError),
    (lambda e: e.train(_input_fn(), hooks=["not a hook"]), TypeError),
    (lambda e: e.evaluate(_input_fn(1), steps=0), ValueError),
    (lambda e: e.get_variable_value("weights"), ValueError),
    (lambda e: e.export_saved_model("/tmp/x", None), ValueError),
])
def test_bad_calls_are_refused_and_leave_no_checkpoint(tmp_path, call,
                                                        error):
  estimator = _estimator(_Ours, tmp_path)
  with pytest.raises(error):
    call(estimator)
  assert tf.train.latest_checkpoint(str(tmp_path)) is None


def test_model_fn_arguments_are_checked_when_the_estimator_is_built():
  with pytest.raises(ValueError, match="features"):
    _Ours.Estimator(lambda x, labels: None)
  with pytest.raises(ValueError, match="params"):
    _Ours.Estimator(lambda features, labels: None, params={"a": 1})
  with pytest.raises(ValueError, match="model_dir"):
    _Ours.Estimator(_model_fn_for(_Ours), model_dir="/tmp/a",
                    config=_Ours.RunConfig(model_dir="/tmp/b"))


def test_labels_for_a_model_fn_without_labels_are_refused(tmp_path):
  # input_fn gives labels, model_fn takes none: refused before any step, as
  # tensorflow-estimator refuses it; model_fn is never called.
  calls = []

  def model_fn(features, mode):
    calls.append(mode)
    raise AssertionError("model_fn was called")

  estimator = _Ours.Estimator(model_fn, model_dir=str(tmp_path))
  with pytest.raises(ValueError, match=(
      r"^Estimator: input_fn returned labels but model_fn takes no `labels` "
      r"argument; add one, or return features only\.$")):
    estimator.train(_input_fn(), steps=1)
  assert not calls
  assert tf.train.latest_checkpoint(str(tmp_path)) is None


def test_model_fn_must_return_an_estimator_spec(tmp_path):
  estimator = _Ours.Estimator(lambda features, labels, mode: {"y": 1},
                              model_dir=str(tmp_path))
  with pytest.raises(ValueError, match="EstimatorSpec"):
    estimator.train(_input_fn(), steps=1)


# --- TF 2.15: the same program on tensorflow-estimator ---------------------


@pytest.fixture(scope="module")
def both(ours, tmp_path_factory):
  theirs_dir = tmp_path_factory.mktemp("theirs")
  return ours, (theirs_dir, _run_program(_tensorflow_estimator(), theirs_dir))


@pytest.mark.tf215
def test_same_checkpoints_and_values_as_tensorflow_estimator(both):
  (ours_dir, _), (theirs_dir, _) = both
  assert _checkpoint_steps(ours_dir) == _checkpoint_steps(theirs_dir)
  ours_vars, theirs_vars = _variables(ours_dir), _variables(theirs_dir)
  assert sorted(ours_vars) == sorted(theirs_vars)
  for name, value in theirs_vars.items():
    np.testing.assert_array_equal(ours_vars[name], value, err_msg=name)


@pytest.mark.tf215
def test_same_events_as_tensorflow_estimator(both):
  (ours_dir, _), (theirs_dir, _) = both
  timing = ("global_step/sec",)  # written when time allows: at most TF's

  def steady(events):
    return {event for event in events if event[0] not in timing}

  assert steady(_events(ours_dir)) == steady(_events(theirs_dir))
  for name in ("eval", "eval_whole"):
    assert _events(ours_dir / name) == _events(theirs_dir / name)


@pytest.mark.tf215
def test_same_metrics_and_predictions_as_tensorflow_estimator(both):
  (_, ours_run), (_, theirs_run) = both
  for key in ("metrics", "whole"):
    assert ours_run[key] == theirs_run[key]
  for mine, theirs in zip(ours_run["predictions"], theirs_run["predictions"],
                          strict=True):
    assert mine.keys() == theirs.keys()
    for key in mine:
      np.testing.assert_array_equal(mine[key], theirs[key])
  assert len(ours_run["batches"]) == len(theirs_run["batches"])


@pytest.mark.tf215
def test_same_serving_signatures_as_tensorflow_estimator(both):
  (_, ours_run), (_, theirs_run) = both

  def signatures(path):
    meta = tf.compat.v1.saved_model.loader.load(
        v1.Session(graph=tf.Graph()), ["serve"], path.decode())
    return {name: (sig.method_name,
                   {k: (v.dtype, str(v.tensor_shape)) for k, v in
                    sig.inputs.items()},
                   {k: (v.dtype, str(v.tensor_shape)) for k, v in
                    sig.outputs.items()})
            for name, sig in meta.signature_def.items()}

  assert signatures(ours_run["exported"]) == signatures(
      theirs_run["exported"])


# --- Keras 2 missing -------------------------------------------------------


@pytest.mark.parametrize("error", [
    AttributeError("`dense` is not available with Keras 3."),
    AttributeError("module 'keras._tf_keras.keras.layers' has no attribute "
                   "'DenseFeatures'"),
    ImportError("Keras cannot be imported. Check that it is installed."),
])
def test_keras_3s_failures_in_model_fn_say_what_to_install(monkeypatch,
                                                          error):
  monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)
  with pytest.raises(ImportError) as raised:
    with keras2.explained("model_fn"):
      raise error
  assert "tf_keras" in str(raised.value)
  assert "TF_USE_LEGACY_KERAS=1" in str(raised.value)
  assert "\n" not in str(raised.value)
  assert raised.value.__cause__ is error


def test_other_errors_of_model_fn_pass_unchanged(monkeypatch):
  monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)
  with pytest.raises(AttributeError, match="no attribute 'wieghts'"):
    with keras2.explained("model_fn"):
      raise AttributeError("'Model' object has no attribute 'wieghts'")
  monkeypatch.setenv("TF_USE_LEGACY_KERAS", "1")
  with pytest.raises(AttributeError, match="Keras 3"):
    with keras2.explained("model_fn"):  # asked for Keras 2: not Keras 3's
      raise AttributeError("`dense` is not available with Keras 3.")


_KERAS_PROGRAM = """
import tempfile
import tensorflow as tf
from estimator_spec.estimator.framework import estimator, model_fn as mf

def model_fn(features, labels, mode):
  logits = tf.compat.v1.layers.dense(features["x"], 1)
  loss = tf.reduce_mean(tf.square(logits - labels))
  step = tf.compat.v1.train.get_global_step()
  train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
      loss, step)
  return mf.EstimatorSpec(mode, loss=loss, train_op=train_op)

def input_fn():
  return tf.data.Dataset.from_tensors(
      ({"x": tf.ones([4, 2])}, tf.ones([4, 1]))).repeat()

estimator.Estimator(model_fn, tempfile.mkdtemp()).train(input_fn, steps=1)
print("trained")
"""


def test_a_keras_2_program_without_legacy_keras_gets_one_line(tmp_path):
  """On TF 2.15 Keras 2 is TF's own and the program trains; on current TF
  without TF_USE_LEGACY_KERAS it ends with the one line."""
  env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
  run = subprocess.run([sys.executable, "-c", _KERAS_PROGRAM], env=env,
                       cwd=tmp_path, capture_output=True, text=True,
                       timeout=300, check=False)
  if tf.__version__.startswith("2.15."):
    assert run.returncode == 0 and "trained" in run.stdout, run.stderr[-2000:]
    return
  assert run.returncode == 1
  last = run.stderr.strip().splitlines()[-1]
  assert last.startswith("ImportError: model_fn uses Keras 2"), last
  assert "pip install" not in last and "tf_keras==" in last
