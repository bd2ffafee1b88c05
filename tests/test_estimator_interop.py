"""Interoperability of `estimator_spec.TPUEstimator` with TF 2.15's own stack.

End-to-end tests through the Estimator API, with tiny models:
* checkpoints move both ways between TF 2.15's
  `tf.compat.v1.estimator.tpu.TPUEstimator(use_tpu=False)` with TF's TPU
  embedding columns and our TPUEstimator with our columns built with the same
  arguments: the other side predicts (and evaluates) what the writer does,
  and training continued on either side from one checkpoint gives the same
  variables (same optimizer on both sides, so TF's CPU fallback, which trains
  the tables with the user's optimizer, computes the TPU update here);
* `div`-sharded tables (3 partitions) move between TF and ours;
* `mod`-sharded tables (3 shards from `TPUConfig(num_shards=24)`) are stored
  in mod partition order and read back correctly, also by an estimator laid
  out for another number of shards (NumPy oracle: TF refuses `mod` off the
  TPU);
* `export_saved_model` writes a SavedModel plain TensorFlow serves, with no
  optimizer, slot or pipelining state, for `div` and `mod`;
* the dict form of the spec (`table_to_config_dict`/`feature_to_config_dict`)
  through train, evaluate, predict and export.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import re  # pylint: disable=g-import-not-at-top
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import estimator_spec as es
from estimator_spec.checkpoints import restore as checkpoints
import tpu_embedding_columns as tec

fc = tf.feature_column
v1 = tf.compat.v1
TF_TPU = tf.compat.v1.tpu.experimental
# TF's own TPUEstimator namespace, the oracle: TF 2.15 only (None elsewhere,
# where the tests that use it are `tf215`).
TF_EST_TPU = (tf.compat.v1.estimator.tpu
              if hasattr(tf.compat.v1, "estimator") else None)
PREDICT = es.estimator.ModeKeys.PREDICT
TRAIN = es.estimator.ModeKeys.TRAIN

V = 20  # vocabulary size of every table
D = 3  # embedding dimension
L = 3  # max_sequence_length
B = 4  # batch size (interop tests)
N = 16  # examples
SHARDED_BATCH = 24  # num_shards=24 (3 hosts) needs a multiple of 24 cores

SLOT_MARKERS = ("Adagrad", "Adam", "Ftrl", "Momentum", "RMSProp",
                "ProximalAdagrad")

IMPLS = {
    "ours": (tec.embedding_column, tec.shared_embedding_columns),
    "tf": (TF_TPU.embedding_column, TF_TPU.shared_embedding_columns),
}

OPTIMIZERS = {
    # name: (user optimizer for the dense model, ours' embedding optimizer,
    #        TF's embedding optimizer); same learning rates, and Adagrad's
    #        initial accumulator is 0.1 in all three.
    "adagrad": (lambda: v1.train.AdagradOptimizer(0.1),
                lambda: es.AdagradParameters(0.1),
                lambda: TF_TPU.AdagradParameters(0.1)),
    "sgd": (lambda: v1.train.GradientDescentOptimizer(0.1),
            lambda: es.StochasticGradientDescentParameters(0.1),
            lambda: TF_TPU.StochasticGradientDescentParameters(0.1)),
}

# ---------------------------------------------------------------------------
# Data.


def padded_ids(rng, n, width, vocab=V, min_len=1):
  """[n, width] int64 ids, left-aligned, padded with -1."""
  out = np.full((n, width), -1, np.int64)
  for i in range(n):
    length = rng.randint(min_len, width + 1)
    out[i, :length] = rng.randint(0, vocab, size=length)
  return out


def interop_data(n=N, seed=0):
  """Features of the interop model (dense int arrays padded with -1)."""
  rng = np.random.RandomState(seed)
  features = {
      "a": padded_ids(rng, n, 3),
      "w": padded_ids(rng, n, 3),
      "b": padded_ids(rng, n, 2),
      "c": padded_ids(rng, n, 2),
      "d": padded_ids(rng, n, 2),
      # Sequence features are exactly L wide: TF's CPU path neither pads nor
      # truncates to max_sequence_length, the TPU semantics do.
      "h": padded_ids(rng, n, L),
      "s": padded_ids(rng, n, L),
  }
  features["w_weight"] = np.where(
      features["w"] >= 0, rng.uniform(0.5, 2.0, features["w"].shape),
      0.0).astype(np.float32)
  labels = rng.randn(n, 1).astype(np.float32)
  return features, labels


def as_sparse(features):
  """Padded dense id arrays -> SparseTensors of the present ids (>= 0), and
  `<key>_weight` at the positions of `<key>`'s ids. Sparse inputs mean the
  same to both sides: dense ids do not (TF's CPU path drops -1 and keeps 0,
  the TPU input path takes the non-zero entries)."""
  result = dict(features)
  for name, value in features.items():
    if name.endswith("_weight") or not value.dtype.is_integer:
      continue
    where = tf.where(value >= 0)
    shape = tf.shape(value, out_type=tf.int64)
    result[name] = tf.SparseTensor(where, tf.gather_nd(value, where), shape)
    if f"{name}_weight" in features:
      result[f"{name}_weight"] = tf.SparseTensor(
          where, tf.gather_nd(features[f"{name}_weight"], where), shape)
  return result


def train_input_fn(features, labels):

  def input_fn(params):
    dataset = tf.data.Dataset.from_tensor_slices((features, labels))
    return dataset.repeat().batch(params["batch_size"],
                                  drop_remainder=True).map(
                                      lambda f, y: (as_sparse(f), y))

  return input_fn


def eval_input_fn(features, labels):

  def input_fn(params):
    dataset = tf.data.Dataset.from_tensor_slices((features, labels))
    return dataset.batch(params["batch_size"], drop_remainder=True).map(
        lambda f, y: (as_sparse(f), y))

  return input_fn


def predict_input_fn(features):

  def input_fn(params):
    dataset = tf.data.Dataset.from_tensor_slices(features)
    return dataset.batch(params["batch_size"],
                         drop_remainder=True).map(as_sparse)

  return input_fn


def predict_all(estimator, features, input_fn=None):
  """{key: array over all examples} from estimator.predict."""
  batches = list(
      estimator.predict(input_fn or predict_input_fn(features),
                        yield_single_examples=False))
  assert batches, "predict returned nothing"
  return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


def checkpoint_values(model_dir):
  """Every tensor of the latest checkpoint, except the partition strategy
  our checkpoints record (`test_checkpoint_restores_under_the_other_
  strategy` checks it), so that ours and TF's compare name by name."""
  reader = tf.train.load_checkpoint(model_dir)
  return {
      name: reader.get_tensor(name)
      for name in reader.get_variable_to_shape_map()
      if name != checkpoints.LAYOUT_TENSOR
  }


def assert_same_checkpoint_layout(got, expected):
  """Same variable names and shapes."""
  assert sorted(got) == sorted(expected)
  for name in expected:
    assert np.shape(got[name]) == np.shape(expected[name]), name


def assert_predictions_close(got, expected, rtol=1e-6, atol=1e-6):
  assert sorted(got) == sorted(expected)
  for key in expected:
    np.testing.assert_allclose(got[key], expected[key], rtol=rtol, atol=atol,
                               err_msg=key)


def to_tf_example(features, i, weights):
  """Serialized tf.Example of example i of padded feature arrays; `weights`
  maps each weight feature to its ids feature (weights are kept where the
  ids are present)."""
  feature = {}
  for name, values in features.items():
    row = np.asarray(values)[i]
    if name in weights:
      present = np.asarray(features[weights[name]])[i] >= 0
      feature[name] = tf.train.Feature(float_list=tf.train.FloatList(
          value=[float(v) for v in row[present]]))
    else:
      feature[name] = tf.train.Feature(int64_list=tf.train.Int64List(
          value=[int(v) for v in row if v >= 0]))
  return tf.train.Example(features=tf.train.Features(
      feature=feature)).SerializeToString()


def serve(export_dir, serialized):
  """Outputs of the SavedModel's serving_default signature, loaded in a fresh
  Graph and Session; also returns the loaded graph's variable and op
  names."""
  with tf.Graph().as_default() as graph, v1.Session() as session:
    meta_graph = v1.saved_model.load(session, ["serve"], export_dir)
    signature = meta_graph.signature_def["serving_default"]
    assert list(signature.inputs) == ["examples"]
    names = sorted(signature.outputs)
    tensors = [signature.outputs[k].name for k in names]
    values = session.run(tensors,
                         {signature.inputs["examples"].name: serialized})
    variables = [v.op.name for v in v1.global_variables()]
    ops = [op.name for op in graph.get_operations()]
  return dict(zip(names, values)), variables, ops


# ---------------------------------------------------------------------------
# The interop model: the same model_fn for TF's and our TPUEstimator.


def interop_columns(impl):
  embedding_column, shared_embedding_columns = IMPLS[impl]
  ident = fc.categorical_column_with_identity
  seq_ident = fc.sequence_categorical_column_with_identity
  a = embedding_column(ident("a", V), D, combiner="mean")
  w = embedding_column(
      fc.weighted_categorical_column(ident("w", V), "w_weight"), D,
      combiner="sum")
  b, c = shared_embedding_columns([ident("b", V), ident("c", V)], D,
                                  combiner="sqrtn")
  d, h = shared_embedding_columns([ident("d", V), seq_ident("h", V)], D,
                                  max_sequence_lengths=[0, L])
  s = embedding_column(seq_ident("s", V), D, max_sequence_length=L)
  return dict(a=a, w=w, b=b, c=c, d=d, h=h, s=s)


def interop_model_fn(columns, spec_class, user_optimizer):
  """A TPUEstimator user's model_fn: a plain and a weighted column in
  input_layer, two shared groups in DenseFeatures / SequenceFeatures (TF's
  shared columns refuse input_layer), a sequence column, linear head."""

  def model_fn(features, labels, mode, params):
    plain = v1.feature_column.input_layer(features,
                                          [columns["a"], columns["w"]])
    shared = v1.keras.layers.DenseFeatures(
        [columns["b"], columns["c"], columns["d"]])(features)
    seq_h, len_h = tf.keras.experimental.SequenceFeatures([columns["h"]])(
        features)
    seq_s, len_s = tf.keras.experimental.SequenceFeatures([columns["s"]])(
        features)
    x = tf.concat([
        plain, shared,
        tf.reshape(seq_h, [-1, L * D]),
        tf.reshape(seq_s, [-1, L * D])
    ], axis=1)
    logits = v1.layers.dense(x, 1, name="out")
    predictions = {
        "logits": logits,
        "x": x,
        "lengths": tf.stack([len_h, len_s], axis=1)
    }
    if mode == PREDICT:
      return spec_class(mode=mode, predictions=predictions)
    loss = v1.losses.mean_squared_error(labels, logits)
    train_op = None
    if mode == TRAIN:
      optimizer = user_optimizer()
      if params["use_tpu"]:
        optimizer = v1.tpu.CrossShardOptimizer(optimizer)
      train_op = optimizer.minimize(loss,
                                    global_step=v1.train.get_global_step())
    return spec_class(mode=mode, loss=loss, train_op=train_op)

  return model_fn


def make_estimator(impl, model_dir, user_opt, spec_opt, num_shards=None):
  """TF's TPUEstimator with TF's columns, or ours with ours; `num_shards`
  TPU cores (ours lays its tables out for them; 24 cores = 3 shards)."""
  columns = interop_columns(impl)
  run_config = TF_EST_TPU.RunConfig(
      model_dir=str(model_dir),
      tpu_config=TF_EST_TPU.TPUConfig(num_shards=num_shards))
  batch = SHARDED_BATCH if num_shards else B
  common = dict(config=run_config, use_tpu=False, train_batch_size=batch,
                eval_batch_size=B, predict_batch_size=B)
  if impl == "tf":
    spec = TF_EST_TPU.experimental.EmbeddingConfigSpec(
        feature_columns=list(columns.values()),
        optimization_parameters=OPTIMIZERS[spec_opt][2]())
    return TF_EST_TPU.TPUEstimator(
        model_fn=interop_model_fn(columns, TF_EST_TPU.TPUEstimatorSpec,
                                  OPTIMIZERS[user_opt][0]),
        embedding_config_spec=spec, **common)
  spec = es.EmbeddingConfigSpec(
      feature_columns=list(columns.values()),
      optimization_parameters=OPTIMIZERS[spec_opt][1]())
  return es.TPUEstimator(
      model_fn=interop_model_fn(columns, es.TPUEstimatorSpec,
                                OPTIMIZERS[user_opt][0]),
      embedding_config_spec=spec, **common)


EXPECTED_TABLES = (
    "input_layer/a_embedding/embedding_weights",
    "input_layer/w_weighted_by_w_weight_embedding/embedding_weights",
    "b_c_shared_embedding",
    "d_h_shared_embedding",
    # the second SequenceFeatures layer of model_fn (Keras numbers it)
    "sequence_features_1/s_embedding/embedding_weights",
)


def _check_interop_checkpoint(values, optimizer, global_step):
  """The names a checkpoint of the interop model must hold."""
  expected = set(EXPECTED_TABLES) | {"out/kernel", "out/bias", "global_step"}
  if optimizer == "adagrad":
    expected |= {f"{name}/Adagrad" for name in list(expected)
                 if name != "global_step"}
  assert set(values) == expected
  for table in EXPECTED_TABLES:
    assert values[table].shape == (V, D), table
  assert int(values["global_step"]) == global_step


# ---------------------------------------------------------------------------
# 1. TF -> ours. Training continued on both sides from one checkpoint is
# compared with the optimizer that has slots (the slots TF's dense optimizer
# made for the tables must restore as the spec's slots).


def _assert_same_variables(got_dir, expected_dir, optimizer, global_step):
  got, expected = checkpoint_values(got_dir), checkpoint_values(expected_dir)
  _check_interop_checkpoint(got, optimizer, global_step)
  assert_same_checkpoint_layout(got, expected)
  for name, value in expected.items():
    np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6,
                               err_msg=name)
  return got


@pytest.mark.slow
@pytest.mark.parametrize("optimizer,continue_training", [("adagrad", True),
                                                         ("sgd", False)])
def test_tf_checkpoint_restores_in_our_estimator(tmp_path, optimizer,
                                                 continue_training):
  features, labels = interop_data()
  tf_dir = tmp_path / "tf"
  tf_est = make_estimator("tf", tf_dir, optimizer, optimizer)
  tf_est.train(train_input_fn(features, labels), max_steps=3)
  tf_ckpt = checkpoint_values(tf_dir)
  _check_interop_checkpoint(tf_ckpt, optimizer, global_step=3)

  ours = make_estimator("ours", tf_dir, optimizer, optimizer)
  assert_predictions_close(predict_all(ours, features),
                           predict_all(tf_est, features))
  if not continue_training:
    return
  # Training continues from TF's checkpoint (global step, dense variables,
  # tables and the slots TF's dense optimizer made for them) as TF's does.
  ours_dir = tmp_path / "ours"
  shutil.copytree(tf_dir, ours_dir)
  ours = make_estimator("ours", ours_dir, optimizer, optimizer)
  ours.train(train_input_fn(features, labels), max_steps=5)
  tf_est.train(train_input_fn(features, labels), max_steps=5)
  ours_after = _assert_same_variables(ours_dir, tf_dir, optimizer, 5)
  for table in EXPECTED_TABLES:  # the continued steps changed the tables
    assert not np.array_equal(ours_after[table], tf_ckpt[table]), table


@pytest.mark.slow
def test_training_continues_from_tf_checkpoint_without_table_slots(tmp_path):
  """TF's CPU path trained the tables with the user's SGD (no slots); our
  estimator, whose spec trains them with Adagrad, continues from that
  checkpoint: the missing accumulators start at their initial value."""
  features, labels = interop_data()
  tf_est = make_estimator("tf", tmp_path, "sgd", "adagrad")
  tf_est.train(train_input_fn(features, labels), max_steps=2)
  before = checkpoint_values(tmp_path)
  assert not [n for n in before if n.endswith("/Adagrad")]
  ours = make_estimator("ours", tmp_path, "sgd", "adagrad")
  ours.train(train_input_fn(features, labels), max_steps=3)
  after = checkpoint_values(tmp_path)
  assert int(after["global_step"]) == 3
  for table in EXPECTED_TABLES:
    accumulator = after[f"{table}/Adagrad"]
    # One Adagrad step from 0.1 on the touched rows, 0.1 elsewhere.
    assert (accumulator >= 0.1).all() and (accumulator > 0.1).any(), table
    changed = np.any(after[table] != before[table], axis=1)
    accumulated = np.any(accumulator > 0.1, axis=1)
    # A touched row whose gradient g has g^2 below half an ulp of 0.1
    # (float32) keeps the accumulator at 0.1 yet moves, by at most
    # lr * sqrt(ulp(0.1)) / sqrt(0.1) (Adagrad with lr 0.1): such rows may
    # differ between the two, no others.
    ulp = np.spacing(np.float32(0.1))
    bound = 0.1 * np.sqrt(ulp) / np.sqrt(0.1)
    moved = np.max(np.abs(after[table] - before[table]), axis=1)
    np.testing.assert_array_equal(accumulated & ~changed, False,
                                  err_msg=table)
    assert (moved[changed & ~accumulated] <= bound).all(), (
        table, moved[changed & ~accumulated], bound)
    assert accumulated.any(), table


# ---------------------------------------------------------------------------
# 2. ours -> TF.


@pytest.mark.slow
@pytest.mark.parametrize("optimizer,continue_training", [("adagrad", True),
                                                         ("sgd", False)])
def test_our_checkpoint_restores_in_tf_estimator(tmp_path, optimizer,
                                                 continue_training):
  features, labels = interop_data(seed=1)
  ours_dir = tmp_path / "ours"
  ours = make_estimator("ours", ours_dir, optimizer, optimizer)
  ours.train(train_input_fn(features, labels), max_steps=3)
  # Tables under TF's CPU names, slots under docs/numerics.md names.
  _check_interop_checkpoint(checkpoint_values(ours_dir), optimizer,
                            global_step=3)

  tf_est = make_estimator("tf", ours_dir, optimizer, optimizer)
  assert_predictions_close(predict_all(tf_est, features),
                           predict_all(ours, features))
  np.testing.assert_allclose(
      tf_est.evaluate(eval_input_fn(features, labels))["loss"],
      ours.evaluate(eval_input_fn(features, labels))["loss"], rtol=1e-6)
  if not continue_training:
    return
  # TF's estimator continues training from our checkpoint as ours does.
  tf_dir = tmp_path / "tf"
  shutil.copytree(ours_dir, tf_dir)
  tf_est = make_estimator("tf", tf_dir, optimizer, optimizer)
  tf_est.train(train_input_fn(features, labels), max_steps=5)
  ours.train(train_input_fn(features, labels), max_steps=5)
  _assert_same_variables(tf_dir, ours_dir, optimizer, 5)


@pytest.mark.slow
def test_div_sharded_checkpoints_move_between_tf_and_ours(tmp_path):
  """Ours with 3 `div` table shards (partitioned variables) writes each
  table as one row-order tensor that TF's unpartitioned CPU path restores,
  and restores TF's tensors into its partitions."""
  features, labels = interop_data(n=2 * SHARDED_BATCH, seed=3)
  ours = make_estimator("ours", tmp_path, "sgd", "sgd", num_shards=24)
  ours.train(train_input_fn(features, labels), max_steps=1)
  graph = (tmp_path / "graph.pbtxt").read_text()
  assert "b_c_shared_embedding/part_2" in graph
  assert "b_c_shared_embedding/part_3" not in graph
  tf_est = make_estimator("tf", tmp_path, "sgd", "sgd", num_shards=24)
  assert_predictions_close(predict_all(tf_est, features),
                           predict_all(ours, features))
  tf_est.train(train_input_fn(features, labels), max_steps=2)
  _check_interop_checkpoint(checkpoint_values(tmp_path), "sgd", 2)
  assert_predictions_close(predict_all(ours, features),
                           predict_all(tf_est, features))


@pytest.mark.slow
def test_tf_predicts_from_our_checkpoint_without_table_slots(tmp_path):
  """The user's dense optimizer has slots, the embedding optimizer (SGD) has
  none: the user's optimizer never sees the tables, so our checkpoint has
  slots for the dense variables only, and TF's estimator predicts from it."""
  features, labels = interop_data(seed=2)
  ours = make_estimator("ours", tmp_path, "adagrad", "sgd")
  ours.train(train_input_fn(features, labels), max_steps=2)
  names = set(checkpoint_values(tmp_path))
  assert {"out/kernel/Adagrad", "out/bias/Adagrad"} <= names
  assert not [n for n in names if "Adagrad" in n and not n.startswith("out/")]
  tf_est = make_estimator("tf", tmp_path, "adagrad", "sgd")
  assert_predictions_close(predict_all(tf_est, features),
                           predict_all(ours, features))


# ---------------------------------------------------------------------------
# 3. mod-sharded tables.


def sharded_columns():
  ident = fc.categorical_column_with_identity
  return [
      tec.embedding_column(ident("m", V), D, combiner="sum"),
      # Zeros: after training, exactly the trained rows are non-zero.
      tec.embedding_column(ident("z", V), D, combiner="sum",
                           initializer=v1.zeros_initializer()),
  ]


def linear_model_fn(columns):
  """logits = [act_m, act_z] @ kernel + bias (kernel starts at ones)."""
  return lambda features, labels, mode: _linear_model(columns, features,
                                                      labels, mode)


def _linear_model(columns, features, labels, mode):
  x = v1.keras.layers.DenseFeatures(columns)(features)
  logits = v1.layers.dense(x, 1, name="out",
                           kernel_initializer=v1.ones_initializer())
  if mode == PREDICT:
    return es.TPUEstimatorSpec(mode, predictions={"logits": logits, "x": x})
  loss = v1.losses.mean_squared_error(labels, logits)
  train_op = v1.train.GradientDescentOptimizer(0.1).minimize(
      loss, global_step=v1.train.get_global_step())
  return es.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)


def sharded_estimator(model_dir, strategy, columns, model_fn,
                      pipelining=False, spec_opt="sgd"):
  """Our TPUEstimator with 3 table shards: num_shards=24 TPU cores are 3
  hosts of 8."""
  spec = es.EmbeddingConfigSpec(
      feature_columns=columns,
      optimization_parameters=OPTIMIZERS[spec_opt][1](),
      partition_strategy=strategy,
      pipeline_execution_with_tensor_core=pipelining)
  config = TF_EST_TPU.RunConfig(
      model_dir=str(model_dir),
      tpu_config=TF_EST_TPU.TPUConfig(num_shards=24))
  return es.TPUEstimator(
      model_fn=model_fn, config=config, use_tpu=False,
      train_batch_size=SHARDED_BATCH, eval_batch_size=4,
      predict_batch_size=4, embedding_config_spec=spec)


TRAINED_Z_IDS = (4, 11, 13)


@pytest.mark.slow
def test_mod_sharded_tables_save_and_restore(tmp_path):
  rng = np.random.RandomState(3)
  n = 2 * SHARDED_BATCH
  features = {
      "m": padded_ids(rng, n, 2),
      "z": rng.choice(TRAINED_Z_IDS, (n, 1)).astype(np.int64),
  }
  labels = rng.randn(n, 1).astype(np.float32)
  columns = sharded_columns()
  est = sharded_estimator(tmp_path, "mod", columns,
                          linear_model_fn(columns))
  est.train(train_input_fn(features, labels), max_steps=2)

  graph = (tmp_path / "graph.pbtxt").read_text()
  assert "dense_features/m_embedding/embedding_weights/part_2" in graph
  assert "dense_features/m_embedding/embedding_weights/part_3" not in graph
  layout = es.ShardLayout(V, 3, "mod")
  assert layout.sizes == (7, 7, 6)
  ckpt = checkpoint_values(tmp_path)
  m_name = "dense_features/m_embedding/embedding_weights"
  z_name = "dense_features/z_embedding/embedding_weights"
  assert set(ckpt) == {m_name, z_name, "out/kernel", "out/bias",
                       "global_step"}
  assert ckpt[m_name].shape == ckpt[z_name].shape == (V, D)

  # Trained rows of the zero table sit at their mod positions:
  # row r -> partition r % 3, local index r // 3.
  nonzero = sorted(np.flatnonzero(np.any(ckpt[z_name] != 0, axis=1)))
  partition, local = layout.locate(TRAINED_Z_IDS)
  expected_positions = sorted(
      np.asarray(layout.offsets)[partition] + local)
  assert expected_positions == [8, 11, 17]
  assert nonzero == expected_positions

  # The row-order tables as the model sees them: one id per example.
  one_hot = {"m": np.arange(V, dtype=np.int64)[:, None],
             "z": np.arange(V, dtype=np.int64)[:, None]}
  looked_up = predict_all(est, one_hot, predict_input_fn(one_hot))["x"]
  rows_m, rows_z = looked_up[:, :D], looked_up[:, D:]
  for name, rows in ((m_name, rows_m), (z_name, rows_z)):
    np.testing.assert_array_equal(ckpt[name],
                                  np.concatenate(layout.split(rows)))
  # Not the identity permutation: the stored tensor is not in row order.
  assert not np.array_equal(ckpt[m_name], rows_m)

  # Predictions: NumPy sum combiner over the row-order tables (from the
  # checkpoint alone), linear head.
  row_m = layout.join(np.split(ckpt[m_name], layout.offsets[1:]))
  row_z = layout.join(np.split(ckpt[z_name], layout.offsets[1:]))

  def numpy_x(ids, table):
    return np.stack([table[r[r >= 0]].sum(axis=0) for r in ids])

  x = np.concatenate(
      [numpy_x(features["m"], row_m), numpy_x(features["z"], row_z)], axis=1)
  logits = x @ ckpt["out/kernel"] + ckpt["out/bias"]
  predicted = predict_all(est, features)
  np.testing.assert_allclose(predicted["x"], x, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(predicted["logits"], logits, rtol=1e-5,
                             atol=1e-6)

  # A second estimator restores the checkpoint and predicts the same.
  columns = sharded_columns()
  again = sharded_estimator(tmp_path, "mod", columns,
                            linear_model_fn(columns))
  assert_predictions_close(predict_all(again, features), predicted, rtol=0,
                           atol=0)
  # And continues training from it: untouched rows of the zero table stay
  # where the mod layout puts them.
  again.train(train_input_fn(features, labels), max_steps=3)
  after = checkpoint_values(tmp_path)
  assert int(after["global_step"]) == 3
  assert sorted(np.flatnonzero(np.any(after[z_name] != 0,
                                      axis=1))) == expected_positions


@pytest.mark.slow
@pytest.mark.parametrize("reader_cores", [16, None])
def test_mod_checkpoint_restores_under_another_topology(tmp_path,
                                                        reader_cores):
  """A checkpoint of 3 `mod` shards (24 cores), read by an estimator laid
  out for 2 shards (16 cores) or 1 (no TPUConfig, e.g. an evaluation or
  export job with a plain RunConfig), must give the same rows: the stored
  tensor is in 3-shard partition order (docs/numerics.md, 'Where a row lives':
  read both layouts correctly and convert between them). Failing that, restoring
  must refuse; it must not silently permute rows."""
  rng = np.random.RandomState(8)
  n = SHARDED_BATCH
  features = {"m": padded_ids(rng, n, 2), "z": padded_ids(rng, n, 1)}
  labels = rng.randn(n, 1).astype(np.float32)
  columns = sharded_columns()
  writer = sharded_estimator(tmp_path, "mod", columns,
                             linear_model_fn(columns))
  writer.train(train_input_fn(features, labels), max_steps=1)
  expected = predict_all(writer, features)

  columns = sharded_columns()
  spec = es.EmbeddingConfigSpec(
      feature_columns=columns,
      optimization_parameters=es.StochasticGradientDescentParameters(0.1),
      partition_strategy="mod")
  reader = es.TPUEstimator(
      model_fn=linear_model_fn(columns),
      config=TF_EST_TPU.RunConfig(
          model_dir=str(tmp_path),
          tpu_config=TF_EST_TPU.TPUConfig(num_shards=reader_cores)),
      use_tpu=False, train_batch_size=48, predict_batch_size=4,
      embedding_config_spec=spec)
  assert_predictions_close(predict_all(reader, features), expected)


@pytest.mark.slow
@pytest.mark.parametrize("written, read", [(("mod", 24), ("div", 24)),
                                           (("div", 24), ("mod", 16)),
                                           (("mod", 24), ("mod", 16))])
def test_checkpoint_restores_under_the_other_strategy(tmp_path, written,
                                                      read):
  """The checkpoint records the strategy that laid its tables out, so a run
  with the other strategy (same or another shard count) restores the same
  rows instead of a permutation of them."""
  rng = np.random.RandomState(9)
  n = 48  # splits over 24 and 16 cores
  features = {"m": padded_ids(rng, n, 2), "z": padded_ids(rng, n, 1)}
  labels = rng.randn(n, 1).astype(np.float32)

  def estimator(strategy, cores):
    columns = sharded_columns()
    spec = es.EmbeddingConfigSpec(
        feature_columns=columns,
        optimization_parameters=es.StochasticGradientDescentParameters(0.1),
        partition_strategy=strategy)
    return es.TPUEstimator(
        model_fn=linear_model_fn(columns),
        config=TF_EST_TPU.RunConfig(
            model_dir=str(tmp_path),
            tpu_config=TF_EST_TPU.TPUConfig(num_shards=cores)),
        use_tpu=False, train_batch_size=n, predict_batch_size=4,
        embedding_config_spec=spec)

  writer = estimator(*written)
  writer.train(train_input_fn(features, labels), max_steps=1)
  reader = tf.train.load_checkpoint(str(tmp_path))
  assert reader.get_tensor(checkpoints.LAYOUT_TENSOR) == written[0].encode()
  expected = predict_all(writer, features)
  got = estimator(*read)
  assert_predictions_close(predict_all(got, features), expected)
  # Training on from it writes the reader's layout and strategy.
  got.train(train_input_fn(features, labels), max_steps=2)
  reader = tf.train.load_checkpoint(str(tmp_path))
  assert reader.get_tensor(checkpoints.LAYOUT_TENSOR) == read[0].encode()
  assert checkpoints.stored_partitions(str(tmp_path))[
      "dense_features/m_embedding/embedding_weights"] == read[1] // 8


# ---------------------------------------------------------------------------
# 4. export_saved_model.


def export_columns():
  ident = fc.categorical_column_with_identity
  a = tec.embedding_column(ident("a", V), D, combiner="mean")
  w = tec.embedding_column(
      fc.weighted_categorical_column(ident("w", V), "w_weight"), D,
      combiner="sum")
  b, c = tec.shared_embedding_columns([ident("b", V), ident("c", V)], D,
                                      combiner="sqrtn")
  s = tec.embedding_column(
      fc.sequence_categorical_column_with_identity("s", V), D,
      max_sequence_length=L)
  return [a, w, b, c], [s]


def export_model_fn(dense_columns, sequence_columns):
  return lambda features, labels, mode: _export_model(
      dense_columns, sequence_columns, features, labels, mode)


def _export_model(dense_columns, sequence_columns, features, labels, mode):
  dense = v1.keras.layers.DenseFeatures(dense_columns)(features)
  seq, lengths = tf.keras.experimental.SequenceFeatures(sequence_columns)(
      features)
  x = tf.concat([dense, tf.reshape(seq, [-1, L * D])], axis=1)
  logits = v1.layers.dense(x, 1, name="out")
  if mode == PREDICT:
    return es.TPUEstimatorSpec(
        mode, predictions={"logits": logits, "x": x, "lengths": lengths})
  loss = v1.losses.mean_squared_error(labels, logits)
  train_op = v1.train.AdagradOptimizer(0.1).minimize(
      loss, global_step=v1.train.get_global_step())
  return es.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)


def export_data(n, seed):
  rng = np.random.RandomState(seed)
  features = {
      "a": padded_ids(rng, n, 3),
      "w": padded_ids(rng, n, 3),
      "b": padded_ids(rng, n, 2),
      "c": padded_ids(rng, n, 2),
      # wider than L: serving and predict both truncate to L
      "s": padded_ids(rng, n, L + 1),
  }
  features["w_weight"] = np.where(features["w"] >= 0,
                                  rng.uniform(0.5, 2.0, features["w"].shape),
                                  0.0).astype(np.float32)
  return features, rng.randn(n, 1).astype(np.float32)


def _assert_serving_state_free(export_dir, variables, ops, train_ckpt):
  """The SavedModel holds the trained tables and dense variables, and no
  optimizer, slot or pipelining state."""
  saved = {
      name for name, _ in tf.train.list_variables(
          os.path.join(export_dir, "variables", "variables"))
  }
  expected = {name for name in train_ckpt
              if not any(marker in name for marker in SLOT_MARKERS)}
  assert any("Adagrad" in name for name in train_ckpt)  # training had slots
  assert saved == expected
  for name in variables:
    assert not any(marker in name for marker in SLOT_MARKERS), name
    assert "pipelined" not in name, name
  assert not [op for op in ops if "pipelined" in op]
  assert not [op for op in ops if "gradient_anchor" in op]


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["div", "mod"])
def test_export_saved_model_serves_what_predict_gives(tmp_path, strategy):
  features, labels = export_data(2 * SHARDED_BATCH, seed=4)
  dense_columns, sequence_columns = export_columns()
  model_dir = tmp_path / "model"
  est = sharded_estimator(model_dir, strategy,
                          dense_columns + sequence_columns,
                          export_model_fn(dense_columns, sequence_columns),
                          pipelining=True, spec_opt="adagrad")
  est.train(train_input_fn(features, labels), max_steps=2)
  train_ckpt = checkpoint_values(model_dir)
  assert "dense_features/a_embedding/embedding_weights/Adagrad" in train_ckpt

  parse_spec = v1.feature_column.make_parse_example_spec(dense_columns +
                                                         sequence_columns)
  export_dir = est.export_saved_model(
      str(tmp_path / "export"),
      tf.estimator.export.build_parsing_serving_input_receiver_fn(
          parse_spec)).decode()

  serve_features, _ = export_data(8, seed=5)
  predicted = predict_all(est, serve_features)
  serialized = [
      to_tf_example(serve_features, i, {"w_weight": "w"}) for i in range(8)
  ]
  served, variables, ops = serve(export_dir, serialized)
  assert sorted(served) == sorted(predicted)
  for key in predicted:
    np.testing.assert_allclose(served[key], predicted[key], rtol=1e-6,
                               atol=1e-6, err_msg=key)
  # The sequence feature was truncated to L in both.
  lengths = (serve_features["s"] >= 0).sum(axis=1)
  assert lengths.max() > L  # the data has sequences to truncate
  np.testing.assert_array_equal(predicted["lengths"], np.minimum(lengths, L))
  # Training ran with pipelining (its graph held the pipelining state).
  assert "pipelined" in (model_dir / "graph.pbtxt").read_text()
  _assert_serving_state_free(export_dir, variables, ops, train_ckpt)

  if strategy == "div":
    result = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "saved_model_cli"),
         "show", "--dir", export_dir, "--all"],
        capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "serving_default" in result.stdout
    assert "examples" in result.stdout


# ---------------------------------------------------------------------------
# 5. The dict form of the spec.

DICT_L = 3


def dict_spec():
  tables = {
      "t_items": es.TableConfig(V, D, combiner="sum"),
      "t_users": es.TableConfig(V, 2, combiner="mean"),
  }
  feature_configs = {
      "item": es.FeatureConfig("t_items", weight_key="item_w"),
      "history": es.FeatureConfig("t_items", max_sequence_length=DICT_L),
      "user": es.FeatureConfig("t_users"),
  }
  return es.EmbeddingConfigSpec(
      table_to_config_dict=tables, feature_to_config_dict=feature_configs,
      optimization_parameters=es.StochasticGradientDescentParameters(0.5))


def dict_data(n, seed, vocab=V):
  rng = np.random.RandomState(seed)
  features = {
      "item": padded_ids(rng, n, 2, vocab),
      "history": padded_ids(rng, n, DICT_L + 1, vocab, min_len=0),
      "user": padded_ids(rng, n, 2, vocab),
  }
  features["item_w"] = np.where(features["item"] >= 0,
                                rng.uniform(0.5, 2.0, features["item"].shape),
                                0.0).astype(np.float32)
  return features, rng.randn(n, 1).astype(np.float32)


def _to_sparse(features):
  """Padded dense arrays -> SparseTensors of the present ids (weights at the
  ids' positions), as a TPUEstimator input_fn gives the dict form."""
  result = {}
  for name in ("item", "history", "user"):
    ids = features[name]
    where = tf.where(ids >= 0)
    result[name] = tf.SparseTensor(where, tf.gather_nd(ids, where),
                                   tf.shape(ids, out_type=tf.int64))
    if name == "item":
      result["item_w"] = tf.SparseTensor(
          where, tf.gather_nd(features["item_w"], where),
          tf.shape(ids, out_type=tf.int64))
  return result


def dict_input_fn(features, labels=None, repeat=False):

  def input_fn(params):
    data = features if labels is None else (features, labels)
    dataset = tf.data.Dataset.from_tensor_slices(data)
    if repeat:
      dataset = dataset.repeat()
    dataset = dataset.batch(params["batch_size"], drop_remainder=True)
    if labels is None:
      return dataset.map(_to_sparse)
    return dataset.map(lambda f, y: (_to_sparse(f), y))

  return input_fn


def dict_model_fn(seen):
  """model_fn of the dict form; records what it finds in `features`."""
  return lambda features, labels, mode: _dict_model(seen, features, labels,
                                                    mode)


def _dict_model(seen, features, labels, mode):
  seen.append((mode, {k: (v.shape.as_list() if isinstance(v, tf.Tensor) else
                          type(v).__name__) for k, v in features.items()}))
  x = tf.concat([
      features["item"], features["user"],
      tf.reshape(features["history"], [-1, DICT_L * D])
  ], axis=1)
  logits = v1.layers.dense(x, 1, name="out")
  if mode == PREDICT:
    return es.TPUEstimatorSpec(mode, predictions={
        "logits": logits,
        "item": features["item"],
        "user": features["user"],
        "history": features["history"],
        "history_len": features["history_seq_length_"],
    })
  loss = v1.losses.mean_squared_error(labels, logits)
  train_op = v1.train.GradientDescentOptimizer(0.1).minimize(
      loss, global_step=v1.train.get_global_step())
  return es.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)


def numpy_dict_model(features, ckpt):
  items, users = ckpt["t_items"], ckpt["t_users"]
  item = np.stack([
      (items[r[r >= 0]] * wt[r >= 0][:, None]).sum(axis=0)
      for r, wt in zip(features["item"], features["item_w"])
  ])
  user = np.stack([users[r[r >= 0]].mean(axis=0) for r in features["user"]])
  history = np.zeros((len(item), DICT_L, D), np.float32)
  lengths = np.zeros(len(item), np.int64)
  for b, r in enumerate(features["history"]):
    present = r[r >= 0][:DICT_L]
    history[b, :len(present)] = items[present]
    lengths[b] = len(present)
  x = np.concatenate([item, user, history.reshape(len(item), -1)], axis=1)
  logits = x @ ckpt["out/kernel"] + ckpt["out/bias"]
  return dict(logits=logits, item=item, user=user, history=history,
              history_len=lengths)


@pytest.mark.slow
def test_dict_form_spec_train_evaluate_predict_export(tmp_path):
  seen = []
  est = es.TPUEstimator(
      model_fn=dict_model_fn(seen),
      config=TF_EST_TPU.RunConfig(model_dir=str(tmp_path / "model")),
      use_tpu=False, train_batch_size=B,
      eval_batch_size=B, predict_batch_size=B,
      embedding_config_spec=dict_spec())
  # Training touches ids < 12 only.
  train_x, train_y = dict_data(N, seed=6, vocab=12)
  est.train(dict_input_fn(train_x, train_y, repeat=True), max_steps=1)
  first = checkpoint_values(tmp_path / "model")
  est.train(dict_input_fn(train_x, train_y, repeat=True), max_steps=3)
  ckpt = checkpoint_values(tmp_path / "model")
  assert set(ckpt) == {"t_items", "t_users", "out/kernel", "out/bias",
                       "global_step"}
  assert int(ckpt["global_step"]) == 3
  assert ckpt["t_items"].shape == (V, D) and ckpt["t_users"].shape == (V, 2)
  for table in ("t_items", "t_users"):
    assert not np.array_equal(ckpt[table][:12], first[table][:12]), table
    np.testing.assert_array_equal(ckpt[table][12:], first[table][12:])

  # model_fn saw activations in place of ids, weights removed.
  assert [mode for mode, _ in seen] == [TRAIN, TRAIN]
  for _, shapes in seen:
    assert shapes == {
        "item": [B, D],
        "user": [B, 2],
        "history": [B, DICT_L, D],
        "history_seq_length_": [B],
    }

  eval_x, eval_y = dict_data(8, seed=7)
  expected = numpy_dict_model(eval_x, ckpt)
  loss = est.evaluate(dict_input_fn(eval_x, eval_y))["loss"]
  np.testing.assert_allclose(loss, np.mean((expected["logits"] - eval_y)**2),
                             rtol=1e-5)

  predicted = predict_all(est, eval_x, dict_input_fn(eval_x))
  assert sorted(predicted) == sorted(expected)
  for key, value in expected.items():
    np.testing.assert_allclose(predicted[key], value, rtol=1e-5, atol=1e-6,
                               err_msg=key)

  parse_spec = {
      "item": tf.io.VarLenFeature(tf.int64),
      "item_w": tf.io.VarLenFeature(tf.float32),
      "history": tf.io.VarLenFeature(tf.int64),
      "user": tf.io.VarLenFeature(tf.int64),
  }
  export_dir = est.export_saved_model(
      str(tmp_path / "export"),
      tf.estimator.export.build_parsing_serving_input_receiver_fn(
          parse_spec)).decode()
  serialized = [
      to_tf_example(eval_x, i, {"item_w": "item"}) for i in range(8)
  ]
  served, variables, _ = serve(export_dir, serialized)
  for key, value in predicted.items():
    np.testing.assert_allclose(served[key], value, rtol=1e-6, atol=1e-6,
                               err_msg=key)
  # Evaluate, predict and the serving graph fed model_fn the same way (the
  # serving batch size is not static).
  assert [mode for mode, _ in seen[2:]] == [
      tf.estimator.ModeKeys.EVAL, PREDICT, PREDICT]
  for _, shapes in seen[2:]:
    assert sorted(shapes) == ["history", "history_seq_length_", "item", "user"]
    assert shapes["item"][1:] == [D] and shapes["user"][1:] == [2]
    assert shapes["history"][1:] == [DICT_L, D]
  assert seen[-1][1]["item"][0] is None
  # Tables are (one-partition) partitioned variables: `<table>/part_0`.
  assert sorted(re.sub(r"/part_\d+$", "", v) for v in variables) == [
      "global_step", "out/bias", "out/kernel", "t_items", "t_users"
  ]
