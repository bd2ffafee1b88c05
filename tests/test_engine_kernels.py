"""The engine's compiled row updates and gather (estimator_spec/engine/
kernels): built from the repository's C++ source on first use, they give
the same tables and slots as the TensorFlow-op path bit for bit, and the
engine falls back to that path (or refuses, when told to require them) if
they cannot be built.

Runs in both environments (TF 2.15 and current TensorFlow): each builds
its own library.
"""
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import rewriter_config_pb2

import estimator_spec as es
from estimator_spec.engine import HostEmbeddingEngine
from estimator_spec.engine import kernels
from tests import test_engine_eager as steps
from tpu_embedding_columns import lookup as column_lookup
from tests.ragged import sparse_value

v1 = tf.compat.v1
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KERNEL_OPS = {"HostEmbeddingAdagradRows", "HostEmbeddingSgdRows",
              "HostEmbeddingGatherRows", "HostEmbeddingLookup",
              "HostEmbeddingIdGradients", "HostEmbeddingCheckAll",
              "HostEmbeddingCheckIds",
              "HostEmbeddingCombine", "HostEmbeddingDropNegativeIds",
              "HostEmbeddingExtremes"}

OPTIMIZERS = {
    "adagrad": steps.OPTIMIZERS["adagrad"],
    # Gradient clipping, weight decay and weight clipping.
    "adagrad_all_steps": steps.OPTIMIZERS["adagrad_clipped"],
    "adagrad_lower_bounds": lambda: es.AdagradParameters(
        0.3, clip_gradient_min=-0.2, weight_decay_factor=0.1,
        multiply_weight_decay_factor_by_learning_rate=True,
        clip_weight_min=-0.7),
    "sgd": lambda: es.StochasticGradientDescentParameters(0.2),
    "sgd_all_steps": lambda: es.StochasticGradientDescentParameters(
        0.2, weight_decay_factor=0.1,
        multiply_weight_decay_factor_by_learning_rate=True,
        clip_gradient_max=0.2, clip_weight_max=0.6),
}


@pytest.fixture(autouse=True)
def _kernels_required(monkeypatch):
  # In these tests the kernels must build: a failure is a failure, not a
  # silent fallback.
  monkeypatch.setenv(kernels.ENV, "1")


def _exact_session_config():
  """Grappler's arithmetic optimizer turns x / sqrt(y) into x * rsqrt(y),
  which can differ in the last bit: off, the graph ops compute the division
  that docs/numerics.md and the kernels do."""
  session_config = v1.ConfigProto()
  session_config.graph_options.rewrite_options.arithmetic_optimization = (
      rewriter_config_pb2.RewriterConfig.OFF)
  return session_config


def _graph_run(spec, num_shards, monkeypatch, use_kernels):
  """(tables and slots after each step and after flush, op types of the
  graph), with the compiled kernels on or off."""
  monkeypatch.setenv(kernels.ENV, "1" if use_kernels else "0")
  config = es.EmbeddingConfig(spec, batch_size=steps.BATCH)
  history = []
  with tf.Graph().as_default() as graph:
    engine = HostEmbeddingEngine(config, num_shards=num_shards)
    ph = {k: v1.sparse_placeholder(tf.int64, [None, None]) for k in "fgh"}
    grad_ph = {"f": v1.placeholder(tf.float32, [None, steps.DIM]),
               "g": v1.placeholder(tf.float32, [None, steps.DIM]),
               "h": v1.placeholder(tf.float32, [None, 2])}
    step = v1.placeholder(tf.int64, [])
    result = engine.lookup(ph)
    train = engine.apply_gradients(result, grad_ph, step)
    flush = engine.flush()
    with v1.Session(config=_exact_session_config()) as sess:
      sess.run([v1.global_variables_initializer(),
                v1.local_variables_initializer()])
      steps.set_initial_tables(engine, sess.run)
      for n, batch in enumerate(steps.BATCHES):
        feed = {ph[k]: sparse_value(batch[k], np.int64) for k in "fgh"}
        feed.update({grad_ph[k]: v
                     for k, v in steps.activation_grads(n).items()})
        feed[step] = n
        sess.run(train, feed)
        history.append(steps.state(engine, sess.run))
      sess.run(flush)
      history.append(steps.state(engine, sess.run))
    op_types = _op_types(graph)
  return history, op_types


def _op_types(graph):
  """Op types of `graph`, with those of its functions (a tf.cond's
  branches)."""
  graph_def = graph.as_graph_def()
  types = {node.op for node in graph_def.node}
  for function in graph_def.library.function:
    types.update(node.op for node in function.node_def)
  return types


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("strategy,shards", [("div", 1), ("div", 3),
                                             ("mod", 3)])
def test_kernels_equal_the_graph_ops_bit_for_bit(optimizer, strategy, shards,
                                                 monkeypatch):
  spec = steps.spec_of(OPTIMIZERS[optimizer](), strategy,
                       clipping_limit=0.28 if "all" in optimizer else None)
  with_kernels, kernel_types = _graph_run(spec, shards, monkeypatch, True)
  without, plain_types = _graph_run(spec, shards, monkeypatch, False)
  steps.assert_same(with_kernels, without, exact=True)
  rule = ("HostEmbeddingAdagradRows" if optimizer.startswith("adagrad") else
          "HostEmbeddingSgdRows")
  # A table in one partition: one op finds its distinct ids and combines
  # their rows; in several: Unique, a compiled gather per partition and the
  # compiled combine.
  lookup = ({"HostEmbeddingLookup"} if shards == 1 else
            {"HostEmbeddingGatherRows", "HostEmbeddingCombine"})
  assert {rule} | lookup <= kernel_types
  assert not KERNEL_OPS & plain_types
  if shards == 1:
    # The graph-op path scatters the new rows back; the kernels write in
    # place. (With partitions the test's own initial assignment scatters.)
    assert "ResourceScatterUpdate" in plain_types
    assert "ResourceScatterUpdate" not in kernel_types
  assert not np.array_equal(with_kernels[-1]["t"], with_kernels[0]["t"])


def test_kernels_with_pipelining_and_a_learning_rate_function(monkeypatch):
  spec = steps.spec_of(
      OPTIMIZERS["adagrad_all_steps"](), "mod", pipeline=True,
      learning_rate_fn=lambda step: 0.3 / (1.0 + tf.cast(step, tf.float32)),
      multiplier=lambda step: 2.0 - tf.cast(step, tf.float32) / 4.0)
  with_kernels, kernel_types = _graph_run(spec, 2, monkeypatch, True)
  without, _ = _graph_run(spec, 2, monkeypatch, False)
  steps.assert_same(with_kernels, without, exact=True)
  assert "HostEmbeddingAdagradRows" in kernel_types


MIXED_BATCHES = [
    # Negative ids are dropped (with their weights and positions).
    {"f": [[1, -3, 3], [], [7]], "fw": [[0.5, 2.0, 1.5], [], [3.0]],
     "q": [[2, -9, 2], [4], []], "u": [[5], [6], [0]]},
    {"f": [[0], [5, 5], [1, 2]], "fw": [[1.0], [0.25, 4.0], [2.0, 0.5]],
     "q": [[], [1, 1], [3, 8, 8]], "u": [[2], [2], [7]]},
]


def _mixed_run(monkeypatch, use_kernels, num_shards=2):
  """Weighted sqrtn, sequence and one-id features sharing one table and a
  mean feature alone, two steps: tables and slots after each."""
  monkeypatch.setenv(kernels.ENV, "1" if use_kernels else "0")
  spec = es.EmbeddingConfigSpec(
      feature_to_config_dict={
          "f": es.FeatureConfig("t", weight_key="fw"),
          "q": es.FeatureConfig("t", max_sequence_length=2),
          "u": es.FeatureConfig("s")},
      table_to_config_dict={
          "t": es.TableConfig(10, 3, combiner="sqrtn"),
          "s": es.TableConfig(8, 2, combiner="mean")},
      optimization_parameters=OPTIMIZERS["adagrad_all_steps"]())
  config = es.EmbeddingConfig(spec, batch_size=3)
  shapes = {"f": (3, 3), "q": (3, 2, 3), "u": (3, 2)}
  history = []
  with tf.Graph().as_default() as graph:
    engine = HostEmbeddingEngine(config, num_shards=num_shards)
    ph = {k: v1.sparse_placeholder(tf.float32 if k == "fw" else tf.int64,
                                   [None, None]) for k in MIXED_BATCHES[0]}
    grad_ph = {k: v1.placeholder(tf.float32, shape)
               for k, shape in shapes.items()}
    result = engine.lookup(ph)
    train = engine.apply_gradients(result, grad_ph, tf.constant(0, tf.int64))
    with v1.Session(config=_exact_session_config()) as sess:
      sess.run(v1.global_variables_initializer())
      steps.set_initial_tables(engine, sess.run)
      rng = np.random.RandomState(7)
      for batch in MIXED_BATCHES:
        feed = {ph[k]: sparse_value(v, np.float32 if k == "fw" else np.int64)
                for k, v in batch.items()}
        feed.update({grad_ph[k]: rng.uniform(-1, 1, shape).astype(np.float32)
                     for k, shape in shapes.items()})
        activations = sess.run(result.activations, feed)
        sess.run(train, feed)
        history.append(dict(steps.state(engine, sess.run), **{
            f"activation {k}": v for k, v in activations.items()}))
  return history, _op_types(graph)


@pytest.mark.parametrize("num_shards", [1, 2])
def test_weighted_sequence_and_mean_features_equal_the_graph_ops(
    monkeypatch, num_shards):
  with_kernels, types = _mixed_run(monkeypatch, True, num_shards)
  without, _ = _mixed_run(monkeypatch, False, num_shards)
  steps.assert_same(with_kernels, without, exact=True)
  # One partition: one op finds the distinct ids and combines their rows;
  # two: the compiled gather reads each one's rows, the compiled combine
  # combines them.
  lookup = ({"HostEmbeddingLookup"} if num_shards == 1 else
            {"HostEmbeddingGatherRows", "HostEmbeddingCombine"})
  assert {"HostEmbeddingIdGradients", "HostEmbeddingAdagradRows",
          "HostEmbeddingDropNegativeIds", "HostEmbeddingExtremes"
         } | lookup <= types
  assert not np.array_equal(with_kernels[-1]["t"], with_kernels[0]["t"])


def _concatenated_run(monkeypatch, use_kernels, features, num_shards=1,
                      gate_gradients=False):
  """`features` features over two tables (mean and sum), their activations
  concatenated (as DenseFeatures does) into a linear model; the engine
  trains from the gradients tf.gradients gives each activation (gated as
  an optimizer's default GATE_OP gates them, with `gate_gradients`). Two
  steps: tables and slots after each, and the graph."""
  monkeypatch.setenv(kernels.ENV, "1" if use_kernels else "0")
  names = [f"f{i:02d}" for i in range(features)]
  spec = es.EmbeddingConfigSpec(
      feature_to_config_dict={
          name: es.FeatureConfig("t" if i % 2 else "s")
          for i, name in enumerate(names)},
      table_to_config_dict={
          "t": es.TableConfig(10, 3, combiner="mean"),
          "s": es.TableConfig(8, 3, combiner="sum")},
      optimization_parameters=OPTIMIZERS["adagrad"]())
  config = es.EmbeddingConfig(spec, batch_size=4)
  history = []
  rng = np.random.RandomState(5)
  with tf.Graph().as_default() as graph:
    engine = HostEmbeddingEngine(config, num_shards=num_shards)
    ph = {name: v1.sparse_placeholder(tf.int64, [None, None])
          for name in names}
    result = engine.lookup(ph)
    pieces = [result.activations[name] for name in names]
    if gate_gradients:
      # As DenseFeatures gives them: of a known batch size.
      pieces = [tf.ensure_shape(piece, [4, 3]) for piece in pieces]
    joined = tf.concat(pieces, axis=1)
    weights = tf.constant(rng.uniform(-1, 1, [3 * features, 1]), tf.float32)
    loss = tf.reduce_sum(tf.square(tf.matmul(joined, weights)))
    grads = dict(zip(names, tf.gradients(loss, pieces + [weights],
                                         gate_gradients=gate_gradients)))
    train = engine.apply_gradients(result, grads, tf.constant(0, tf.int64))
    with v1.Session(config=_exact_session_config()) as sess:
      sess.run(v1.global_variables_initializer())
      steps.set_initial_tables(engine, sess.run)
      for _ in range(2):
        feed = {}
        for i, name in enumerate(names):
          ids = [list(rng.randint(0, 8, rng.randint(0, 3))) for _ in range(4)]
          feed[ph[name]] = sparse_value(ids, np.int64)
        sess.run(train, feed)
        history.append(steps.state(engine, sess.run))
  return history, graph


@pytest.mark.parametrize("features, num_shards", [(17, 1), (17, 2), (3, 1)])
def test_gradients_of_concatenated_activations_are_read_unsplit(
    monkeypatch, features, num_shards):
  """With more than 16 activations concatenated, TF's gradient of the
  concatenation splits the gradient of the whole (one SplitV): the compiled
  per-id sums read each feature's columns of the whole instead, so the split
  is not needed, with the same numbers. With fewer, TF slices each piece
  (no SplitV): the sums read the pieces."""
  with_kernels, graph = _concatenated_run(monkeypatch, True, features,
                                          num_shards)
  without, _ = _concatenated_run(monkeypatch, False, features, num_shards)
  steps.assert_same(with_kernels, without, exact=True)
  assert not np.array_equal(with_kernels[-1]["t"], with_kernels[0]["t"])
  sums = [op for op in graph.get_operations()
          if op.type == "HostEmbeddingIdGradients"]
  assert len(sums) == 2
  splits = [op for op in graph.get_operations() if op.type == "SplitV"]
  read = {t.op.type for op in sums for t in op.inputs[:op.get_attr("F")]}
  if features > 16:
    assert len(splits) == 1 and "SplitV" not in read
    whole = splits[0].inputs[0]
    for op in sums:
      assert all(t is whole for t in op.inputs[:op.get_attr("F")])
      assert op.get_attr("dim") == 3
    # Feature i's columns start at 3 * i; table "s" has the even features.
    assert sorted(sums[0].get_attr("offsets") + sums[1].get_attr("offsets")
                  ) == [3 * i for i in range(features)]
    # Nothing the step runs needs the split.
    needed = v1.graph_util.extract_sub_graph(graph.as_graph_def(),
                                             [op.name for op in sums])
    assert splits[0].name not in {node.name for node in needed.node}
  else:
    assert not splits
    assert all(op.get_attr("offsets") == [] for op in sums)


def test_gated_gradients_are_read_before_the_gate_with_the_same_numbers(
    monkeypatch):
  """With the backward pass gated (an optimizer's default), the gradient of
  the concatenation waits for the product's other gradient (the weights');
  the per-id sums read the product's gradient itself and need not wait."""
  gated, graph = _concatenated_run(monkeypatch, True, 17,
                                   gate_gradients=True)
  plain, _ = _concatenated_run(monkeypatch, True, 17)
  steps.assert_same(gated, plain, exact=True)
  sums = [op for op in graph.get_operations()
          if op.type == "HostEmbeddingIdGradients"]
  assert len(sums) == 2
  for op in sums:
    read = {t.op for t in op.inputs[:op.get_attr("F")]}
    assert [r.type for r in read] == ["MatMul"]
  gates = [op for op in graph.get_operations()
           if op.type == "Identity" and "/tuple/" in op.name]
  assert gates, "TF no longer gates the product's gradients"
  needed = v1.graph_util.extract_sub_graph(graph.as_graph_def(),
                                           [op.name for op in sums])
  assert not {op.name for op in gates} & {node.name for node in needed.node}


def test_one_op_checks_every_tables_sums_before_the_first_update():
  """The step's gate on the per-id sums is one compiled op: it names every
  table whose sums are not finite (in table order), and nothing is written.
  The updates' constant inputs do not wait for it: the first update starts
  when the check ends."""
  config = es.EmbeddingConfig(steps.spec_of(OPTIMIZERS["adagrad"]()),
                              batch_size=steps.BATCH)
  with tf.Graph().as_default() as graph:
    engine = HostEmbeddingEngine(config)
    ph = {k: v1.sparse_placeholder(tf.int64, [None, None]) for k in "fgh"}
    grad_ph = {k: v1.placeholder(tf.float32, [None, 2 if k == "h" else
                                              steps.DIM]) for k in "fgh"}
    train = engine.apply_gradients(engine.lookup(ph), grad_ph,
                                   tf.constant(0, tf.int64))
    (check,) = [op for op in graph.get_operations()
                if op.type == "HostEmbeddingCheckAll"]
    assert [t.op.type for t in check.inputs] == ["HostEmbeddingIdGradients"] * 2
    updates = [op for op in graph.get_operations()
               if op.type == "HostEmbeddingAdagradRows"]
    assert len(updates) == 2
    for update in updates:
      constants = [t.op for t in update.inputs if t.op.type == "Const"]
      assert constants and not any(c.control_inputs for c in constants)
      # The check is among what the update waits for.
      needed = v1.graph_util.extract_sub_graph(graph.as_graph_def(),
                                               [update.name])
      assert check.name in {node.name for node in needed.node}
    with v1.Session() as sess:
      sess.run(v1.global_variables_initializer())
      steps.set_initial_tables(engine, sess.run)
      before = steps.state(engine, sess.run)
      feed = {ph[k]: sparse_value(steps.BATCHES[0][k], np.int64)
              for k in "fgh"}
      assert list(engine.model.tables) == ["s", "t"]
      for bad, named in ((("h",), ["'h' (table 's')"]),
                         (("g", "h"), ["'h' (table 's')",
                                       "'f', 'g' (table 't')"])):
        grads = steps.activation_grads(0)
        for feature in bad:
          grads[feature][:, 0] = np.nan
        feed.update({grad_ph[k]: v for k, v in grads.items()})
        with pytest.raises(tf.errors.InvalidArgumentError) as info:
          sess.run(train, feed)
        lines = info.value.message.splitlines()
        assert [line for line in lines if "is not finite" in line] == [
            f"Gradient of features {n} is not finite; no table was updated."
            for n in named]
        after = steps.state(engine, sess.run)
        for key in before:
          np.testing.assert_array_equal(after[key], before[key], err_msg=key)
      feed.update({grad_ph[k]: v
                   for k, v in steps.activation_grads(0).items()})
      sess.run(train, feed)
      assert not np.array_equal(steps.state(engine, sess.run)["t"],
                                before["t"])


def test_the_check_of_many_flags_names_each_false_one_in_order():
  ops = kernels.row_updates()
  flags = [tf.constant(v) for v in (True, False, True, False)]
  messages = ["m-one", "m-two", "m-three", "m-four"]
  with pytest.raises(tf.errors.InvalidArgumentError) as info:
    ops.host_embedding_check_all(ok=flags, messages=messages)
  assert "m-two\nm-four" in info.value.message
  assert "m-one" not in info.value.message
  assert "m-three" not in info.value.message
  ops.host_embedding_check_all(ok=flags[:1] + flags[2:3],
                               messages=["m-one", "m-three"])
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match="ok has 2 flags for 1 messages"):
    ops.host_embedding_check_all(ok=flags[:2], messages=["m-one"])
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"ok\[0\] must be a scalar"):
    ops.host_embedding_check_all(ok=[tf.constant([True, True])],
                                 messages=["m-one"])


def test_optimizers_without_a_kernel_keep_the_graph_ops(monkeypatch):
  """Adam's update stays TF ops (gathers and scatters); its lookup and
  gradient sums are compiled, with the same numbers."""
  spec = steps.spec_of(es.AdamParameters(0.05))
  with_kernels, types = _graph_run(spec, 1, monkeypatch, True)
  without, _ = _graph_run(spec, 1, monkeypatch, False)
  steps.assert_same(with_kernels, without, exact=True)
  assert not {"HostEmbeddingAdagradRows", "HostEmbeddingSgdRows"} & types
  assert {"ResourceScatterUpdate", "HostEmbeddingLookup",
          "HostEmbeddingIdGradients"} <= types


def test_eager_steps_with_kernels_equal_the_graph_ops(monkeypatch):
  spec = steps.spec_of(OPTIMIZERS["adagrad_all_steps"](), "div")
  monkeypatch.setenv(kernels.ENV, "1")
  eager = steps.run_eager(spec, 2)
  monkeypatch.setenv(kernels.ENV, "0")
  plain = steps.run_eager(spec, 2)
  steps.assert_same(eager, plain, exact=True)


def test_evaluation_graphs_use_plain_tensorflow_ops():
  spec = steps.spec_of(OPTIMIZERS["adagrad"]())
  config = es.EmbeddingConfig(spec, batch_size=steps.BATCH, mode="eval")
  with tf.Graph().as_default() as graph:
    engine = HostEmbeddingEngine(config)
    engine.lookup({k: v1.sparse_placeholder(tf.int64, [None, None])
                   for k in "fgh"})
    types = _op_types(graph)
  assert not KERNEL_OPS & types
  assert "ResourceGather" in types


def _variable(values):
  return tf.Variable(np.asarray(values, np.float32))


def test_an_update_does_not_change_a_value_read_before_it():
  ops = kernels.row_updates()
  table = _variable(np.ones((4, 2)))
  accumulator = _variable(np.full((4, 2), 0.5))
  before = table.read_value()      # may share the variable's buffer
  ops.host_embedding_adagrad_rows(
      table.handle, accumulator.handle, indices=tf.constant([2], tf.int64),
      grad=tf.constant([[1.0, -1.0]]), lr=tf.constant(0.5),
      grad_lo=tf.constant(-np.inf), grad_hi=tf.constant(np.inf),
      factor=tf.constant(0.0), weight_lo=tf.constant(-np.inf),
      weight_hi=tf.constant(np.inf), clip_gradients=False, decay=False,
      clip_weights=False)
  np.testing.assert_array_equal(before.numpy(), np.ones((4, 2), np.float32))
  want = np.ones((4, 2), np.float32)
  want[2] = np.float32(1) - np.float32(0.5) * np.array(
      [1, -1], np.float32) / np.sqrt(np.float32(1.5))
  np.testing.assert_array_equal(table.numpy(), want)
  np.testing.assert_array_equal(accumulator.numpy()[2], [1.5, 1.5])


def test_a_row_index_out_of_range_is_refused_and_nothing_written():
  ops = kernels.row_updates()
  table = _variable(np.ones((4, 2)))
  accumulator = _variable(np.full((4, 2), 0.5))
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"row index 4 at 1 is outside \[0, 4\)"):
    ops.host_embedding_adagrad_rows(
        table.handle, accumulator.handle,
        indices=tf.constant([0, 4], tf.int64), grad=tf.ones([2, 2]),
        lr=tf.constant(0.5), grad_lo=tf.constant(-np.inf),
        grad_hi=tf.constant(np.inf), factor=tf.constant(0.0),
        weight_lo=tf.constant(-np.inf), weight_hi=tf.constant(np.inf),
        clip_gradients=False, decay=False, clip_weights=False)
  np.testing.assert_array_equal(table.numpy(), np.ones((4, 2)))
  np.testing.assert_array_equal(accumulator.numpy(), np.full((4, 2), 0.5))
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"row index -1 at 0 is outside \[0, 4\)"):
    ops.host_embedding_gather_rows(table.handle, tf.constant([-1], tf.int32))


@pytest.mark.parametrize("dtype", [tf.int32, tf.int64])
def test_the_gather_equals_tf_gather(dtype):
  ops = kernels.row_updates()
  values = np.random.RandomState(0).randn(50, 3).astype(np.float32)
  table = _variable(values)
  ids = tf.constant([7, 0, 49, 7, 7, 12] * 10, dtype)
  np.testing.assert_array_equal(
      ops.host_embedding_gather_rows(table.handle, ids).numpy(),
      tf.gather(table, ids).numpy())
  assert ops.host_embedding_gather_rows(
      table.handle, tf.constant([], dtype)).shape == (0, 3)


def _plan(segment, num_segments, weights, combiner):
  return column_lookup.Plan(
      tf.constant(segment, tf.int32), tf.constant(num_segments, tf.int32),
      None if weights is None else tf.constant(weights, tf.float32),
      combiner, [3], [])


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_the_combine_and_its_gradient_sums_equal_the_graph_ops(combiner):
  """Each feature's activation and per-id gradient sums, with empty
  examples and weights that sum to 0, equal the plan's TF ops."""
  ops = kernels.row_updates()
  rng = np.random.RandomState(3)
  plans = [
      _plan([0, 0, 2, 3, 3, 3], 5, rng.uniform(-2, 2, 6), combiner),
      _plan([1, 1, 4], 5, None, combiner),
      _plan([0, 2, 2], 4, [0.5, 1.5, -1.5], combiner),
  ]
  # The rows of 8 distinct ids; the 12 ids of the features point at them.
  rows = tf.constant(rng.randn(8, 3), tf.float32)
  index = tf.constant([0, 1, 2, 3, 4, 5, 1, 6, 2, 7, 0, 7], tf.int32)
  sizes = [6, 3, 3]
  empty = tf.zeros([0], tf.float32)
  activations, scales = ops.host_embedding_combine(
      rows, index, segments=[p.segment for p in plans],
      weights=[empty if p.weights is None else p.weights for p in plans],
      num_segments=[p.num_segments for p in plans],
      combiners=[combiner] * 3)
  for plan, part, out, scale in zip(plans, tf.split(index, sizes),
                                    activations, scales):
    np.testing.assert_array_equal(out.numpy(),
                                  plan.combine(tf.gather(rows, part)).numpy())
    if combiner == "sum":
      assert scale.shape == (0,)
    else:
      np.testing.assert_array_equal(scale.numpy(), plan.scale.numpy())
  grads = [tf.constant(rng.randn(5, 3), tf.float32),
           tf.constant(rng.randn(5, 3), tf.float32),
           tf.constant(rng.randn(4, 3), tf.float32)]

  def id_gradients(grads, multiplier, **windows):
    return ops.host_embedding_id_gradients(
        grads=grads, segments=[p.segment for p in plans],
        weights=[empty if p.weights is None else p.weights for p in plans],
        scales=scales, index=index, num_ids=8, multiplier=multiplier,
        **windows)

  summed, finite = id_gradients(grads, empty)
  want = tf.math.unsorted_segment_sum(
      tf.concat([p.backprop(g) for p, g in zip(plans, grads)], 0), index, 8)
  np.testing.assert_array_equal(summed.numpy(), want.numpy())
  assert finite.numpy()
  # With a multiplier: the sums times it, as a multiplication after them.
  summed, finite = id_gradients(grads, tf.constant(0.3))
  np.testing.assert_array_equal(summed.numpy(), (want * 0.3).numpy())
  assert finite.numpy()
  # A multiplier that overflows a sum, or a NaN gradient, is not finite.
  assert not id_gradients(grads, tf.constant(3e38))[1].numpy()
  nan = [tf.tensor_scatter_nd_update(grads[0], [[0, 2]], [np.nan])]
  assert not id_gradients(nan + grads[1:], empty)[1].numpy()
  # Read where they lie in wider gradients: columns [offset, offset + 3),
  # the first two features from one matrix, the third alone at offset 0.
  wide = tf.concat([tf.constant(rng.randn(5, 2), tf.float32), grads[1],
                    tf.constant(rng.randn(5, 1), tf.float32), grads[0]],
                   axis=1)
  summed, finite = id_gradients([wide, wide, grads[2]], empty,
                                offsets=[6, 2, 0], dim=3)
  np.testing.assert_array_equal(summed.numpy(), want.numpy())
  assert summed.shape == (8, 3) and finite.numpy()
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"grads\[1\] has 9 columns; columns \[7, 10\) are "
                     "outside them"):
    id_gradients([wide, wide, grads[2]], empty, offsets=[6, 7, 0], dim=3)
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match="offsets must be empty or one per feature"):
    id_gradients([wide, wide, grads[2]], empty, offsets=[6, 2], dim=3)
  if combiner != "sum":
    # The last feature: examples 1 and 3 are empty, and example 2's weights
    # sum to 0 (their squares do not); the scale is 0 where the sum is 0.
    zero = [1, 2, 3] if combiner == "mean" else [1, 3]
    np.testing.assert_array_equal(scales[2].numpy()[zero], 0.0)
    assert np.all(scales[2].numpy()[[0]] != 0.0)


def test_the_gradient_sums_refuse_scales_of_another_length():
  """A scale per gradient row (mean, sqrtn), or none: another count would
  be read past its end."""
  ops = kernels.row_updates()
  for offsets in ([], [1]):
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="feature 0: scales must be empty or one per "
                       "gradient row"):
      ops.host_embedding_id_gradients(
          grads=[tf.ones([3, 4])], segments=[tf.constant([0, 2], tf.int32)],
          weights=[tf.zeros([0])], scales=[tf.ones([2])],
          index=tf.constant([0, 1]), num_ids=2, multiplier=tf.zeros([0]),
          offsets=offsets, dim=3 if offsets else -1)


def test_the_combine_refuses_segments_outside_the_batch():
  ops = kernels.row_updates()
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"feature 0: segment 3 at 1 is outside \[0, 3\)"):
    ops.host_embedding_combine(
        tf.ones([2, 3]), tf.constant([0, 1]),
        segments=[tf.constant([0, 3], tf.int32)],
        weights=[tf.zeros([0])], num_segments=[tf.constant(3, tf.int32)],
        combiners=["sum"])
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"index has shape \[2\] for 1 ids"):
    ops.host_embedding_combine(
        tf.ones([2, 3]), tf.constant([0, 1]),
        segments=[tf.constant([0], tf.int32)],
        weights=[tf.zeros([0])], num_segments=[tf.constant(3, tf.int32)],
        combiners=["mean"])
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"index 2 at 1 is outside \[0, 2\)"):
    ops.host_embedding_combine(
        tf.ones([2, 3]), tf.constant([0, 2]),
        segments=[tf.constant([0, 0], tf.int32)],
        weights=[tf.zeros([0])], num_segments=[tf.constant(3, tf.int32)],
        combiners=["sum"])


def _lookup(table, ids, plans, keep_rows=True):
  return kernels.row_updates().host_embedding_lookup(
      table.handle, ids, segments=[p.segment for p in plans],
      weights=kernels.or_empty([p.weights for p in plans]),
      num_segments=[p.num_segments for p in plans],
      combiners=[p.combiner for p in plans], keep_rows=keep_rows)


@pytest.mark.parametrize("dtype", [tf.int32, tf.int64])
@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_the_lookup_equals_unique_a_gather_and_the_combine(dtype, combiner):
  """Distinct ids in order of first appearance over all features, each
  id's place, the distinct ids' rows and each feature's activation and
  scales: tf.unique of the concatenated ids, tf.gather and the plan's TF
  ops, with empty features, weights and many colliding ids."""
  rng = np.random.RandomState(8)
  values = rng.randn(5000, 3).astype(np.float32)
  table = _variable(values)
  features = [
      rng.randint(0, 5000, 3000),
      np.zeros([0], np.int64),
      # Multiples of 1024: the same low bits, which a hash must spread.
      (np.arange(400) % 4) * 1024 + 7,
      np.array([4999, 0, 4999]),
  ]
  plans = [
      _plan(np.sort(rng.randint(0, 64, 3000)), 64, rng.uniform(-2, 2, 3000),
            combiner),
      _plan([], 64, None, combiner),
      _plan(np.arange(400) // 7, 64, None, combiner),
      _plan([0, 2, 2], 64, [0.5, 1.5, -1.5], combiner),
  ]
  ids = [tf.constant(f, dtype) for f in features]
  unique_ids, index, rows, num_ids, activations, scales = _lookup(
      table, ids, plans)
  want_ids, want_index = tf.unique(tf.concat(ids, 0))
  assert unique_ids.dtype == dtype and index.dtype == tf.int32
  assert num_ids.dtype == tf.int32 and num_ids.numpy() == len(want_ids)
  np.testing.assert_array_equal(unique_ids.numpy(), want_ids.numpy())
  np.testing.assert_array_equal(index.numpy(), want_index.numpy())
  np.testing.assert_array_equal(rows.numpy(), values[want_ids.numpy()])
  for plan, f, out, scale in zip(plans, features, activations, scales):
    np.testing.assert_array_equal(
        out.numpy(), plan.combine(tf.gather(values, f)).numpy())
    if combiner == "sum":
      assert scale.shape == (0,)
    else:
      np.testing.assert_array_equal(scale.numpy(), plan.scale.numpy())
  # Without the rows: the same ids, places and activations; rows [0, 3].
  unique_ids, index, rows, _, activations_only, _ = _lookup(
      table, ids, plans, keep_rows=False)
  np.testing.assert_array_equal(index.numpy(), want_index.numpy())
  assert rows.shape == (0, 3)
  for out, want in zip(activations_only, activations):
    np.testing.assert_array_equal(out.numpy(), want.numpy())
  unique_ids, index, rows, num_ids, activations, _ = _lookup(
      table, [tf.zeros([0], dtype)], [_plan([], 2, None, combiner)])
  assert unique_ids.shape == index.shape == (0,) and rows.shape == (0, 3)
  assert num_ids.numpy() == 0
  np.testing.assert_array_equal(activations[0].numpy(), np.zeros((2, 3)))


def test_the_lookup_refuses_bad_ids_and_segments():
  table = _variable(np.ones((4, 3), np.float32))
  plans = [_plan([0, 1], 2, None, "sum"), _plan([0, 1, 1], 2, None, "sum")]
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"ids\[1\]: row index 4 at 2 is outside \[0, 4\)"):
    _lookup(table, [tf.constant([1, 2], tf.int64),
                    tf.constant([0, 3, 4], tf.int64)], plans)
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"ids\[0\]: row index -1 at 0 is outside"):
    _lookup(table, [tf.constant([-1, 0], tf.int32),
                    tf.constant([0, 3, 1], tf.int32)], plans)
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"ids\[1\] must be a vector of one id per segment "
                     r"entry; got shape \[2\] for 3 entries"):
    _lookup(table, [tf.constant([1, 2], tf.int64),
                    tf.constant([0, 3], tf.int64)], plans)
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"feature 1: segment 2 at 2 is outside \[0, 2\)"):
    _lookup(table, [tf.constant([1, 2], tf.int64),
                    tf.constant([0, 3, 1], tf.int64)],
            plans[:1] + [_plan([0, 1, 2], 2, None, "sum")])
  np.testing.assert_array_equal(table.numpy(), np.ones((4, 3)))


def test_the_extremes_equal_tf_reductions():
  rng = np.random.RandomState(5)
  indices = [tf.constant(rng.randint(-9, 9, (7, 2)), tf.int64),
             tf.zeros([0, 2], tf.int64),
             tf.constant([[3, 1]], tf.int64)]
  largest, smallest = kernels.extremes(indices)
  np.testing.assert_array_equal(
      largest.numpy(), tf.stack([tf.reduce_max(t, axis=0)
                                 for t in indices]).numpy())
  np.testing.assert_array_equal(
      smallest.numpy(), tf.stack([tf.reduce_min(t, axis=0)
                                  for t in indices]).numpy())
  ids = [tf.constant([4, -2, 11], tf.int64), tf.zeros([0], tf.int64)]
  largest, smallest = kernels.extremes(ids)
  assert largest.shape == smallest.shape == (2, 1)
  np.testing.assert_array_equal(largest.numpy()[:, 0],
                                [11, np.iinfo(np.int64).min])
  np.testing.assert_array_equal(smallest.numpy()[:, 0],
                                [-2, np.iinfo(np.int64).max])


@pytest.mark.parametrize("width", [1, 2, 3])
def test_the_extremes_of_many_features_equal_numpy(width):
  """Widths 1 and 2 (one pass over each tensor) and 3 (column by column);
  row counts that are not multiples of a vector's lanes, values spread over
  all of int64."""
  rng = np.random.RandomState(width)
  values = [rng.randint(np.iinfo(np.int64).min, np.iinfo(np.int64).max,
                        (rows, width), dtype=np.int64)
            for rows in rng.randint(0, 9000, 40)]
  values[3] = values[3][:0]
  largest, smallest = kernels.extremes(
      [tf.constant(v if width > 1 else v[:, 0]) for v in values])
  low, high = np.iinfo(np.int64).min, np.iinfo(np.int64).max
  np.testing.assert_array_equal(largest.numpy(), [
      v.max(axis=0) if len(v) else [low] * width for v in values])
  np.testing.assert_array_equal(smallest.numpy(), [
      v.min(axis=0) if len(v) else [high] * width for v in values])


def test_dropping_negative_ids_keeps_the_rest_in_order():
  indices = [tf.constant([[0, 0], [0, 1], [2, 0], [3, 4]], tf.int64),
             tf.constant([[1, 0], [1, 1]], tf.int64),
             tf.zeros([0, 2], tf.int64)]
  ids = [tf.constant([4, -1, 0, -7], tf.int64),
         tf.constant([3, 5], tf.int64), tf.zeros([0], tf.int64)]
  weights = [tf.constant([0.5, 2.0, 3.0, 4.0]), None, None]
  kept_indices, kept_ids, kept_weights, kept_examples = (
      kernels.drop_negative_ids(indices, ids, weights,
                                tf.constant([-7, 3, 0], tf.int64)))
  np.testing.assert_array_equal(kept_indices[0].numpy(), [[0, 0], [2, 0]])
  # The examples of the kept ids, as int32, also where nothing is dropped.
  assert [e.dtype for e in kept_examples] == [tf.int32] * 3
  np.testing.assert_array_equal(kept_examples[0].numpy(), [0, 2])
  np.testing.assert_array_equal(kept_examples[1].numpy(), [1, 1])
  assert kept_examples[2].shape == (0,)
  np.testing.assert_array_equal(kept_ids[0].numpy(), [4, 0])
  np.testing.assert_array_equal(kept_weights[0].numpy(), [0.5, 3.0])
  np.testing.assert_array_equal(kept_indices[1].numpy(), indices[1].numpy())
  np.testing.assert_array_equal(kept_ids[1].numpy(), [3, 5])
  assert kept_weights[1] is None and kept_weights[2] is None
  assert kept_ids[2].shape == (0,) and kept_indices[2].shape == (0, 2)
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"smallest must be a vector of one id per "
                     r"feature \(3\); got shape \[2\]"):
    kernels.drop_negative_ids(indices, ids, weights,
                              tf.constant([0, 0], tf.int64))


def test_a_large_table_is_moved_to_huge_pages_with_its_values():
  """A kernel's first read of a table of >= 4 MiB asks Linux for huge pages
  (where transparent huge pages are not turned off): the process's
  AnonHugePages grow, and the values stay."""
  code = """
      import numpy as np
      import tensorflow as tf
      from estimator_spec.engine import kernels
      def huge_kb():
        with open("/proc/self/smaps_rollup") as f:
          return sum(int(line.split()[1]) for line in f
                     if line.startswith("AnonHugePages:"))
      table = tf.Variable(tf.random.uniform([200_000, 16], seed=1))
      values = table.numpy().copy()
      before = huge_kb()
      rows = kernels.row_updates().host_embedding_gather_rows(
          table.handle, tf.constant([0, 199_999], tf.int64))
      print("grew", huge_kb() - before)
      np.testing.assert_array_equal(rows.numpy(), values[[0, 199_999]])
      np.testing.assert_array_equal(table.numpy(), values)
  """
  result = _python(code, {kernels.ENV: "1"})
  assert result.returncode == 0, result.stderr
  grew = int(result.stdout.split("grew")[1])
  with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
    enabled = f.read()
  if "[never]" in enabled:
    assert grew == 0
  else:
    # 12.8 MB: at least 5 whole 2 MiB blocks; one is enough to show it.
    assert grew >= 2048, (grew, enabled)


def _python(code, env):
  return subprocess.run(
      [sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT,
      env=dict(os.environ, PYTHONPATH=ROOT, **env), capture_output=True,
      text=True, timeout=300, check=False)


def test_without_a_compiler_the_engine_warns_and_uses_graph_ops(tmp_path):
  code = """
      import warnings
      import tensorflow as tf
      from estimator_spec.engine import kernels
      with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        print("module", kernels.row_updates())
      print("warnings", [str(w.message) for w in caught])
  """
  env = {"CXX": "no-such-compiler", kernels.ENV: "auto",
         kernels.CACHE_ENV: str(tmp_path / "cache")}
  result = _python(code, env)
  assert result.returncode == 0, result.stderr
  assert "module None" in result.stdout
  assert "'no-such-compiler' is not on PATH" in result.stdout
  assert "uses TensorFlow ops instead" in result.stdout

  result = _python(code, dict(env, **{kernels.ENV: "1"}))
  assert result.returncode != 0
  assert "KernelBuildError" in result.stderr
  assert "HOST_EMBEDDING_KERNELS=1 requires the compiled row updates" in (
      result.stderr)

  result = _python(code, dict(env, **{kernels.ENV: "yes"}))
  assert result.returncode != 0
  assert "use 'auto'" in result.stderr


# The cache's locking is the same code on both stacks (each stack's build
# itself runs in every engine test): the reference stack's run.
@pytest.mark.reference_only
@pytest.mark.slow
def test_processes_building_at_once_share_one_cached_library(tmp_path):
  cache = tmp_path / "cache"
  code = """
      from estimator_spec.engine import kernels
      print("built", kernels.build())
  """
  env = {kernels.CACHE_ENV: str(cache)}
  procs = [subprocess.Popen(
      [sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT,
      env=dict(os.environ, PYTHONPATH=ROOT, **env), stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True) for _ in range(2)]
  outputs = []
  for proc in procs:
    try:
      out, err = proc.communicate(timeout=300)
    finally:
      proc.kill()
    assert proc.returncode == 0, err
    outputs.append(out.strip())
  assert outputs[0] == outputs[1]
  library = os.path.basename(outputs[0].split()[-1])
  # The library, the digest recorded when it was built, the cache's lock.
  assert sorted(os.listdir(cache)) == [".lock", library,
                                       library + kernels.DIGEST_SUFFIX]


def test_the_baseline_copies_of_the_loops_give_the_same_numbers():
  """On x86-64 the kernels' hot loops also have an AVX2 copy, which this
  file's other tests run where the CPU has it; the baseline copies (what a
  CPU without AVX2 runs) must give the same bits: the concatenated and
  gated runs above (updates, combiners, per-id sums, each compared exactly
  with TF ops), the ids' extremes, the sums' finite check and the range
  checks' refusals (and the compiled input check's), again with the
  baseline forced."""
  result = subprocess.run(
      [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
       os.path.join("tests", "test_engine_kernels.py"), "-k",
       "concatenated or gated or optimizers_without or extremes or "
       "combine_and_its_gradient or refuse"],
      cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT,
                         HOST_EMBEDDING_KERNELS_BASELINE="1"),
      capture_output=True, text=True, timeout=600, check=False)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  assert "18 passed" in result.stdout, result.stdout[-2000:]


@pytest.mark.parametrize("dtype", [tf.int32, tf.int64])
@pytest.mark.parametrize("vocabulary,partitions,strategy", [
    (10, 3, "div"), (10, 3, "mod"), (7, 1, "div"), (5, 5, "div"),
    (1000, 4, "mod"), (1001, 4, "div")])
def test_routed_ids_equal_the_tf_routing(vocabulary, partitions, strategy,
                                         dtype):
  """The compiled routing of a table's ids (one op) against the TF ops'
  (`tf.unique`, the layout's rule, the partitions' stable grouping): the
  same distinct ids in the same order, the same index, local ids and
  sizes."""
  from estimator_spec.config.sharding import ShardLayout
  from estimator_spec.engine import storage
  layout = ShardLayout(vocabulary, partitions, strategy)
  rng = np.random.RandomState(vocabulary + partitions)
  ids = [tf.constant(rng.randint(0, vocabulary, n), tf.int64)
         for n in (0, 37, 5)]
  unique, index, local_ids, sizes = kernels.route_ids(ids, layout, dtype)
  expected_unique, expected_index = tf.unique(tf.concat(ids, axis=0))
  partition, local = storage.route(layout, expected_unique)
  count = layout.num_partitions
  order = tf.concat(tf.dynamic_partition(
      tf.range(tf.size(partition)), partition, count), axis=0)
  np.testing.assert_array_equal(unique.numpy(),
                                tf.gather(expected_unique, order).numpy())
  np.testing.assert_array_equal(
      index.numpy(),
      tf.gather(tf.math.invert_permutation(order), expected_index).numpy())
  pieces = tf.dynamic_partition(local, partition, count)
  assert len(local_ids) == len(sizes) == count
  for got, size, piece in zip(local_ids, sizes, pieces):
    assert got.dtype == size.dtype == dtype
    np.testing.assert_array_equal(got.numpy(), piece.numpy())
    assert size.numpy() == piece.shape[0]


def test_routing_refuses_ids_outside_the_table():
  from estimator_spec.config.sharding import ShardLayout
  layout = ShardLayout(10, 2, "div")
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"ids\[1\]: id 10 at 1 is outside \[0, 10\)"):
    kernels.route_ids([tf.constant([1], tf.int64),
                       tf.constant([3, 10], tf.int64)], layout, tf.int32)
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"ids\[0\]: id -1 at 0 is outside \[0, 10\)"):
    kernels.route_ids([tf.constant([-1], tf.int64)], layout, tf.int32)


def test_the_compiled_parse_of_many_features_equals_the_tf_ops():
  """More features than one compiled drop of negative ids takes (two
  groups), every third with negative ids, one weighted, one that refuses
  negative ids (it has none): the compiled parse gives the TF ops' ids,
  weights, indices and examples."""
  from tests.ragged import sparse_value
  from tpu_embedding_columns import lookup
  rng = np.random.RandomState(11)
  rows = [[list(rng.randint(-2 if f % 3 == 0 and f != 69 else 0, 40,
                            rng.randint(0, 3))) for _ in range(5)]
          for f in range(70)]
  weights = [[[float(x) + 0.5 for x in row] for row in rows[4]]]

  def parse(compiled_ops):
    sources = []
    for f, feature_rows in enumerate(rows):
      weight = (tf.SparseTensor.from_value(sparse_value(weights[0],
                                                        np.float32))
                if f == 4 else None)
      sources.append(lookup.IdSource(
          tf.SparseTensor.from_value(sparse_value(feature_rows, np.int64)),
          weight, 40, f"feature {f}", drop_negative=f != 69))
    return lookup.flatten_many(sources, compiled_ops)

  ours, theirs = parse(kernels), parse(None)
  assert len(ours) == len(theirs) == 70
  for a, b in zip(ours, theirs):
    np.testing.assert_array_equal(a.ids.numpy(), b.ids.numpy())
    np.testing.assert_array_equal(a.example.numpy(), b.example.numpy())
    np.testing.assert_array_equal(a.position.numpy(), b.position.numpy())
    np.testing.assert_array_equal(a.example_int32.numpy(),
                                  b.example.numpy().astype(np.int32))
    assert b.example_int32 is None
    assert (a.weights is None) == (b.weights is None)
    if a.weights is not None:
      np.testing.assert_array_equal(a.weights.numpy(), b.weights.numpy())
  # Negative ids were there, and were dropped.
  given = sum(len(row) for feature_rows in rows for row in feature_rows)
  assert sum(int(a.ids.shape[0]) for a in ours) < given
  assert all((a.ids.numpy() >= 0).all() for a in ours)


def _failed_check(compiled_ops, rows, shapes=None):
  """What the parse of features `rows` (vocabulary 10; the second refuses
  negative ids; `shapes`: dense shapes to give, by feature) fails with:
  the report after 'assertion failed: ', quotes unescaped."""
  from tests.ragged import sparse_value
  from tpu_embedding_columns import lookup
  sources = []
  for f, feature_rows in enumerate(rows):
    value = sparse_value(feature_rows, np.int64)
    if shapes and shapes.get(f):
      value = v1.SparseTensorValue(value.indices, value.values,
                                   np.array(shapes[f], np.int64))
    sources.append(lookup.IdSource(tf.SparseTensor.from_value(value), None,
                                   10, f"feature {f}", drop_negative=f != 1))
  with pytest.raises(tf.errors.InvalidArgumentError) as info:
    lookup.flatten_many(sources, compiled_ops)
  message = info.value.message.replace("\\'", "'")
  return re.search(r"assertion failed: (.*?)(?: \[Op:|\n|$)",
                   message).group(1)


@pytest.mark.parametrize("case", ["range", "negative", "structure", "both"])
def test_the_compiled_input_check_reports_as_the_asserts_do(case):
  """The one compiled check of every feature's indices and ids fails where
  the TF ops' two Asserts fail, with their report: the features at fault,
  then their dense shapes and largest indices, or their smallest and
  largest ids; a bad index is reported before a bad id."""
  rows = [[[1, 2], [3]], [[4], [5, 6]], [[7], []]]
  shapes = None
  if case in ("range", "both"):
    rows[0][1], rows[2][0] = [10], [12, 1]
  if case == "negative":
    rows[1][0] = [-1, 2]
  if case in ("structure", "both"):
    shapes = {0: [1, 2], 2: [2, 0]}
  report = _failed_check(kernels, rows, shapes)
  assert report == _failed_check(None, rows, shapes)
  if case == "range":
    assert report.startswith("[feature 0: id out of range [0, 10)")
    assert "feature 1" not in report and "feature 2: id out of" in report
    assert report.endswith("[1 1] [10 12]")
  elif case == "negative":
    assert report.startswith("[feature 1: id out of range [0, 10) (negative "
                             "ids are refused")
    assert report.endswith("[-1] [6]")
  else:
    assert "feature 0: SparseTensor indices are out of bounds" in report
    assert "feature 2: SparseTensor indices are out of bounds" in report
    largest = "[[1 1][0 0]]" if case == "structure" else "[[1 1][0 1]]"
    assert report.endswith("[[1 2][2 0]] " + largest)
  # In a graph: that one op, and no Assert.
  from tests.ragged import sparse_value
  from tpu_embedding_columns import lookup
  with tf.Graph().as_default() as graph:
    lookup.flatten_many([
        lookup.IdSource(tf.SparseTensor.from_value(sparse_value(r, np.int64)),
                        None, 10, f"feature {f}") for f, r in enumerate(rows)
    ], kernels)
  types = [op.type for op in graph.get_operations()]
  assert types.count("HostEmbeddingCheckIds") == 1 and "Assert" not in types


def test_the_compiled_drop_runs_beside_the_check_of_the_ids():
  """The compiled drop of negative ids waits for the weights' Asserts but
  not for the check of every feature's indices and ids (it reads only the
  ids' smallest values), so it runs while that check's reductions do; all
  it gives waits for that check. The reports stay the checks': a bad id,
  or weights that do not match their ids, fail the step with the check's
  message, never the drop's."""
  from tests.ragged import sparse_value
  from tpu_embedding_columns import lookup
  with tf.Graph().as_default() as graph:
    ids = [v1.sparse_placeholder(tf.int64, [None, None]) for _ in range(2)]
    weights = v1.sparse_placeholder(tf.float32, [None, None])
    flats = lookup.flatten_many([
        lookup.IdSource(ids[0], weights, 10, "feature 0"),
        lookup.IdSource(ids[1], None, 10, "feature 1", drop_negative=False)
    ], kernels)
    ops = graph.get_operations()
    check, = [op for op in ops if op.type == "HostEmbeddingCheckIds"]
    drop, = [op for op in ops if op.type == "HostEmbeddingDropNegativeIds"]
    asserts = {op.name for op in ops if op.type == "Assert"}
    assert len(asserts) == 2  # the weights' count and positions
    graph_def = graph.as_graph_def()

    def waited_for(op):
      return {node.name for node in v1.graph_util.extract_sub_graph(
          graph_def, [op.name]).node}

    before_drop = waited_for(drop)
    assert check.name not in before_drop and asserts <= before_drop
    given = [t for f in flats for t in (f.ids, f.weights, f.example_int32)
             if t is not None]
    assert len(given) == 5 and flats[1].weights is None
    for tensor in given:
      assert check.name in waited_for(tensor.op), tensor

    def feed(first, second, first_weights=None):
      value = sparse_value(first, np.int64)
      weight_value = sparse_value(first_weights or first, np.float32)
      return {ids[0]: value, ids[1]: sparse_value(second, np.int64),
              weights: weight_value}

    with v1.Session() as sess:
      got = sess.run(given, feed([[1, -2], [3]], [[4], [], [5, 6]]))
      np.testing.assert_array_equal(got[0], [1, 3])
      np.testing.assert_array_equal(got[1], [1.0, 3.0])
      np.testing.assert_array_equal(got[2], [0, 1])
      np.testing.assert_array_equal(got[3], [4, 5, 6])
      np.testing.assert_array_equal(got[4], [0, 2, 2])
      with pytest.raises(tf.errors.InvalidArgumentError,
                         match=r"feature 1: id out of range \[0, 10\) "
                         r"\(negative ids are refused"):
        sess.run(given, feed([[1], [3]], [[-4]]))
      with pytest.raises(tf.errors.InvalidArgumentError,
                         match="feature 0: weights do not match the ids"):
        sess.run(given, feed([[1, 2], [3]], [[4]], [[1.0], [3.0]]))


def test_the_compiled_input_check_refuses_mismatched_inputs():
  ops = kernels.row_updates()
  pair = tf.zeros([2, 2], tf.int64)
  one = tf.zeros([2], tf.int64)
  attrs = dict(vocabulary=[3, 3], refuse_negative=[True, False],
               structure_messages=["s0", "s1"], range_messages=["r0", "r1"])
  ops.host_embedding_check_ids(pair, pair, pair + 1, one, one, **attrs)
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"index extremes and shapes must be \[2, 2\]"):
    ops.host_embedding_check_ids(pair, pair, tf.zeros([3, 2], tf.int64),
                                 one, one, **attrs)
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match="id extremes must have 2 values"):
    ops.host_embedding_check_ids(pair, pair, pair + 1, one, tf.zeros([1],
                                                                 tf.int64),
                                 **attrs)
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match="one entry per feature"):
    ops.host_embedding_check_ids(pair, pair, pair + 1, one, one,
                                 **dict(attrs, range_messages=["r0"]))


def test_a_features_example_and_position_are_split_when_first_read():
  """In a graph, the parse splits a feature's indices into example and
  position only when they are read (a compiled lookup without positions
  reads neither): then in the scope the parse ran in, without the reader's
  control dependencies, and equal to the indices' columns."""
  from tests.ragged import sparse_value
  from tpu_embedding_columns import lookup
  rows = [[[1, 2], [], [3]], [[0], [4, 4, 5], []]]
  graph = tf.Graph()
  with graph.as_default(), tf.name_scope("parse"):
    sources = [
        lookup.IdSource(
            tf.SparseTensor.from_value(sparse_value(r, np.int64)), None, 8,
            f"feature {f}") for f, r in enumerate(rows)]
    flats = lookup.flatten_many(sources, kernels)
  splits = lambda: [op for op in graph.get_operations()
                    if op.type == "Unpack" and op.inputs[0].shape.rank == 2
                    and op.inputs[0].shape[1] == 2]
  assert not splits()
  with graph.as_default(), tf.name_scope("reader"):
    gate = tf.no_op()
    with tf.control_dependencies([gate]):
      columns = [(flat.example, flat.position) for flat in flats]
  assert len(splits()) == 2
  for op in splits():
    assert op.name.startswith("parse/"), op.name
    assert not op.control_inputs
  # A second read gives the same tensors.
  assert all(flat.example is pair[0] and flat.position is pair[1]
             for flat, pair in zip(flats, columns))
  with tf.compat.v1.Session(graph=graph) as session:
    got = session.run(columns)
  expected = [([0, 0, 2], [0, 1, 0]), ([0, 1, 1, 1], [0, 0, 1, 2])]
  for (example, position), (want_example, want_position) in zip(got,
                                                                 expected):
    np.testing.assert_array_equal(example, want_example)
    np.testing.assert_array_equal(position, want_position)
  with pytest.raises(ValueError, match="`indices` instead of both"):
    lookup.FlatIds(None, None, flats[0].ids, None, flats[0].batch_size)
