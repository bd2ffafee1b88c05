"""HostTPUEmbedding under MirroredStrategy: two replicas (two logical CPU
devices) compute what one replica computes on the global batch.

tests/replica_scenarios.py runs in a fresh process (logical devices must be
configured before TensorFlow starts) and saves, for three ways of writing
the step (enqueue outside `strategy.run` in a tf.function, as TF2's
TPUEmbedding documents; enqueue inside `strategy.run`; the first without
tf.function) the activations of every step and the tables and slots after
three steps, beside the same model trained without a strategy on the
global batch; a Keras model fit with and without the strategy; plus a
checkpoint round trip and the refusals. The tests
compare them here.

Runs in both environments (TF 2.15 and current TensorFlow).
"""
import os
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
MODES = ("function", "inside", "eager")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
  path = tmp_path_factory.mktemp("replicas") / "results.npz"
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
             PYTHONPATH=os.pathsep.join(
                 [os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")]))
  run = subprocess.run(
      [sys.executable, os.path.join(HERE, "replica_scenarios.py"), str(path)],
      env=env, capture_output=True, text=True, timeout=600, check=False)
  assert run.returncode == 0, run.stderr[-4000:]
  with np.load(path) as data:
    return {key: data[key] for key in data.files}


def _keys(results, prefix):
  return sorted(k[len(prefix):] for k in results if k.startswith(prefix))


@pytest.mark.parametrize("mode", MODES)
def test_two_replicas_equal_one_on_the_global_batch(results, mode):
  reference = [k for k in _keys(results, "reference/")
               if not k.startswith("keras/")]
  assert _keys(results, mode + "/") == sorted(
      reference + ["plain_variables", "table_devices"])
  assert any(k.startswith("slot/t/accumulators") for k in reference)
  assert any(k.startswith("slot/s/velocities") for k in reference)
  for key in reference:
    expected, got = results["reference/" + key], results[f"{mode}/{key}"]
    if mode == "eager":
      # Eager kernels may round differently from the traced function's.
      np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7,
                                 err_msg=key)
    else:
      # The same sums over the same values in the same order: exact.
      np.testing.assert_array_equal(got, expected, err_msg=key)


def test_training_moved_the_tables(results):
  # The comparison above would pass for a model that never trains.
  restored = results["restored/table/t"]
  accumulators = results["reference/slot/t/accumulators"]
  assert (accumulators > 0.1).any()  # initial value 0.1: rows were touched
  assert (accumulators == accumulators.min()).any()  # and some were not
  assert np.abs(results["reference/slot/s/momenta"]).max() > 0
  assert restored.shape == (11, 3)


@pytest.mark.parametrize("mode", MODES)
def test_one_copy_of_each_table_on_the_host(results, mode):
  assert bool(results[f"{mode}/plain_variables"])
  devices = list(results[f"{mode}/table_devices"])
  assert len(devices) == 1 and devices[0].endswith("CPU:0")


def test_checkpoint_under_the_strategy_restores_without_one(results):
  for key in _keys(results, "restored/"):
    np.testing.assert_array_equal(results["restored/" + key],
                                  results["eager/" + key], err_msg=key)
  keys = set(results["checkpoint_keys"])
  assert "embedding/t/.ATTRIBUTES/VARIABLE_VALUE" in keys
  assert "embedding/t.Saccumulators/.ATTRIBUTES/VARIABLE_VALUE" in keys
  assert not any("replica_1" in k for k in keys)


@pytest.mark.parametrize("case,words", [
    ("dequeue_outside_run", ["enqueued per replica",
                             "dequeue inside strategy.run"]),
    ("dequeue_one_batch_inside_run", ["inside strategy.run",
                                      "enqueued as one batch"]),
    ("one_value_for_all", ["apply_gradients", "feature 'f'",
                           "per-replica values"]),
    ("other_strategy", ["called under MirroredStrategy",
                        "created with no strategy"]),
    ("per_replica_values_without_a_strategy", [
        "enqueue", "feature 'f'", "made without a strategy",
        "strategy.scope()"]),
    ("unsupported_strategy", ["CentralStorageStrategy", "not supported",
                              "MirroredStrategy"]),
])
def test_refusals_name_the_problem(results, case, words):
  message = str(results["error/" + case])
  for word in words:
    assert word in message, message


def test_keras_fit_under_the_strategy_equals_fit_without(results):
  # A keras.Model whose train_step trains the tables with the embedding's
  # optimizer and the dense layer with Keras' SGD, fit on two replicas and
  # with no strategy: the same tables, slots and kernel (the dense
  # gradients' all-reduce may round the last bit).
  keys = _keys(results, "mirrored/keras/")
  assert set(keys) == {"table/items", "slot/items/accumulators", "kernel",
                       "plain_variables"}
  assert bool(results["mirrored/keras/plain_variables"])
  for key in ("table/items", "slot/items/accumulators", "kernel"):
    np.testing.assert_allclose(results["mirrored/keras/" + key],
                               results["reference/keras/" + key],
                               rtol=1e-6, atol=1e-6, err_msg=key)
  kernel = results["reference/keras/kernel"][:, 0]
  assert np.abs(kernel - np.linspace(-1, 1, 4)).max() > 1e-3  # trained
  accumulators = results["reference/keras/slot/items/accumulators"]
  assert (accumulators > 0.1).any()
