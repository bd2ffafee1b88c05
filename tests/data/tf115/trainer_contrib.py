"""A TF 1.15 TPU trainer in the other common habit: `tf.contrib` modules
imported under aliases, `tf.app.flags`, PER_HOST_V1 input, a parsing
serving input receiver built from the columns, and predict."""
from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import os

import numpy as np
import tensorflow as tf
from tensorflow.contrib import cluster_resolver as contrib_cluster_resolver
from tensorflow.contrib import tpu as contrib_tpu

flags = tf.app.flags
flags.DEFINE_string("model_dir", None, "Where checkpoints and exports go.")
flags.DEFINE_bool("use_tpu", False, "Whether to train on a Cloud TPU.")
flags.DEFINE_string("tpu_name", None, "The Cloud TPU's name.")
flags.DEFINE_integer("num_shards", 2, "TPU cores.")
FLAGS = flags.FLAGS

VOCAB = 30


def feature_columns():
  user = tf.feature_column.categorical_column_with_hash_bucket("user", VOCAB)
  embedded = tf.tpu.experimental.embedding_column(user, dimension=4)
  return [embedded, tf.feature_column.numeric_column("age")]


def input_fn(params, repeat=True):
  batch_size = params["batch_size"]  # per host under PER_HOST_V1
  rng = np.random.RandomState(3)
  users = rng.randint(0, 1000, (64, 2)).astype(np.int64)
  ages = rng.uniform(0, 1, (64, 1)).astype(np.float32)
  labels = (ages > 0.5).astype(np.float32)
  dataset = tf.data.Dataset.from_tensor_slices(
      ({"user": users, "age": ages}, labels))
  if repeat:
    dataset = dataset.repeat()
  dataset = dataset.batch(batch_size, drop_remainder=True)
  return dataset.map(lambda f, l: (
      {"user": tf.sparse.from_dense(tf.as_string(f["user"])),
       "age": f["age"]}, l))


def model_fn(features, labels, mode, params):
  net = tf.feature_column.input_layer(features, feature_columns())
  logits = tf.layers.dense(net, 1)
  if mode == tf.estimator.ModeKeys.PREDICT:
    return contrib_tpu.TPUEstimatorSpec(
        mode, predictions={"logits": logits},
        export_outputs={"serving_default": tf.estimator.export.PredictOutput(
            {"logits": logits})})
  loss = tf.losses.sigmoid_cross_entropy(labels, logits)
  optimizer = tf.train.AdagradOptimizer(0.1)
  if params["use_tpu"]:
    optimizer = contrib_tpu.CrossShardOptimizer(optimizer)
  train_op = optimizer.minimize(loss, tf.train.get_global_step())
  return contrib_tpu.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)


def main(argv):
  del argv
  tpu_cluster_resolver = None
  if FLAGS.use_tpu:
    tpu_cluster_resolver = contrib_cluster_resolver.TPUClusterResolver(
        tpu=[FLAGS.tpu_name])
  config = contrib_tpu.RunConfig(
      cluster=tpu_cluster_resolver,
      model_dir=FLAGS.model_dir,
      tpu_config=contrib_tpu.TPUConfig(
          iterations_per_loop=2, num_shards=FLAGS.num_shards,
          per_host_input_for_training=(
              contrib_tpu.InputPipelineConfig.PER_HOST_V1)))
  estimator = contrib_tpu.TPUEstimator(
      model_fn=model_fn, config=config, use_tpu=FLAGS.use_tpu,
      train_batch_size=16, eval_batch_size=16, predict_batch_size=16,
      export_to_tpu=False,
      embedding_config_spec=tf.estimator.tpu.experimental.EmbeddingConfigSpec(
          feature_columns=feature_columns()[:1],
          optimization_parameters=(
              tf.tpu.experimental.StochasticGradientDescentParameters(
                  learning_rate=0.1))))
  estimator.train(input_fn, max_steps=4)
  metrics = estimator.evaluate(input_fn, steps=2)
  predictions = list(estimator.predict(
      lambda params: input_fn(params, repeat=False),
      yield_single_examples=False))
  tf.logging.info("predicted %d batches", len(predictions))
  spec = tf.feature_column.make_parse_example_spec(feature_columns())
  exported = estimator.export_saved_model(
      os.path.join(FLAGS.model_dir, "export"),
      tf.estimator.export.build_parsing_serving_input_receiver_fn(spec))
  with tf.gfile.GFile(os.path.join(FLAGS.model_dir, "done.txt"), "w") as f:
    f.write("done\n")
  print("RESULT step=%d batches=%d export=%s" % (
      metrics["global_step"], len(predictions), exported.decode()))


if __name__ == "__main__":
  tf.app.run(main)
