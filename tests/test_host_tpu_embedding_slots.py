"""HostTPUEmbedding: an optimizer's `slot_variable_creation_fn`.

`build` calls it once per table, as TF2 does: with the table's variable,
the slot names in TF2's order and initializers of the host's initial
values; the variables it returns are the slot storage (training reads and
writes them, `slot_variables` gives them, checkpoints save them). Checked
against the host engine with the same initial values; bad returns are
refused naming the table and the slot; `interop.from_mid_level` still
refuses the function (a spec cannot hold it).

Runs in both environments (TF 2.15 and current TensorFlow).
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest
import tensorflow as tf

import estimator_spec as es
from estimator_spec import interop
from estimator_spec.engine import HostEmbeddingEngine
from tests.test_host_tpu_embedding import _engine_state
from tests.test_host_tpu_embedding import _state

emb = tf.tpu.experimental.embedding
F32 = np.float32
SHAPES = {"t": (9, 3), "u": (6, 2)}


def _initial(name):
  seed = {"t": 1, "u": 2}[name]
  return np.random.RandomState(seed).uniform(-1, 1, SHAPES[name]).astype(F32)


def _config(u_optimizer=None):
  t = emb.TableConfig(9, 3, initializer=tf.constant_initializer(
      _initial("t")), combiner="sum", name="t")
  u = emb.TableConfig(6, 2, initializer=tf.constant_initializer(
      _initial("u")), combiner="mean", name="u", optimizer=u_optimizer)
  return {"a": emb.FeatureConfig(t), "b": emb.FeatureConfig(u)}


def _spec(t_optimizer, u_optimizer=None):
  return es.EmbeddingConfigSpec(
      feature_to_config_dict={"a": es.FeatureConfig("t"),
                              "b": es.FeatureConfig("u")},
      table_to_config_dict={
          "t": es.TableConfig(9, 3, tf.constant_initializer(_initial("t")),
                              combiner="sum"),
          "u": es.TableConfig(6, 2, tf.constant_initializer(_initial("u")),
                              combiner="mean",
                              optimization_parameters=u_optimizer)},
      optimization_parameters=t_optimizer)


BATCHES = [{"a": [[1, 3, 3], [], [8]], "b": [[0, 5], [2], [1]]},
           {"a": [[0], [4, 4], [1, 2]], "b": [[5], [5, 3], []]}]


def _sparse(rows):
  indices = [[b, p] for b, row in enumerate(rows) for p in range(len(row))]
  values = [x for row in rows for x in row]
  return tf.SparseTensor(np.array(indices, np.int64).reshape(-1, 2),
                         np.array(values, np.int64),
                         [len(rows), max(len(r) for r in rows)])


def _grads(step):
  rng = np.random.RandomState(20 + step)
  return {"a": rng.uniform(-1, 1, (3, 3)).astype(F32),
          "b": rng.uniform(-1, 1, (3, 2)).astype(F32)}


def _recording_fn(calls, fill=None):
  """A creation fn that records its calls and fills each slot with the
  given initializer's value (fill None) or with `fill[slot]`."""

  def create(table, slot_names, initializers):
    calls.append((table, list(slot_names), initializers))
    result = {}
    for slot, initializer in zip(slot_names, initializers):
      if fill is None:
        value = initializer(table.shape, dtype=tf.float32)
      else:
        value = tf.fill(table.shape, fill[slot])
      result[slot] = tf.Variable(value, name=f"mine_{slot}")
    return result

  return create


def _train(embedding, in_function):
  def step(features, grads):
    acts = embedding(features)
    embedding.apply_gradients(grads)
    return acts

  if in_function:
    step = tf.function(step)
  for n, batch in enumerate(BATCHES):
    step({k: _sparse(v) for k, v in batch.items()},
         {k: tf.constant(v) for k, v in _grads(n).items()})


def _reference(spec):
  engine = HostEmbeddingEngine(es.EmbeddingConfig(spec, batch_size=3))
  engine.create_variables()
  for n, batch in enumerate(BATCHES):
    result = engine.lookup({k: _sparse(v) for k, v in batch.items()})
    engine.apply_gradients(result, {k: tf.constant(v)
                                    for k, v in _grads(n).items()},
                           tf.constant(n, tf.int64))
  return _engine_state(engine)


def _assert_state(state, reference):
  assert sorted(state) == sorted(reference)
  for k in reference:
    # (FTRL in a tf.function differs from eager FTRL in the last bits.)
    np.testing.assert_allclose(state[k], reference[k], rtol=1e-5, atol=1e-6,
                               err_msg=k)


@pytest.mark.parametrize("in_function", [False, True])
def test_called_as_tf2_calls_it_and_its_variables_are_trained(in_function):
  calls = []
  optimizer = emb.FTRL(0.1, initial_accumulator_value=0.7,
                       slot_variable_creation_fn=_recording_fn(calls))
  embedding = es.HostTPUEmbedding(_config(), optimizer)
  embedding.build()
  # Once per table, with the table's variable, TF2's slot names and order,
  # initializers of the host's initial values (callables taking shape and
  # dtype).
  tables = embedding.embedding_tables
  assert [c[0] for c in calls] == list(tables.values())
  assert all(c[1] == ["accumulators", "linears"] for c in calls)
  for initializer, value in zip(calls[0][2], [0.7, 0.0]):
    np.testing.assert_array_equal(initializer([2, 3], dtype=tf.float32),
                                  np.full([2, 3], value, F32))
  # The returned variables are the slot variables, and are what trains.
  created = {}
  for table, slots in embedding.slot_variables.items():
    for slot, variable in slots.items():
      assert variable.name.startswith(f"mine_{slot}")
      created[(table.name, slot)] = variable
  _train(embedding, in_function)
  reference = _reference(_spec(es.FtrlParameters(
      0.1, initial_accumulator_value=0.7)))
  _assert_state(_state(embedding), reference)
  np.testing.assert_allclose(created[("t", "linears")].numpy(),
                             reference["t/linears"], rtol=1e-5, atol=1e-6)
  assert not np.allclose(reference["t/linears"], 0)


def test_custom_initial_values_are_what_training_reads():
  # Accumulators 0.5 (the creation fn's own constant, not the optimizer's
  # 0.1): the same as an engine whose Adagrad starts from 0.5.
  # Table u has its own optimizer, without a function: the host creates
  # its slots.
  calls = []
  own = emb.Adagrad(0.3, initial_accumulator_value=0.2)
  optimizer = emb.Adagrad(0.2, initial_accumulator_value=0.1,
                          slot_variable_creation_fn=_recording_fn(
                              calls, fill={"accumulators": 0.5}))
  embedding = es.HostTPUEmbedding(_config(u_optimizer=own), optimizer)
  _train(embedding, in_function=True)
  assert [c[0].shape for c in calls] == [(9, 3)]
  _assert_state(_state(embedding), _reference(_spec(
      es.AdagradParameters(0.2, initial_accumulator=0.5),
      u_optimizer=es.AdagradParameters(0.3, initial_accumulator=0.2))))


def test_checkpoints_save_and_restore_the_created_variables(tmp_path):
  calls = []
  optimizer = emb.Adam(0.05, slot_variable_creation_fn=_recording_fn(
      calls, fill={"momenta": 0.25, "velocities": 0.5}))
  embedding = es.HostTPUEmbedding(_config(), optimizer)
  _train(embedding, in_function=False)
  trained = _state(embedding)
  path = tf.train.Checkpoint(embedding=embedding).save(str(tmp_path / "c"))
  keys = {name for name, _ in tf.train.list_variables(path)}
  for table in ("t", "u"):
    for slot in ("momenta", "velocities"):
      key = f"embedding/{table}.S{slot}/.ATTRIBUTES/VARIABLE_VALUE"
      assert key in keys
      variable = embedding.slot_variables[
          embedding._conversion.table_configs[table]][slot]
      np.testing.assert_array_equal(tf.train.load_variable(path, key),
                                    variable.numpy())
  # Restored (before build) into the variables a fresh creation fn makes.
  fresh_calls = []
  fresh = es.HostTPUEmbedding(_config(), emb.Adam(
      0.05, slot_variable_creation_fn=_recording_fn(fresh_calls)))
  status = tf.train.Checkpoint(embedding=fresh).restore(path)
  fresh.build()
  status.assert_consumed()
  assert len(fresh_calls) == 2
  _assert_state(_state(fresh), trained)


def _bad(created, match):
  def create(table, slot_names, initializers):
    del slot_names, initializers
    return created(table)

  embedding = es.HostTPUEmbedding(
      _config(), emb.AdagradMomentum(0.1, momentum=0.9,
                                     slot_variable_creation_fn=create))
  with pytest.raises(ValueError, match=match):
    embedding.build()


def test_bad_returns_are_refused_by_table_and_slot():
  ok = lambda table: tf.Variable(tf.zeros(table.shape))
  _bad(lambda t: {"accumulators": ok(t)},
       r"table 't'.*missing \['momenta'\]")
  _bad(lambda t: {"accumulators": ok(t), "momenta": ok(t), "m": ok(t)},
       r"table 't'.*unknown \['m'\]")
  _bad(lambda t: [ok(t), ok(t)], "table 't'.*must return a dict")
  _bad(lambda t: {"accumulators": ok(t), "momenta": tf.zeros(t.shape)},
       "table 't'.*slot 'momenta'.*not a tf.Variable")
  _bad(lambda t: {"accumulators": tf.Variable(tf.zeros([9, 2])),
                  "momenta": ok(t)},
       r"table 't'.*slot 'accumulators'.*shape \(9, 2\)")
  _bad(lambda t: {"accumulators": ok(t),
                  "momenta": tf.Variable(tf.zeros(t.shape, tf.float64))},
       "table 't'.*slot 'momenta'.*float64")
  _bad(lambda t: {"accumulators": t, "momenta": ok(t)},
       "table 't'.*slot 'accumulators'.*the table's own variable")
  shared = {}

  def same(table):
    variable = shared.setdefault("v", tf.Variable(tf.zeros(table.shape)))
    return {"accumulators": variable, "momenta": variable}

  _bad(same, "table 't'.*slot 'momenta'.*already given")


def test_a_failed_build_can_be_retried():
  attempts = []

  def create(table, slot_names, initializers):
    attempts.append(table.shape)
    if len(attempts) == 2:
      raise RuntimeError("not now")
    return {s: tf.Variable(i(table.shape, dtype=tf.float32))
            for s, i in zip(slot_names, initializers)}

  embedding = es.HostTPUEmbedding(_config(), emb.Adagrad(
      0.1, slot_variable_creation_fn=create))
  with pytest.raises(RuntimeError, match="not now"):
    embedding.build()
  embedding.build()
  assert len(attempts) == 3  # t once, u twice
  assert all(sorted(s) == ["accumulators"]
             for s in embedding.slot_variables.values())


def test_from_mid_level_refuses_it():
  table = emb.TableConfig(5, 2, name="t",
                          optimizer=emb.Adagrad(0.1, slot_variable_creation_fn=(
                              lambda *a: {})))
  with pytest.raises(ValueError, match="'t'.*slot_variable_creation_fn"):
    interop.from_mid_level({"a": emb.FeatureConfig(table)}, emb.SGD(0.1))
