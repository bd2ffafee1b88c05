"""The estimator model of docs/tf2_migration.md, as a checked-in fixture.

docs/tf2_migration.md runs on TF 2.15 only (the estimator needs it). Its
TF2 half is shown to work on current TensorFlow through saved outputs: on
TF 2.15, `generate(directory)` trains this module's estimator model a few
steps, exports its checkpoint with `export_mid_level_checkpoint` to
`<directory>/embedding`, restores that into `HostTPUEmbedding` and saves in
`<directory>/expected.npz`

- `ids/<feature>`: one batch of ids ([batch, width], -1 = no id);
- `grads/<feature>`: a fixed gradient of each feature's activations;
- `lookups/<feature>`: the activations of that batch;
- `after/<table>`, `after/<table>/accumulators`: every row of each table
  and its Adagrad accumulators after one step with those gradients.

tests/test_tf2_migration_fixture.py restores the checked-in copy (in
tests/data/tf2_migration/) on both TensorFlow versions and checks it
against a regeneration on TF 2.15. Regenerate it with

    .venv/bin/python -m tests.tf2_migration_fixture

`spec()`, `batch()` and `as_sparse` need only the columns and the config
model, which work on current TensorFlow too; `generate` needs TF 2.15.
"""
import os
import pathlib
import shutil
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

import estimator_spec as es  # pylint: disable=g-import-not-at-top
import tpu_embedding_columns as tec  # pylint: disable=g-import-not-at-top

DIRECTORY = pathlib.Path(__file__).resolve().parent / "data" / "tf2_migration"
PREFIX = "embedding"
EXPECTED = "expected.npz"
BATCH = 8
TRAIN_STEPS = 3
SEED = 3
FEATURES = ("user_id", "item_id", "clicked_items")


def columns():
  """The page's columns: user; item and its click history sharing a table.
  Their initializers have their own seeds (as the dense layer's): the
  RunConfig's `tf_random_seed` does not make two runs start alike."""
  fc = tf.feature_column
  user = tec.embedding_column(
      fc.categorical_column_with_identity("user_id", 50), dimension=4,
      combiner="mean", initializer=_initializer(SEED))
  item, clicked = tec.shared_embedding_columns(
      [fc.categorical_column_with_identity("item_id", 30),
       fc.sequence_categorical_column_with_identity("clicked_items", 30)],
      dimension=4, max_sequence_lengths=[0, 3],
      initializer=_initializer(SEED + 1))
  return user, item, clicked


def _initializer(seed):
  return tf.compat.v1.truncated_normal_initializer(stddev=0.5, seed=seed)


def spec(cols=None):
  return es.EmbeddingConfigSpec(
      feature_columns=list(cols or columns()),
      optimization_parameters=es.AdagradParameters(
          0.1, clip_gradient_min=-0.02, clip_gradient_max=0.02),
      partition_strategy="mod")


def examples(n, seed):
  """n examples: {feature: [n, width] ids, -1 = no id}, labels [n, 1]."""
  rng = np.random.RandomState(seed)
  clicks = rng.randint(0, 30, (n, 4))
  clicks[np.arange(4) >= rng.randint(1, 5, (n, 1))] = -1
  features = {"user_id": rng.randint(0, 50, (n, 1)),
              "item_id": rng.randint(0, 30, (n, 1)),
              "clicked_items": clicks}
  return features, rng.randint(0, 2, (n, 1)).astype(np.float32)


def batch():
  """The batch whose lookups and next step the fixture holds, and the
  fixed activation gradients of that step ({feature: array})."""
  features, _ = examples(BATCH, SEED + 1)
  rng = np.random.RandomState(SEED + 2)
  grads = {"user_id": rng.uniform(-0.05, 0.05, (BATCH, 4)),
           "item_id": rng.uniform(-0.05, 0.05, (BATCH, 4)),
           "clicked_items": rng.uniform(-0.05, 0.05, (BATCH, 3, 4))}
  return features, {k: v.astype(np.float32) for k, v in grads.items()}


def as_sparse(ids):
  """[batch, width] ids, -1 where there is none, as a SparseTensor."""
  ids = tf.cast(ids, tf.int64)
  where = tf.where(ids >= 0)
  return tf.SparseTensor(where, tf.gather_nd(ids, where),
                         tf.shape(ids, out_type=tf.int64))


def state(embedding, config):
  """{'after/<table>' and 'after/<table>/<slot>': array} of an embedding."""
  result = {}
  for name, table in config.tables.items():
    result[f"after/{name}"] = embedding.embedding_tables[table].numpy()
    for slot, variable in embedding.slot_variables[table].items():
      result[f"after/{name}/{slot}"] = variable.numpy()
  return result


def _estimator(model_dir, cols):
  """The page's estimator (a dense layer trained with SGD)."""
  user, item, clicked = cols
  v1 = tf.compat.v1

  def model_fn(features, labels, mode, params):
    del params
    users = v1.keras.layers.DenseFeatures([user])(features)
    items = v1.keras.layers.DenseFeatures([item])(features)
    history, lengths = tf.keras.experimental.SequenceFeatures([clicked])(
        features)
    pooled = tf.reduce_sum(history, 1) / tf.maximum(
        tf.cast(lengths, tf.float32), 1.0)[:, None]
    logits = v1.layers.dense(tf.concat([users, items, pooled], 1), 1,
                             kernel_initializer=_initializer(SEED + 2),
                             name="logits")
    loss = v1.losses.sigmoid_cross_entropy(labels, logits)
    train_op = v1.tpu.CrossShardOptimizer(
        v1.train.GradientDescentOptimizer(0.5)).minimize(
            loss, v1.train.get_global_step())
    return es.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)

  tpu = v1.estimator.tpu
  return es.TPUEstimator(
      model_fn=model_fn,
      config=tpu.RunConfig(model_dir=str(model_dir)),
      use_tpu=False, train_batch_size=BATCH,
      embedding_config_spec=spec(cols))


def generate(directory):
  """Writes the fixture into `directory` (TF 2.15); returns the npz dict."""
  from estimator_spec import interop  # pylint: disable=import-outside-toplevel
  from estimator_spec.checkpoints import read_rows  # pylint: disable=import-outside-toplevel
  directory = pathlib.Path(directory)
  directory.mkdir(parents=True, exist_ok=True)
  cols = columns()
  model_spec = spec(cols)
  features, labels = examples(TRAIN_STEPS * BATCH, SEED)

  def input_fn(params):
    data = tf.data.Dataset.from_tensor_slices((features, labels))
    return data.batch(params["batch_size"], drop_remainder=True).map(
        lambda f, y: ({k: as_sparse(v) for k, v in f.items()}, y))

  model_dir = tempfile.mkdtemp()
  try:
    _estimator(model_dir, cols).train(input_fn, max_steps=TRAIN_STEPS)
    prefix = es.interop.export_mid_level_checkpoint(
        model_dir, model_spec, str(directory / PREFIX))
    config = interop.to_mid_level(model_spec)
    host = es.HostTPUEmbedding(*config)
    status = tf.train.Checkpoint(embedding=host).restore(prefix)
    host.build()
    status.assert_consumed()
    # The export holds the estimator's rows (a check of the generator).
    for name, table in config.tables.items():
      np.testing.assert_array_equal(
          host.embedding_tables[table].numpy(),
          read_rows(model_dir, model_spec, name,
                    np.arange(table.vocabulary_size)))
  finally:
    shutil.rmtree(model_dir, ignore_errors=True)
  ids, grads = batch()
  lookups = host({k: as_sparse(v) for k, v in ids.items()})
  host.apply_gradients({k: tf.constant(v) for k, v in grads.items()})
  saved = {f"ids/{k}": v for k, v in ids.items()}
  saved.update({f"grads/{k}": v for k, v in grads.items()})
  saved.update({f"lookups/{k}": v.numpy() for k, v in lookups.items()})
  saved.update(state(host, config))
  np.savez(directory / EXPECTED, **saved)
  return saved


if __name__ == "__main__":
  if DIRECTORY.exists():
    shutil.rmtree(DIRECTORY)
  generate(DIRECTORY)
  print(f"wrote {DIRECTORY}:",
        ", ".join(sorted(p.name for p in DIRECTORY.iterdir())))
