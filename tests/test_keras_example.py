"""examples/keras_dlrm.py: a Keras model whose tables train with the TPU
embedding optimizer (HostTPUEmbedding) and whose dense layers train with
the Keras optimizer, inside Keras' compiled train_step. Runs with Keras 3
(current TensorFlow) and with TF 2.15's Keras 2."""
from examples.keras_dlrm import keras  # Keras 3, or tf_keras when TF_USE_LEGACY_KERAS=1
import numpy as np
import pytest
import tensorflow as tf

import estimator_spec
from examples import keras_dlrm


def _batch(size=64, seed=3):
  features, labels = keras_dlrm.generate(size, seed=seed)
  return ({k: tf.constant(v) for k, v in features.items()},
          tf.constant(labels)), features


def _tables(embedding):
  return {t.name: v for t, v in embedding.embedding_tables.items()}


def _slots(embedding):
  return {t.name: {k: s.numpy() for k, s in slots.items()}
          for t, slots in embedding.slot_variables.items()}


def _numpy_activations(tables, features):
  """The lookups computed from the tables in numpy: a row per single-id
  feature, the mean of the item rows of `history`'s ids (zeros without
  ids)."""
  out = {}
  for name, _ in keras_dlrm.SINGLE:
    out[name] = tables[name][features[name]]
  history = features["history"]
  mask = history >= 0
  rows = tables["item"][np.maximum(history, 0)] * mask[..., None]
  out["history"] = rows.sum(1) / np.maximum(mask.sum(1), 1)[:, None]
  return {k: v.astype(np.float32) for k, v in out.items()}


@pytest.fixture(name="model")
def _model():
  tf.random.set_seed(0)
  return keras_dlrm.make_model(learning_rate=0.01)


def test_tables_are_not_keras_variables(model):
  table_ids = {id(v) for v in _tables(model.embedding).values()}
  assert table_ids
  assert not table_ids & {id(v) for v in model.trainable_variables}
  assert not table_ids & {id(v) for v in model.variables}
  # Only the dense layers are Keras' to train: 2 bottom + 3 top layers.
  assert len(model.trainable_variables) == 2 * 5


def test_one_train_step_is_the_tpu_optimizer_on_tables_and_keras_on_dense(
    model):
  (features, labels), raw = _batch()
  tables_before = {k: v.numpy() for k, v in _tables(model.embedding).items()}
  slots_before = _slots(model.embedding)
  dense_before = [v.numpy() for v in model.trainable_variables]

  # By hand: activations from the tables in numpy, gradients of the same
  # loss through a twin of the dense tower.
  activations = _numpy_activations(tables_before, raw)
  twin = keras_dlrm.DLRM(estimator_spec.HostTPUEmbedding(
      keras_dlrm.feature_config(), keras_dlrm.embedding_optimizer()))
  for variable, value in zip(twin.trainable_variables, dense_before):
    variable.assign(value)
  constants = {k: tf.constant(v) for k, v in activations.items()}
  with tf.GradientTape() as tape:
    tape.watch(constants)
    logits = twin.tower(features["numeric"], constants)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
        labels=labels, logits=logits))
  activation_grads, dense_grads = tape.gradient(
      loss, (constants, twin.trainable_variables))

  # The step under test: Keras' compiled train function.
  model.train_on_batch(features, labels)

  # Tables: what HostTPUEmbedding's own apply_gradients (the TPU Adagrad
  # with clipvalue) makes of the hand-computed gradients.
  reference = twin.embedding
  for name, variable in _tables(reference).items():
    variable.assign(tables_before[name])
  lookups = reference(keras_dlrm.embedding_inputs(features))
  for name, value in activations.items():
    np.testing.assert_allclose(lookups[name].numpy(), value, rtol=1e-6,
                               atol=1e-7)
  reference.apply_gradients(activation_grads)
  after = {k: v.numpy() for k, v in _tables(model.embedding).items()}
  expected = {k: v.numpy() for k, v in _tables(reference).items()}
  slots_after = _slots(model.embedding)
  for name in after:
    np.testing.assert_allclose(after[name], expected[name], rtol=1e-5,
                               atol=1e-6, err_msg=name)
    for slot, value in _slots(reference)[name].items():
      np.testing.assert_allclose(slots_after[name][slot], value, rtol=1e-5,
                                 err_msg=f"{name}/{slot}")
  # Lazy Adagrad: only the rows of this batch's ids moved, and they did.
  touched = {name: set(raw[name].tolist()) for name, _ in keras_dlrm.SINGLE}
  touched["item"] |= set(raw["history"][raw["history"] >= 0].tolist())
  for name, ids in touched.items():
    moved = np.flatnonzero((after[name] != tables_before[name]).any(1))
    assert set(moved.tolist()) == ids, name
    accumulators = slots_after[name]["accumulators"]
    grown = np.flatnonzero(
        (accumulators != slots_before[name]["accumulators"]).any(1))
    # (A tiny gradient's square can vanish beside 0.1 in float32.)
    assert set(grown.tolist()) <= ids and grown.size, name

  # The TPU Adagrad, in numpy, on the ids of the `category` table (no
  # other feature uses it): per-id gradient sums, clipped to [-1, 1],
  # accumulator 0.1 + g^2, step 0.1 * g / sqrt(accumulator).
  grads = np.zeros_like(tables_before["category"])
  np.add.at(grads, raw["category"], activation_grads["category"].numpy())
  grads = np.clip(grads, -1.0, 1.0)
  accumulator = 0.1 + grads**2
  numpy_table = tables_before["category"] - 0.1 * grads / np.sqrt(accumulator)
  ids = sorted(touched["category"])
  np.testing.assert_allclose(after["category"][ids], numpy_table[ids],
                             rtol=1e-5, atol=1e-6)

  # Dense layers: the model's Keras Adam applied to the same gradients.
  twin.compile(optimizer=keras.optimizers.Adam(0.01))
  twin.optimizer.apply_gradients(zip(dense_grads, twin.trainable_variables))
  for got, want in zip(model.trainable_variables, twin.trainable_variables):
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5,
                               atol=1e-6)
  assert any((got.numpy() != before).any() for got, before in
             zip(model.trainable_variables, dense_before))


def test_fit_lowers_the_loss():
  tf.random.set_seed(0)
  losses, before, after = keras_dlrm.main(
      ["--steps", "200", "--batch", "256", "--epochs", "4"])
  assert losses[-1] < losses[0] - 0.05, losses
  assert after < before - 0.1, (before, after)


def test_predict_changes_no_table(model):
  (features, _), _ = _batch(32)
  before = {k: v.numpy() for k, v in _tables(model.embedding).items()}
  logits = model.predict(tf.data.Dataset.from_tensors(features), verbose=0)
  assert logits.shape == (32, 1)
  for name, variable in _tables(model.embedding).items():
    np.testing.assert_array_equal(variable.numpy(), before[name])


def test_fit_creates_the_tables_outside_its_function_when_not_built():
  """Without HostTPUEmbedding.build() in the model's build, the first
  enqueue (inside fit's tf.function) still creates the tables, once."""

  class Lazy(keras_dlrm.DLRM):

    def build(self, input_shape=None):
      self.build_tower()  # the dense layers only
      self.built = True

  model = Lazy(estimator_spec.HostTPUEmbedding(
      keras_dlrm.feature_config(), keras_dlrm.embedding_optimizer()))
  with pytest.raises(RuntimeError, match="build"):
    model.embedding.embedding_tables  # pylint: disable=pointless-statement
  model.compile(optimizer=keras.optimizers.Adam(0.01))
  features, labels = keras_dlrm.generate(1024)
  model.fit(keras_dlrm.dataset(features, labels, 256), epochs=1,
            steps_per_epoch=1, shuffle=False, verbose=0)
  before = {k: v.numpy() for k, v in _tables(model.embedding).items()}
  tables = {k: id(v) for k, v in _tables(model.embedding).items()}
  model.fit(keras_dlrm.dataset(features, labels, 256), epochs=1,
            steps_per_epoch=3, shuffle=False, verbose=0)
  assert {k: id(v) for k, v in _tables(model.embedding).items()} == tables
  assert any((v.numpy() != before[k]).any()
             for k, v in _tables(model.embedding).items())



def test_saved_model_weights_and_embedding_checkpoint_restore_the_model(
    model, tmp_path):
  # As docs/keras.md says: the Keras weights with save_weights, the tables
  # and their slots with a tf.train.Checkpoint of the embedding.
  (features, labels), _ = _batch()
  model.train_on_batch(features, labels)
  weights = str(tmp_path / "dense.weights.h5")
  model.save_weights(weights)
  path = tf.train.Checkpoint(embedding=model.embedding).save(
      str(tmp_path / "embedding"))
  saved_tables = {k: v.numpy() for k, v in _tables(model.embedding).items()}
  saved_slots = _slots(model.embedding)
  saved_logits = model.predict_on_batch(features)

  tf.random.set_seed(7)  # another initialization
  fresh = keras_dlrm.make_model(learning_rate=0.01)
  assert not np.allclose(
      _tables(fresh.embedding)["user"].numpy(), saved_tables["user"])
  fresh.load_weights(weights)
  tf.train.Checkpoint(embedding=fresh.embedding).restore(
      path).assert_consumed()
  for name, value in saved_tables.items():
    np.testing.assert_array_equal(_tables(fresh.embedding)[name].numpy(),
                                  value)
  restored_slots = _slots(fresh.embedding)
  for table, slots in saved_slots.items():
    for slot, value in slots.items():
      np.testing.assert_array_equal(restored_slots[table][slot], value)
  np.testing.assert_allclose(fresh.predict_on_batch(features), saved_logits,
                             rtol=1e-6, atol=1e-7)
