"""The host engine run eagerly (TF2's default mode), step by step.

`lookup` then `apply_gradients` with eager tensors, no graph and no
session: after every step the tables and slots must equal those of the same
engine built as a graph and run in a session (which the other engine tests
hold against the NumPy twin and TF's kernels). Covered: optimizers with one
or several slots and non-lazy Adam (every row), gradient clipping, weight
decay, a learning-rate function, a gradient multiplier, several partitions
(`div` and `mod`), pipelining (the update held for one step, then `flush`).
A step whose gradient or learning rate is not finite raises eagerly and
changes no table and no slot.

Runs in both environments (TF 2.15 and current TensorFlow).
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # pylint: disable=g-import-not-at-top
import pytest
import tensorflow as tf

import estimator_spec as es
from estimator_spec.engine import HostEmbeddingEngine
from tests.ragged import sparse_value

v1 = tf.compat.v1
F32 = np.float32
VOCAB, DIM, BATCH = 11, 3, 3

# Ids repeat within an example, across examples and across the two
# features sharing table "t"; "s" is a second table with a sequence
# feature-free mean combiner. Some examples are empty.
BATCHES = [
    {"f": [[1, 3, 3], [], [7]], "g": [[3, 1], [10, 0], []],
     "h": [[2], [2, 4], [0]]},
    {"f": [[0], [5, 5, 5], [1, 2]], "g": [[2], [2, 2], [9]],
     "h": [[], [1], [4, 4]]},
    {"f": [[], [3], [3, 7, 8]], "g": [[1, 1, 1], [], [3]],
     "h": [[3], [0, 1, 2], [2]]},
]

OPTIMIZERS = {
    "adagrad": lambda: es.AdagradParameters(0.1, initial_accumulator=0.2),
    "adagrad_clipped": lambda: es.AdagradParameters(
        0.1, clip_gradient_min=-0.3, clip_gradient_max=0.25,
        weight_decay_factor=0.05, clip_weight_min=-0.9, clip_weight_max=0.8),
    "sgd_decayed": lambda: es.StochasticGradientDescentParameters(
        0.2, weight_decay_factor=0.1,
        multiply_weight_decay_factor_by_learning_rate=True),
    "adam_every_row": lambda: es.AdamParameters(0.05, lazy_adam=False),
    "lazy_adam": lambda: es.AdamParameters(0.05),
    "ftrl": lambda: es.FtrlParameters(0.1, l1_regularization_strength=0.01,
                                      l2_regularization_strength=0.02),
    "momentum_nesterov": lambda: es.MomentumParameters(0.1, 0.9,
                                                       use_nesterov=True),
}


def spec_of(optimizer, strategy="div", pipeline=False, learning_rate_fn=None,
          multiplier=None, clipping_limit=None):
  return es.EmbeddingConfigSpec(
      feature_to_config_dict={"f": es.FeatureConfig("t"),
                              "g": es.FeatureConfig("t"),
                              "h": es.FeatureConfig("s")},
      table_to_config_dict={
          "t": es.TableConfig(VOCAB, DIM, combiner="sum"),
          "s": es.TableConfig(5, 2, combiner="mean",
                              learning_rate_fn=learning_rate_fn)},
      optimization_parameters=optimizer,
      partition_strategy=strategy,
      pipeline_execution_with_tensor_core=pipeline,
      clipping_limit=clipping_limit,
      experimental_gradient_multiplier_fn=multiplier)


def _initial(name, shape):
  seed = {"t": 3, "s": 4}[name]
  return np.random.RandomState(seed).uniform(-1, 1, shape).astype(F32)


def activation_grads(step, scale=1.0):
  rng = np.random.RandomState(50 + step)
  return {"f": rng.uniform(-1, 1, (BATCH, DIM)).astype(F32) * F32(scale),
          "g": rng.uniform(-1, 1, (BATCH, DIM)).astype(F32) * F32(scale),
          "h": rng.uniform(-1, 1, (BATCH, 2)).astype(F32) * F32(scale)}


def state(engine, read):
  """{table or table/slot: array} of every table and slot."""
  tensors = {}
  for name in engine.created_tables():
    tensors[name] = engine.table_rows(name).read_all()
    for slot, rows in engine.slot_rows(name).items():
      tensors[f"{name}/{slot}"] = rows.read_all()
  return read(tensors)


def set_initial_tables(engine, run):
  for name in engine.created_tables():
    table = engine.table_rows(name)
    shape = (table.layout.vocabulary_size, engine.model.tables[name].dimension)
    run(table.assign_all(_initial(name, shape)))


def run_graph(spec, num_shards, steps=len(BATCHES)):
  """Tables and slots after each step (and after `flush`), in a session."""
  config = es.EmbeddingConfig(spec, batch_size=BATCH)
  history = []
  with tf.Graph().as_default():
    engine = HostEmbeddingEngine(config, num_shards=num_shards)
    ph = {k: v1.sparse_placeholder(tf.int64, [None, None]) for k in "fgh"}
    grad_ph = {"f": v1.placeholder(tf.float32, [None, DIM]),
               "g": v1.placeholder(tf.float32, [None, DIM]),
               "h": v1.placeholder(tf.float32, [None, 2])}
    step = v1.placeholder(tf.int64, [])
    result = engine.lookup(ph)
    train = engine.apply_gradients(result, grad_ph, step)
    flush = engine.flush()
    with v1.Session() as sess:
      sess.run([v1.global_variables_initializer(),
                v1.local_variables_initializer()])
      set_initial_tables(engine, sess.run)
      for n, batch in enumerate(BATCHES[:steps]):
        feed = {ph[k]: sparse_value(batch[k], np.int64) for k in "fgh"}
        feed.update({grad_ph[k]: v for k, v in activation_grads(n).items()})
        feed[step] = n
        sess.run(train, feed)
        history.append(state(engine, sess.run))
      sess.run(flush)
      history.append(state(engine, sess.run))
  return history


def _eager_features(batch):
  return {k: tf.SparseTensor(*sparse_value(batch[k], np.int64))
          for k in "fgh"}


def run_eager(spec, num_shards, steps=len(BATCHES)):
  """The same steps eagerly."""
  assert tf.executing_eagerly()
  config = es.EmbeddingConfig(spec, batch_size=BATCH)
  engine = HostEmbeddingEngine(config, num_shards=num_shards)
  engine.create_variables()
  set_initial_tables(engine, lambda op: op)
  history = []
  for n, batch in enumerate(BATCHES[:steps]):
    result = engine.lookup(_eager_features(batch))
    grads = {k: tf.constant(v) for k, v in activation_grads(n).items()}
    engine.apply_gradients(result, grads, tf.constant(n, tf.int64))
    history.append(state(engine, lambda t: {k: v.numpy()
                                             for k, v in t.items()}))
  engine.flush()
  history.append(state(engine, lambda t: {k: v.numpy()
                                           for k, v in t.items()}))
  return history


def assert_same(eager, graph, exact=False):
  """Every table and slot of every step equal: within float32 rounding, or
  bit for bit when `exact`."""
  assert len(eager) == len(graph)
  for n, (got, want) in enumerate(zip(eager, graph)):
    assert sorted(got) == sorted(want)
    for key in want:
      if exact:
        np.testing.assert_array_equal(got[key], want[key],
                                      err_msg=f"{key} after step {n}")
      else:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-6,
                                   atol=1e-7, err_msg=f"{key} after step {n}")


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_eager_steps_equal_the_graph(optimizer):
  spec = spec_of(OPTIMIZERS[optimizer]())
  graph = run_graph(spec, 1)
  eager = run_eager(spec, 1)
  assert_same(eager, graph)
  assert not np.array_equal(eager[-1]["t"], eager[0]["t"]), "it trained"


@pytest.mark.parametrize("strategy", ["div", "mod"])
@pytest.mark.parametrize("pipeline", [False, True], ids=["", "pipelined"])
def test_eager_partitions_and_pipelining_equal_the_graph(strategy, pipeline):
  spec = spec_of(OPTIMIZERS["adagrad_clipped"](), strategy, pipeline,
               learning_rate_fn=lambda step: 0.3 / (1.0 + tf.cast(
                   step, tf.float32)),
               multiplier=lambda step: 2.0 - tf.cast(step, tf.float32) / 4.0)
  graph = run_graph(spec, 3)
  eager = run_eager(spec, 3)
  assert_same(eager, graph)
  if pipeline:
    # The first step's update is held: nothing moved until step 2.
    np.testing.assert_array_equal(eager[0]["t"], _initial("t", (VOCAB, DIM)))
    assert not np.array_equal(eager[-1]["t"], eager[-2]["t"]), "flushed"


def test_eager_adam_every_row_over_partitions_equals_the_graph():
  spec = spec_of(OPTIMIZERS["adam_every_row"](), "mod", clipping_limit=0.5)
  assert_same(run_eager(spec, 2), run_graph(spec, 2))


def _one_eager_step(spec, grads):
  config = es.EmbeddingConfig(spec, batch_size=BATCH)
  engine = HostEmbeddingEngine(config, num_shards=2)
  engine.create_variables()
  set_initial_tables(engine, lambda op: op)
  before = state(engine, lambda t: {k: v.numpy() for k, v in t.items()})
  result = engine.lookup(_eager_features(BATCHES[0]))
  return engine, before, result, {k: tf.constant(v) for k, v in grads.items()}


def test_eager_step_with_a_non_finite_gradient_raises_and_writes_nothing():
  grads = activation_grads(0)
  grads["h"][1, 0] = np.inf
  engine, before, result, grads = _one_eager_step(
      spec_of(OPTIMIZERS["adagrad"]()), grads)
  with pytest.raises(tf.errors.InvalidArgumentError,
                     # (the Assert's message escapes the quotes)
                     match=r"Gradient of features \\?'h\\?' \(table "
                     r"\\?'s\\?'\) is not finite; no table was updated"):
    engine.apply_gradients(result, grads, tf.constant(0, tf.int64))
  after = state(engine, lambda t: {k: v.numpy() for k, v in t.items()})
  for key in before:
    np.testing.assert_array_equal(after[key], before[key], err_msg=key)


def test_eager_step_with_a_non_finite_learning_rate_raises_and_writes_nothing():
  spec = spec_of(OPTIMIZERS["adagrad"](),
               learning_rate_fn=lambda step: tf.math.log(
                   tf.cast(step, tf.float32) - 1.0))
  engine, before, result, grads = _one_eager_step(spec, activation_grads(0))
  with pytest.raises(tf.errors.InvalidArgumentError,
                     # (the Assert's message escapes the quotes)
                     match=r"learning_rate_fn of table \\?'s\\?' returned a "
                     "value that is not finite"):
    engine.apply_gradients(result, grads, tf.constant(0, tf.int64))
  after = state(engine, lambda t: {k: v.numpy() for k, v in t.items()})
  for key in before:
    np.testing.assert_array_equal(after[key], before[key], err_msg=key)


@pytest.mark.parametrize("num_shards", [1, 3])
def test_slots_start_from_a_fill_that_graph_optimization_cannot_fold(
    num_shards):
  # A full-size constant in the slots' initializers (a constant initializer,
  # or a Fill of constants that Grappler folds into one) stays alive in the
  # session after the assignment: twice a slot's memory. The initial value
  # enters the Fill through a PlaceholderWithDefault instead.
  config = es.EmbeddingConfig(
      spec_of(es.AdagradParameters(0.1, initial_accumulator=0.3)),
      batch_size=BATCH)
  with tf.Graph().as_default() as graph:
    engine = HostEmbeddingEngine(config, num_shards=num_shards)
    engine.create_variables()
    for op in graph.get_operations():
      if op.type == "Const":
        shape = tf.TensorShape(op.get_attr("value").tensor_shape)
        assert shape.num_elements() <= 2, (op.name, shape)
    # TF's Fill, or the kernels' (the same values; its buffer's pages huge
    # from the start).
    fills = [op for op in graph.get_operations()
             if op.type in ("Fill", "HostEmbeddingFill")]
    slots = [rows for name in engine.created_tables()
             for rows in engine.slot_rows(name).values()]
    # Tables 't' (VOCAB rows) and 's' (5 rows): one slot each, in
    # min(rows, num_shards) partitions.
    assert len(fills) == sum(len(rows.partitions) for rows in slots) == (
        2 * num_shards)
    assert {op.inputs[1].op.type for op in fills} == {"PlaceholderWithDefault"}
    with v1.Session() as sess:
      sess.run(v1.global_variables_initializer())
      values = state(engine, sess.run)
  for name, rows in (("t", VOCAB), ("s", 5)):
    (slot,) = engine.slot_rows(name)
    np.testing.assert_array_equal(values[f"{name}/{slot}"],
                                  np.full((rows, DIM if name == "t" else 2),
                                          0.3, F32))


@pytest.mark.parametrize("bad", [("h",), ("f", "h")])
def test_one_gradient_check_names_every_table_at_fault_and_no_other(bad):
  grads = activation_grads(0)
  for feature in bad:
    grads[feature][0, 1] = np.nan
  engine, before, result, grads = _one_eager_step(
      spec_of(OPTIMIZERS["adagrad"]()), grads)
  with pytest.raises(tf.errors.InvalidArgumentError) as info:
    engine.apply_gradients(result, grads, tf.constant(0, tf.int64))
  message = info.value.message.replace("\\'", "'")
  named_t = "Gradient of features 'f', 'g' (table 't') is not finite"
  named_s = "Gradient of features 'h' (table 's') is not finite"
  assert named_s in message
  assert (named_t in message) == ("f" in bad)
  after = state(engine, lambda t: {k: v.numpy() for k, v in t.items()})
  for key in before:
    np.testing.assert_array_equal(after[key], before[key], err_msg=key)
