"""The small model of docs/recipes.md's tests and examples.

tests/test_recipes.py runs each recipe on it, and the recipes' setups in
tests/doc_setups/ give docs/recipes.md's blocks (run by tests/test_readme.py)
the reader's `model_fn`, input functions, `spec` and directories from it.

A plain column through input_layer, a shared pair through DenseFeatures
(TF's shared columns refuse input_layer), a linear head trained by the
model's own optimizer; and the checkpoint a TPU job writes for it (NumPy,
since no TPU runs here).
"""
import os

import numpy as np
import tensorflow as tf

import estimator_spec as es
import tpu_embedding_columns as tec
from tests import test_mid_level as ml

fc = tf.feature_column
v1 = tf.compat.v1
TF_TPU = v1.tpu.experimental
TF_EST_TPU = ml.TF_EST_TPU  # the oracle: TF 2.15 only
PREDICT = es.estimator.ModeKeys.PREDICT
TRAIN = es.estimator.ModeKeys.TRAIN

V = 12  # vocabulary of every table
D = 2  # dimension
B = 4  # training batch
N = 16  # examples

A_TABLE = "input_layer/a_embedding/embedding_weights"
BC_TABLE = "b_c_shared_embedding"
TABLES = (A_TABLE, BC_TABLE)


def columns(api):
  ident = fc.categorical_column_with_identity
  if api == "ours":
    embedding, shared = tec.embedding_column, tec.shared_embedding_columns
  else:
    embedding, shared = TF_TPU.embedding_column, TF_TPU.shared_embedding_columns
  a = embedding(ident("a", V), D, combiner="mean")
  b, c = shared([ident("b", V), ident("c", V)], D, combiner="sum")
  return a, b, c


def model_fn_for(cols, spec_class, optimizer):

  def model_fn(features, labels, mode, params):
    del params
    a, b, c = cols
    x = tf.concat([v1.feature_column.input_layer(features, [a]),
                   v1.keras.layers.DenseFeatures([b, c])(features)], axis=1)
    logits = v1.layers.dense(x, 1, name="out")
    if mode == PREDICT:
      return spec_class(mode, predictions={"logits": logits, "x": x})
    loss = v1.losses.mean_squared_error(labels, logits)
    train_op = None
    if mode == TRAIN:
      train_op = optimizer().minimize(loss,
                                      global_step=v1.train.get_global_step())
    return spec_class(mode, loss=loss, train_op=train_op)

  return model_fn


def data(n=N, seed=0):
  rng = np.random.RandomState(seed)
  features = {k: rng.randint(0, V, (n, 2)).astype(np.int64)
              for k in ("a", "b", "c")}
  return features, rng.randn(n, 1).astype(np.float32)


def sparse(features):
  return {k: _ids(v) for k, v in features.items()}


def _ids(dense):
  """[batch, width] ids (all present) as a SparseTensor."""
  where = tf.where(tf.ones_like(dense, tf.bool))
  return tf.SparseTensor(where, tf.gather_nd(dense, where),
                         tf.shape(dense, out_type=tf.int64))


def input_fn_for(features, labels=None, repeat=True):

  def input_fn(params):
    pieces = features if labels is None else (features, labels)
    dataset = tf.data.Dataset.from_tensor_slices(pieces)
    if repeat:
      dataset = dataset.repeat()
    dataset = dataset.batch(params["batch_size"], drop_remainder=repeat)
    if labels is None:
      return dataset.map(sparse)
    return dataset.map(lambda f, y: (sparse(f), y))

  return input_fn


def our_spec(cols, optimizer=None, strategy="div"):
  return es.EmbeddingConfigSpec(
      feature_columns=list(cols),
      optimization_parameters=optimizer or es.AdagradParameters(0.1),
      partition_strategy=strategy)


def our_estimator(model_dir, dense_optimizer, num_shards=None,
                  strategy="div", spec_optimizer=None, use_tpu=False,
                  batch=B):
  cols = columns("ours")
  return es.TPUEstimator(
      model_fn=model_fn_for(cols, es.TPUEstimatorSpec, dense_optimizer),
      config=es.RunConfig(
          model_dir=str(model_dir),
          tpu_config=es.TPUConfig(num_shards=num_shards)),
      use_tpu=use_tpu, train_batch_size=batch, eval_batch_size=B,
      predict_batch_size=B,
      embedding_config_spec=our_spec(cols, spec_optimizer, strategy))


def adam():
  return v1.train.AdamOptimizer(0.01)


HOSTS = 2  # the TPU job: 16 cores, 2 hosts, partition_strategy='mod'


def mod_partitions(rows, hosts=HOSTS):
  """A table as a TPU job with `hosts` hosts stores it: partition p holds
  rows p, p + hosts, ... (NumPy, independent of ShardLayout)."""
  return [rows[p::hosts] for p in range(hosts)]


def tpu_job_checkpoint(model_dir, seed=0):
  """The checkpoint TF's TPUEstimator writes on a 2-host TPU for this
  model (tables and their Adagrad slots in `mod` partitions, no recorded
  strategy; the head and its Adam state as any TF job saves them)."""
  rng = np.random.RandomState(seed)
  state = {
      A_TABLE: rng.randn(V, D).astype(np.float32),
      BC_TABLE: rng.randn(V, D).astype(np.float32),
      A_TABLE + "/Adagrad": rng.uniform(0.1, 1, (V, D)).astype(np.float32),
      BC_TABLE + "/Adagrad": rng.uniform(0.1, 1, (V, D)).astype(np.float32),
      "out/kernel": rng.randn(3 * D, 1).astype(np.float32),
      "out/bias": rng.randn(1).astype(np.float32),
      "global_step": np.int64(100),
  }
  for name in ("out/kernel", "out/bias"):
    state[name + "/Adam"] = rng.randn(*state[name].shape).astype(np.float32)
    state[name + "/Adam_1"] = rng.uniform(
        0, 1, state[name].shape).astype(np.float32)
  state["beta1_power"] = np.float32(0.9**100)
  state["beta2_power"] = np.float32(0.999**100)
  stored = {name: mod_partitions(value) if value.shape == (V, D) else value
            for name, value in state.items()}
  # Absolute: the `checkpoint` file then names model.ckpt-100 relative to
  # its own directory, as TF's Saver writes it.
  model_dir = os.path.abspath(model_dir)
  os.makedirs(model_dir, exist_ok=True)
  ml.write_checkpoint(os.path.join(model_dir, "model.ckpt-100"), stored)
  return state
