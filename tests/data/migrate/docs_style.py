"""A click model as TF's EmbeddingConfigSpec documentation writes one."""
import sys

import numpy as np
import tensorflow.compat.v1 as tf

BATCH = 16
VOCAB = 50


def input_fn(params):
  batch_size = params["batch_size"]
  rng = np.random.RandomState(0)
  watched = rng.randint(0, VOCAB, (256, 3)).astype(np.int64)
  impression = rng.randint(0, VOCAB, (256, 1)).astype(np.int64)
  labels = (watched[:, :1] % 2 == impression % 2).astype(np.float32)
  dataset = tf.data.Dataset.from_tensor_slices(
      ({"watched": watched, "impression": impression}, labels))
  dataset = dataset.repeat().batch(batch_size, drop_remainder=True)
  return dataset.map(lambda f, y: (
      {k: tf.sparse.from_dense(v + 1) for k, v in f.items()}, y))


column_watched = tf.feature_column.categorical_column_with_identity(
    "watched", VOCAB + 1)
column_impression = tf.feature_column.categorical_column_with_identity(
    "impression", VOCAB + 1)
embedding_watched, embedding_impression = (
    tf.tpu.experimental.shared_embedding_columns(
        [column_watched, column_impression], dimension=8))


def model_fn(features, labels, mode, params):
  del params
  net = tf.feature_column.input_layer(
      features, [embedding_watched, embedding_impression])
  logits = tf.layers.dense(net, 1)
  if mode == tf.estimator.ModeKeys.PREDICT:
    return tf.estimator.tpu.TPUEstimatorSpec(
        mode, predictions={"probability": tf.sigmoid(logits)})
  loss = tf.losses.sigmoid_cross_entropy(labels, logits)
  optimizer = tf.tpu.CrossShardOptimizer(tf.train.AdagradOptimizer(0.1))
  train_op = optimizer.minimize(loss, tf.train.get_global_step())

  def metric_fn(labels, logits):
    return {"accuracy": tf.metrics.accuracy(labels, tf.round(
        tf.sigmoid(logits)))}

  return tf.estimator.tpu.TPUEstimatorSpec(
      mode, loss=loss, train_op=train_op, eval_metrics=(metric_fn,
                                                        [labels, logits]))


def main(model_dir):
  run_config = tf.estimator.tpu.RunConfig(
      model_dir=model_dir,
      tpu_config=tf.estimator.tpu.TPUConfig(
          iterations_per_loop=2, num_shards=2,
          per_host_input_for_training=(
              tf.estimator.tpu.InputPipelineConfig.PER_HOST_V2)))
  estimator = tf.estimator.tpu.TPUEstimator(
      model_fn=model_fn, config=run_config, use_tpu=False,
      train_batch_size=BATCH, eval_batch_size=BATCH,
      predict_batch_size=BATCH,
      embedding_config_spec=tf.estimator.tpu.experimental.EmbeddingConfigSpec(
          feature_columns=[embedding_watched, embedding_impression],
          optimization_parameters=tf.tpu.experimental.AdagradParameters(
              learning_rate=0.1),
          partition_strategy="mod"))
  estimator.train(input_fn, max_steps=4)
  metrics = estimator.evaluate(input_fn, steps=2)
  prediction = next(estimator.predict(input_fn))
  exported = estimator.export_saved_model(
      model_dir + "/export", lambda: tf.estimator.export.ServingInputReceiver(
          {"watched": tf.sparse.placeholder(tf.int64, [None, 3]),
           "impression": tf.sparse.placeholder(tf.int64, [None, 1])},
          {}))
  print(f"RESULT step={metrics['global_step']} "
        f"accuracy={metrics['accuracy']:.3f} "
        f"probability={float(prediction['probability'][0]):.3f} "
        f"export={exported.decode() if isinstance(exported, bytes) else exported}")


if __name__ == "__main__":
  main(sys.argv[1])
