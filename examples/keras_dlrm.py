"""A DLRM-style Keras model whose tables train with the TPU embedding
optimizer and whose dense layers train with a Keras optimizer.

The one way to do it: a `keras.Model` subclass (`DLRM` here) that holds an
`estimator_spec.HostTPUEmbedding` and overrides `train_step`:

1. `embedding.enqueue(ids)` and `embedding.dequeue()` give the activations;
2. the dense tower (bottom MLP, pairwise dot-product interactions, top MLP)
   runs under a `tf.GradientTape` that watches the activations;
3. the dense variables' gradients go to the model's Keras optimizer
   (`model.compile(optimizer=...)`), the activations' gradients go to
   `embedding.apply_gradients`, which trains the tables with the TPU
   embedding optimizer given in the `FeatureConfig`/`TableConfig`
   (per-id gradient sums, clipping, slots: docs/numerics.md, 'Lookup' to
   'Pipelining').

The tables are not Keras variables: they are not in
`model.trainable_variables`, so the Keras optimizer never touches them.
`HostTPUEmbedding.build()` creates them in `DLRM.build` (called from
`__init__`), outside the `tf.function` that `model.fit` traces
`train_step` into. `model.fit`, `model.evaluate` and `model.predict` then
work as usual on a `tf.data` dataset of `(features, labels)`.

Runs with Keras 3 on current TensorFlow (`make venv-tf2`), with TF 2.15's
Keras 2 (`tf.keras`), and with Keras 2 on current TensorFlow (the
`tf_keras` package, chosen as TensorFlow chooses it: TF_USE_LEGACY_KERAS=1):
the code uses only what both offer.

Usage: python -m examples.keras_dlrm [--steps 200] [--batch 256]
"""
import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

if os.environ.get("TF_USE_LEGACY_KERAS") == "1":
  import tf_keras as keras  # pylint: disable=g-import-not-at-top
else:
  import keras  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

import estimator_spec  # pylint: disable=g-import-not-at-top

emb = tf.tpu.experimental.embedding

NUM_NUMERIC = 8
DIM = 8
# Single-id features: (name, vocabulary size). "history" (several ids per
# example, mean-combined) shares the "item" table.
SINGLE = (("user", 5_000), ("item", 2_000), ("category", 100),
          ("country", 50))
HISTORY_WIDTH = 8


def feature_config(optimizer=None):
  """{feature: TF2 FeatureConfig}: one table per single-id feature, the
  `history` feature on the item table. `optimizer` (optional) is the item
  table's own optimizer; the others use HostTPUEmbedding's default."""
  tables = {}
  for name, vocabulary in SINGLE:
    tables[name] = emb.TableConfig(
        vocabulary_size=vocabulary, dim=DIM, name=name,
        combiner="mean",
        initializer=tf.random_uniform_initializer(-0.05, 0.05, seed=len(name)),
        optimizer=optimizer if name == "item" else None)
  config = {name: emb.FeatureConfig(tables[name], name=name)
            for name, _ in SINGLE}
  config["history"] = emb.FeatureConfig(tables["item"], name="history")
  return config


def embedding_optimizer():
  """The tables' TPU embedding optimizer: Adagrad with gradient clipping."""
  return emb.Adagrad(learning_rate=0.1, initial_accumulator_value=0.1,
                     clipvalue=1.0)


def generate(num_examples, seed=0):
  """(features, labels): features {name: numpy array}: `numeric` [N, 8]
  float32, one id column [N] int64 per single-id feature, `history`
  [N, 8] int64 padded with -1; labels [N, 1] float32 clicks drawn from a
  hidden model (a weight per id, a linear numeric term), ids Zipf
  distributed so that frequent ids are learnable."""
  rng = np.random.RandomState(seed)
  hidden = np.random.RandomState(1234)
  features, logit = {}, np.zeros(num_examples)
  for name, vocabulary in SINGLE:
    weights = hidden.normal(0.0, 1.0, size=vocabulary)
    ranks = np.minimum(rng.zipf(1.3, size=num_examples), 10**9)
    ids = (ranks.astype(np.int64) * 2654435761) % vocabulary
    features[name] = ids
    logit += weights[ids]
    if name == "item":
      item_weights = weights
  ranks = np.minimum(rng.zipf(1.3, size=(num_examples, HISTORY_WIDTH)), 10**9)
  history = (ranks.astype(np.int64) * 2654435761) % dict(SINGLE)["item"]
  lengths = rng.randint(0, HISTORY_WIDTH + 1, size=num_examples)
  mask = np.arange(HISTORY_WIDTH)[None, :] < lengths[:, None]
  logit += (np.where(mask, item_weights[history], 0.0).sum(1) /
            np.maximum(lengths, 1))
  features["history"] = np.where(mask, history, -1)
  numeric = rng.normal(size=(num_examples, NUM_NUMERIC)).astype(np.float32)
  features["numeric"] = numeric
  logit += numeric @ np.linspace(-1.0, 1.0, NUM_NUMERIC)
  logit = 2.0 * (logit - logit.mean()) / logit.std() - 0.5
  labels = rng.uniform(size=num_examples) < 1 / (1 + np.exp(-logit))
  return features, labels.astype(np.float32).reshape(-1, 1)


def dataset(features, labels, batch_size, repeat=True):
  """A tf.data dataset of (features, labels) batches (dense tensors: the
  model turns `history`'s -1 padding into ragged ids)."""
  data = tf.data.Dataset.from_tensor_slices((features, labels))
  if repeat:
    data = data.repeat()
  return data.batch(batch_size, drop_remainder=True).prefetch(2)


def embedding_inputs(features):
  """The HostTPUEmbedding inputs of a batch: dense [batch] ids for the
  single-id features, ragged ids for `history`."""
  ids = {name: features[name] for name, _ in SINGLE}
  ids["history"] = tf.RaggedTensor.from_tensor(features["history"],
                                               padding=-1)
  return ids


class DLRM(keras.Model):
  """Bottom MLP on the numeric features, the embeddings, pairwise dot
  products, top MLP -> click logit.

  Args:
    embedding: an `estimator_spec.HostTPUEmbedding` over `feature_config()`
      (its optimizer trains the tables).
    bottom, top: widths of the bottom and top MLPs' hidden layers.
  """

  def __init__(self, embedding, bottom=(32,), top=(64, 32), **kwargs):
    super().__init__(**kwargs)
    self.embedding = embedding
    self.bottom = [keras.layers.Dense(w, activation="relu") for w in bottom]
    self.bottom.append(keras.layers.Dense(DIM, activation="relu"))
    self.top = [keras.layers.Dense(w, activation="relu") for w in top]
    self.top.append(keras.layers.Dense(1))
    self.loss_tracker = keras.metrics.Mean(name="loss")
    self.build(None)

  def build(self, input_shape=None):
    """Creates every variable, eagerly: the embedding tables and slots
    (HostTPUEmbedding.build) and the dense layers."""
    del input_shape
    self.embedding.build()
    self.build_tower()

  def build_tower(self):
    """Creates the dense layers' variables."""
    width = NUM_NUMERIC
    for layer in self.bottom:
      layer.build((None, width))
      width = layer.units
    vectors = len(SINGLE) + 2   # the bottom output, the embeddings
    width = DIM + vectors * (vectors - 1) // 2
    for layer in self.top:
      layer.build((None, width))
      width = layer.units
    self.built = True

  @property
  def metrics(self):
    return [self.loss_tracker]

  def tower(self, numeric, activations):
    """The dense part: click logits [batch, 1] from the numeric features
    and the activations {feature: [batch, DIM]}."""
    x = numeric
    for layer in self.bottom:
      x = layer(x)
    names = [name for name, _ in SINGLE] + ["history"]
    vectors = tf.stack([x] + [activations[n] for n in names], axis=1)
    dots = tf.matmul(vectors, vectors, transpose_b=True)
    upper = np.triu_indices(len(names) + 1, k=1)
    pairs = tf.gather_nd(
        tf.transpose(dots, [1, 2, 0]), np.stack(upper, axis=1))
    x = tf.concat([x, tf.transpose(pairs)], axis=1)
    for layer in self.top:
      x = layer(x)
    return x

  def call(self, features, training=False):
    """Click logits; lookups only (no table update follows)."""
    del training
    self.embedding.enqueue(embedding_inputs(features), training=False)
    return self.tower(features["numeric"], self.embedding.dequeue())

  def compute_gradients(self, features, labels):
    """(loss, activation gradients {feature: [batch, DIM]}, dense
    gradients in the order of `trainable_variables`) of one batch; the
    embedding is enqueued and dequeued for training, ready for its
    `apply_gradients`."""
    self.embedding.enqueue(embedding_inputs(features), training=True)
    activations = self.embedding.dequeue()
    with tf.GradientTape() as tape:
      tape.watch(activations)
      logits = self.tower(features["numeric"], activations)
      loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
          labels=labels, logits=logits))
    activation_grads, dense_grads = tape.gradient(
        loss, (activations, self.trainable_variables))
    return loss, activation_grads, dense_grads

  def train_step(self, data):
    features, labels = _unpack(data)
    loss, activation_grads, dense_grads = self.compute_gradients(
        features, labels)
    self.optimizer.apply_gradients(zip(dense_grads, self.trainable_variables))
    self.embedding.apply_gradients(activation_grads)
    self.loss_tracker.update_state(loss)
    return {"loss": self.loss_tracker.result()}

  def test_step(self, data):
    features, labels = _unpack(data)
    logits = self(features)
    self.loss_tracker.update_state(tf.reduce_mean(
        tf.nn.sigmoid_cross_entropy_with_logits(labels=labels,
                                                logits=logits)))
    return {"loss": self.loss_tracker.result()}


def _unpack(data):
  features, labels, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
  if sample_weight is not None:
    raise ValueError("DLRM: sample weights are not supported.")
  return features, labels


def make_model(learning_rate=0.01):
  """A compiled DLRM: Keras Adam on the dense layers, the TPU embedding
  Adagrad (`embedding_optimizer()`) on the tables."""
  embedding = estimator_spec.HostTPUEmbedding(feature_config(),
                                              embedding_optimizer())
  model = DLRM(embedding)
  model.compile(optimizer=keras.optimizers.Adam(learning_rate))
  return model


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=200)
  parser.add_argument("--batch", type=int, default=256)
  parser.add_argument("--epochs", type=int, default=4)
  args = parser.parse_args(argv)
  tf.random.set_seed(0)
  features, labels = generate(args.steps * args.batch)
  held_out = generate(4096, seed=1)
  model = make_model()
  before = model.evaluate(dataset(*held_out, 1024, repeat=False),
                          verbose=0, return_dict=True)["loss"]
  history = model.fit(dataset(features, labels, args.batch),
                      epochs=args.epochs,
                      steps_per_epoch=args.steps // args.epochs, shuffle=False,
                      verbose=2)
  after = model.evaluate(dataset(*held_out, 1024, repeat=False),
                         verbose=0, return_dict=True)["loss"]
  print(f"keras {keras.__version__}, tensorflow {tf.__version__}")
  print("training loss per epoch:",
        " ".join(f"{v:.4f}" for v in history.history["loss"]))
  print(f"held-out log loss: {before:.4f} before, {after:.4f} after")
  return history.history["loss"], before, after


if __name__ == "__main__":
  main()
