"""HostTPUEmbedding on two replicas (MirroredStrategy over two logical CPU
devices) against one replica on the global batch.

Run as a program (a fresh process: logical devices must be set before
TensorFlow starts): `python tests/replica_scenarios.py OUT.npz`. It writes
the arrays and facts that tests/test_host_tpu_embedding_replicas.py checks;
nothing is compared here.

The model: table t (11 x 3, Adagrad with `clipvalue`, the default
optimizer) read by a SparseTensor feature and a RaggedTensor feature with
weights; table s (5 x 2, its own Adam) read by dense ids [batch], a
sequence feature and dense ids [batch, 2, 1] (each id looked up alone:
activations [batch, 2, dim]). The loss is the sum of activations times fixed per-example
weights over the global batch size (as `tf.nn.compute_average_loss`
scales), so each replica's gradient is its share of the global batch's.
The replicas' inputs differ in width (the sparse and sequence widths of
one replica's half are smaller than the other's).
"""
import contextlib
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf

CPUS = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(
    CPUS[0], [tf.config.LogicalDeviceConfiguration()] * 2)

import estimator_spec as es  # pylint: disable=g-import-not-at-top

emb = tf.tpu.experimental.embedding
GLOBAL = 4
STEPS = 3
DIMS = {"f": 3, "g": 3, "h": 2, "q": 2, "p": 2}


def feature_config():
  t = emb.TableConfig(
      vocabulary_size=11, dim=3, name="t",
      initializer=tf.constant_initializer(
          np.random.RandomState(3).uniform(-1, 1, (11, 3))))
  s = emb.TableConfig(
      vocabulary_size=5, dim=2, name="s", combiner="mean",
      optimizer=emb.Adam(0.05),
      initializer=tf.constant_initializer(
          np.random.RandomState(4).uniform(-1, 1, (5, 2))))
  return {"f": emb.FeatureConfig(t), "g": emb.FeatureConfig(t),
          "h": emb.FeatureConfig(s),
          "q": emb.FeatureConfig(s, max_sequence_length=3),
          "p": emb.FeatureConfig(s)}


def optimizer():
  return emb.Adagrad(0.1, clipvalue=0.5)


def _sparse(rows):
  indices = [[b, p] for b, row in enumerate(rows) for p in range(len(row))]
  values = [x for row in rows for x in row]
  width = max([1] + [len(row) for row in rows])
  return tf.SparseTensor(np.array(indices, np.int64).reshape(-1, 2),
                         np.array(values, np.int64), [len(rows), width])


def batch(step):
  """(features, weights, loss weights) of the global batch at `step`."""
  rng = np.random.RandomState(10 + step)
  # Replica 0 gets examples 0-1, replica 1 examples 2-3; the first half
  # has wider rows than the second.
  f = [[1, 3, 3, 9], [7], [2], []]
  g = [[3, 1], [10, 0, 4], [2], [5]]
  gw = [[0.5, 2.0], [1.0, -1.5, 0.25], [3.0], [1.0]]
  q = [[1, 2, 3, 4], [0], [2], [4, 4]]
  shift = step % 3
  f = [[(x + shift) % 11 for x in row] for row in f]
  q = [[(x + shift) % 5 for x in row] for row in q]
  features = {"f": _sparse(f), "g": tf.ragged.constant(g, tf.int64),
              "h": tf.constant([(2 + step) % 5, 0, 4, 1], tf.int64),
              "q": _sparse(q),
              "p": tf.constant([[[1], [2]], [[3], [3]], [[0], [4]],
                                [[step % 5], [1]]], tf.int64)}
  weights = {"f": None, "g": tf.ragged.constant(gw, tf.float32),
             "h": None, "q": None, "p": None}
  loss_weights = {
      "f": rng.uniform(-1, 1, (GLOBAL, 3)).astype(np.float32),
      "g": rng.uniform(-1, 1, (GLOBAL, 3)).astype(np.float32),
      "h": rng.uniform(-1, 1, (GLOBAL, 2)).astype(np.float32),
      "q": rng.uniform(-1, 1, (GLOBAL, 3, 2)).astype(np.float32),
      "p": rng.uniform(-1, 1, (GLOBAL, 2, 2)).astype(np.float32)}
  return features, weights, loss_weights


def _loss(activations, loss_weights):
  return tf.add_n([
      tf.reduce_sum(activations[k] * loss_weights[k]) for k in DIMS
  ]) / GLOBAL


def _dequeue_and_train(embedding, loss_weights):
  """dequeue, the loss's gradient, apply_gradients; the activations."""
  with tf.GradientTape() as tape:
    activations = embedding.dequeue()
    tape.watch(activations)
    loss = _loss(activations, loss_weights)
  embedding.apply_gradients(tape.gradient(loss, activations))
  return activations


def _state(embedding):
  out = {}
  for table, variable in embedding.embedding_tables.items():
    out[f"table/{table.name}"] = variable.numpy()
    for slot, value in embedding.slot_variables[table].items():
      out[f"slot/{table.name}/{slot}"] = value.numpy()
  return out


def reference():
  """One replica, no strategy, the global batch."""
  embedding = es.HostTPUEmbedding(feature_config(), optimizer())

  @tf.function
  def step(features, weights, loss_weights):
    embedding.enqueue(features, weights)
    return _dequeue_and_train(embedding, loss_weights)

  out = {}
  for i in range(STEPS):
    activations = step(*batch(i))
    for k in DIMS:
      out[f"activations/{i}/{k}"] = activations[k].numpy()
  out.update(_state(embedding))
  features, weights, _ = batch(0)
  embedding.enqueue(features, weights, training=False)
  for k, value in embedding.dequeue().items():
    out[f"whole_batch/{k}"] = value.numpy()
  return out


def _dataset():
  dataset = None
  for i in range(STEPS):
    element = tf.data.Dataset.from_tensors(batch(i))
    dataset = element if dataset is None else dataset.concatenate(element)
  return dataset


def mirrored(strategy, mode):
  """Two replicas. mode: 'function' (enqueue outside strategy.run, in a
  tf.function: TF2's own pattern), 'inside' (enqueue inside strategy.run),
  'eager' (as 'function', without tf.function)."""
  with strategy.scope():
    embedding = es.HostTPUEmbedding(feature_config(), optimizer())
  iterator = iter(strategy.experimental_distribute_dataset(_dataset()))

  def replica_step(loss_weights, features=None, weights=None):
    if features is not None:
      embedding.enqueue(features, weights)
    return _dequeue_and_train(embedding, loss_weights)

  def step():
    features, weights, loss_weights = next(iterator)
    if mode == "inside":
      return strategy.run(replica_step,
                          args=(loss_weights, features, weights))
    embedding.enqueue(features, weights)
    return strategy.run(replica_step, args=(loss_weights,))

  if mode != "eager":
    step = tf.function(step)
  out = {}
  for i in range(STEPS):
    activations = step()
    for k in DIMS:
      out[f"activations/{i}/{k}"] = np.concatenate([
          v.numpy() for v in strategy.experimental_local_results(
              activations[k])])
  out.update(_state(embedding))
  # Plain tensors outside strategy.run are one batch: lookups of the whole
  # batch, in cross-replica context (a Keras model called on a batch).
  features, weights, _ = batch(0)
  embedding.enqueue(features, weights, training=False)
  for k, value in embedding.dequeue().items():
    out[f"whole_batch/{k}"] = value.numpy()
  out["plain_variables"] = np.array(not any(
      isinstance(v, tf.distribute.DistributedValues)
      for v in embedding.embedding_tables.values()))
  out["table_devices"] = np.array(sorted(
      {v.device for v in embedding.embedding_tables.values()}))
  return out, embedding


def keras_fit(strategy):
  """A Keras model whose train_step trains the tables with the embedding's
  optimizer and the dense layer with Keras' SGD, fit for 4 steps of a
  global batch of 8 (under `strategy`, or with none)."""
  import keras  # pylint: disable=g-import-not-at-top

  table = emb.TableConfig(
      vocabulary_size=30, dim=4, name="items",
      initializer=tf.constant_initializer(
          np.random.RandomState(5).uniform(-1, 1, (30, 4))))

  class Model(keras.Model):

    def __init__(self):
      super().__init__()
      self.embedding = es.HostTPUEmbedding(
          {"items": emb.FeatureConfig(table)},
          emb.Adagrad(0.2, clipvalue=0.3))
      self.logit = keras.layers.Dense(
          1, kernel_initializer=keras.initializers.Constant(
              np.linspace(-1, 1, 4).reshape(4, 1)))
      self.build(None)

    def build(self, input_shape=None):
      self.embedding.build()
      self.logit.build((None, 4))
      self.built = True

    def train_step(self, data):
      ids, labels = data
      self.embedding.enqueue({"items": tf.RaggedTensor.from_tensor(ids)})
      activations = self.embedding.dequeue()
      with tf.GradientTape() as tape:
        tape.watch(activations)
        logits = self.logit(activations["items"])
        loss = tf.nn.compute_average_loss(
            tf.nn.sigmoid_cross_entropy_with_logits(labels, logits)[:, 0],
            global_batch_size=8)
      activation_grads, dense_grads = tape.gradient(
          loss, (activations, self.trainable_variables))
      self.optimizer.apply_gradients(zip(dense_grads,
                                         self.trainable_variables))
      self.embedding.apply_gradients(activation_grads)
      return {"loss": loss}

  rng = np.random.RandomState(7)
  ids = rng.randint(0, 30, size=(32, 2))
  labels = (ids[:, :1] % 3 == 0).astype(np.float32)
  data = tf.data.Dataset.from_tensor_slices((ids, labels)).batch(8)
  with strategy.scope() if strategy else contextlib.nullcontext():
    model = Model()
    model.compile(optimizer=keras.optimizers.SGD(0.5))
  model.fit(data, epochs=1, verbose=0)
  out = {f"keras/{k}": v for k, v in _state(model.embedding).items()}
  out["keras/kernel"] = np.array(model.logit.kernel)
  out["keras/plain_variables"] = np.array(not isinstance(
      model.embedding.embedding_tables[table], tf.distribute.DistributedValues))
  return out


def errors(strategy):
  """The messages of what is refused under a strategy."""
  out = {}

  def message(fn):
    try:
      fn()
    except (ValueError, RuntimeError) as error:
      return str(error)
    return ""

  with strategy.scope():
    embedding = es.HostTPUEmbedding(feature_config(), optimizer())
  features, weights, _ = batch(0)
  distributed = next(iter(strategy.experimental_distribute_dataset(
      tf.data.Dataset.from_tensors((features, weights)))))
  embedding.enqueue(*distributed)
  out["dequeue_outside_run"] = message(embedding.dequeue)
  embedding.enqueue(features, weights)  # one batch that no replica owns
  out["dequeue_one_batch_inside_run"] = message(
      lambda: strategy.run(embedding.dequeue))
  embedding.enqueue(*distributed)
  strategy.run(embedding.dequeue)
  out["one_value_for_all"] = message(lambda: embedding.apply_gradients(
      {k: tf.zeros([GLOBAL, DIMS[k]]) for k in DIMS}))
  outsider = es.HostTPUEmbedding(feature_config(), optimizer())
  out["other_strategy"] = message(lambda: strategy.run(
      lambda: outsider.enqueue(features, weights)))
  # Per-replica values given, outside strategy.run, to an object made
  # without a strategy.
  out["per_replica_values_without_a_strategy"] = message(
      lambda: outsider.enqueue(*distributed))
  central = tf.distribute.experimental.CentralStorageStrategy()
  with central.scope():
    out["unsupported_strategy"] = message(
        lambda: es.HostTPUEmbedding(feature_config(), optimizer()))
  return out


def main(path):
  strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
  results = {}
  for key, value in reference().items():
    results["reference/" + key] = value
  for key, value in keras_fit(None).items():
    results["reference/" + key] = value
  for key, value in keras_fit(strategy).items():
    results["mirrored/" + key] = value
  for mode in ("function", "inside", "eager"):
    out, embedding = mirrored(strategy, mode)
    for key, value in out.items():
      results[f"{mode}/{key}"] = value
  # A checkpoint saved under the strategy restores without one.
  directory = os.path.dirname(os.path.abspath(path))
  saved = tf.train.Checkpoint(embedding=embedding).save(
      os.path.join(directory, "replicas"))
  restored = es.HostTPUEmbedding(feature_config(), optimizer())
  restored.build()
  tf.train.Checkpoint(embedding=restored).restore(saved).assert_consumed()
  for key, value in _state(restored).items():
    results["restored/" + key] = value
  results["checkpoint_keys"] = np.array(sorted(
      name for name, _ in tf.train.list_variables(saved)))
  for key, value in errors(strategy).items():
    results["error/" + key] = np.array(value)
  np.savez(path, **results)


if __name__ == "__main__":
  main(sys.argv[1])
