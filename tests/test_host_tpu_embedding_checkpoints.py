"""HostTPUEmbedding checkpoints in TF2's `TPUEmbedding` object layout.

- What `tf.train.Checkpoint(embedding=HostTPUEmbedding(...))` saves, TF's
  own `TPUEmbeddingForServing` (same feature_config and optimizer, on CPU)
  restores completely (`assert_consumed`): the same checkpoint keys as TF's
  class saves, the same table and slot values in row order, the same
  lookups.
- What `export_mid_level_checkpoint` writes from a TPUEstimator-style
  checkpoint (hand-written here from the host engine's variables; from a
  real TPUEstimator run in the TF 2.15 test) restores into HostTPUEmbedding,
  tables and slots; the next lookups and update equal the host engine's
  (the estimator's).
- What HostTPUEmbedding saves restores into a fresh one (before or after
  `build`), and training continues exactly as an uninterrupted run, eagerly
  and in a `tf.function`.

Runs in both environments; the TPUEstimator test is `tf215`.
"""
import os
import re

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest
import tensorflow as tf

import estimator_spec as es
from estimator_spec.checkpoints import mid_level as checkpoint_layout
from estimator_spec.engine import HostEmbeddingEngine
from tests.test_host_tpu_embedding import BATCH
from tests.test_host_tpu_embedding import BATCHES
from tests.test_host_tpu_embedding import OPTIMIZERS
from tests.test_host_tpu_embedding import _assert_same
from tests.test_host_tpu_embedding import _engine_inputs
from tests.test_host_tpu_embedding import _grads
from tests.test_host_tpu_embedding import _initial
from tests.test_host_tpu_embedding import _reference
from tests.test_host_tpu_embedding import _spec
from tests.test_host_tpu_embedding import _state
from tests.test_host_tpu_embedding import _tf2_config
from tests.test_host_tpu_embedding import _tf2_inputs

emb = tf.tpu.experimental.embedding
SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"


def _key(name, attribute="embedding"):
  """The checkpoint key of object `name` ('t', 't/accumulators')."""
  return f"{attribute}/{name.replace('/', '.S')}{SUFFIX}"


def _saved(path, attribute="embedding"):
  """{object name: array} of the embedding's variables in a checkpoint."""
  reader = tf.train.load_checkpoint(path)
  prefix = attribute + "/"
  result = {}
  for key in reader.get_variable_to_shape_map():
    if key.startswith(prefix) and key.endswith(SUFFIX):
      name = key[len(prefix):-len(SUFFIX)].replace(".S", "/")
      result[name] = reader.get_tensor(key)
  return result


def _step(embedding, n, function=None):
  """Trains `embedding` on step n's batch and gradients; returns
  (activations, state) as `_run` of the first test file does."""

  def step(features, weights, grads):
    acts = embedding(features, weights)
    embedding.apply_gradients(grads)
    return acts

  features, weights = _tf2_inputs(BATCHES[n])
  grads = {k: tf.constant(v) for k, v in _grads(n).items()}
  acts = (function or step)(features, weights, grads)
  return ({k: v.numpy() for k, v in acts.items()}, _state(embedding))


def _lookups(embedding, n):
  features, weights = _tf2_inputs(BATCHES[n])
  return {k: v.numpy() for k, v in embedding(features, weights).items()}


# ---------------------------------------------------------------------------
# HostTPUEmbedding -> TF's TPUEmbeddingForServing.


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_saved_checkpoint_restores_into_tpu_embedding_for_serving(
    tmp_path, name):
  tf2 = OPTIMIZERS[name]()[0]
  host = es.HostTPUEmbedding(_tf2_config(), tf2)
  for n in range(2):
    _step(host, n)
  path = tf.train.Checkpoint(embedding=host).save(str(tmp_path / "host"))
  trained = _state(host)

  serving = emb.TPUEmbeddingForServing(_tf2_config(), tf2)
  serving.build()
  # TF's class saves the same keys, with its own (initial) values.
  initial = tf.train.Checkpoint(embedding=serving).save(
      str(tmp_path / "tf_initial"))
  assert (sorted(tf.train.list_variables(initial)) ==
          sorted(tf.train.list_variables(path)))
  tf.train.Checkpoint(embedding=serving).restore(path).assert_consumed()
  restored = _saved(tf.train.Checkpoint(embedding=serving).save(
      str(tmp_path / "tf_restored")))
  assert sorted(restored) == sorted(trained)
  # Every table and slot of the optimizer is there (SGD: no slot).
  slots = {"sgd_clip_decay": [], "adagrad_clip_decay": ["accumulators"],
           "adagrad_momentum": ["accumulators", "momenta"],
           "lazy_adam": ["momenta", "velocities"],
           "adam_every_row": ["momenta", "velocities"],
           "ftrl": ["accumulators", "linears"]}[name]
  assert sorted(trained) == sorted(
      ["s", "t"] + [f"{t}/{s}" for t in "st" for s in slots])
  for key, value in trained.items():
    np.testing.assert_array_equal(restored[key], value, err_msg=key)
  for table, variable in serving.embedding_tables.items():
    np.testing.assert_array_equal(variable.numpy(), trained[table.name])
  assert not np.allclose(trained["t"], _initial("t"))
  # TF's lookups (its CPU path) from the restored tables equal ours.
  features, weights = _tf2_inputs(BATCHES[0])
  ours = _lookups(host, 0)
  theirs = serving(features, weights)
  for k in ours:
    np.testing.assert_allclose(theirs[k].numpy(), ours[k], rtol=1e-6,
                               atol=1e-7, err_msg=k)


def test_checkpoint_keys_are_tf2s_names():
  """The object names come from one place (`checkpoints.mid_level`) and
  are TF2's: '<table>' and '<table>/<slot>'."""
  host = es.HostTPUEmbedding(_tf2_config(), OPTIMIZERS["ftrl"]()[0])
  names = checkpoint_layout.object_names(host.spec.model)
  assert sorted(names) == ["s", "s/accumulators", "s/linears", "t",
                           "t/accumulators", "t/linears"]
  assert names["t/linears"][0] == "t"
  assert names["t/linears"][1].mid_level == "linears"
  assert names["t"] == ("t", None)


# ---------------------------------------------------------------------------
# export_mid_level_checkpoint -> HostTPUEmbedding.


def _write_estimator_checkpoint(engine, directory, step):
  """A TPUEstimator-style (name-based) checkpoint of the engine's tables
  and slots, as a TPUEstimator trained with the spec writes them."""
  names, slices, values = ["global_step"], [""], [tf.constant(step,
                                                              tf.int64)]
  for variable in engine.variables():
    # One partition each: saved whole under the partitioned variable's name.
    names.append(re.sub(r"/part_0$", "", variable.name.split(":")[0]))
    slices.append("")
    values.append(variable.read_value())
  os.makedirs(directory, exist_ok=True)
  prefix = os.path.join(directory, f"model.ckpt-{step}")
  tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names,
                    shape_and_slices=slices, tensors=values)
  tf.compat.v1.train.update_checkpoint_state(directory, prefix)
  return prefix


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_exported_checkpoint_restores_into_host_tpu_embedding(tmp_path,
                                                              name):
  tf2, ours = OPTIMIZERS[name]()
  spec = _spec(ours)
  # The estimator side: the host engine after one step, as a checkpoint.
  engine = HostEmbeddingEngine(es.EmbeddingConfig(spec, batch_size=BATCH))
  engine.create_variables()
  result = engine.lookup(_engine_inputs(BATCHES[0]))
  engine.apply_gradients(result, {k: tf.constant(v)
                                  for k, v in _grads(0).items()},
                         tf.constant(0, tf.int64))
  model_dir = str(tmp_path / "model")
  _write_estimator_checkpoint(engine, model_dir, 1)
  path = es.interop.export_mid_level_checkpoint(
      model_dir, spec, str(tmp_path / "export" / "embedding"))

  host = es.HostTPUEmbedding(_tf2_config(), tf2)
  status = tf.train.Checkpoint(embedding=host).restore(path)  # before build
  host.build()
  status.assert_consumed()
  reference = _reference(spec, steps=2)
  assert sorted(_state(host)) == sorted(reference[0][1])
  for key, value in reference[0][1].items():
    np.testing.assert_array_equal(_state(host)[key], value, err_msg=key)
  # The next step (lookups, then the update) is the engine's second step.
  _assert_same([_step(host, 1)], reference[1:])


# ---------------------------------------------------------------------------
# HostTPUEmbedding -> HostTPUEmbedding.


@pytest.mark.parametrize("in_function", [False, True])
@pytest.mark.parametrize("name", ["adagrad_momentum", "adam_every_row",
                                  "ftrl"])
def test_restored_embedding_trains_on_as_an_uninterrupted_one(
    tmp_path, name, in_function):
  def make():
    return es.HostTPUEmbedding(_tf2_config(), OPTIMIZERS[name]()[0])

  def runner(embedding):
    if not in_function:
      return None

    @tf.function
    def step(features, weights, grads):
      acts = embedding(features, weights)
      embedding.apply_gradients(grads)
      return acts

    return step

  uninterrupted = make()
  run = runner(uninterrupted)
  expected = [_step(uninterrupted, n, run) for n in range(2)]

  first = make()
  _step(first, 0, runner(first))
  checkpoint = tf.train.Checkpoint(embedding=first)
  path = checkpoint.save(str(tmp_path / "ckpt"))

  # Restored after build ...
  built = make()
  built.build()
  tf.train.Checkpoint(embedding=built).restore(path).assert_consumed()
  assert sorted(_state(built)) == sorted(expected[0][1])
  for key, value in expected[0][1].items():
    np.testing.assert_array_equal(_state(built)[key], value, err_msg=key)
  _assert_same([_step(built, 1, runner(built))], expected[1:])
  # ... and before it: the variables the first (traced) step creates get
  # the checkpoint's values.
  fresh = make()
  status = tf.train.Checkpoint(embedding=fresh).restore(path)
  _assert_same([_step(fresh, 1, runner(fresh))], expected[1:])
  status.assert_consumed()


def test_lookups_only_embedding_saves_and_restores_tables(tmp_path):
  trained = es.HostTPUEmbedding(_tf2_config(), OPTIMIZERS["ftrl"]()[0])
  _step(trained, 0)
  path = tf.train.Checkpoint(embedding=trained).save(str(tmp_path / "c"))
  lookups = es.HostTPUEmbedding(_tf2_config(), None)
  tf.train.Checkpoint(embedding=lookups).restore(path).expect_partial()
  lookups.build()
  for table, variable in lookups.embedding_tables.items():
    np.testing.assert_array_equal(variable.numpy(), _state(trained)[
        table.name])
  assert lookups.slot_variables == {t: {} for t in lookups.slot_variables}
  np.testing.assert_array_equal(_lookups(lookups, 1)["g"],
                                _lookups(trained, 1)["g"])


# ---------------------------------------------------------------------------
# A TPUEstimator's checkpoint -> export-mid-level -> HostTPUEmbedding (TF
# 2.15: the estimator is the oracle of the next update).


def _estimator(model_dir, spec, columns, grads, batch):
  """This project's TPUEstimator (CPU) whose loss is sum(activation * G) per
  feature: the embedding gradients are the constants G."""
  v1 = tf.compat.v1

  def model_fn(features, labels, mode, params):
    del labels, params
    loss = tf.constant(0.0)
    for name, column in columns.items():
      acts = v1.feature_column.input_layer(features, [column])
      loss += tf.reduce_sum(acts * tf.constant(grads[name]))
    # A dense variable for the optimizer; its learning rate is 0.
    scale = v1.get_variable("scale", initializer=1.0)
    loss *= scale
    train_op = v1.train.GradientDescentOptimizer(0.0).minimize(
        loss, global_step=v1.train.get_global_step())
    return es.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)

  tpu = tf.compat.v1.estimator.tpu
  config = tpu.RunConfig(model_dir=str(model_dir),
                         tpu_config=tpu.TPUConfig(num_shards=2))
  return es.TPUEstimator(model_fn=model_fn, config=config, use_tpu=False,
                         train_batch_size=batch,
                         embedding_config_spec=spec)


@pytest.mark.tf215
@pytest.mark.parametrize("optimizer", ["adagrad", "adam"])
def test_estimator_checkpoint_exported_restores_and_trains_on(tmp_path,
                                                              optimizer):
  from tests.test_estimator_interop import as_sparse
  from tests.test_estimator_interop import padded_ids
  import tpu_embedding_columns as tec
  vocabulary, dim, batch = 20, 3, 8
  ident = tf.feature_column.categorical_column_with_identity
  columns = {"a": tec.embedding_column(ident("a", vocabulary), dim,
                                       combiner="mean"),
             "b": tec.embedding_column(ident("b", vocabulary), dim,
                                       combiner="sum")}
  parameters = {
      "adagrad": es.AdagradParameters(0.1, clip_gradient_min=-0.4,
                                      clip_gradient_max=0.4),
      "adam": es.AdamParameters(0.05, beta1=0.8, beta2=0.99, epsilon=1e-6),
  }[optimizer]
  spec = es.EmbeddingConfigSpec(feature_columns=list(columns.values()),
                                optimization_parameters=parameters,
                                partition_strategy="mod")
  rng = np.random.RandomState(7)
  ids = {k: padded_ids(rng, batch, 3, vocabulary, 1) for k in columns}
  grads = {k: rng.uniform(-1, 1, (batch, dim)).astype(np.float32)
           for k in columns}

  def input_fn(params):
    # Each `train` call reads it from the start: every step sees `ids`.
    data = tf.data.Dataset.from_tensor_slices(ids)
    return data.batch(params["batch_size"], drop_remainder=True).map(
        lambda f: (as_sparse(f), tf.zeros([batch, 1])))

  exported = []
  for steps in (1, 2):
    model_dir = tmp_path / "model"
    _estimator(model_dir, spec, columns, grads, batch).train(
        input_fn, max_steps=steps)
    exported.append(es.interop.export_mid_level_checkpoint(
        str(model_dir), spec, str(tmp_path / f"export{steps}" / "emb")))

  config = es.interop.to_mid_level(spec)
  host = es.HostTPUEmbedding(config.feature_config, config.optimizer)
  status = tf.train.Checkpoint(embedding=host).restore(exported[0])
  host.build()
  status.assert_consumed()
  after_one = _saved(exported[0])
  assert sorted(_state(host)) == sorted(after_one)
  for key, value in after_one.items():
    np.testing.assert_array_equal(_state(host)[key], value, err_msg=key)
  # The estimator's second step, by HostTPUEmbedding from the first
  # export.
  features = {k: tf.RaggedTensor.from_tensor(
      ids[k], lengths=(ids[k] >= 0).sum(axis=1)) for k in columns}
  assert sorted(config.feature_config) == sorted(features)
  host.enqueue(features)
  host.dequeue()
  host.apply_gradients({k: tf.constant(v) for k, v in grads.items()})
  after_two = _saved(exported[1])
  assert sorted(_state(host)) == sorted(after_two)
  for key, value in after_two.items():
    np.testing.assert_allclose(_state(host)[key], value, rtol=1e-6,
                               atol=1e-7, err_msg=key)
  assert not np.allclose(after_two["tbl_a"], after_one["tbl_a"])
