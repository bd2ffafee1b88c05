"""HostTPUEmbedding: TF2's TPUEmbedding interface trained on the host.

The oracle is the host engine built from the equivalent EmbeddingConfigSpec
(written here by hand with this project's optimizer classes): the same
lookups, and the same tables and slots after one and two updates, for every
optimizer TF2 has, with gradient clipping (`clipvalue`), weight decay, a
callable learning rate and a table-level optimizer; sparse, ragged and
dense ids, weights, a sequence feature. Eager and `tf.function` give the
same results. Settings it cannot honour are refused by name; an id out of
range raises and changes no table and no slot. `to_mid_level` followed by
`from_mid_level` gives back the config model.

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

emb = tf.tpu.experimental.embedding
F32 = np.float32
BATCH = 3
SHAPES = {"t": (11, 3), "s": (5, 2)}

# f: SparseTensor ids of table t (sum); g: RaggedTensor ids with weights,
# table t; h: dense ids, one per example, table s (mean); q: a sequence
# feature of table s (max_sequence_length 3; ids past it are dropped).
BATCHES = [
    {"f": [[1, 3, 3], [], [7]], "g": [[3, 1], [10, 0], []],
     "gw": [[0.5, 2.0], [1.0, -1.5], []], "h": [2, 0, 4],
     "q": [[1, 2, 3, 4], [0], []]},
    {"f": [[0], [5, 5, 5], [1, 2]], "g": [[2], [2, 2], [9]],
     "gw": [[3.0], [0.25, 1.0], [2.0]], "h": [1, 1, 3],
     "q": [[2], [4, 4], [0, 1, 2]]},
]


def _initial(name):
  seed = {"t": 3, "s": 4}[name]
  return np.random.RandomState(seed).uniform(-1, 1, SHAPES[name]).astype(F32)


def _grads(step):
  rng = np.random.RandomState(50 + step)
  return {"f": rng.uniform(-1, 1, (BATCH, 3)).astype(F32),
          "g": rng.uniform(-1, 1, (BATCH, 3)).astype(F32),
          "h": rng.uniform(-1, 1, (BATCH, 2)).astype(F32),
          "q": rng.uniform(-1, 1, (BATCH, 3, 2)).astype(F32)}


def _sparse(rows, dtype=np.int64):
  indices = [[b, p] for b, row in enumerate(rows) for p in range(len(row))]
  values = [x for row in rows for x in row]
  width = max([1] + [len(row) for row in rows])
  return tf.SparseTensor(np.array(indices, np.int64).reshape(-1, 2),
                         np.array(values, dtype), [len(rows), width])


def _tf2_inputs(batch):
  features = {"f": _sparse(batch["f"]),
              "g": tf.ragged.constant(batch["g"], tf.int64),
              "h": tf.constant(batch["h"], tf.int64),
              "q": _sparse(batch["q"])}
  weights = {"f": None, "g": tf.ragged.constant(batch["gw"], tf.float32),
             "h": None, "q": None}
  return features, weights


def _engine_inputs(batch):
  return {"f": _sparse(batch["f"]), "g": _sparse(batch["g"]),
          "g_w": _sparse(batch["gw"], np.float32),
          "h": _sparse([[x] for x in batch["h"]]), "q": _sparse(batch["q"])}


# name -> (TF2 optimizer, this project's equivalent)
OPTIMIZERS = {
    "sgd_clip_decay": lambda: (
        emb.SGD(0.2, clipvalue=0.3, weight_decay_factor=0.1,
                multiply_weight_decay_factor_by_learning_rate=True),
        es.StochasticGradientDescentParameters(
            0.2, clip_gradient_min=-0.3, clip_gradient_max=0.3,
            weight_decay_factor=0.1,
            multiply_weight_decay_factor_by_learning_rate=True)),
    "adagrad_clip_decay": lambda: (
        emb.Adagrad(0.1, initial_accumulator_value=0.2,
                    clipvalue=(-0.3, 0.25), clip_weight_min=-0.9,
                    clip_weight_max=0.8, weight_decay_factor=0.05),
        es.AdagradParameters(0.1, initial_accumulator=0.2,
                             clip_gradient_min=-0.3, clip_gradient_max=0.25,
                             clip_weight_min=-0.9, clip_weight_max=0.8,
                             weight_decay_factor=0.05)),
    "adagrad_momentum": lambda: (
        emb.AdagradMomentum(0.1, momentum=0.9, use_nesterov=True, exponent=3,
                            beta2=0.99, epsilon=1e-6),
        es.AdagradMomentumParameters(0.1, 0.9, use_nesterov=True, exponent=3,
                                     beta2=0.99, epsilon=1e-6)),
    "lazy_adam": lambda: (
        emb.Adam(0.05, beta_1=0.8, beta_2=0.99, epsilon=1e-6),
        es.AdamParameters(0.05, beta1=0.8, beta2=0.99, epsilon=1e-6)),
    "adam_every_row": lambda: (
        emb.Adam(0.05, lazy_adam=False, sum_inside_sqrt=False, clipvalue=0.5),
        es.AdamParameters(0.05, epsilon=1e-7, lazy_adam=False,
                          sum_inside_sqrt=False, clip_gradient_min=-0.5,
                          clip_gradient_max=0.5)),
    "ftrl": lambda: (
        emb.FTRL(0.1, learning_rate_power=-0.6, l1_regularization_strength=0.01,
                 l2_regularization_strength=0.02, beta=0.1,
                 initial_accumulator_value=0.2,
                 multiply_linear_by_learning_rate=True,
                 weight_decay_factor=0.01),
        es.FtrlParameters(0.1, learning_rate_power=-0.6,
                          initial_accumulator_value=0.2,
                          l1_regularization_strength=0.01,
                          l2_regularization_strength=0.02, beta=0.1,
                          multiply_linear_by_learning_rate=True,
                          weight_decay_factor=0.01)),
}


def _tf2_config(optimizer=None, s_optimizer=None, output_shape=None):
  t = emb.TableConfig(11, 3, initializer=tf.constant_initializer(
      _initial("t")), combiner="sum", name="t")
  s = emb.TableConfig(5, 2, initializer=tf.constant_initializer(
      _initial("s")), combiner="mean", name="s", optimizer=s_optimizer)
  return {"f": emb.FeatureConfig(t), "g": emb.FeatureConfig(t),
          "h": emb.FeatureConfig(s, output_shape=output_shape),
          "q": emb.FeatureConfig(s, max_sequence_length=3)}


def _spec(optimizer, s_optimizer=None, learning_rate_fn=None):
  return es.EmbeddingConfigSpec(
      feature_to_config_dict={
          "f": es.FeatureConfig("t"), "g": es.FeatureConfig("t",
                                                            weight_key="g_w"),
          "h": es.FeatureConfig("s"),
          "q": es.FeatureConfig("s", max_sequence_length=3)},
      table_to_config_dict={
          "t": es.TableConfig(11, 3, tf.constant_initializer(_initial("t")),
                              combiner="sum",
                              learning_rate_fn=learning_rate_fn),
          "s": es.TableConfig(5, 2, tf.constant_initializer(_initial("s")),
                              combiner="mean",
                              learning_rate_fn=(None if s_optimizer else
                                                learning_rate_fn),
                              optimization_parameters=s_optimizer)},
      optimization_parameters=optimizer)


def _reference(spec, steps=2, from_spec=False):
  """[(activations, {table or table/slot: array})] per step, by the engine
  (built from an EmbeddingConfig, or from `spec` and a mode)."""
  engine = (HostEmbeddingEngine(spec=spec, mode="train")
            if from_spec else
            HostEmbeddingEngine(es.EmbeddingConfig(spec, batch_size=BATCH)))
  engine.create_variables()
  history = []
  for n, batch in enumerate(BATCHES[:steps]):
    result = engine.lookup(_engine_inputs(batch))
    acts = {k: result.activations[k].numpy() for k in "fghq"}
    engine.apply_gradients(result, {k: tf.constant(v)
                                    for k, v in _grads(n).items()},
                           tf.constant(n, tf.int64))
    history.append((acts, _engine_state(engine)))
  return history


def _engine_state(engine):
  state = {}
  for name in engine.created_tables():
    state[name] = engine.table_rows(name).read_all().numpy()
    optimizer = engine.optimizer_for(name)
    names = {s.name: s.mid_level for s in optimizer.slot_specs()}
    for slot, rows in engine.slot_rows(name).items():
      state[f"{name}/{names[slot]}"] = rows.read_all().numpy()
  return state


def test_an_engine_of_a_spec_and_a_mode_trains_as_one_of_a_config():
  """The engine takes what it uses (a spec and a mode): the same lookups,
  tables and slots as built from an EmbeddingConfig."""
  spec = _spec(OPTIMIZERS["adagrad_clip_decay"]()[1])
  expected = _reference(spec)
  got = _reference(spec, from_spec=True)
  for (acts, state), (want_acts, want_state) in zip(got, expected):
    for key, value in want_acts.items():
      np.testing.assert_array_equal(acts[key], value)
    assert sorted(state) == sorted(want_state)
    for key, value in want_state.items():
      np.testing.assert_array_equal(state[key], value)


def test_the_engine_constructor_refuses_what_it_cannot_use():
  spec = _spec(OPTIMIZERS["sgd_clip_decay"]()[1])
  config = es.EmbeddingConfig(spec, batch_size=BATCH)
  with pytest.raises(ValueError, match="not both"):
    HostEmbeddingEngine(config, spec=spec, mode="train")
  with pytest.raises(ValueError, match="`mode` must be"):
    HostEmbeddingEngine(spec=spec, mode="training")
  with pytest.raises(TypeError, match="`spec` must be"):
    HostEmbeddingEngine(spec={"t": 1}, mode="train")
  no_optimizer = es.EmbeddingConfigSpec(
      feature_to_config_dict={"f": es.FeatureConfig("t")},
      table_to_config_dict={"t": es.TableConfig(11, 3)})
  with pytest.raises(ValueError, match=r"tables \['t'\] have none"):
    HostEmbeddingEngine(spec=no_optimizer, mode="train")
  engine = HostEmbeddingEngine(spec=no_optimizer, mode="infer")
  assert not engine.is_training and engine.optimizer_for("t") is None


def test_the_engine_state_api_gives_the_partitions_of_tables_and_slots():
  spec = es.EmbeddingConfigSpec(
      feature_to_config_dict={"f": es.FeatureConfig("t"),
                              "h": es.FeatureConfig("s")},
      table_to_config_dict={"t": es.TableConfig(11, 3),
                            "s": es.TableConfig(5, 2)},
      optimization_parameters=OPTIMIZERS["ftrl"]()[1])
  engine = HostEmbeddingEngine(spec=spec, mode="train", num_shards=2)
  assert engine.created_tables() == [] and not engine.has_variables("t")
  with pytest.raises(RuntimeError, match="do not exist yet"):
    engine.table_rows("t")
  with pytest.raises(ValueError, match="unknown table 'x'"):
    engine.has_variables("x")
  engine.create_variables()
  assert engine.created_tables() == list(engine.model.tables) == ["s", "t"]
  partitions = engine.table_partitions("s")
  assert [p.shape.as_list() for p in partitions] == [[3, 2], [2, 2]]
  assert engine.table_layout("s").num_partitions == 2
  slots = engine.slot_rows("t")
  assert list(slots) == [s.name for s in
                         engine.optimizer_for("t").slot_specs()]
  first = next(iter(slots))
  assert [id(p) for p in engine.slot_partitions("t", first)] == [
      id(p) for p in slots[first].partitions]
  assert not {id(p) for p in partitions} & {
      id(p) for p in engine.slot_partitions("s", first)}
  with pytest.raises(ValueError, match="has no slot 'nope'"):
    engine.slot_partitions("t", "nope")
  # Global ids routed to the partitions holding them (div: rows 0-2, 3-4).
  split = engine.split_by_partition(
      "s", tf.constant([4, 0, 3], tf.int64),
      tf.constant([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]))
  assert [ids.numpy().tolist() for ids, _ in split] == [[0], [1, 0]]
  assert [v.numpy()[:, 0].tolist() for _, v in split] == [[2.0], [1.0, 3.0]]


def _state(embedding):
  state = {}
  for table, variable in embedding.embedding_tables.items():
    state[table.name] = variable.numpy()
    for slot, rows in embedding.slot_variables[table].items():
      state[f"{table.name}/{slot}"] = rows.numpy()
  return state


def _train_step(embedding, in_function=False):
  """step(features, weights, grads): looks up, applies `grads`, returns the
  activations (traced into a tf.function when `in_function`)."""

  def step(features, weights, grads):
    acts = embedding(features, weights)
    embedding.apply_gradients(grads)
    return acts

  return tf.function(step) if in_function else step


def _run(embedding, steps=2, in_function=False):
  step = _train_step(embedding, in_function)
  history = []
  for n, batch in enumerate(BATCHES[:steps]):
    features, weights = _tf2_inputs(batch)
    acts = step(features, weights,
                {k: tf.constant(v) for k, v in _grads(n).items()})
    history.append(({k: v.numpy() for k, v in acts.items()},
                    _state(embedding)))
  return history


def _assert_same(history, reference):
  assert len(history) == len(reference)
  for (acts, state), (ref_acts, ref_state) in zip(history, reference):
    assert sorted(acts) == sorted(ref_acts)
    for k in ref_acts:
      np.testing.assert_allclose(acts[k], ref_acts[k], rtol=1e-6, atol=1e-7,
                                 err_msg=k)
    assert sorted(state) == sorted(ref_state)
    for k in ref_state:
      np.testing.assert_allclose(state[k], ref_state[k], rtol=1e-6,
                                 atol=1e-7, err_msg=k)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_same_lookups_and_updates_as_the_engine(name):
  tf2, ours = OPTIMIZERS[name]()
  embedding = es.HostTPUEmbedding(_tf2_config(), tf2)
  history = _run(embedding)
  _assert_same(history, _reference(_spec(ours)))
  # The steps changed the tables (the comparison is not of initial values).
  assert not np.allclose(history[-1][1]["t"], _initial("t"))


@pytest.mark.parametrize("name", ["adagrad_clip_decay", "adam_every_row"])
def test_tf_function_equals_eager(name):
  eager = _run(es.HostTPUEmbedding(_tf2_config(), OPTIMIZERS[name]()[0]))
  traced = _run(es.HostTPUEmbedding(_tf2_config(), OPTIMIZERS[name]()[0]),
                in_function=True)
  _assert_same(traced, eager)


def test_callable_learning_rate_is_called_at_each_update():
  rate = tf.Variable(0.1)
  rates = [0.1, 0.05]
  embedding = es.HostTPUEmbedding(_tf2_config(), emb.Adagrad(lambda: rate))

  @tf.function
  def step(features, weights, grads):
    acts = embedding(features, weights)
    embedding.apply_gradients(grads)
    return acts

  history = []
  for n, batch in enumerate(BATCHES):
    rate.assign(rates[n])
    features, weights = _tf2_inputs(batch)
    acts = step(features, weights,
                {k: tf.constant(v) for k, v in _grads(n).items()})
    history.append(({k: v.numpy() for k, v in acts.items()},
                    _state(embedding)))

  def learning_rate_fn(global_step):
    return tf.gather(tf.constant(rates), global_step)

  _assert_same(history, _reference(_spec(es.AdagradParameters(0.7),
                                         learning_rate_fn=learning_rate_fn)))


def test_table_optimizer_overrides_the_default():
  tf2_sgd, ours_sgd = OPTIMIZERS["sgd_clip_decay"]()
  tf2_adam, ours_adam = OPTIMIZERS["lazy_adam"]()
  embedding = es.HostTPUEmbedding(_tf2_config(s_optimizer=tf2_sgd), tf2_adam)
  embedding.build()
  slots = {t.name: sorted(v) for t, v in embedding.slot_variables.items()}
  assert slots == {"t": ["momenta", "velocities"], "s": []}
  _assert_same(_run(embedding),
               _reference(_spec(ours_adam, s_optimizer=ours_sgd)))


def test_pipelining_applies_each_update_one_step_late():
  tf2, ours = OPTIMIZERS["adagrad_clip_decay"]()
  embedding = es.HostTPUEmbedding(_tf2_config(), tf2,
                                  pipeline_execution_with_tensor_core=True)
  history = _run(embedding, in_function=True)
  spec = _spec(ours)._replace(pipeline_execution_with_tensor_core=True)
  engine = HostEmbeddingEngine(es.EmbeddingConfig(spec, batch_size=BATCH))
  engine.create_variables()
  for n, batch in enumerate(BATCHES):
    result = engine.lookup(_engine_inputs(batch))
    for k in "fghq":
      np.testing.assert_allclose(history[n][0][k],
                                 result.activations[k].numpy(), rtol=1e-6)
    engine.apply_gradients(result, {k: tf.constant(v)
                                    for k, v in _grads(n).items()},
                           tf.constant(n, tf.int64))
  embedding.flush()
  engine.flush()
  state, ref = _state(embedding), _engine_state(engine)
  for k in ref:
    np.testing.assert_allclose(state[k], ref[k], rtol=1e-6, atol=1e-7)


def test_shapes_none_gradients_and_output_shape():
  embedding = es.HostTPUEmbedding(_tf2_config(output_shape=[3, 1]),
                                  emb.SGD(0.5))
  features, weights = _tf2_inputs(BATCHES[0])
  embedding.enqueue(features, weights)
  acts = embedding.dequeue()
  assert acts["f"].shape == (3, 3) and acts["q"].shape == (3, 3, 2)
  assert acts["h"].shape == (3, 1, 2)
  # Sequence positions past an example's length are zeros.
  np.testing.assert_array_equal(acts["q"][1, 1:].numpy(), 0)
  np.testing.assert_array_equal(acts["q"][2].numpy(), 0)
  before = _state(embedding)
  # None is a zero gradient: SGD leaves every row as it was.
  embedding.apply_gradients({"f": None, "g": None, "h": None, "q": None})
  after = _state(embedding)
  for k in before:
    np.testing.assert_array_equal(after[k], before[k])
  with pytest.raises(RuntimeError, match="enqueue"):
    embedding.apply_gradients({"f": None, "g": None, "h": None, "q": None})
  wrong = es.HostTPUEmbedding(_tf2_config(output_shape=[2]), emb.SGD(0.5))
  with pytest.raises(ValueError, match="output_shape"):
    wrong(*_tf2_inputs(BATCHES[0]))


def test_lookups_only_without_optimizer_and_training_false():
  lookups = es.HostTPUEmbedding(_tf2_config(), None)
  lookups(*_tf2_inputs(BATCHES[0]))
  assert not lookups.is_training
  assert all(not slots for slots in lookups.slot_variables.values())
  with pytest.raises(RuntimeError, match="optimizer"):
    lookups.apply_gradients({"f": None, "g": None, "h": None, "q": None})
  trained = es.HostTPUEmbedding(_tf2_config(), emb.SGD(0.5))
  trained.enqueue(*_tf2_inputs(BATCHES[0]), training=False)
  trained.dequeue()
  with pytest.raises(RuntimeError, match="training=True"):
    trained.apply_gradients({"f": None, "g": None, "h": None, "q": None})


@pytest.mark.parametrize("in_function", [False, True])
def test_an_id_out_of_range_raises_and_changes_nothing(in_function):
  embedding = es.HostTPUEmbedding(_tf2_config(), emb.Adagrad(0.1))
  embedding.build()
  before = _state(embedding)
  batch = dict(BATCHES[0], f=[[1, 11], [], [7]])  # table t has 11 rows

  def step(features, weights):
    embedding(features, weights)
    embedding.apply_gradients({k: tf.constant(v)
                               for k, v in _grads(0).items()})

  if in_function:
    step = tf.function(step)
  with pytest.raises(tf.errors.InvalidArgumentError):
    step(*_tf2_inputs(batch))
  after = _state(embedding)
  assert sorted(after) == sorted(before)
  for k in before:
    np.testing.assert_array_equal(after[k], before[k])


def _refused(match, feature_config, optimizer):
  with pytest.raises(ValueError, match=match):
    es.HostTPUEmbedding(feature_config, optimizer)


def test_refusals_name_the_setting():
  table = emb.TableConfig(5, 2, name="t")
  feature = {"a": emb.FeatureConfig(table)}
  # A spec has no slot creation hook: from_mid_level refuses it
  # (HostTPUEmbedding calls it: test_host_tpu_embedding_slots.py).
  with pytest.raises(ValueError, match="slot_variable_creation_fn"):
    interop.from_mid_level(feature, emb.Adagrad(
        0.1, slot_variable_creation_fn=lambda *a: {}))
  _refused("quantization_config", {"a": emb.FeatureConfig(emb.TableConfig(
      5, 2, quantization_config=emb.QuantizationConfig(5, -1.0, 1.0)))},
           emb.SGD(0.1))
  odd = emb.SGD(0.1)
  odd.some_new_setting = 3
  _refused("some_new_setting", feature, odd)
  if hasattr(emb, "CustomOptimizer"):
    _refused("CustomOptimizer", feature, emb.CustomOptimizer(
        lambda *a: None, learning_rate=0.1))
  if hasattr(emb, "CustomCombiner"):
    _refused("combiner", {"a": emb.FeatureConfig(emb.TableConfig(
        5, 2, combiner=emb.CustomCombiner(lambda *a: None, max_valency=2)))},
             emb.SGD(0.1))
  if "dtype" in vars(table):
    _refused("dtype", {"a": emb.FeatureConfig(emb.TableConfig(
        5, 2, dtype=tf.int32))}, emb.SGD(0.1))
  with pytest.raises(TypeError, match="FeatureConfig"):
    es.HostTPUEmbedding({"a": table}, emb.SGD(0.1))
  mixed = {"a": emb.FeatureConfig(table), "b": emb.FeatureConfig(
      emb.TableConfig(5, 2, name="u", optimizer=emb.SGD(0.1)))}
  _refused("no optimizer", mixed, None)


def test_bad_inputs_are_refused_by_feature():
  embedding = es.HostTPUEmbedding(_tf2_config(), emb.SGD(0.1))
  features, weights = _tf2_inputs(BATCHES[0])
  with pytest.raises(ValueError, match="'h'.*dense ids take no weights"):
    embedding.enqueue(features, dict(weights, h=tf.ones([3])))
  with pytest.raises(ValueError, match="'q'.*sequence"):
    embedding.enqueue(features, dict(weights, q=_sparse([[1.0], [], []],
                                                        np.float32)))
  with pytest.raises(ValueError, match="'h'.*one id per example"):
    embedding.enqueue(dict(features, h=tf.constant([[1, 2], [2, 3], [3, 4]])),
                      weights)


def test_to_mid_level_then_from_mid_level_gives_back_the_model():
  spec = es.EmbeddingConfigSpec(
      feature_to_config_dict={
          "a": es.FeatureConfig("t", weight_key="a_w"),
          "b": es.FeatureConfig("t"),
          "c": es.FeatureConfig("u", max_sequence_length=4)},
      table_to_config_dict={
          "t": es.TableConfig(20, 4, combiner="sqrtn"),
          "u": es.TableConfig(7, 2, combiner="sum",
                              optimization_parameters=es.AdamParameters(
                                  0.01, lazy_adam=False))},
      optimization_parameters=es.FtrlParameters(
          0.1, l1_regularization_strength=0.1, clip_gradient_min=-1.0,
          clip_gradient_max=2.0, weight_decay_factor=0.01))
  mid = interop.to_mid_level(spec)
  back = interop.from_mid_level(*mid, weight_keys=mid.weight_keys)
  assert back.model == spec.model


@pytest.mark.parametrize("use_nesterov", [True, False])
@pytest.mark.parametrize("in_function", [False, True])
def test_adagrad_momentum_accumulates_the_scaled_gradient(use_nesterov,
                                                          in_function):
  # As TF's TPU test states it, with g the row's summed gradient and
  # s = (a + eps)^(-1/exponent) after the accumulator a moved:
  # m = mu*m + g*s; w -= lr*(mu*m + g*s) (Nesterov) or lr*m. One row, whose
  # gradient is 6 then 1 (two examples of 3, then one of 1, sum combiner),
  # TF's test's hyper-parameters.
  table = emb.TableConfig(2, 1, initializer=tf.zeros_initializer(),
                          combiner="sum", name="t")
  embedding = es.HostTPUEmbedding(
      {"f": emb.FeatureConfig(table)},
      emb.AdagradMomentum(0.1, momentum=0.9, use_nesterov=use_nesterov,
                          exponent=3.0, epsilon=0.1, beta2=0.9))
  step = _train_step(embedding, in_function)
  for ids, grad in (([[0], [0]], [[3.0], [3.0]]), ([[0], [1]], [[1.0],
                                                             [0.0]])):
    step({"f": tf.ragged.constant(ids, tf.int64)}, None,
         {"f": tf.constant(grad)})
  w, a, m = 0.0, 0.0, 0.0
  for g in (6.0, 1.0):
    a = 0.9 * a + 0.1 * g * g
    s = (a + 0.1) ** (-1 / 3)
    m = 0.9 * m + g * s
    w -= 0.1 * (0.9 * m + g * s if use_nesterov else m)
  if use_nesterov:
    np.testing.assert_allclose(w, -1.177148, rtol=1e-6)  # the number
  state = _state(embedding)
  np.testing.assert_allclose(state["t"][0, 0], w, rtol=1e-5)
  np.testing.assert_allclose(state["t/accumulators"][0, 0], a, rtol=1e-5)
  np.testing.assert_allclose(state["t/momenta"][0, 0], m, rtol=1e-5)
  # Row 1 took a zero gradient: its momentum holds 0 * s = 0.
  np.testing.assert_array_equal(state["t/momenta"][1], [0.0])
