"""A program importing the modules behind the public TPU names."""
import sys

import numpy as np
import tensorflow as tf
from tensorflow.compat.v1.estimator import tpu as tpu_estimator
from tensorflow.python.tpu import tpu_embedding
from tensorflow.python.tpu import feature_column_v2 as tpu_fc
from tensorflow_estimator.python.estimator.tpu import tpu_config
from tensorflow.compat.v1.estimator.tpu.experimental import EmbeddingConfigSpec

NUM_USERS, NUM_ITEMS, DIM = 40, 60, 6


def input_fn(params):
  """(user, item) pairs with ratings, as the NCF sample feeds them."""
  rng = np.random.RandomState(2)
  users = rng.randint(0, NUM_USERS, (512, 1)).astype(np.int64)
  items = rng.randint(0, NUM_ITEMS, (512, 1)).astype(np.int64)
  ratings = ((users + items) % 5 / 4.0).astype(np.float32)
  dataset = tf.data.Dataset.from_tensor_slices(
      ({"user_id": users, "item_id": items}, ratings))
  return dataset.repeat().batch(params["batch_size"], drop_remainder=True)


def build_columns():
  user = tpu_fc.embedding_column_v2(
      tf.feature_column.categorical_column_with_identity(
          "user_id", NUM_USERS), DIM)
  item = tpu_fc.embedding_column_v2(
      tf.feature_column.categorical_column_with_identity(
          "item_id", NUM_ITEMS), DIM)
  return [user, item]


def model_fn(features, labels, mode, params):
  user, item = build_columns()
  user_vector = tf.compat.v1.feature_column.input_layer(features, [user])
  item_vector = tf.compat.v1.feature_column.input_layer(features, [item])
  rating = tf.reduce_sum(user_vector * item_vector, axis=1, keepdims=True)
  if mode == tf.estimator.ModeKeys.PREDICT:
    return tpu_estimator.TPUEstimatorSpec(mode, predictions={"rating": rating})
  loss = tf.compat.v1.losses.mean_squared_error(labels, rating)
  global_step = tf.compat.v1.train.get_global_step()
  train_op = tf.compat.v1.assign_add(global_step, 1)
  return tpu_estimator.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)


def main(model_dir):
  estimator = tpu_estimator.TPUEstimator(
      model_fn=model_fn,
      config=tpu_config.RunConfig(
          model_dir=model_dir,
          tpu_config=tpu_config.TPUConfig(
              iterations_per_loop=2,
              per_host_input_for_training=(
                  tpu_config.InputPipelineConfig.PER_HOST_V2))),
      use_tpu=False, train_batch_size=32, eval_batch_size=32,
      predict_batch_size=32,
      embedding_config_spec=EmbeddingConfigSpec(
          feature_columns=build_columns(),
          optimization_parameters=tpu_embedding.AdamParameters(
              learning_rate=0.05),
          partition_strategy="div"))
  estimator.train(input_fn, steps=4)
  metrics = estimator.evaluate(input_fn, steps=2)
  prediction = next(estimator.predict(input_fn))
  exported = estimator.export_saved_model(
      model_dir + "/export",
      tf.estimator.export.build_raw_serving_input_receiver_fn(
          {"user_id": tf.zeros([1, 1], tf.int64),
           "item_id": tf.zeros([1, 1], tf.int64)}))
  print(f"RESULT step={metrics['global_step']} loss={metrics['loss']:.4f} "
        f"rating={float(prediction['rating'][0]):.4f} "
        f"export={exported.decode()}")


if __name__ == "__main__":
  main(sys.argv[1])
