"""A TF 1.15-era program: tf.contrib.tpu beside tf.compat.v1 names."""
from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import sys

import numpy as np
import tensorflow as tf
from tensorflow.contrib import tpu as contrib_tpu

FLAGS_batch = 8
_VOCAB = 30


def _input_fn(params):
  """Sparse ids of one feature plus weights, and a dense numeric feature."""
  n = params["batch_size"]
  rng = np.random.RandomState(1)
  ids = rng.randint(0, _VOCAB, (128, 2)).astype(np.int64)
  weights = rng.uniform(0.5, 1.5, (128, 2)).astype(np.float32)
  dense = rng.normal(size=(128, 1)).astype(np.float32)
  labels = rng.normal(size=(128, 1)).astype(np.float32)
  ds = tf.data.Dataset.from_tensor_slices(
      ({"item": ids, "item_weight": weights, "age": dense}, labels))
  ds = ds.repeat().batch(n, drop_remainder=True)

  def to_sparse(features, label):
    return ({"item": tf.sparse.from_dense(features["item"] + 1),
             "item_weight": tf.sparse.from_dense(features["item_weight"]),
             "age": features["age"]}, label)

  return ds.map(to_sparse)


def _columns():
  item = tf.feature_column.weighted_categorical_column(
      tf.feature_column.categorical_column_with_identity("item", _VOCAB + 1),
      "item_weight")
  embedded = tf.compat.v1.tpu.experimental.embedding_column(
      item, dimension=4, combiner="sqrtn")
  return [embedded], [tf.feature_column.numeric_column("age")]


def model_fn(features, labels, mode, params):
  """Regression on the weighted embedding and the numeric feature."""
  embedded, numeric = _columns()
  net = tf.compat.v1.feature_column.input_layer(features, embedded + numeric)
  net = tf.compat.v1.layers.dense(net, 8, activation=tf.nn.relu)
  predictions = tf.compat.v1.layers.dense(net, 1)
  if mode == tf.estimator.ModeKeys.PREDICT:
    return contrib_tpu.TPUEstimatorSpec(mode,
                                        predictions={"value": predictions})
  loss = tf.compat.v1.losses.mean_squared_error(labels, predictions)
  optimizer = contrib_tpu.CrossShardOptimizer(
      tf.compat.v1.train.GradientDescentOptimizer(0.05))
  train_op = optimizer.minimize(loss, tf.compat.v1.train.get_global_step())
  return contrib_tpu.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)


def main(model_dir):
  embedded, _ = _columns()
  config = contrib_tpu.RunConfig(
      model_dir=model_dir, save_checkpoints_steps=3,
      tpu_config=contrib_tpu.TPUConfig(iterations_per_loop=3))
  estimator = contrib_tpu.TPUEstimator(
      model_fn=model_fn, config=config, use_tpu=False,
      train_batch_size=FLAGS_batch, eval_batch_size=FLAGS_batch,
      predict_batch_size=FLAGS_batch,
      embedding_config_spec=tf.compat.v1.estimator.tpu.experimental
      .EmbeddingConfigSpec(
          feature_columns=embedded,
          optimization_parameters=(
              tf.compat.v1.tpu.experimental.FtrlParameters(
                  learning_rate=0.1)),
          clipping_limit=5.0))
  estimator.train(input_fn=_input_fn, max_steps=6)
  metrics = estimator.evaluate(input_fn=_input_fn, steps=2)
  prediction = next(estimator.predict(input_fn=_input_fn))

  def serving_input_fn():
    features = {
        "item": tf.compat.v1.sparse_placeholder(tf.int64, [None, 2]),
        "item_weight": tf.compat.v1.sparse_placeholder(tf.float32, [None, 2]),
        "age": tf.compat.v1.placeholder(tf.float32, [None, 1]),
    }
    return tf.estimator.export.ServingInputReceiver(features, features)

  exported = estimator.export_saved_model(model_dir + "/export",
                                          serving_input_fn)
  print("RESULT step=%d loss=%.4f value=%.4f export=%s" % (
      metrics["global_step"], metrics["loss"], prediction["value"][0],
      exported.decode()))


if __name__ == "__main__":
  main(sys.argv[1])
