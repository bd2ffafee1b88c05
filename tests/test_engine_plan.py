"""Each table's plan, decided once when its variables are made, is what the
lookup and the update run (docs/architecture.md, 'The engine').

The plan records the executor of the update, where and when it runs,
whether under a lock, and whether the lookup keeps the rows it read for the
update; these tests check each field against what the step's graph then
holds (the ops the lookup and the update are made of), and that nothing
asks again: the plan's executor is the one that runs even when the
optimizer's registered shortcuts change after it was made.
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest
import tensorflow as tf

import estimator_spec as es
from estimator_spec.engine import HostEmbeddingEngine
from estimator_spec.engine import executors
from estimator_spec.engine import kernels
from estimator_spec.engine import plan as plan_lib
from tests.ragged import sparse_value

v1 = tf.compat.v1
VOCAB, DIM = 10, 4


def _config(optimizer, mode=es.estimator.ModeKeys.TRAIN, pipelining=False):
  spec = es.EmbeddingConfigSpec(
      feature_to_config_dict={"f": es.FeatureConfig("t")},
      table_to_config_dict={"t": es.TableConfig(VOCAB, DIM, combiner="sum")},
      optimization_parameters=optimizer,
      pipeline_execution_with_tensor_core=pipelining)
  return es.EmbeddingConfig(spec, batch_size=2, mode=mode)


def _step(engine):
  """The step's graph: (lookup result, train op or None, placeholders)."""
  ids = v1.sparse_placeholder(tf.int64, [None, None])
  result = engine.lookup({"f": ids})
  train = None
  if engine.is_training:
    train = engine.apply_gradients(
        result, {"f": tf.ones([2, DIM])}, tf.constant(0, tf.int64))
  return result, train, ids


def _op_types(graph):
  return {op.type for op in graph.get_operations()}


@pytest.fixture(params=["1", "0"], ids=["kernels", "tf_ops"])
def kernels_mode(request, monkeypatch):
  monkeypatch.setenv(kernels.ENV, request.param)
  return request.param == "1"


def test_the_plan_is_made_with_the_variables_and_names_the_executor(
    kernels_mode):
  with tf.Graph().as_default() as graph:
    engine = HostEmbeddingEngine(_config(es.AdagradParameters(0.1)))
    with pytest.raises(RuntimeError, match="do not exist yet"):
      engine.table_plan("t")
    _step(engine)
    plan = engine.table_plan("t")
    assert plan.executor == ("compiled" if kernels_mode else "rows")
    assert (plan.where, plan.when, plan.locked) == (
        plan_lib.LOCAL, plan_lib.NOW, False)
    # The lookup keeps the rows it read only for an update that reads them.
    assert plan.keeps_rows == (not kernels_mode)
    assert plan.one_op_lookup == kernels_mode
    types = _op_types(graph)
    if kernels_mode:
      assert {"HostEmbeddingLookup", "HostEmbeddingAdagradRows"} <= types
      assert "ResourceScatterUpdate" not in types
    else:
      assert not any(t.startswith("HostEmbedding") for t in types)
      assert "ResourceScatterUpdate" in types
    assert plan.describe().startswith("t: ")


def test_an_optimizer_moving_every_row_gets_the_every_row_executor(
    kernels_mode):
  del kernels_mode
  with tf.Graph().as_default():
    engine = HostEmbeddingEngine(_config(es.AdamParameters(0.1,
                                                           lazy_adam=False)))
    _step(engine)
    plan = engine.table_plan("t")
    assert plan.executor == "every_row" and plan.keeps_rows


def test_outside_training_there_is_no_update_and_no_kernel(kernels_mode):
  del kernels_mode
  with tf.Graph().as_default() as graph:
    engine = HostEmbeddingEngine(_config(es.AdagradParameters(0.1),
                                         mode=es.estimator.ModeKeys.EVAL))
    _step(engine)
    plan = engine.table_plan("t")
    assert (plan.pipeline, plan.executor, plan.ops) == (None, None, None)
    assert not engine.step_plan.compiles_here
    assert not any(op.type.startswith("HostEmbedding")
                   for op in graph.get_operations())


def test_partitions_on_other_tasks_are_updated_there_under_a_lock():
  with tf.Graph().as_default() as graph:
    engine = HostEmbeddingEngine(
        _config(es.AdagradParameters(0.1)), num_shards=2,
        shard_device_fn=lambda table, p: "/cpu:0")
    _step(engine)
    plan = engine.table_plan("t")
    assert (plan.where, plan.locked, plan.ops) == (plan_lib.REMOTE, True,
                                                   None)
    # TF's sparse-apply kernel locks the variables itself.
    assert plan.executor == "fused"
    assert "ResourceSparseApplyAdagradV2" in _op_types(graph)
    assert engine.step_plan.packs_requests


def test_pipelining_holds_the_update(kernels_mode):
  del kernels_mode
  with tf.Graph().as_default() as graph:
    engine = HostEmbeddingEngine(_config(es.AdagradParameters(0.1),
                                         pipelining=True))
    _step(engine)
    assert engine.table_plan("t").when == plan_lib.HELD
    names = [v.op.name for v in graph.get_collection(
        v1.GraphKeys.LOCAL_VARIABLES)]
    assert "t/pipelined_ids" in " ".join(names), names


def test_the_update_runs_the_executor_the_plan_recorded(monkeypatch):
  """Decided once: after the plan is made, the update asks nothing again
  (here, the executor table is swapped after the plan: the recorded name
  is the one looked up when the update is built)."""
  monkeypatch.setenv(kernels.ENV, "0")
  ran = []
  original = executors.EXECUTORS["rows"]

  def spy(*args):
    ran.append("rows")
    return original(*args)

  monkeypatch.setitem(executors.EXECUTORS, "rows", spy)
  with tf.Graph().as_default():
    engine = HostEmbeddingEngine(_config(es.AdagradParameters(0.1)))
    ids = v1.sparse_placeholder(tf.int64, [None, None])
    result = engine.lookup({"f": ids})
    assert engine.table_plan("t").executor == "rows"
    train = engine.apply_gradients(result, {"f": tf.ones([2, DIM])},
                                   tf.constant(0, tf.int64))
    assert ran == ["rows"]
    with v1.Session() as sess:
      sess.run([v1.global_variables_initializer(),
                v1.local_variables_initializer()])
      before = sess.run(engine.table_rows("t").read_all())
      sess.run(train, {ids: sparse_value([[1], [3]], np.int64)})
      after = sess.run(engine.table_rows("t").read_all())
  changed = np.nonzero(np.any(before != after, axis=1))[0].tolist()
  assert changed == [1, 3]


def test_an_optimizer_the_engine_cannot_run_is_refused_before_any_variable():
  class Unknown(es.StochasticGradientDescentParameters):
    pass

  with tf.Graph().as_default() as graph:
    engine = HostEmbeddingEngine(_config(Unknown(0.1)))
    with pytest.raises(TypeError, match="Unknown"):
      engine.create_variables()
    assert not engine.created_tables()
    assert not graph.get_collection(v1.GraphKeys.GLOBAL_VARIABLES)
