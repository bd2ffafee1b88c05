"""A TF 1.15 TPUEstimator trainer, written as TPU code of that time reads:
`tf.flags`, `tf.app.run`, `tf.logging`, `tf.gfile`, `tf.contrib.tpu`,
`tf.contrib.cluster_resolver`, TF 1.x's optimizers, layers and metrics,
TFRecord input, a weighted column and a shared sequence column."""
from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import os

import numpy as np
import tensorflow as tf

flags = tf.flags
FLAGS = flags.FLAGS

flags.DEFINE_string("model_dir", None, "Where checkpoints and exports go.")
flags.DEFINE_string("data_dir", None, "Where the TFRecord files are written.")
flags.DEFINE_bool("use_tpu", False, "Whether to train on a Cloud TPU.")
flags.DEFINE_string("tpu", None, "The Cloud TPU's name.")
flags.DEFINE_string("tpu_zone", None, "The Cloud TPU's zone.")
flags.DEFINE_integer("train_steps", 6, "Training steps.")
flags.DEFINE_integer("iterations_per_loop", 3, "Steps per TPU loop.")
flags.DEFINE_integer("batch_size", 8, "Global batch size.")
flags.DEFINE_float("learning_rate", 0.1, "Embedding learning rate.")

VOCAB = 50
HISTORY = 3


def write_records(path, count=64):
  rng = np.random.RandomState(7)
  with tf.python_io.TFRecordWriter(path) as writer:
    for _ in range(count):
      example = tf.train.Example(features=tf.train.Features(feature={
          "item": tf.train.Feature(int64_list=tf.train.Int64List(
              value=rng.randint(0, VOCAB, 2))),
          "item_weight": tf.train.Feature(float_list=tf.train.FloatList(
              value=rng.uniform(0.5, 1.5, 2))),
          "history": tf.train.Feature(int64_list=tf.train.Int64List(
              value=rng.randint(0, VOCAB, rng.randint(1, HISTORY + 1)))),
          "label": tf.train.Feature(float_list=tf.train.FloatList(
              value=[float(rng.randint(0, 2))])),
      }))
      writer.write(example.SerializeToString())


FEATURES = {
    "item": tf.VarLenFeature(tf.int64),
    "item_weight": tf.VarLenFeature(tf.float32),
    "history": tf.VarLenFeature(tf.int64),
    "label": tf.FixedLenFeature([1], tf.float32),
}


def make_input_fn(path):
  def input_fn(params):
    batch_size = params["batch_size"]
    dataset = tf.data.TFRecordDataset(path).repeat()
    dataset = dataset.apply(tf.contrib.data.map_and_batch(
        lambda record: tf.parse_single_example(record, FEATURES),
        batch_size, drop_remainder=True))
    return dataset.map(lambda f: (f, f.pop("label")))
  return input_fn


def columns():
  item = tf.feature_column.weighted_categorical_column(
      tf.feature_column.categorical_column_with_identity("item", VOCAB),
      "item_weight")
  history = tf.feature_column.sequence_categorical_column_with_identity(
      "history", VOCAB)
  item_embedding, history_embedding = (
      tf.tpu.experimental.shared_embedding_columns(
          [item, history], dimension=4, combiner="sqrtn",
          max_sequence_lengths=[0, HISTORY]))
  return item_embedding, history_embedding


def model_fn(features, labels, mode, params):
  del params
  item, history = columns()
  dense = tf.feature_column.input_layer(features, [item])
  sequence, lengths = tf.keras.experimental.SequenceFeatures([history])(
      features)
  pooled = tf.reduce_sum(sequence, 1) / tf.maximum(
      tf.cast(lengths, tf.float32), 1.0)[:, None]
  net = tf.layers.dense(tf.concat([dense, pooled], 1), 8,
                        activation=tf.nn.relu)
  logits = tf.layers.dense(net, 1)
  if mode == tf.estimator.ModeKeys.PREDICT:
    return tf.contrib.tpu.TPUEstimatorSpec(
        mode, predictions={"probability": tf.sigmoid(logits)})
  loss = tf.losses.sigmoid_cross_entropy(labels, logits)
  optimizer = tf.train.AdamOptimizer(0.01)
  if FLAGS.use_tpu:
    optimizer = tf.contrib.tpu.CrossShardOptimizer(optimizer)
  train_op = optimizer.minimize(loss, tf.train.get_global_step())

  def metric_fn(labels, logits):
    return {"auc": tf.metrics.auc(labels, tf.sigmoid(logits))}

  return tf.contrib.tpu.TPUEstimatorSpec(
      mode, loss=loss, train_op=train_op,
      eval_metrics=(metric_fn, [labels, logits]))


def serving_input_fn():
  serialized = tf.placeholder(tf.string, [None], name="examples")
  spec = dict(FEATURES)
  spec.pop("label")
  return tf.estimator.export.ServingInputReceiver(
      tf.parse_example(serialized, spec), {"examples": serialized})


def main(_):
  tf.logging.set_verbosity(tf.logging.WARN)
  if not tf.gfile.Exists(FLAGS.data_dir):
    tf.gfile.MakeDirs(FLAGS.data_dir)
  path = os.path.join(FLAGS.data_dir, "train.tfrecord")
  write_records(path)
  tpu_cluster_resolver = None
  if FLAGS.use_tpu and FLAGS.tpu:
    tpu_cluster_resolver = tf.contrib.cluster_resolver.TPUClusterResolver(
        FLAGS.tpu, zone=FLAGS.tpu_zone)
  run_config = tf.contrib.tpu.RunConfig(
      cluster=tpu_cluster_resolver,
      model_dir=FLAGS.model_dir,
      save_checkpoints_steps=FLAGS.iterations_per_loop,
      tpu_config=tf.contrib.tpu.TPUConfig(
          iterations_per_loop=FLAGS.iterations_per_loop,
          per_host_input_for_training=(
              tf.contrib.tpu.InputPipelineConfig.PER_HOST_V2)))
  estimator = tf.contrib.tpu.TPUEstimator(
      model_fn=model_fn,
      config=run_config,
      use_tpu=FLAGS.use_tpu,
      train_batch_size=FLAGS.batch_size,
      eval_batch_size=FLAGS.batch_size,
      predict_batch_size=FLAGS.batch_size,
      embedding_config_spec=tf.estimator.tpu.experimental.EmbeddingConfigSpec(
          feature_columns=columns(),
          optimization_parameters=tf.tpu.experimental.AdagradParameters(
              learning_rate=FLAGS.learning_rate),
          clipping_limit=5.0))
  estimator.train(input_fn=make_input_fn(path), max_steps=FLAGS.train_steps)
  metrics = estimator.evaluate(input_fn=make_input_fn(path), steps=2)
  exported = estimator.export_saved_model(
      os.path.join(FLAGS.model_dir, "export"), serving_input_fn)
  tf.logging.warn("exported to %s", exported)
  print("RESULT step=%d auc=%.4f export=%s" % (
      metrics["global_step"], metrics["auc"], exported.decode()))


if __name__ == "__main__":
  flags.mark_flag_as_required("model_dir")
  tf.app.run()
