"""Cluster training, the parts that run in one process: the options, each
training task's batch and input context, the engine's per-partition update
(what a ps task runs) against the one-process update, what a synchronous
step refuses, and each task's device filters."""
import collections
import json
import os
import re

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest
import tensorflow as tf

import estimator_spec as es
import tpu_embedding_columns as tec
from estimator_spec.engine import HostEmbeddingEngine
from tests import cluster_graph
from tests.ragged import sparse_value

v1 = tf.compat.v1
ModeKeys = es.estimator.ModeKeys

CLUSTER = {
    "chief": ["localhost:2220"],
    "worker": ["localhost:2221", "localhost:2222"],
    "ps": ["localhost:2223", "localhost:2224"],
}


def _tf_config(monkeypatch, task_type, index, cluster=None):
  monkeypatch.setenv("TF_CONFIG", json.dumps(
      {"cluster": cluster or CLUSTER, "task": {"type": task_type,
                                               "index": index}}))


def _spec():
  column = tec.embedding_column(
      tf.feature_column.categorical_column_with_identity("a", 10), 2)
  return es.EmbeddingConfigSpec(
      feature_columns=[column],
      optimization_parameters=es.AdagradParameters(0.1))


def _model_fn(features, labels, mode, params):
  del features, labels, mode, params
  raise AssertionError("not called")


def _estimator(tmp_path, batch=12, **kwargs):
  return es.TPUEstimator(
      model_fn=_model_fn,
      config=es.RunConfig(model_dir=str(tmp_path)),
      use_tpu=False, train_batch_size=batch, embedding_config_spec=_spec(),
      **kwargs)


class _Built(Exception):
  """Stops `train`/`evaluate` once the graph is built (no session: the
  cluster's servers are not running in these tests)."""


def _input_params(estimator, mode=ModeKeys.TRAIN):
  """The params `estimator` gives input_fn in `mode` (through the public
  train/evaluate, stopped right after input_fn)."""
  seen = {}

  def input_fn(params):
    seen.update(params)
    raise _Built()

  with pytest.raises(_Built):
    if mode == ModeKeys.TRAIN:
      estimator.train(input_fn, max_steps=1)
    else:
      estimator.evaluate(input_fn, steps=1)
  return seen


def _build_training_graph(estimator):
  """Builds `estimator`'s training graph on a batch of 3 examples (model_fn
  runs); stops before any session."""

  class Stop(tf.compat.v1.train.SessionRunHook):

    def begin(self):
      raise _Built()

  def input_fn(params):
    del params
    return {"a": tf.sparse.from_dense(tf.constant([[1], [2], [3]],
                                                  tf.int64))}

  with pytest.raises(_Built):
    estimator.train(input_fn, max_steps=1, hooks=[Stop()])


# --- options ------------------------------------------------------------------


def test_cluster_training_defaults_and_validation():
  options = es.ClusterTraining()
  assert options.asynchronous is False
  assert options.step_timeout_secs == 600.0
  with pytest.raises(TypeError, match="asynchronous"):
    es.ClusterTraining(asynchronous="yes")
  for bad in (0, -1, True, "10"):
    with pytest.raises(ValueError, match="step_timeout_secs"):
      es.ClusterTraining(step_timeout_secs=bad)
  with pytest.raises(ValueError, match="report_after_secs"):
    es.ClusterTraining(report_after_secs=0)


def test_cluster_training_must_be_a_cluster_training(tmp_path):
  with pytest.raises(TypeError, match="ClusterTraining"):
    _estimator(tmp_path, cluster_training={"asynchronous": True})


# --- each training task's share of the batch ----------------------------------


@pytest.mark.parametrize("task_type,index,position", [("chief", 0, 0),
                                                      ("worker", 0, 1),
                                                      ("worker", 1, 2)])
def test_synchronous_task_reads_its_share_with_its_context(
    tmp_path, monkeypatch, task_type, index, position):
  _tf_config(monkeypatch, task_type, index)
  params = _input_params(_estimator(tmp_path, batch=12))
  assert params["batch_size"] == 4  # 12 examples over 3 training tasks
  device, invocation, invocations, replicas = (
      params["context"].current_input_fn_deployment())
  assert device == f"/job:{task_type}/task:{index}/device:CPU:0"
  assert (invocation, invocations, replicas) == (position, 3, 1)
  assert params["context"].num_hosts == 3


def test_asynchronous_task_reads_whole_batches(tmp_path, monkeypatch):
  _tf_config(monkeypatch, "worker", 1)
  params = _input_params(_estimator(
      tmp_path, batch=10,
      cluster_training=es.ClusterTraining(asynchronous=True)))
  assert params["batch_size"] == 10
  assert params["context"].current_input_fn_deployment()[1:] == (2, 3, 1)


def test_a_global_batch_that_does_not_split_is_refused(tmp_path,
                                                       monkeypatch):
  _tf_config(monkeypatch, "worker", 0)
  with pytest.raises(ValueError, match=r"train_batch_size=10 .* 3 training "
                     r"tasks \(chief 0, worker 0, worker 1\)"):
    _estimator(tmp_path, batch=10)


def test_evaluation_and_single_process_keep_the_global_batch(tmp_path,
                                                             monkeypatch):
  _tf_config(monkeypatch, "worker", 0)
  estimator = es.TPUEstimator(
      model_fn=_model_fn,
      config=es.RunConfig(model_dir=str(tmp_path)),
      use_tpu=False, train_batch_size=12, eval_batch_size=7,
      embedding_config_spec=_spec())
  assert _input_params(estimator, ModeKeys.EVAL)["batch_size"] == 7
  monkeypatch.delenv("TF_CONFIG")
  params = _input_params(_estimator(tmp_path / "single", batch=12))
  assert params["batch_size"] == 12 and "context" not in params


# --- the update a ps task runs ------------------------------------------------

VOCAB, DIM, BATCH = 11, 3, 4
BATCHES = [[[1, 3, 3], [], [7], [10, 1]], [[0], [5, 5], [1, 2], [3]],
           [[], [3], [3, 7, 8], [9]]]


def _grads(step):
  return np.random.RandomState(50 + step).uniform(
      -1, 1, (BATCH, DIM)).astype(np.float32)


def _train(optimizer, shards, strategy, remote, pipelining, clipping=None):
  spec = es.EmbeddingConfigSpec(
      feature_to_config_dict={"f": es.FeatureConfig("t")},
      table_to_config_dict={"t": es.TableConfig(VOCAB, DIM, combiner="sum")},
      optimization_parameters=optimizer, partition_strategy=strategy,
      clipping_limit=clipping,
      pipeline_execution_with_tensor_core=pipelining)
  config = es.EmbeddingConfig(spec, batch_size=BATCH)
  device_fn = (lambda table, i: "/device:CPU:0") if remote else None
  with tf.Graph().as_default():
    engine = HostEmbeddingEngine(config, num_shards=shards,
                                 shard_device_fn=device_fn)
    ids = v1.sparse_placeholder(tf.int64, [None, None])
    grads = v1.placeholder(tf.float32, [None, DIM])
    step = v1.placeholder(tf.int64, [])
    result = engine.lookup({"f": ids})
    train = engine.apply_gradients(result, {"f": grads}, step)
    flush = engine.flush()
    reads = [engine.table_rows("t").read_all()] + [
        s.read_all() for s in engine.slot_rows("t").values()]
    graph_def = tf.compat.v1.get_default_graph().as_graph_def()
    # Held updates are applied inside a cond: its branches are functions.
    nodes = list(graph_def.node) + [
        node for function in graph_def.library.function
        for node in function.node_def]
    locks = [node for node in nodes if node.op == "MutexLock"]
    with v1.Session() as sess:
      sess.run([v1.global_variables_initializer(),
                v1.local_variables_initializer()])
      start = np.random.RandomState(3).uniform(-1, 1, (VOCAB, DIM))
      sess.run(engine.table_rows("t").assign_all(start.astype(np.float32)))
      for n, batch in enumerate(BATCHES):
        sess.run(train, {ids: sparse_value(batch, np.int64),
                         grads: _grads(n), step: n})
      sess.run(flush)
      return sess.run(reads), len(locks)


@pytest.mark.parametrize("optimizer,clipping,fused", [
    (es.AdagradParameters(0.2, weight_decay_factor=0.01, clip_weight_max=0.9),
     0.6, False),
    (es.AdagradParameters(0.2), None, True),
    (es.AdamParameters(0.05, lazy_adam=False), 0.6, False),
    (es.FtrlParameters(0.1, l1_regularization_strength=0.01,
                       clip_gradient_min=-0.5, clip_gradient_max=0.4),
     None, False),
    (es.StochasticGradientDescentParameters(0.3), None, True),
    (es.StochasticGradientDescentParameters(0.3), 0.6, False),
], ids=["adagrad-decay", "adagrad-fused", "adam-dense", "ftrl",
        "sgd-fused", "sgd-clipped"])
@pytest.mark.parametrize("strategy", ["div", "mod"])
@pytest.mark.parametrize("pipelining", [False, True])
def test_partition_updates_on_their_task_equal_the_local_update(
    optimizer, clipping, fused, strategy, pipelining):
  # What a ps task runs (per partition, rows read at update time under the
  # partition's lock, or one of TF's sparse-apply kernels under the
  # variables' lock where it computes the same rule) trains exactly like the
  # one-process update.
  local, no_locks = _train(optimizer, 1, strategy, False, pipelining,
                           clipping=clipping)
  remote, locks = _train(optimizer, 3, strategy, True, pipelining,
                         clipping=clipping)
  assert no_locks == 0
  # One lock per partition (3) in each place an update is built (with
  # pipelining: the step and the flush).
  assert (locks == 0) if fused else (locks > 0 and locks % 3 == 0)
  for ours, reference in zip(remote, local):
    np.testing.assert_allclose(ours, reference, rtol=1e-6, atol=1e-7)


# Tables of several sizes and widths (one smaller than the partition count,
# one shared by two features) whose partitions are spread over two devices:
# the packed requests give the rows and updates of the one-process engine.
TABLES = {"t0": (11, 3), "t1": (7, 2), "t2": (2, 4)}
FEATURES = {"f0": "t0", "f1": "t1", "f2": "t0", "f3": "t2"}


def _train_tables(remote, strategy, pipelining):
  spec = es.EmbeddingConfigSpec(
      feature_to_config_dict={f: es.FeatureConfig(t)
                              for f, t in FEATURES.items()},
      table_to_config_dict={t: es.TableConfig(v, d, combiner="sum")
                            for t, (v, d) in TABLES.items()},
      optimization_parameters=es.AdagradParameters(0.2), clipping_limit=0.7,
      partition_strategy=strategy,
      pipeline_execution_with_tensor_core=pipelining)
  device_fn = (lambda table, i: f"/device:CPU:{i % 2}") if remote else None
  rng = np.random.RandomState(7)
  with tf.Graph().as_default():
    engine = HostEmbeddingEngine(es.EmbeddingConfig(spec, batch_size=BATCH),
                                 num_shards=3, shard_device_fn=device_fn)
    ids = {f: v1.sparse_placeholder(tf.int64, [None, None])
           for f in FEATURES}
    grads = {f: v1.placeholder(tf.float32, [None, TABLES[t][1]])
             for f, t in FEATURES.items()}
    result = engine.lookup(ids)
    train = engine.apply_gradients(result, grads, tf.constant(0, tf.int64))
    flush = engine.flush()
    reads = [engine.table_rows(t).read_all() for t in TABLES]
    starts = [engine.table_rows(t).assign_all(
        rng.uniform(-1, 1, TABLES[t]).astype(np.float32)) for t in TABLES]
    outputs = []
    with v1.Session(config=v1.ConfigProto(device_count={"CPU": 2})) as sess:
      sess.run([v1.global_variables_initializer(),
                v1.local_variables_initializer()])
      sess.run(starts)
      for _ in range(3):
        feed = {}
        for f, t in FEATURES.items():
          vocab, dim = TABLES[t]
          feed[ids[f]] = sparse_value(
              [list(rng.randint(0, vocab, rng.randint(0, 3)))
               for _ in range(BATCH)], np.int64)
          feed[grads[f]] = rng.uniform(-1, 1, (BATCH, dim))
        outputs.append(sess.run([result.activations, train], feed)[0])
      sess.run(flush)
      return outputs, sess.run(reads)


@pytest.mark.parametrize("strategy", ["div", "mod"])
@pytest.mark.parametrize("pipelining", [False, True])
def test_packed_requests_over_devices_equal_the_local_engine(strategy,
                                                             pipelining):
  local_outputs, local_tables = _train_tables(False, strategy, pipelining)
  outputs, tables = _train_tables(True, strategy, pipelining)
  # (The local engine combines and updates by its compiled kernels, a ps
  # task by TF ops: the same operations, up to the order of float sums.)
  for ours, reference in zip(outputs, local_outputs):
    for f in FEATURES:
      np.testing.assert_allclose(ours[f], reference[f], rtol=1e-6,
                                 atol=1e-7)
  for ours, reference in zip(tables, local_tables):
    np.testing.assert_allclose(ours, reference, rtol=1e-6, atol=1e-7)


def test_requests_carry_int64_ids_only_for_partitions_of_2_31_rows_or_more():
  # Local ids travel as int32 where they fit (half the bytes of the ids);
  # the update reads them as int64 on the ps task, as before.
  from estimator_spec.config.sharding import ShardLayout
  from estimator_spec.engine.requests import StepRequests
  with tf.Graph().as_default():
    ids = tf.constant([0, 5, 9], tf.int64)
    device = lambda table, p: f"/device:CPU:{p}"
    small = StepRequests({"t": ShardLayout(10, 2, "div")}, {"t": 2}, device,
                         {"t": ids})
    large = StepRequests({"t": ShardLayout(2**32, 2, "div")}, {"t": 2},
                         device, {"t": ids})
    assert small.ids("/device:CPU:0").dtype == tf.int32
    assert large.ids("/device:CPU:0").dtype == tf.int64
    unpacked = small.unpack("/device:CPU:1", small.ids("/device:CPU:1"),
                            tf.constant([0.5, 1, 2, 3, 4]))
    ((name, p, local, grads, lr),) = unpacked
    with v1.Session() as sess:
      local, grads, lr = sess.run([local, grads, lr])
    # Global ids 5 and 9 are rows 0 and 4 of partition 1 (rows 5..9).
    assert (name, p, local.tolist(), lr) == ("t", 1, [0, 4], 0.5)
    assert local.dtype == np.int64 and grads.tolist() == [[1, 2], [3, 4]]


def test_routed_requests_carry_the_ids_the_tf_routing_gives():
  # A training task that compiles its ops routes each table by one op
  # (`kernels.route_ids`); the requests it builds hold the same ids, in the
  # same order, as the TF ops' routing of the same distinct ids.
  from estimator_spec.config.sharding import ShardLayout
  from estimator_spec.engine import kernels
  from estimator_spec.engine.requests import StepRequests, request_dtype
  layouts = {"t": ShardLayout(10, 3, "div"), "u": ShardLayout(7, 2, "mod")}
  device = lambda table, p: f"/device:CPU:{p % 2}"
  with tf.Graph().as_default():
    ids = {"t": tf.constant([9, 0, 4, 9, 3], tf.int64),
           "u": tf.constant([6, 1, 2, 1], tf.int64)}
    dtype = request_dtype(layouts)
    routed, reference = {}, {}
    for name, layout in layouts.items():
      unique, _, local_ids, sizes = kernels.route_ids([ids[name]], layout,
                                                      dtype)
      routed[name] = (local_ids, sizes)
      reference[name] = tf.unique(ids[name])[0]
    ours = StepRequests(layouts, {"t": 2, "u": 2}, device, routed=routed)
    theirs = StepRequests(layouts, {"t": 2, "u": 2}, device, reference)
    with v1.Session() as sess:
      for d in ("/device:CPU:0", "/device:CPU:1"):
        a, b = sess.run([ours.ids(d), theirs.ids(d)])
        assert a.tolist() == b.tolist()
    with pytest.raises(ValueError, match="one of unique_ids and routed"):
      StepRequests(layouts, {"t": 2, "u": 2}, device)


# --- the requests of a step ------------------------------------------------------
# TF sends one tensor per edge of the step's graph that crosses tasks (a
# RecvTensor request each): the lookups of every table partition a ps task
# holds go there as one request and come back as one reply, and the update
# reuses the lookup's ids and adds one float32 request, however many tables.


def _edges(task_type, tables, asynchronous):
  built = cluster_graph.training_graph(
      task_type, 0, "async" if asynchronous else "sync", tables=tables)
  replies = collections.Counter(
      node.device for node in built[0].as_graph_def().node
      if re.search(r"/lookup_reply(_\d+)?$", node.name))
  return cluster_graph.cross_task_edges(built, f"{task_type}:0"), replies


@pytest.mark.parametrize("asynchronous", [False, True],
                         ids=["sync", "async"])
@pytest.mark.parametrize("task_type", ["chief", "worker"])
def test_a_step_sends_one_lookup_and_one_update_request_per_ps_task(
    task_type, asynchronous):
  one, replies_one = _edges(task_type, 1, asynchronous)
  four, replies = _edges(task_type, 4, asynchronous)
  # Four tables (two partitions each, one per ps task) cross between the
  # tasks exactly as often as one.
  assert four == one
  assert replies == replies_one == {"/job:ps/task:0": 1, "/job:ps/task:1": 1}
  if task_type == "worker" and not asynchronous:
    # A synchronous worker applies nothing itself: it sends the lookup's
    # ids and its entry's floats (step, dense and table gradients), no more.
    assert four[("worker:0", "ps:0")] == four[("worker:0", "ps:1")] == 2


def test_once_the_entries_are_taken_a_synchronous_step_stays_on_the_ps_tasks():
  # After the chief takes the tasks' entries, what the replies to the
  # workers wait for runs on the ps tasks only (the optimizer's join of its
  # updates and the global step's increment on ps 0): no round trip through
  # the chief; the dense variables' updates run beside the tables', not
  # after them.
  built = cluster_graph.training_graph("chief", 0, "sync", workers=1,
                                       tables=2)
  step, nodes, device = cluster_graph.step_devices(built, "chief:0")
  names = {node.name for node in step}
  inputs = {node.name: cluster_graph.op_inputs(node) for node in step}
  outputs = collections.defaultdict(list)
  for name, sources in inputs.items():
    for source in sources:
      outputs[source].append(name)
  takes = {n for n in names if nodes[n].op == "QueueDequeueV2" and
           "/gradients_task_" in n}
  replies = {n for n in names if nodes[n].op == "QueueEnqueueV2" and
             "/replies_task_" in n}
  assert takes and replies
  between = (cluster_graph.closure(takes, outputs) &
             cluster_graph.closure(replies, inputs))
  tables = {n for n in between if nodes[n].op == "ResourceSparseApplyAdagradV2"}
  dense = {n for n in between if nodes[n].op == "ResourceApplyAdagrad" and
           device[n].startswith("ps:")}
  increments = {n for n in between if nodes[n].op == "AssignAddVariableOp"}
  assert len(tables) == 4 and len(dense) == 4 and len(increments) == 1
  assert {device[n] for n in between} == {"ps:0", "ps:1"}
  assert not cluster_graph.closure(dense, inputs) & tables
  # The op the chief's step waits for is ps 0's, after the replies there
  # only (they wait for everything else).
  (done,) = [n for n in names if n.endswith("/synchronous_step_done")]
  assert device[done] == "ps:0"
  assert {device[n] for n in inputs[done]} == {"ps:0"}


# --- model_fn checks of a synchronous step ------------------------------------


def _train_op_advancing_the_step_itself(loss):
  # Every task runs model_fn's train op: its own increment would advance
  # the step once per task.
  optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.1)
  return tf.group(optimizer.minimize(loss),
                  tf.compat.v1.train.get_global_step().assign_add(1))


def _train_op_without_an_optimizer(loss):
  # The dense gradients are averaged where a tf.compat.v1.train optimizer
  # applies them; a train op that never calls one cannot be synchronous.
  del loss
  return tf.no_op()


def _train_op_summing_over_replicas(loss):
  # The tasks' gradients are averaged, CrossShardOptimizer's default.
  optimizer = tf.compat.v1.tpu.CrossShardOptimizer(
      tf.compat.v1.train.GradientDescentOptimizer(0.1),
      reduction=tf.compat.v1.losses.Reduction.SUM)
  return optimizer.minimize(
      loss, global_step=tf.compat.v1.train.get_global_step())


@pytest.mark.parametrize("task_type,train_op_fn,error", [
    ("worker", _train_op_advancing_the_step_itself,
     "writes the global step itself"),
    ("chief", _train_op_without_an_optimizer,
     "did not call `apply_gradients`"),
    ("chief", _train_op_summing_over_replicas,
     r"reduction=SUM\) in synchronous"),
], ids=["own-step-increment", "no-v1-optimizer", "sum-reduction"])
def test_a_synchronous_step_refuses_what_it_cannot_run_as_one(
    tmp_path, monkeypatch, task_type, train_op_fn, error):
  # Refused while the graph is built, before any session.
  _tf_config(monkeypatch, task_type, 0)

  def model_fn(features, labels, mode, params):
    del labels, params
    net = tf.compat.v1.feature_column.input_layer(
        features, [_spec().feature_columns[0]])
    loss = tf.reduce_sum(net)
    return es.TPUEstimatorSpec(mode, loss=loss, train_op=train_op_fn(loss))

  estimator = es.TPUEstimator(
      model_fn=model_fn,
      config=es.RunConfig(model_dir=str(tmp_path)),
      use_tpu=False, train_batch_size=9, embedding_config_spec=_spec())
  with pytest.raises(ValueError, match=error):
    _build_training_graph(estimator)


# --- device filters -------------------------------------------------------------
# A host TPUEstimator in a between-graph cluster sets the session config
# Estimator's own RunConfig would: device filters, so that a task waits only
# for the tasks it talks to (the ps tasks and itself). TF's TPU RunConfig
# leaves them out (a TPU job runs in-graph); without them a chief waits for
# every worker before it starts. Oracle: TF 2.15's
# `tf.compat.v1.estimator.RunConfig` under the same TF_CONFIG.


def _estimators_own(tmp_path):
  """The session config a plain Estimator runs with (plain RunConfig):
  tensorflow-estimator's on TF 2.15, the library's framework (held to TF
  2.15's by tests/test_framework_run_config.py) on current TF."""
  return es.estimator.Estimator(
      model_fn=_model_fn,
      config=es.estimator.RunConfig(
          model_dir=str(tmp_path))).config.session_config


@pytest.mark.parametrize("task_type,index", [("chief", 0), ("worker", 0),
                                             ("worker", 1), ("ps", 0),
                                             ("ps", 1), ("evaluator", 0)])
def test_session_config_is_estimators_for_every_task(tmp_path, monkeypatch,
                                                      task_type, index):
  _tf_config(monkeypatch, task_type, index)
  expected = _estimators_own(tmp_path)
  estimator = _estimator(tmp_path)
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
  estimator = es.TPUEstimator(
      model_fn=_model_fn,
      config=es.RunConfig(
          model_dir=str(tmp_path), session_config=own),
      use_tpu=False, train_batch_size=12, embedding_config_spec=_spec())
  assert estimator.config.session_config == own
  assert not list(estimator.config.session_config.device_filters)


def test_without_a_cluster_the_session_config_is_estimators(tmp_path,
                                                           monkeypatch):
  monkeypatch.delenv("TF_CONFIG", raising=False)
  estimator = _estimator(tmp_path)
  assert estimator.config.session_config == _estimators_own(tmp_path)
  assert not list(estimator.config.session_config.device_filters)


def test_the_step_watch_reports_a_waiting_step_from_one_thread():
  """The synchronous step's watch: one thread per session (not one per
  step) reports a step that runs past `report_after_secs` (naming the
  tasks that have not sent it) and again after as long, stops once the
  step ends, and ends with the session (or when the session is gone)."""
  import threading
  import time
  import types
  from estimator_spec.cluster import sync
  graph = tf.Graph()
  with graph.as_default():
    v1.train.create_global_step()
    table = tf.raw_ops.MutableHashTableV2(key_dtype=tf.int64,
                                          value_dtype=tf.int64)
    sent = tf.raw_ops.LookupTableInsertV2(
        table_handle=table, keys=tf.constant([0], tf.int64),
        values=tf.constant([0], tf.int64))
    cluster = types.SimpleNamespace(
        num_training_tasks=2,
        training_task_name=lambda index: ["chief", "worker 0"][index])
    options = types.SimpleNamespace(report_after_secs=0.2,
                                    step_timeout_secs=60)
    reports = []
    hook = sync.SyncWatchHook(cluster, options, table, reports)
    watchers = lambda: [t for t in threading.enumerate()
                        if t.name == "synchronous_step_watch"]
    with v1.Session(graph=graph) as session:
      session.run([v1.global_variables_initializer(), sent])
      before = len(watchers())
      hook.after_create_session(session, None)
      for _ in range(50):  # quick steps: nothing to report
        hook.before_run(None)
        hook.after_run(None, None)
      assert not reports
      assert len(watchers()) == before + 1
      hook.before_run(None)  # a step that waits
      time.sleep(0.75)
      assert len(reports) >= 2, reports
      assert reports[0] == (0, ["worker 0 (nothing sent yet)"])
      hook.after_run(None, None)
      time.sleep(0.1)
      count = len(reports)
      time.sleep(0.5)
      assert len(reports) == count
      hook.end(session)
      for _ in range(100):
        if len(watchers()) == before:
          break
        time.sleep(0.01)
      assert len(watchers()) == before
    # A step that fails does not end the hook; once its session is closed,
    # the report cannot be read and the watcher ends too.
    session = v1.Session(graph=graph)
    session.run(sent)
    hook.after_create_session(session, None)
    assert len(watchers()) == before + 1
    hook.before_run(None)
    session.close()
    count = len(reports)
    for _ in range(100):
      if len(watchers()) == before:
        break
      time.sleep(0.02)
    assert len(watchers()) == before
    assert len(reports) == count
