"""A host TPUEstimator in a between-graph cluster (TF_CONFIG) sets the
session config Estimator's own RunConfig would: device filters, so that a
task waits only for the tasks it talks to (the ps tasks and itself). TF's
TPU RunConfig leaves them out (a TPU job runs in-graph); without them a
chief waits for every worker before it starts. Oracle: TF 2.15's
`tf.compat.v1.estimator.RunConfig` under the same TF_CONFIG."""
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

import estimator_spec as es  # pylint: disable=g-import-not-at-top
import tpu_embedding_columns as tec  # pylint: disable=g-import-not-at-top

CLUSTER = {
    "chief": ["localhost:2220"],
    "worker": ["localhost:2221", "localhost:2222"],
    "ps": ["localhost:2223", "localhost:2224"],
}


def _spec():
  column = tec.embedding_column(
      tf.feature_column.categorical_column_with_identity("a", 10), 2)
  return es.EmbeddingConfigSpec(
      feature_columns=[column],
      optimization_parameters=es.AdagradParameters(0.1))


def _model_fn(features, labels, mode, params):
  del features, labels, mode, params
  raise AssertionError("not called: only the configuration is inspected")


def _tf_config(monkeypatch, task_type, index):
  # An evaluator is not in the cluster spec, as Estimator wants it.
  monkeypatch.setenv("TF_CONFIG", json.dumps(
      {"cluster": CLUSTER, "task": {"type": task_type, "index": index}}))


def _estimators_own(tmp_path):
  """The session config TF's own Estimator runs with (plain RunConfig)."""
  return tf.compat.v1.estimator.Estimator(
      model_fn=_model_fn,
      config=tf.compat.v1.estimator.RunConfig(
          model_dir=str(tmp_path))).config.session_config


def _ours(run_config):
  return es.TPUEstimator(
      model_fn=_model_fn, config=run_config, use_tpu=False,
      train_batch_size=12, embedding_config_spec=_spec())


@pytest.mark.parametrize("task_type,index", [("chief", 0), ("worker", 0),
                                             ("worker", 1), ("ps", 0),
                                             ("ps", 1), ("evaluator", 0)])
def test_session_config_is_estimators_for_every_task(tmp_path, monkeypatch,
                                                      task_type, index):
  _tf_config(monkeypatch, task_type, index)
  expected = _estimators_own(tmp_path)
  estimator = _ours(tf.compat.v1.estimator.tpu.RunConfig(
      model_dir=str(tmp_path)))
  got = estimator.config.session_config
  assert got == expected
  assert bool(list(got.device_filters)) == (task_type != "evaluator")
  # The tables still live on the two ps tasks (an evaluator, outside the
  # cluster, reads checkpoints locally).
  if task_type != "evaluator":
    assert estimator.config.cluster_spec.num_tasks("ps") == 2


def test_a_session_config_of_the_users_own_is_kept(tmp_path, monkeypatch):
  _tf_config(monkeypatch, "worker", 1)
  own = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=3)
  estimator = _ours(tf.compat.v1.estimator.tpu.RunConfig(
      model_dir=str(tmp_path), session_config=own))
  assert estimator.config.session_config == own
  assert not list(estimator.config.session_config.device_filters)


def test_without_a_cluster_the_session_config_is_estimators(tmp_path,
                                                           monkeypatch):
  monkeypatch.delenv("TF_CONFIG", raising=False)
  estimator = _ours(tf.compat.v1.estimator.tpu.RunConfig(
      model_dir=str(tmp_path)))
  assert estimator.config.session_config == _estimators_own(tmp_path)
  assert not list(estimator.config.session_config.device_filters)
