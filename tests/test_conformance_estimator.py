"""Conformance of `estimator_spec.TPUEstimator` with TF 2.15's TPUEstimator.

One test (or one parametrized test) per scenario of TensorFlow's public
TPUEstimator embedding tests (tensorflow/estimator:
`tpu/tpu_estimator_embedding_test.py` and `tpu/tpu_enqueue_sequence_test.py`),
written anew for this library, plus the TPUEstimator behaviours the library
promises on top of them (params, TPU context, static shapes, input checks).

Every estimator scenario runs on these sides (`SIDES`, or a variant with
another number of cores):
* ours with use_tpu=False;
* ours with use_tpu=True, PER_HOST_V1 and PER_HOST_V2 input (no TPU exists
  here: ours emulates the TPU cores of `tpu_config.num_shards` on the host);
* TF's own `TPUEstimator(use_tpu=False)` (TF's CPU path) with TF's columns,
  as an oracle where it computes what a TPU computes. TF's CPU path trains
  tables with the model's optimizer (the embedding optimizer, learning-rate
  functions and multiplier are ignored), does not pad or truncate sequences,
  refuses integer weights and `mod` sharding: there each side is held to its
  own behaviour.

Expected numbers are computed by hand from docs/numerics.md (SGD / Adagrad on
the accumulated per-id gradient, combiners, sequence padding/truncation).

Scenario map (TF test -> test here):
  test_get_tpu_embedding_config_from_feature_columns
      -> test_config_from_feature_columns
  test_feature_in_two_embeddings -> test_feature_in_two_embeddings
  test_two_features_with_config_dicts -> test_two_features_dict_form
  test_non_tpu_embedding_column -> test_non_tpu_embedding_column
  test_feature_in_embedding_and_shared_embedding
      -> test_feature_in_embedding_and_shared_embedding
  test_sequence_column_with_no_max_length,
  test_non_sequence_column_with_max_length,
  test_sequence_column_shared_embedding_wrong_max_sequence_length,
  test_sequence_column_shared_embedding_non_sequence_with_max_length,
  test_sequence_column_shared_embedding_sequence_without_max_length
      -> test_sequence_length_arguments[<TF test name>]
  test_sequence_column_length -> test_sequence_column_length
  test_unknown_partition_strategy -> test_unknown_partition_strategy
  test_mod_partition_strategy_on_cpu -> test_mod_partition_strategy
  test_two_features -> test_two_features_columns
  test_dynamic_learning_rate -> test_dynamic_learning_rate
  test_embedding_with_weighted_categorical_column -> test_weighted_column
  test_shared_embedding_with_weighted_categorical_column_and_dataset
      -> test_shared_weighted_column_integer_weights
  test_embedding_with_with_weighted_categorical_column_with_vocab_error
      -> test_weighted_vocabulary_column
  test_embedding_with_weighted_categorical_column_dense_weights_error
      -> test_dense_weights_refused
  test_embedding_with_weighted_categorical_column_share_weights_error
      -> test_shared_weight_key_refused
  test_tensor_core_embedding -> test_tensor_core_embedding
  test_non_contiguous_sequence,
  test_non_contiguous_sequence_with_length_gt_max_sequence_length,
  test_multivalent_sequence_features -> test_sequence_activations[...]

Beyond TF's test files (behaviours of TF 2.15's TPUEstimator source):
  params: test_params_reserved_keys_and_use_tpu, test_cpu_path_params
  TPU context and input pipelines (use_tpu=True, no TPU):
      test_tpu_context_with_embeddings, test_tpu_context_without_embeddings,
      test_embedding_refuses_other_input_pipelines
  static activation shapes: test_static_activation_shapes
  a loss of the activations alone: test_embedding_only_loss_trains_tables
  bad input refused before any write: test_bad_input_fails_before_any_write
"""
import os
import re
import types
from typing import NamedTuple, Optional

import numpy as np
import pytest
import tensorflow as tf
from tensorflow_estimator.python.estimator.tpu import (
    _tpu_estimator_embedding as tf_tpu_embedding)

import estimator_spec as es
import tpu_embedding_columns as tec
from estimator_spec.checkpoints import restore as checkpoints

fc = tf.feature_column
v1 = tf.compat.v1
TT = tf.compat.v1.tpu.experimental
ET = tf.compat.v1.estimator.tpu
TRAIN = es.estimator.ModeKeys.TRAIN
EVAL = es.estimator.ModeKeys.EVAL
PREDICT = es.estimator.ModeKeys.PREDICT
PER_HOST_V1 = ET.InputPipelineConfig.PER_HOST_V1
PER_HOST_V2 = ET.InputPipelineConfig.PER_HOST_V2
PER_SHARD_V1 = ET.InputPipelineConfig.PER_SHARD_V1
BROADCAST = ET.InputPipelineConfig.BROADCAST

# ---------------------------------------------------------------------------
# Sides: which implementation runs a scenario, how.

OURS_API = types.SimpleNamespace(
    embedding_column=tec.embedding_column,
    shared_embedding_columns=tec.shared_embedding_columns,
    EmbeddingConfigSpec=es.EmbeddingConfigSpec,
    SGD=es.StochasticGradientDescentParameters,
    Adagrad=es.AdagradParameters,
    TPUEstimator=es.TPUEstimator,
    TPUEstimatorSpec=es.TPUEstimatorSpec)

TF_API = types.SimpleNamespace(
    embedding_column=TT.embedding_column,
    shared_embedding_columns=TT.shared_embedding_columns,
    EmbeddingConfigSpec=ET.experimental.EmbeddingConfigSpec,
    SGD=TT.StochasticGradientDescentParameters,
    Adagrad=TT.AdagradParameters,
    TPUEstimator=ET.TPUEstimator,
    TPUEstimatorSpec=ET.TPUEstimatorSpec)


class Side(NamedTuple):
  impl: str  # "ours" or "tf"
  use_tpu: bool
  input_method: object = PER_HOST_V2
  num_shards: Optional[int] = 8

  @property
  def api(self):
    return OURS_API if self.impl == "ours" else TF_API

  @property
  def is_tf(self):
    return self.impl == "tf"

  def __str__(self):
    method = {PER_HOST_V1: "v1", PER_HOST_V2: "v2", PER_SHARD_V1: "shard",
              BROADCAST: "broadcast"}[self.input_method]
    if not self.use_tpu:
      return f"{self.impl}-cpu"
    return f"{self.impl}-tpu-{method}"


# The 8 TPU cores of TF's tests (one host), batch 8.
TF_CPU = Side("tf", False)
OURS_CPU = Side("ours", False)
OURS_TPU_V1 = Side("ours", True, PER_HOST_V1)
OURS_TPU_V2 = Side("ours", True, PER_HOST_V2)
SIDES = [TF_CPU, OURS_CPU, OURS_TPU_V1, OURS_TPU_V2]
OURS_SIDES = [OURS_CPU, OURS_TPU_V1, OURS_TPU_V2]


def run_config(side, model_dir, num_shards="side", **tpu_kwargs):
  shards = side.num_shards if num_shards == "side" else num_shards
  return ET.RunConfig(
      model_dir=str(model_dir),
      tpu_config=ET.TPUConfig(
          iterations_per_loop=1, num_shards=shards,
          per_host_input_for_training=side.input_method, **tpu_kwargs))


def make_estimator(side, model_fn, spec, model_dir, train_batch_size=8,
                   num_shards="side", **kwargs):
  return side.api.TPUEstimator(
      model_fn=model_fn, config=run_config(side, model_dir, num_shards),
      use_tpu=side.use_tpu, train_batch_size=train_batch_size,
      embedding_config_spec=spec, **kwargs)


def train_op_for(optimizer, loss, params):
  """The user's train op, TF style: CrossShardOptimizer on a TPU only (TF's
  CPU path has no CrossReplicaSum kernel)."""
  if params.get("use_tpu"):
    optimizer = v1.tpu.CrossShardOptimizer(optimizer)
  return optimizer.minimize(loss, global_step=v1.train.get_global_step())


def squared_error_spec(api, mode, labels, predictions, params, optimizer):
  """EVAL/TRAIN spec of a mean-squared-error model; `optimizer` (a callable
  making the model's optimizer) trains it in TRAIN."""
  loss = v1.losses.mean_squared_error(labels, predictions)
  train_op = None
  if mode == TRAIN:
    train_op = train_op_for(optimizer(), loss, params)
  return api.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)


def read_checkpoint(model_dir):
  """{name: value} of the latest checkpoint (without the partition-strategy
  record of our checkpoints)."""
  reader = tf.train.load_checkpoint(str(model_dir))
  return {
      name: reader.get_tensor(name)
      for name in reader.get_variable_to_shape_map()
      if name != checkpoints.LAYOUT_TENSOR
  }


def has_no_checkpoint(model_dir):
  model_dir = str(model_dir)
  if not os.path.exists(model_dir):
    return True
  return (tf.train.latest_checkpoint(model_dir) is None and
          not [n for n in os.listdir(model_dir) if ".index" in n])


def only_the_initial_checkpoint(model_dir):
  """No checkpoint, or only the one of global step 0 (the initial state)."""
  latest = tf.train.latest_checkpoint(str(model_dir))
  if latest is None:
    return has_no_checkpoint(model_dir)
  return tf.train.load_checkpoint(latest).get_tensor("global_step") == 0


def row_initializer(rows):
  """Initializer giving row r of a table the values rows(r) (a function of
  the row index, broadcast over the dimension); row order = stored order
  (`div`), also for the partitions of a partitioned table."""

  def initializer(shape, dtype=tf.float32, partition_info=None):
    start = partition_info.var_offset[0] if partition_info else 0
    index = np.arange(start, start + shape[0], dtype=np.float64)
    values = np.broadcast_to(
        np.asarray(rows(index), np.float64).reshape(shape[0], -1), shape)
    return tf.constant(values.astype(np.float32), dtype)

  return initializer


class FetchHook(tf.compat.v1.train.SessionRunHook):
  """Fetches `tensors` with every run; keeps the values of each run."""

  def __init__(self, tensors, hooks=None):
    self._tensors = tensors
    self.values = []
    if hooks is not None:
      hooks.append(self)

  def before_run(self, run_context):
    return tf.compat.v1.train.SessionRunArgs(self._tensors)

  def after_run(self, run_context, run_values):
    self.values.append(run_values.results)


def sgd(w, g, lr):
  return np.asarray(w, np.float64) - lr * np.asarray(g, np.float64)


def adagrad(w, g, lr, accumulator=0.1):
  """One Adagrad step on rows (docs/numerics.md, 'Each optimizer on a touched
  row'): (new rows, accumulator)."""
  g = np.asarray(g, np.float64)
  acc = accumulator + g * g
  return np.asarray(w, np.float64) - lr * g / np.sqrt(acc), acc


def sparse_dataset(value):
  """A dataset of the examples of a SparseTensorValue (one per element)."""
  return tf.data.Dataset.range(1).map(
      lambda _: tf.SparseTensor.from_value(value)).unbatch()


def pairs(batch, first, second):
  """[batch, 2] SparseTensor with ids (first, second) in every example."""
  return tf.SparseTensor(
      indices=[[i, j] for i in range(batch) for j in (0, 1)],
      values=[first, second] * batch, dense_shape=[batch, 2])


# ---------------------------------------------------------------------------
# Configuration from columns.


def _config_columns(api, initializers):
  ident = fc.categorical_column_with_identity
  seq = fc.sequence_categorical_column_with_identity
  a = api.embedding_column(ident("a", 3), 2, combiner="mean",
                           initializer=initializers["a"])
  b, c = api.shared_embedding_columns(
      [ident("b", 6), fc.weighted_categorical_column(ident("c", 6),
                                                     "c_weight")],
      5, combiner="sqrtn", initializer=initializers["bc"])
  d = api.embedding_column(
      fc.weighted_categorical_column(ident("d", 3), "d_weight"), 2,
      combiner="mean", initializer=initializers["d"])
  e = api.embedding_column(seq("e", 7), 3, max_sequence_length=3,
                           initializer=initializers["e"])
  f, g, h = api.shared_embedding_columns(
      [seq("f", 4), seq("g", 4), ident("h", 4)], 4,
      max_sequence_lengths=[2, 1, 0], initializer=initializers["fgh"])
  return [a, b, c, d, e, f, g, h]


def test_config_from_feature_columns():
  """Tables and features derived from columns: names, sizes, combiners,
  initializers, sequence lengths and weight keys, as TF derives them."""
  initializers = {
      k: (lambda k=k: f"init_{k}") for k in ("a", "bc", "d", "e", "fgh")
  }
  model = es.EmbeddingConfigSpec(
      feature_columns=_config_columns(OURS_API, initializers),
      optimization_parameters=es.AdagradParameters(0.1)).model

  expected_tables = {
      # name: (vocabulary, dimension, combiner, initializer)
      "tbl_a": (3, 2, "mean", "init_a"),
      "tbl_b_c_weighted_by_c_weight_shared_embedding": (6, 5, "sqrtn",
                                                        "init_bc"),
      "tbl_d_weighted_by_d_weight": (3, 2, "mean", "init_d"),
      "tbl_e": (7, 3, "mean", "init_e"),
      "tbl_f_g_h_shared_embedding": (4, 4, "mean", "init_fgh"),
  }
  expected_features = {
      # name: (table, max_sequence_length, weight_key)
      "a": ("tbl_a", 0, None),
      "b": ("tbl_b_c_weighted_by_c_weight_shared_embedding", 0, None),
      "c": ("tbl_b_c_weighted_by_c_weight_shared_embedding", 0, "c_weight"),
      "d": ("tbl_d_weighted_by_d_weight", 0, "d_weight"),
      "e": ("tbl_e", 3, None),
      "f": ("tbl_f_g_h_shared_embedding", 2, None),
      "g": ("tbl_f_g_h_shared_embedding", 1, None),
      "h": ("tbl_f_g_h_shared_embedding", 0, None),
  }
  got_tables = {
      name: (t.vocabulary_size, t.dimension, t.combiner, t.initializer())
      for name, t in model.tables.items()
  }
  got_features = {
      name: (f.table, f.max_sequence_length, f.weight_key)
      for name, f in model.features.items()
  }
  assert got_tables == expected_tables
  assert got_features == expected_features

  # TF's own derivation from TF's columns agrees.
  tf_tables, tf_features = tf_tpu_embedding.get_configs_from_feature_columns(
      _config_columns(TF_API, initializers))
  assert {
      name: (t.vocabulary_size, t.dimension, t.combiner, t.initializer())
      for name, t in tf_tables.items()
  } == expected_tables
  assert {
      name: (f.table_id, f.max_sequence_length, f.weight_key)
      for name, f in tf_features.items()
  } == expected_features


# ---------------------------------------------------------------------------
# Refusals of column sets (TF raises them where it builds the TPU
# configuration; ours must raise the same type with TF's key phrase).


def _simple_model_fn(api, columns):

  def model_fn(features, labels, mode, params):
    x = v1.keras.layers.DenseFeatures(columns)(features)
    logits = v1.layers.dense(x, 1)
    loss = v1.losses.mean_squared_error(labels, logits)
    return api.TPUEstimatorSpec(
        mode, loss=loss,
        train_op=train_op_for(v1.train.AdagradOptimizer(0.5), loss, params))

  return model_fn


def _xy_input_fn(params):
  batch = params["batch_size"]
  return tf.data.Dataset.from_tensors(({
      "x": pairs(batch, 1, 2),
      "y": pairs(batch, 3, 4)
  }, np.zeros((batch, 1), np.float32))).repeat()


def _refusal_columns(api, case):
  x = fc.categorical_column_with_identity("x", 10)
  y = fc.categorical_column_with_identity("y", 10)
  if case == "two_embeddings":
    return [api.embedding_column(x, 2), api.embedding_column(x, 4)]
  if case == "embedding_and_shared":
    return [api.embedding_column(x, 2)] + api.shared_embedding_columns(
        [x, y], 4)
  assert case == "non_tpu_column"
  return [api.embedding_column(x, 2), fc.embedding_column(y, 4)]


def _check_column_set_refusal(tmp_path, side, case, error, phrase):
  columns = _refusal_columns(side.api, case)
  if side.is_tf:
    # TF on a TPU: the configuration TF derives from the columns refuses.
    with pytest.raises(error, match=phrase):
      tf_tpu_embedding.get_configs_from_feature_columns(columns)
    return columns
  with pytest.raises(error, match=phrase):
    spec = es.EmbeddingConfigSpec(
        feature_columns=columns,
        optimization_parameters=es.AdagradParameters(0.01))
    estimator = make_estimator(side, _simple_model_fn(side.api, columns),
                               spec, tmp_path)
    estimator.train(_xy_input_fn, steps=1)
  assert has_no_checkpoint(tmp_path)
  return columns


def _tf_cpu_estimator(tmp_path, columns):
  spec = ET.experimental.EmbeddingConfigSpec(
      feature_columns=columns,
      optimization_parameters=TT.AdagradParameters(0.01))
  return make_estimator(TF_CPU, _simple_model_fn(TF_API, columns), spec,
                        tmp_path)


@pytest.mark.parametrize("side", SIDES, ids=str)
def test_feature_in_two_embeddings(tmp_path, side):
  columns = _check_column_set_refusal(
      tmp_path, side, "two_embeddings", ValueError,
      "is used with multiple embeddings")
  if side.is_tf:
    # TF's CPU path: DenseFeatures refuses two columns of one name.
    with pytest.raises(ValueError, match="Duplicate feature column name"):
      _tf_cpu_estimator(tmp_path, columns).train(_xy_input_fn, steps=1)


@pytest.mark.parametrize("side", SIDES, ids=str)
def test_feature_in_embedding_and_shared_embedding(tmp_path, side):
  columns = _check_column_set_refusal(
      tmp_path, side, "embedding_and_shared", ValueError,
      "is used with multiple embeddings")
  if side.is_tf:
    # TF's CPU path never builds the TPU configuration: it trains.
    _tf_cpu_estimator(tmp_path, columns).train(_xy_input_fn, steps=1)
    assert read_checkpoint(tmp_path)["global_step"] == 1


@pytest.mark.parametrize("side", SIDES, ids=str)
def test_non_tpu_embedding_column(tmp_path, side):
  columns = _check_column_set_refusal(tmp_path, side, "non_tpu_column",
                                      TypeError, "Unsupported feature column")
  if side.is_tf:
    _tf_cpu_estimator(tmp_path, columns).train(_xy_input_fn, steps=1)
    assert read_checkpoint(tmp_path)["global_step"] == 1


# ---------------------------------------------------------------------------
# Column arguments: sequence lengths.

_SEQUENCE_ARGUMENT_CASES = {
    "test_sequence_column_with_no_max_length": "max_sequence_length must be "
                                               "greater than 0",
    "test_non_sequence_column_with_max_length": "Non zero max_seq_length=2 "
                                                "specified for non",
    "test_sequence_column_shared_embedding_wrong_max_sequence_length":
        "max_sequence_lengths and categorical_columns must be of",
    "test_sequence_column_shared_embedding_non_sequence_with_max_length":
        "Non zero max_seq_length=1 specified for non",
    "test_sequence_column_shared_embedding_sequence_without_max_length":
        "max_sequence_length must be greater than 0",
}


def _build_bad_sequence_column(api, case):
  seq_x = fc.sequence_categorical_column_with_identity("x", 10)
  seq_y = fc.sequence_categorical_column_with_identity("y", 10)
  x = fc.categorical_column_with_identity("x", 10)
  y = fc.categorical_column_with_identity("y", 10)
  if case == "test_sequence_column_with_no_max_length":
    api.embedding_column(seq_x, 2)
  elif case == "test_non_sequence_column_with_max_length":
    api.embedding_column(x, 2, max_sequence_length=2)
  elif case == ("test_sequence_column_shared_embedding_wrong_max_sequence_"
                "length"):
    api.shared_embedding_columns([seq_x, seq_y], 2, max_sequence_lengths=[2])
  elif case == ("test_sequence_column_shared_embedding_non_sequence_with_max_"
                "length"):
    api.shared_embedding_columns([seq_x, y], 2, max_sequence_lengths=[2, 1])
  else:
    api.shared_embedding_columns([seq_x, y], 2)


@pytest.mark.parametrize("impl", ["tf", "ours"])
@pytest.mark.parametrize("case", sorted(_SEQUENCE_ARGUMENT_CASES))
def test_sequence_length_arguments(case, impl):
  """Column constructors refuse inconsistent sequence lengths (no
  estimator involved: use_tpu plays no part)."""
  api = TF_API if impl == "tf" else OURS_API
  with pytest.raises(ValueError, match=_SEQUENCE_ARGUMENT_CASES[case]):
    _build_bad_sequence_column(api, case)


# ---------------------------------------------------------------------------
# Dict form: two features, shared or not, sequence or not.


def _dict_two_features_spec(shared, sequence):
  y_table = "t1" if shared else "t2"
  features = {
      "x": es.FeatureConfig("t1"),
      "y": es.FeatureConfig(y_table, max_sequence_length=2 if sequence else 0),
  }
  tables = {"t1": es.TableConfig(10, 2, row_initializer(lambda r: 0.1 * r))}
  if not shared:
    tables["t2"] = es.TableConfig(10, 4,
                                  row_initializer(lambda r: 0.2 * r + 0.05))
  return es.EmbeddingConfigSpec(
      feature_to_config_dict=features, table_to_config_dict=tables,
      optimization_parameters=es.AdagradParameters(0.01,
                                                   initial_accumulator=0.1))


@pytest.mark.slow
@pytest.mark.parametrize("side", OURS_SIDES, ids=str)
@pytest.mark.parametrize("shared,sequence", [(False, False), (True, False),
                                             (False, True), (True, True)],
                         ids=["non_shared_non_sequence", "shared_non_sequence",
                              "non_shared_sequence", "shared_sequence"])
def test_two_features_dict_form(tmp_path, side, shared, sequence):
  """model_fn gets the activations in `features` (static batch) and
  `y_seq_length_`; one Adagrad step per table on the ids' summed gradients.

  x has ids (1, 1) and y (2, 2) in every example, combiner mean; the loss
  is the sum of all activations, so every activation element has gradient
  1: mean sends 1/2 to each of the two ids (row 1 of t1: 8 examples x 1),
  a sequence sends 1 per position (row 2: 8 x 2)."""
  y_dim = 2 if shared else 4
  hooks = []
  seen = {}

  def model_fn(features, labels, mode, params):
    del labels
    seen["x"] = features["x"].shape.as_list()
    seen["y"] = features["y"].shape.as_list()
    fetch = {"x": features["x"], "y": features["y"]}
    if sequence:
      seen["len"] = features["y_seq_length_"].shape.as_list()
      fetch["len"] = features["y_seq_length_"]
    bias = v1.get_variable("bias", [], initializer=tf.zeros_initializer())
    loss = tf.reduce_sum(features["x"]) + tf.reduce_sum(features["y"]) + bias
    return es.TPUEstimatorSpec(
        mode, loss=loss,
        train_op=train_op_for(v1.train.GradientDescentOptimizer(0.5), loss,
                              params),
        training_hooks=[FetchHook(fetch, hooks)])

  def input_fn(params):
    batch = params["batch_size"]
    return tf.data.Dataset.from_tensors({
        "x": pairs(batch, 1, 1),
        "y": pairs(batch, 2, 2)
    }).repeat()

  estimator = make_estimator(side, model_fn,
                             _dict_two_features_spec(shared, sequence),
                             tmp_path)
  estimator.train(input_fn, steps=1)

  assert seen["x"] == [8, 2]
  assert seen["y"] == ([8, 2, y_dim] if sequence else [8, y_dim])
  fetched = hooks[-1].values[0]
  t1 = 0.1 * np.arange(10)
  t2 = 0.2 * np.arange(10) + 0.05
  np.testing.assert_allclose(fetched["x"], np.full((8, 2), t1[1]), rtol=1e-6)
  y_row = t1[2] if shared else t2[2]
  y_expected = np.full((8, 2, y_dim) if sequence else (8, y_dim), y_row)
  np.testing.assert_allclose(fetched["y"], y_expected, rtol=1e-6)
  if sequence:
    np.testing.assert_array_equal(fetched["len"], np.full(8, 2))

  values = read_checkpoint(tmp_path)
  y_grad = 16.0 if sequence else 8.0
  expected_t1 = np.repeat(t1[:, None], 2, 1)
  acc_t1 = np.full((10, 2), 0.1)
  expected_t1[1], acc_t1[1] = adagrad(expected_t1[1], 8.0, 0.01)
  if shared:
    expected_t1[2], acc_t1[2] = adagrad(expected_t1[2], y_grad, 0.01)
  else:
    expected_t2 = np.repeat(t2[:, None], 4, 1)
    acc_t2 = np.full((10, 4), 0.1)
    expected_t2[2], acc_t2[2] = adagrad(expected_t2[2], y_grad, 0.01)
    np.testing.assert_allclose(values["t2"], expected_t2, rtol=1e-5)
    np.testing.assert_allclose(values["t2/Adagrad"], acc_t2, rtol=1e-5)
  np.testing.assert_allclose(values["t1"], expected_t1, rtol=1e-5)
  np.testing.assert_allclose(values["t1/Adagrad"], acc_t1, rtol=1e-5)
  np.testing.assert_allclose(values["bias"], -0.5)


# ---------------------------------------------------------------------------
# Columns form: two features; TF's CPU checkpoint names are all in ours.


def _two_feature_columns(api, shared, sequence):
  x = fc.categorical_column_with_identity("x", 10)
  if sequence:
    y = fc.sequence_categorical_column_with_identity("y", 10)
  else:
    y = fc.categorical_column_with_identity("y", 10)
  init = row_initializer(lambda r: 0.1 * r - 0.3)
  if shared:
    return api.shared_embedding_columns(
        [x, y], 2, initializer=init,
        max_sequence_lengths=[0, 2] if sequence else None)
  return [
      api.embedding_column(x, 2, initializer=init),
      api.embedding_column(y, 4, initializer=init,
                           max_sequence_length=2 if sequence else 0)
  ]


def _two_features_model_fn(api, columns, sequence):
  """A linear model over the dense columns, the flattened sequence column
  and its lengths; zero kernel; mean squared error to labels 1."""
  dense = columns[:1] if sequence else columns

  def model_fn(features, labels, mode, params):
    parts = [v1.keras.layers.DenseFeatures(dense)(features)]
    if sequence:
      acts, lengths = tf.keras.experimental.SequenceFeatures(columns[1:])(
          features)
      parts += [
          tf.reshape(acts, [-1, 2 * acts.shape[-1]]),
          tf.cast(lengths, tf.float32)[:, None]
      ]
    logits = v1.layers.dense(tf.concat(parts, 1), 1,
                             kernel_initializer=tf.zeros_initializer())
    if mode == PREDICT:
      return api.TPUEstimatorSpec(mode, predictions={"logits": logits})
    return squared_error_spec(api, mode, labels, logits, params,
                              lambda: v1.train.AdagradOptimizer(0.5))

  return model_fn


def _ones_labels_input_fn(params):
  batch = params["batch_size"]
  return tf.data.Dataset.from_tensors(({
      "x": pairs(batch, 1, 1),
      "y": pairs(batch, 2, 2)
  }, np.ones((batch, 1), np.float32))).repeat()


def _train_two_features(tmp_path, side, shared, sequence):
  columns = _two_feature_columns(side.api, shared, sequence)
  spec = side.api.EmbeddingConfigSpec(
      feature_columns=columns,
      optimization_parameters=side.api.Adagrad(0.01,
                                               initial_accumulator=0.1))
  model_dir = tmp_path / str(side)
  estimator = make_estimator(
      side, _two_features_model_fn(side.api, columns, sequence), spec,
      model_dir)
  estimator.train(_ones_labels_input_fn, steps=1)
  return read_checkpoint(model_dir)


@pytest.mark.slow
@pytest.mark.parametrize("shared,sequence", [(False, False), (True, False),
                                             (False, True), (True, True)],
                         ids=["non_shared_non_sequence", "shared_non_sequence",
                              "non_shared_sequence", "shared_sequence"])
def test_two_features_columns(tmp_path, shared, sequence):
  """Every variable TF's CPU path checkpoints is in ours' checkpoint with
  the same shape, for use_tpu=False and True (V1, V2); after one step the
  values agree too: the zero kernel sends no gradient to the tables, and
  the dense variables' gradients depend only on the (equal) activations."""
  tf_values = _train_two_features(tmp_path, TF_CPU, shared, sequence)
  assert tf_values["global_step"] == 1
  assert not np.allclose(tf_values["dense/kernel"], 0.0)
  for side in OURS_SIDES:
    ours = _train_two_features(tmp_path, side, shared, sequence)
    missing = sorted(set(tf_values) - set(ours))
    assert not missing, (str(side), missing)
    for name, value in tf_values.items():
      np.testing.assert_allclose(ours[name], value, rtol=1e-5, atol=1e-6,
                                 err_msg=f"{side}: {name}")


# ---------------------------------------------------------------------------
# Sequence lengths, through evaluate.


@pytest.mark.parametrize("side", SIDES, ids=str)
def test_sequence_column_length(tmp_path, side):
  """The sequence length a SequenceFeatures layer returns equals the number
  of positions up to the last id: evaluation of lengths against themselves
  has loss 0."""
  column = side.api.embedding_column(
      fc.sequence_categorical_column_with_identity("x", 10), 4,
      max_sequence_length=10)

  def model_fn(features, labels, mode, params):
    del params
    _, lengths = tf.keras.experimental.SequenceFeatures([column])(features)
    predictions = tf.cast(lengths, tf.float32)
    loss = v1.losses.mean_squared_error(labels, predictions)
    return side.api.TPUEstimatorSpec(
        mode, loss=loss,
        eval_metrics=(lambda labels, predictions: {
            "mae": v1.metrics.mean_absolute_error(labels, predictions)
        }, [labels, predictions]))

  rng = np.random.RandomState(7)

  def input_fn(params):
    batch = params["batch_size"]
    lengths = rng.randint(1, 10, batch)
    indices = [[i, j] for i in range(batch) for j in range(lengths[i])]
    ids = tf.SparseTensor(indices, [1] * len(indices), [batch, 10])
    return tf.data.Dataset.from_tensors(
        ({"x": ids}, lengths.astype(np.float32))).repeat()

  spec = side.api.EmbeddingConfigSpec(
      feature_columns=[column],
      optimization_parameters=side.api.Adagrad(0.01))
  estimator = make_estimator(side, model_fn, spec, tmp_path,
                             eval_batch_size=8)
  metrics = estimator.evaluate(input_fn, steps=1)
  assert metrics["loss"] == pytest.approx(0.0, abs=1e-6)
  assert metrics["mae"] == pytest.approx(0.0, abs=1e-6)


# ---------------------------------------------------------------------------
# partition_strategy.


@pytest.mark.parametrize("side", SIDES, ids=str)
def test_unknown_partition_strategy(tmp_path, side):
  x = fc.categorical_column_with_identity("x", 10)
  columns = [side.api.embedding_column(x, 2)]
  # TF's exact text, as callers match it (on both sides).
  tf_text = 'Invalid partition_strategy invalid. Must be one of "mod" or "div".'
  with pytest.raises(ValueError, match=re.escape(tf_text)):
    spec = side.api.EmbeddingConfigSpec(
        feature_columns=columns,
        optimization_parameters=side.api.Adagrad(0.01),
        partition_strategy="invalid")
    make_estimator(side, _simple_model_fn(side.api, columns), spec, tmp_path)
  assert has_no_checkpoint(tmp_path)


@pytest.mark.parametrize("side", [TF_CPU, Side("ours", False, num_shards=16),
                                  Side("ours", True, PER_HOST_V1, 16),
                                  Side("ours", True, PER_HOST_V2, 16)],
                         ids=str)
def test_mod_partition_strategy(tmp_path, side):
  """TF's CPU path refuses `mod`; ours trains `mod` tables (2 hosts for
  16 cores) and checkpoints them in the TPU's partition order."""
  if side.is_tf:
    x = fc.categorical_column_with_identity("x", 10)
    columns = [TT.embedding_column(x, 2)]
    spec = ET.experimental.EmbeddingConfigSpec(
        feature_columns=columns,
        optimization_parameters=TT.StochasticGradientDescentParameters(0.1),
        partition_strategy="mod")
    with pytest.raises(ValueError,
                       match="Mod sharding of embedding tables not supported"):
      make_estimator(side, _simple_model_fn(TF_API, columns), spec, tmp_path,
                     train_batch_size=16)
    return

  spec = es.EmbeddingConfigSpec(
      feature_to_config_dict={"x": es.FeatureConfig("t")},
      table_to_config_dict={
          "t": es.TableConfig(10, 2, tf.constant_initializer(0.5), "sum")
      },
      optimization_parameters=es.StochasticGradientDescentParameters(0.1),
      partition_strategy="mod")

  def model_fn(features, labels, mode, params):
    del labels
    bias = v1.get_variable("bias", [], initializer=tf.zeros_initializer())
    loss = tf.reduce_sum(features["x"] * tf.constant([1.0, 2.0])) + bias
    return es.TPUEstimatorSpec(
        mode, loss=loss,
        train_op=train_op_for(v1.train.GradientDescentOptimizer(0.1), loss,
                              params))

  ids_per_example = [1, 3, 3, 8, 8, 8]

  def input_fn(params):
    batch = params["batch_size"]
    width = len(ids_per_example)
    ids = tf.SparseTensor([[i, j] for i in range(batch) for j in range(width)],
                          ids_per_example * batch, [batch, width])
    return tf.data.Dataset.from_tensors({"x": ids}).repeat()

  estimator = make_estimator(side, model_fn, spec, tmp_path,
                             train_batch_size=16)
  estimator.train(input_fn, steps=1)
  # Sum combiner: every occurrence of an id in the 16 examples sends the
  # coefficients (1, 2).
  counts = np.zeros(10)
  for i in ids_per_example:
    counts[i] += 16
  rows = sgd(np.full((10, 2), 0.5), counts[:, None] * [1.0, 2.0], 0.1)
  # mod over 2 shards: shard 0 holds rows 0, 2, ..., shard 1 rows 1, 3, ...
  stored_order = list(range(0, 10, 2)) + list(range(1, 10, 2))
  np.testing.assert_allclose(read_checkpoint(tmp_path)["t"],
                             rows[stored_order], rtol=1e-6)


# ---------------------------------------------------------------------------
# Dynamic learning rates.


def _dynamic_lr_columns(api):
  ident = fc.categorical_column_with_identity
  ones = v1.ones_initializer()

  def rate(first):
    return lambda step: v1.cond(tf.equal(step, 0), lambda: float(first),
                                lambda: 0.0)

  return ([
      api.embedding_column(ident("a", 10), 2, initializer=ones),
      api.embedding_column(ident("b", 10), 2, initializer=ones,
                           learning_rate_fn=rate(2)),
  ] + api.shared_embedding_columns([ident("c", 10), ident("d", 10)], 2,
                                   initializer=ones) +
          api.shared_embedding_columns([ident("e", 10), ident("f", 10)], 2,
                                       initializer=ones,
                                       learning_rate_fn=rate(3)))


@pytest.mark.parametrize("side", [
    Side("tf", False, num_shards=4),
    Side("ours", False, num_shards=4),
    Side("ours", True, PER_HOST_V1, 4),
    Side("ours", True, PER_HOST_V2, 4)
], ids=str)
def test_dynamic_learning_rate(tmp_path, side):
  """Spec SGD at learning rate 1; b's learning_rate_fn gives 2 at step 0
  then 0, the shared e/f table's gives 3 then 0.

  Batch: examples ids (3) and (0, 1, 2) twice, combiner mean; prediction =
  sum of all 12 activation values (ones kernel) = 12, loss = mean squared
  error to 0, so every activation element has gradient 2 * 12 / 4 = 6: id 3
  accumulates 2 x 6 = 12, ids 0-2 2 x 6 / 3 = 4 (twice that in a shared
  table, whose two features both see the batch)."""
  columns = _dynamic_lr_columns(side.api)

  def model_fn(features, labels, mode, params):
    x = v1.keras.layers.DenseFeatures(columns)(features)
    logits = v1.layers.dense(x, 1, kernel_initializer=v1.ones_initializer())
    loss = v1.losses.mean_squared_error(labels, logits)
    return side.api.TPUEstimatorSpec(
        mode, loss=loss,
        train_op=train_op_for(v1.train.AdagradOptimizer(0.5), loss, params))

  def input_fn(params):
    ids = tf.SparseTensor([[0, 0], [1, 0], [1, 1], [1, 2]], [3, 0, 1, 2],
                          [2, 3])
    features = {k: ids for k in "abcdef"}
    dataset = tf.data.Dataset.from_tensor_slices(
        (features, np.zeros((2, 1), np.int32)))
    return dataset.repeat().batch(params["batch_size"], drop_remainder=True)

  spec = side.api.EmbeddingConfigSpec(
      feature_columns=columns, optimization_parameters=side.api.SGD(1.0))
  estimator = make_estimator(side, model_fn, spec, tmp_path,
                             train_batch_size=4)
  estimator.train(input_fn, steps=1)
  step1 = read_checkpoint(tmp_path)
  names = {
      "a": "dense_features/a_embedding/embedding_weights",
      "b": "dense_features/b_embedding/embedding_weights",
      "cd": "c_d_shared_embedding",
      "ef": "e_f_shared_embedding",
  }
  grads = np.zeros((10, 2))
  grads[3], grads[:3] = 12.0, 4.0
  ones = np.ones((10, 2))
  if side.is_tf:
    # TF's CPU path ignores the spec: the model's Adagrad (0.5) trains
    # every table, learning_rate_fn or not.
    for name, scale in (("a", 1), ("b", 1), ("cd", 2), ("ef", 2)):
      expected, _ = adagrad(ones, scale * grads, 0.5)
      np.testing.assert_allclose(step1[names[name]], expected, rtol=1e-5,
                                 err_msg=name)
    return
  for name, scale, rate in (("a", 1, 1), ("b", 1, 2), ("cd", 2, 1),
                            ("ef", 2, 3)):
    np.testing.assert_allclose(step1[names[name]],
                               sgd(ones, scale * grads, rate), rtol=1e-6,
                               err_msg=name)
  estimator.train(input_fn, steps=1)
  step2 = read_checkpoint(tmp_path)
  assert step2["global_step"] == 2
  for name in ("a", "cd"):  # static learning rate: trained again
    assert not np.allclose(step2[names[name]], step1[names[name]]), name
  for name in ("b", "ef"):  # learning rate 0 at step 1
    np.testing.assert_array_equal(step2[names[name]], step1[names[name]])


# ---------------------------------------------------------------------------
# Weighted columns.


def _identity_model_fn(api, columns):
  """predictions = the dense layer of `columns`; loss = mean squared error
  to labels that equal the expected activations (so 0 when they match)."""

  def model_fn(features, labels, mode, params):
    predictions = tf.identity(v1.keras.layers.DenseFeatures(columns)(features))
    if mode == PREDICT:
      return api.TPUEstimatorSpec(mode, predictions=predictions)
    return squared_error_spec(api, mode, labels, predictions, params,
                              lambda: v1.train.AdagradOptimizer(0.5))

  return model_fn


def _constant_rows(values):
  return row_initializer(lambda r: np.asarray(values, np.float64)[r.astype(
      np.int64)])


@pytest.mark.parametrize("side", SIDES, ids=str)
def test_weighted_column(tmp_path, side):
  """Weighted mean: example 0 has ids (2, 1) with weights (0.5, 1.0),
  example 1 ids (1, 0) with weights (0.2, 0.0); row r holds r + 1."""
  column = side.api.embedding_column(
      fc.weighted_categorical_column(
          fc.categorical_column_with_identity("ids", 3), "values"), 5,
      combiner="mean", initializer=_constant_rows([1.0, 2.0, 3.0]))
  expected = np.zeros((2, 5), np.float32)
  expected[0] = (3 * 0.5 + 2 * 1.0) / 1.5
  expected[1] = (2 * 0.2 + 1 * 0.0) / 0.2

  def input_fn(params):
    indices = [[0, 0], [0, 2], [1, 0], [1, 1]]
    features = {
        "ids": tf.SparseTensor(indices, [2, 1, 1, 0], [2, 3]),
        "values": tf.SparseTensor(indices, [0.5, 1.0, 0.2, 0.0], [2, 3]),
    }
    return tf.data.Dataset.from_tensor_slices((features, expected)).repeat(
    ).batch(params["batch_size"], drop_remainder=True)

  spec = side.api.EmbeddingConfigSpec(
      feature_columns=[column],
      optimization_parameters=side.api.Adagrad(0.01))
  estimator = make_estimator(side, _identity_model_fn(side.api, [column]),
                             spec, tmp_path, eval_batch_size=8)
  estimator.train(input_fn, steps=1)
  assert estimator.evaluate(input_fn, steps=1)["loss"] == pytest.approx(
      0.0, abs=1e-10)
  # Zero loss, zero gradient: the table is as initialized.
  table = read_checkpoint(tmp_path)[
      "dense_features/ids_weighted_by_values_embedding/embedding_weights"]
  np.testing.assert_allclose(table, np.repeat([[1.0], [2.0], [3.0]], 5, 1))


@pytest.mark.parametrize("side", SIDES, ids=str)
def test_shared_weighted_column_integer_weights(tmp_path, side):
  """A shared table, one feature weighted by INTEGER weights, combiner sum:
  ids1 example 0 = 3*1 + 2*2, example 1 = 2*3 + 1*0; ids2 example 0 = 2,
  example 1 = 3 + 1 (row r holds r + 1). TF's CPU path refuses integer
  weights (its weighted column needs floats); a TPU casts them."""
  columns = side.api.shared_embedding_columns(
      [
          fc.weighted_categorical_column(
              fc.categorical_column_with_identity("ids1", 3), "values"),
          fc.categorical_column_with_identity("ids2", 3)
      ], 5, combiner="sum", initializer=_constant_rows([1.0, 2.0, 3.0]))
  expected = np.zeros((2, 10), np.float32)
  expected[0, :5], expected[1, :5] = 3 * 1 + 2 * 2, 2 * 3 + 1 * 0
  expected[0, 5:], expected[1, 5:] = 2, 3 + 1

  def input_fn(params):
    indices1 = [[0, 0], [0, 2], [1, 0], [1, 1]]
    features = {
        "ids1": tf.SparseTensor(indices1, [2, 1, 1, 0], [2, 3]),
        "values": tf.SparseTensor(indices1, [1, 2, 3, 0], [2, 3]),
        "ids2": tf.SparseTensor([[0, 1], [1, 0], [1, 2]], [1, 2, 0], [2, 3]),
    }
    return tf.data.Dataset.from_tensor_slices((features, expected)).repeat(
    ).batch(params["batch_size"], drop_remainder=True)

  spec = side.api.EmbeddingConfigSpec(
      feature_columns=columns, optimization_parameters=side.api.Adagrad(0.01))
  estimator = make_estimator(side, _identity_model_fn(side.api, columns),
                             spec, tmp_path, eval_batch_size=8)
  if side.is_tf:
    with pytest.raises(ValueError, match="dtype"):
      estimator.train(input_fn, steps=1)
    return
  estimator.train(input_fn, steps=1)
  assert estimator.evaluate(input_fn, steps=1)["loss"] == pytest.approx(
      0.0, abs=1e-10)


@pytest.mark.parametrize("side", SIDES, ids=str)
def test_weighted_vocabulary_column(tmp_path, side):
  """A weighted vocabulary-list column fed strings. TF's TPU input path
  refuses string ids ("SparseTensor with string as values are not
  supported"); this library documents the deliberate difference (the column
  turns strings into ids, as TF's CPU path does), so every side computes
  the weighted mean: row r of the table holds r, '2' (0.5) + '1' (1.0) ->
  (2*0.5 + 1)/1.5 and '1' (0.2) + '0' (0.0) -> 1. Zero loss: training
  leaves the table as initialized."""
  vocab = fc.categorical_column_with_vocabulary_list(
      "x", ["0", "1", "2", "3"], num_oov_buckets=1)
  column = side.api.embedding_column(
      fc.weighted_categorical_column(vocab, "values"), 10,
      initializer=row_initializer(lambda r: r))
  expected = np.zeros((2, 10), np.float32)
  expected[0], expected[1] = (2 * 0.5 + 1 * 1.0) / 1.5, 1.0

  def input_fn(params):
    indices = [[0, 0], [0, 2], [1, 0], [1, 1]]
    features = {
        "x": tf.SparseTensor(indices, ["2", "1", "1", "0"], [2, 5]),
        "values": tf.SparseTensor(indices, [0.5, 1.0, 0.2, 0.0], [2, 5]),
    }
    return tf.data.Dataset.from_tensor_slices((features, expected)).repeat(
    ).batch(params["batch_size"], drop_remainder=True)

  spec = side.api.EmbeddingConfigSpec(
      feature_columns=[column], optimization_parameters=side.api.Adagrad(0.01))
  estimator = make_estimator(side, _identity_model_fn(side.api, [column]),
                             spec, tmp_path, eval_batch_size=8)
  estimator.train(input_fn, steps=1)
  assert estimator.evaluate(input_fn, steps=1)["loss"] == pytest.approx(
      0.0, abs=1e-10)
  table = read_checkpoint(tmp_path)[
      "dense_features/x_weighted_by_values_embedding/embedding_weights"]
  np.testing.assert_allclose(table, np.repeat(np.arange(5.0)[:, None], 10, 1))


@pytest.mark.parametrize("side", SIDES, ids=str)
def test_dense_weights_refused(tmp_path, side):
  """Dense (non-sparse) weights: a TPU refuses them when the graph is
  built. TF's CPU path turns them into sparse weights without the 0.0
  entry, which then no longer match the ids, and fails at run time."""
  column = side.api.embedding_column(
      fc.weighted_categorical_column(
          fc.categorical_column_with_identity("ids", 5), "values"), 10)

  def input_fn(params):
    indices = [[0, 0], [0, 2], [1, 0], [1, 1]]
    weights = tf.sparse.to_dense(
        tf.SparseTensor(indices, [0.5, 1.0, 0.2, 0.0], [2, 5]))
    features = {
        "ids": tf.SparseTensor(indices, [2, 1, 1, 0], [2, 5]),
        "values": weights
    }
    return tf.data.Dataset.from_tensor_slices(
        (features, np.zeros((2, 10), np.float32))).repeat().batch(
            params["batch_size"], drop_remainder=True)

  spec = side.api.EmbeddingConfigSpec(
      feature_columns=[column], optimization_parameters=side.api.Adagrad(0.01))
  estimator = make_estimator(side, _identity_model_fn(side.api, [column]),
                             spec, tmp_path)
  if side.is_tf:
    with pytest.raises(tf.errors.InvalidArgumentError):
      estimator.train(input_fn, steps=1)
    return
  with pytest.raises(ValueError, match="Dense weights are not supported on "
                     "TPU"):
    estimator.train(input_fn, steps=1)
  assert has_no_checkpoint(tmp_path)


def _shared_weight_key_columns(api):
  return api.shared_embedding_columns([
      fc.weighted_categorical_column(
          fc.categorical_column_with_identity("ids1", 5), "values"),
      fc.weighted_categorical_column(
          fc.categorical_column_with_identity("ids2", 5), "values")
  ], 10)


def _shared_weight_key_input_fn(params):
  indices = [[0, 0], [0, 2], [1, 0], [1, 1]]
  ids = tf.SparseTensor(indices, [2, 1, 1, 0], [2, 5])
  features = {
      "ids1": ids,
      "ids2": ids,
      "values": tf.SparseTensor(indices, [0.5, 1.0, 0.2, 0.0], [2, 5])
  }
  return tf.data.Dataset.from_tensor_slices(
      (features, np.zeros((2, 20), np.float32))).repeat().batch(
          params["batch_size"], drop_remainder=True)


SHARED_WEIGHTS_PHRASE = ("weight-sharing among weighted_categorical_column is "
                         "not supported on TPU")


def test_shared_weight_key_tf_phrase():
  """The phrase ours carries is TF's own, from the function that refuses
  the input on a TPU (the first reader pops the weights; the next one finds
  none)."""
  with pytest.raises(ValueError) as raised:
    tf_tpu_embedding._get_weights_from_features("values", {"ids1": 0})
  assert SHARED_WEIGHTS_PHRASE in str(raised.value)
  assert "Cannot find weights values for weighted_categorical_column" in str(
      raised.value)


@pytest.mark.parametrize("side", [TF_CPU] + OURS_SIDES, ids=str)
def test_shared_weight_key_refused(tmp_path, side):
  """Two weighted columns reading one weight key: the spec constructs (as
  TF's does); a TPU refuses the input when it is read (the first feature
  consumes the weights), and so does ours, for use_tpu=False and True, in
  every mode, before anything is written. TF's CPU path trains."""
  columns = _shared_weight_key_columns(side.api)
  spec = side.api.EmbeddingConfigSpec(
      feature_columns=columns, optimization_parameters=side.api.Adagrad(0.01))
  estimator = make_estimator(side, _identity_model_fn(side.api, columns),
                             spec, tmp_path, eval_batch_size=8,
                             predict_batch_size=8)
  if side.is_tf:
    estimator.train(_shared_weight_key_input_fn, steps=1)
    assert read_checkpoint(tmp_path)["global_step"] == 1
    return
  assert spec.model.shared_weight_keys == {"values": ("ids1", "ids2")}
  runs = [
      lambda: estimator.train(_shared_weight_key_input_fn, steps=1),
      lambda: estimator.evaluate(_shared_weight_key_input_fn, steps=1),
      lambda: next(estimator.predict(
          lambda params: _shared_weight_key_input_fn(params).map(
              lambda f, l: f))),
  ]
  for run in runs:
    with pytest.raises(ValueError, match=SHARED_WEIGHTS_PHRASE) as raised:
      run()
    for name in ("'values'", "'ids1'", "'ids2'"):
      assert name in str(raised.value), str(raised.value)
  assert has_no_checkpoint(tmp_path)


def test_shared_weight_key_refused_by_split_inputs():
  spec = es.EmbeddingConfigSpec(
      feature_columns=_shared_weight_key_columns(OURS_API),
      optimization_parameters=es.AdagradParameters(0.01))
  config = es.EmbeddingConfig(spec, batch_size=2)
  with tf.Graph().as_default():
    features, _ = v1.data.make_one_shot_iterator(
        _shared_weight_key_input_fn({"batch_size": 2})).get_next()
    with pytest.raises(ValueError, match=re.escape(
        "features ['ids1', 'ids2'] all take their weights from the key "
        "'values'")) as raised:
      config.split_inputs(features)
  assert SHARED_WEIGHTS_PHRASE in str(raised.value)
  # TF's whole sentence, which callers match.
  with pytest.raises(ValueError) as tfs:
    tf_tpu_embedding._get_weights_from_features("values", {"ids1": 0})
  assert str(tfs.value) in str(raised.value)


# ---------------------------------------------------------------------------
# Tensor-core columns.


def _tensor_core_columns(api, case):
  x = fc.categorical_column_with_identity("x", 10)
  y = fc.categorical_column_with_identity("y", 10)
  init = row_initializer(lambda r: 0.1 * r + 0.1)
  core = dict(embedding_lookup_device="tpu_tensor_core",
              tensor_core_shape=[None, 2], initializer=init)
  if case == "shared":
    return api.shared_embedding_columns([x, y], 2, **core)
  columns = [api.embedding_column(x, 2, **core)]
  if case == "both":
    columns.append(api.embedding_column(y, 4, **core))
  else:
    columns.append(api.embedding_column(y, 4, initializer=init))
  return columns


def _tensor_core_run(tmp_path, side, case, evaluate):
  columns = _tensor_core_columns(side.api, case)
  spec = side.api.EmbeddingConfigSpec(
      feature_columns=columns, optimization_parameters=side.api.Adagrad(0.01))
  model_dir = tmp_path / str(side)
  estimator = make_estimator(
      side, _two_features_model_fn(side.api, columns, sequence=False), spec,
      model_dir, eval_batch_size=8, predict_batch_size=8)
  estimator.train(_ones_labels_input_fn, steps=1)
  values = read_checkpoint(model_dir)
  if not evaluate:
    return values, None, None
  loss = estimator.evaluate(_ones_labels_input_fn, steps=1)["loss"]

  def predict_input_fn(params):
    # One global batch of 8 (per-core input: 8 elements of 1).
    return _ones_labels_input_fn(params).map(lambda f, l: f).take(
        8 // params["batch_size"])

  predictions = next(
      estimator.predict(predict_input_fn,
                        yield_single_examples=False))["logits"]
  return values, loss, predictions


@pytest.mark.slow
@pytest.mark.parametrize("case", ["single", "both", "shared"],
                         ids=["non_shared_single", "non_shared_both",
                              "shared"])
def test_tensor_core_embedding(tmp_path, case):
  """Tensor-core columns (looked up by the model, trained by the model's
  optimizer on a TPU too), alone ('both', 'shared': a spec without any
  embedding-core table) or next to an embedding-core column ('single'):
  training, evaluation and prediction work, TF's CPU checkpoint names are in
  ours, and values, loss and predictions agree with TF's CPU path (the zero
  kernel sends no gradient to the tables at step 1)."""
  tf_values, tf_loss, tf_predictions = _tensor_core_run(
      tmp_path, TF_CPU, case, evaluate=True)
  assert np.isfinite(tf_loss) and tf_predictions.shape == (8, 1)
  for side in OURS_SIDES:
    evaluate = side.input_method == PER_HOST_V2
    values, loss, predictions = _tensor_core_run(tmp_path, side, case,
                                                 evaluate)
    missing = sorted(set(tf_values) - set(values))
    assert not missing, (str(side), missing)
    for name, value in tf_values.items():
      np.testing.assert_allclose(values[name], value, rtol=1e-5, atol=1e-6,
                                 err_msg=f"{side}: {name}")
    if evaluate:
      assert loss == pytest.approx(tf_loss, rel=1e-5), str(side)
      np.testing.assert_allclose(predictions, tf_predictions, rtol=1e-5,
                                 err_msg=str(side))


# ---------------------------------------------------------------------------
# Sequence activations (tpu_enqueue_sequence_test).

_SEQ_TABLE = np.float32([[-5.0], [10.0], [20.0], [30.0], [40.0], [50.0]])

_SEQUENCE_CASES = {
    # TF test: (ids, combiner, activations [4, 3, 1], lengths,
    #           id occurrence weights for the table gradient)
    "non_contiguous": (
        tf.compat.v1.SparseTensorValue([[0, 0], [1, 0], [1, 1], [2, 0],
                                        [2, 2]], [1, 2, 3, 4, 5], [4, 3]),
        "mean",
        [[10, 0, 0], [20, 30, 0], [40, 0, 50], [0, 0, 0]],
        [1, 2, 3, 0],
        {1: 1, 2: 1, 3: 1, 4: 1, 5: 1}),
    # Position 3 is past max_sequence_length 3: dropped, its id 6 (beyond
    # the 6-row table) is never looked up.
    "length_gt_max_sequence_length": (
        tf.compat.v1.SparseTensorValue(
            [[0, 0], [1, 0], [1, 1], [2, 0], [2, 2], [2, 3]],
            [1, 2, 3, 4, 5, 6], [4, 4]),
        "mean",
        [[10, 0, 0], [20, 30, 0], [40, 0, 50], [0, 0, 0]],
        [1, 2, 3, 0],
        {1: 1, 2: 1, 3: 1, 4: 1, 5: 1}),
    # 3-D ids: several ids per position, combined by the combiner.
    "multivalent_sum": (
        tf.compat.v1.SparseTensorValue(
            [[0, 0, 0], [0, 0, 1], [1, 0, 0], [1, 1, 0], [3, 0, 0],
             [3, 2, 0], [3, 2, 1], [3, 3, 0]], [1, 0, 2, 3, 4, 5, 2, 5],
            [4, 4, 2]),
        "sum",
        [[5, 0, 0], [20, 30, 0], [0, 0, 0], [40, 0, 70]],
        [1, 2, 0, 3],
        {0: 1, 1: 1, 2: 2, 3: 1, 4: 1, 5: 1}),
    "multivalent_mean": (
        tf.compat.v1.SparseTensorValue(
            [[0, 0, 0], [0, 0, 1], [1, 0, 0], [1, 1, 0], [3, 0, 0],
             [3, 2, 0], [3, 2, 1], [3, 3, 0]], [1, 0, 2, 3, 4, 5, 2, 5],
            [4, 4, 2]),
        "mean",
        [[2.5, 0, 0], [20, 30, 0], [0, 0, 0], [40, 0, 35]],
        [1, 2, 0, 3],
        {0: 0.5, 1: 0.5, 2: 1.5, 3: 1, 4: 1, 5: 0.5}),
}

_SEQUENCE_SIDES = [TF_CPU, Side("ours", False, num_shards=4),
                   Side("ours", True, PER_HOST_V2, 4)]


@pytest.mark.parametrize("side", _SEQUENCE_SIDES, ids=str)
@pytest.mark.parametrize("case", list(_SEQUENCE_CASES))
def test_sequence_activations(tmp_path, case, side):
  """TRAIN step with loss = sum of a sequence column's activations (no dense
  variable), SGD 0.1 as the embedding optimizer and the model's optimizer:
  the host_call sees the padded/truncated activations [4, 3, 1] and the
  lengths min(last position + 1, 3); each looked-up id's row moves by
  -0.1 x its (combiner-weighted) occurrences."""
  ids, combiner, activations, lengths, occurrences = _SEQUENCE_CASES[case]
  column = side.api.embedding_column(
      fc.sequence_categorical_column_with_identity("ids", 6), 1,
      max_sequence_length=3, combiner=combiner,
      initializer=tf.constant_initializer(_SEQ_TABLE))
  captured = []
  shapes = []

  def host_call(acts, seq_lengths):

    def record(a, l):
      captured.append((a.numpy(), l.numpy()))
      return np.int64(0)

    return [tf.py_function(record, [acts, seq_lengths], tf.int64)]

  def model_fn(features, params, mode):
    acts, seq_lengths = tf.keras.experimental.SequenceFeatures([column])(
        features)
    shapes.append(acts.shape.as_list())
    loss = tf.reduce_sum(acts)
    return side.api.TPUEstimatorSpec(
        mode, loss=loss,
        train_op=train_op_for(v1.train.GradientDescentOptimizer(0.1), loss,
                              params),
        host_call=(host_call, [acts, seq_lengths]))

  def input_fn(params):
    return sparse_dataset(ids).map(lambda x: {
        "ids": x
    }).repeat().batch(params["batch_size"])

  spec = side.api.EmbeddingConfigSpec(
      feature_columns=[column], optimization_parameters=side.api.SGD(0.1))
  estimator = make_estimator(side, model_fn, spec, tmp_path,
                             train_batch_size=4)
  table_name = "sequence_features/ids_embedding/embedding_weights"
  if side.is_tf and case == "length_gt_max_sequence_length":
    # TF's CPU path does not truncate: it looks up id 6 and fails.
    with pytest.raises(tf.errors.InvalidArgumentError):
      estimator.train(input_fn, steps=1)
    return
  estimator.train(input_fn, steps=1)
  assert len(captured) == 1
  got_acts, got_lengths = captured[0]
  expected_acts = np.asarray(activations, np.float32)[:, :, None]
  expected_lengths = np.asarray(lengths)
  grads = np.zeros((6, 1))
  for i, count in occurrences.items():
    grads[i] = count
  if side.is_tf and case.startswith("multivalent"):
    # TF's CPU path keeps all 4 positions (no truncation): position 3 of
    # example 3 (id 5) is looked up and trained, and counts in the length.
    extra = np.zeros((4, 1, 1), np.float32)
    extra[3] = 50.0
    expected_acts = np.concatenate([expected_acts, extra], axis=1)
    expected_lengths = np.asarray([1, 2, 0, 4])
    grads[5] += 1
  np.testing.assert_allclose(got_acts, expected_acts, rtol=1e-6)
  np.testing.assert_array_equal(got_lengths, expected_lengths)
  np.testing.assert_allclose(
      read_checkpoint(tmp_path)[table_name], sgd(_SEQ_TABLE, grads, 0.1),
      rtol=1e-6)
  if not side.is_tf:
    # Static [train_batch_size, L, D] although the input's batch is not.
    assert shapes == [[4, 3, 1]]


# ---------------------------------------------------------------------------
# Behaviours beyond TF's test files (TF 2.15's TPUEstimator source).


def _dense_ids_input_fn(record=None, with_labels=True, examples=16):
  """Features 'x' (dense ids padded with -1) and labels; records params."""

  def input_fn(params):
    if record is not None:
      record.append(dict(params))
    rng = np.random.RandomState(0)
    ids = rng.randint(1, 5, (examples, 2)).astype(np.int64)
    labels = rng.uniform(size=(examples, 1)).astype(np.float32)
    data = ({"x": ids}, labels) if with_labels else {"x": ids}
    return tf.data.Dataset.from_tensor_slices(data).repeat().batch(
        params["batch_size"], drop_remainder=True)

  return input_fn


def _params_model_fn(api, column, record):

  def model_fn(features, labels, mode, params):
    record.append((mode, dict(params)))
    x = v1.keras.layers.DenseFeatures([column])(features)
    logits = v1.layers.dense(x, 1)
    if mode == PREDICT:
      return api.TPUEstimatorSpec(mode, predictions={"logits": logits})
    return squared_error_spec(api, mode, labels, logits, params,
                              lambda: v1.train.GradientDescentOptimizer(0.1))

  return model_fn


def _x_column(api):
  return api.embedding_column(fc.categorical_column_with_identity("x", 5), 2)


@pytest.mark.parametrize("side", [TF_CPU, OURS_CPU, OURS_TPU_V1], ids=str)
def test_params_reserved_keys_and_use_tpu(tmp_path, side):
  """'batch_size' and 'context' are reserved; 'use_tpu' is allowed: model_fn
  sees the estimator's use_tpu, input_fn the user's own value."""
  column = _x_column(side.api)
  spec = side.api.EmbeddingConfigSpec(
      feature_columns=[column], optimization_parameters=side.api.SGD(0.1))
  constructors = [side]
  if side.is_tf:
    # TF checks params first in its constructor: use_tpu=True runs here too.
    constructors.append(Side("tf", True, PER_HOST_V1))
  for constructor in constructors:
    for reserved in ("batch_size", "context"):
      with pytest.raises(ValueError,
                         match="are reserved keys but existed in params"):
        make_estimator(constructor, _params_model_fn(side.api, column, []),
                       spec, tmp_path, params={reserved: 1})
  model_calls, input_calls = [], []
  estimator = make_estimator(side, _params_model_fn(side.api, column,
                                                    model_calls), spec,
                             tmp_path, params={"use_tpu": "mine"})
  estimator.train(_dense_ids_input_fn(input_calls), steps=1)
  assert [p["use_tpu"] for p in input_calls] == ["mine"] * len(input_calls)
  assert input_calls
  assert [p["use_tpu"] for _, p in model_calls] == [side.use_tpu]


@pytest.mark.parametrize("side", [TF_CPU, OURS_CPU,
                                  Side("ours", True, PER_HOST_V1)], ids=str)
def test_cpu_path_params(tmp_path, side):
  """TF's CPU path: input_fn and model_fn get the mode's global batch size
  and no 'context'; model_fn gets use_tpu False. With use_tpu=True and
  eval_on_tpu=False, evaluation takes that path."""
  column = _x_column(side.api)
  spec = side.api.EmbeddingConfigSpec(
      feature_columns=[column], optimization_parameters=side.api.SGD(0.1))
  model_calls, input_calls = [], []
  estimator = make_estimator(side, _params_model_fn(side.api, column,
                                                    model_calls),
                             spec, tmp_path, eval_batch_size=4,
                             predict_batch_size=2, eval_on_tpu=False)
  modes = [EVAL] if side.use_tpu else [TRAIN, EVAL, PREDICT]
  if TRAIN in modes:
    estimator.train(_dense_ids_input_fn(input_calls), steps=1)
  estimator.evaluate(_dense_ids_input_fn(input_calls), steps=1)
  if PREDICT in modes:
    next(estimator.predict(_dense_ids_input_fn(input_calls,
                                               with_labels=False)))
  batch = {TRAIN: 8, EVAL: 4, PREDICT: 2}
  assert [p["batch_size"] for p in input_calls] == [batch[m] for m in modes]
  assert not [p for p in input_calls if "context" in p]
  assert [(m, p["batch_size"], p["use_tpu"]) for m, p in model_calls
         ] == [(m, batch[m], False) for m in modes]
  assert not [p for _, p in model_calls if "context" in p]


def _host_index_initializer():
  # Row r holds r + 1 (dimension 1): an activation shows its id.
  return row_initializer(lambda r: r + 1.0)


@pytest.mark.parametrize("num_shards,method,eval_batch", [
    (None, PER_HOST_V1, None),
    (16, PER_HOST_V1, 16),
    (16, PER_HOST_V2, 2),
], ids=["one_core", "two_hosts_v1", "two_hosts_v2"])
def test_tpu_context_with_embeddings(tmp_path, num_shards, method,
                                     eval_batch):
  """use_tpu=True without a TPU: input_fn runs once per host (V1: global /
  hosts examples; V2: per-core batches, each step taking 8 per host) with
  params['context'] telling its deployment; the host concatenates the
  invocations' examples into the global batch model_fn sees (static batch
  32, params['batch_size'] = 32, a context of one replica without input_fn's
  fields)."""
  hosts = 1 if num_shards is None else num_shards // 8
  cores = num_shards or 1
  global_batch = 32
  column = tec.embedding_column(
      fc.categorical_column_with_identity("x", 4), 1, combiner="sum",
      initializer=_host_index_initializer())
  input_calls, model_calls, hooks = [], [], []

  def input_fn(params):
    context = params.get("context")
    assert context is not None, "input_fn params have no 'context'"
    deployment = context.current_input_fn_deployment()
    input_calls.append(
        dict(batch=params["batch_size"], deployment=tuple(deployment),
             host=context.current_host, num_hosts=context.num_hosts,
             num_replicas=context.num_replicas,
             per_host=context.num_of_replicas_per_host))
    # Every example of invocation i has the one id i + 1.
    batch = params["batch_size"]
    ids = tf.SparseTensor([[b, 0] for b in range(batch)],
                          [deployment[1] + 1] * batch, [batch, 1])
    return tf.data.Dataset.from_tensors({"x": ids}).repeat()

  def model_fn(features, labels, mode, params):
    del labels
    context = params.get("context")
    call = dict(mode=mode, batch=params["batch_size"],
                use_tpu=params["use_tpu"], context=context is not None)
    if context is not None:
      call.update(num_hosts=context.num_hosts,
                  num_replicas=context.num_replicas,
                  per_host=context.num_of_replicas_per_host)
      for field in ("current_input_fn_deployment", "current_host"):
        try:
          value = getattr(context, field)
          if callable(value):
            value()
          call[field] = "no error"
        except RuntimeError:
          call[field] = "RuntimeError"
    model_calls.append(call)
    x = v1.keras.layers.DenseFeatures([column])(features)
    call["shape"] = x.shape.as_list()
    bias = v1.get_variable("bias", [], initializer=tf.zeros_initializer())
    loss = tf.reduce_sum(x) + bias
    return es.TPUEstimatorSpec(
        mode, loss=loss,
        train_op=(train_op_for(v1.train.GradientDescentOptimizer(1.0), loss,
                               params) if mode == TRAIN else None),
        training_hooks=[FetchHook(x, hooks)])

  spec = es.EmbeddingConfigSpec(
      feature_columns=[column],
      optimization_parameters=es.StochasticGradientDescentParameters(1.0))
  estimator = es.TPUEstimator(
      model_fn=model_fn,
      config=run_config(Side("ours", True, method), tmp_path, num_shards),
      use_tpu=True, train_batch_size=global_batch,
      eval_batch_size=global_batch, embedding_config_spec=spec)
  estimator.train(input_fn, steps=1)

  per_host = cores // hosts
  if method == PER_HOST_V1:
    input_batch = global_batch // hosts
  else:
    input_batch = global_batch // cores
  assert len(input_calls) == hosts, input_calls
  assert input_calls == [
      dict(batch=input_batch, deployment=(input_calls[h]["deployment"][0], h,
                                          hosts, per_host),
           host=h, num_hosts=hosts, num_replicas=cores, per_host=per_host)
      for h in range(hosts)
  ]
  for call in input_calls:
    assert "CPU" in str(call["deployment"][0]).upper(), call
  # model_fn runs once, as one replica, on the global batch: its context
  # says one replica on one host, so per-replica arithmetic holds.
  assert model_calls == [
      dict(mode=TRAIN, batch=global_batch, use_tpu=True, context=True,
           num_hosts=1, num_replicas=1, per_host=1,
           current_input_fn_deployment="RuntimeError",
           current_host="RuntimeError", shape=[global_batch, 1])
  ]
  # Host h's examples (id h + 1, activation h + 2) in host order.
  per_host_examples = global_batch // hosts
  np.testing.assert_array_equal(
      hooks[0].values[0].ravel(),
      np.repeat(np.arange(hosts) + 2.0, per_host_examples))
  # SGD 1 on d sum / d activation = 1: row h + 1 moves by -(its examples).
  expected = np.arange(4) + 1.0
  expected[1:hosts + 1] -= per_host_examples
  table = read_checkpoint(tmp_path)[
      "dense_features/x_embedding/embedding_weights"]
  np.testing.assert_allclose(table.ravel(), expected)

  if eval_batch is not None:
    del input_calls[:], model_calls[:]
    estimator.evaluate(input_fn, steps=1)
    assert [c["batch"] for c in input_calls] == [eval_batch] * hosts
    assert [(c["mode"], c["batch"]) for c in model_calls
           ] == [(EVAL, global_batch)]


@pytest.mark.parametrize("method,invocations,input_batch,consumed", [
    (PER_SHARD_V1, 16, 2, 1),
    (BROADCAST, 1, 32, 16),
], ids=["per_shard_v1", "broadcast"])
def test_tpu_context_without_embeddings(tmp_path, method, invocations,
                                        input_batch, consumed):
  """Without an embedding spec every input pipeline of TF is available:
  PER_SHARD_V1 calls input_fn once per core with the per-core batch,
  BROADCAST once with the global batch; model_fn gets the global batch,
  concatenated in invocation order."""
  input_calls, hooks = [], []
  seen = {}

  def input_fn(params):
    context = params.get("context")
    assert context is not None, "input_fn params have no 'context'"
    deployment = tuple(context.current_input_fn_deployment())
    input_calls.append(dict(batch=params["batch_size"],
                            deployment=deployment[1:],
                            host=context.current_host))
    values = np.full((params["batch_size"], 1), deployment[1] + 1.0,
                     np.float32)
    return tf.data.Dataset.from_tensors({"v": values}).repeat()

  def model_fn(features, labels, mode, params):
    del labels
    seen["batch"] = params["batch_size"]
    seen["shape"] = features["v"].shape.as_list()
    w = v1.get_variable("w", [], initializer=tf.zeros_initializer())
    loss = tf.reduce_mean(features["v"] * w)
    return es.TPUEstimatorSpec(
        mode, loss=loss,
        train_op=train_op_for(v1.train.GradientDescentOptimizer(1.0), loss,
                              params),
        training_hooks=[FetchHook(features["v"], hooks)])

  estimator = es.TPUEstimator(
      model_fn=model_fn,
      config=run_config(Side("ours", True, method), tmp_path, 16),
      use_tpu=True, train_batch_size=32)
  estimator.train(input_fn, steps=1)
  assert input_calls == [
      dict(batch=input_batch, deployment=(i, invocations, consumed),
           host=(i // 8 if method == PER_SHARD_V1 else 0))
      for i in range(invocations)
  ]
  assert seen == {"batch": 32, "shape": [32, 1]}
  np.testing.assert_array_equal(
      hooks[0].values[0].ravel(),
      np.repeat(np.arange(invocations) + 1.0, 32 // invocations))


@pytest.mark.parametrize("impl", ["tf", "ours"])
@pytest.mark.parametrize("method", [PER_SHARD_V1, BROADCAST],
                         ids=["per_shard_v1", "broadcast"])
def test_embedding_refuses_other_input_pipelines(tmp_path, method, impl):
  """TF's TPUEstimator with an embedding spec and use_tpu=True accepts only
  PER_HOST_V1/V2 input (checked in its constructor, which runs here without
  a TPU); with use_tpu=False the input pipeline setting is not checked."""
  api = TF_API if impl == "tf" else OURS_API
  column = _x_column(api)
  spec = api.EmbeddingConfigSpec(feature_columns=[column],
                                 optimization_parameters=api.SGD(0.1))
  model_fn = _params_model_fn(api, column, [])
  with pytest.raises(ValueError,
                     match="Only PER_HOST_V1 and PER_HOST_V2 is supported"):
    make_estimator(Side(impl, True, method), model_fn, spec, tmp_path)
  make_estimator(Side(impl, False, method), model_fn, spec, tmp_path)
  assert has_no_checkpoint(tmp_path)


def _serialized_examples(n=16):
  rng = np.random.RandomState(3)
  out = []
  for _ in range(n):
    feature = {
        key: tf.train.Feature(int64_list=tf.train.Int64List(
            value=list(rng.randint(0, 6, rng.randint(0, 5)))))
        for key in ("a", "s")
    }
    out.append(tf.train.Example(features=tf.train.Features(
        feature=feature)).SerializeToString())
  return out


@pytest.mark.parametrize("side", [Side("ours", False), OURS_TPU_V2], ids=str)
@pytest.mark.parametrize("form", ["columns", "dict"])
def test_static_activation_shapes(tmp_path, side, form):
  """TRAIN activations have the static batch train_batch_size even when
  input_fn parses tf.Examples (dynamic SparseTensor shapes); EVAL/PREDICT
  ones are static when the batch is."""
  shapes = []
  if form == "columns":
    a = tec.embedding_column(fc.categorical_column_with_identity("a", 6), 2)
    s = tec.embedding_column(
        fc.sequence_categorical_column_with_identity("s", 6), 2,
        max_sequence_length=3)
    spec = es.EmbeddingConfigSpec(
        feature_columns=[a, s],
        optimization_parameters=es.AdagradParameters(0.1))
  else:
    spec = es.EmbeddingConfigSpec(
        feature_to_config_dict={
            "a": es.FeatureConfig("ta"),
            "s": es.FeatureConfig("ts", max_sequence_length=3)
        },
        table_to_config_dict={
            "ta": es.TableConfig(6, 2),
            "ts": es.TableConfig(6, 2)
        },
        optimization_parameters=es.AdagradParameters(0.1))

  def model_fn(features, labels, mode, params):
    if form == "columns":
      dense = v1.keras.layers.DenseFeatures([a])(features)
      seq, lengths = tf.keras.experimental.SequenceFeatures([s])(features)
    else:
      dense, seq, lengths = (features["a"], features["s"],
                             features["s_seq_length_"])
    shapes.append((mode, dense.shape.as_list(), seq.shape.as_list(),
                   lengths.shape.as_list()))
    logits = v1.layers.dense(
        tf.concat([dense, tf.reshape(seq, [-1, 6])], 1), 1)
    if mode == PREDICT:
      return es.TPUEstimatorSpec(mode, predictions={"logits": logits})
    return squared_error_spec(es, mode, labels, logits, params,
                              lambda: v1.train.GradientDescentOptimizer(0.1))

  serialized = _serialized_examples()
  labels = np.ones((16, 1), np.float32)
  parse_spec = {"a": tf.io.VarLenFeature(tf.int64),
                "s": tf.io.VarLenFeature(tf.int64)}

  def parsing_input_fn(params):
    dataset = tf.data.Dataset.from_tensor_slices((serialized, labels))
    # No drop_remainder: the batch dimension is not static.
    dataset = dataset.repeat().batch(params["batch_size"])
    return dataset.map(lambda s, l: (tf.io.parse_example(s, parse_spec), l))

  def static_input_fn(params):
    rng = np.random.RandomState(4)
    features = {"a": rng.randint(1, 6, (16, 2)).astype(np.int64),
                "s": rng.randint(1, 6, (16, 4)).astype(np.int64)}
    return tf.data.Dataset.from_tensor_slices((features, labels)).batch(
        params["batch_size"], drop_remainder=True)

  estimator = make_estimator(side, model_fn, spec, tmp_path,
                             eval_batch_size=8, predict_batch_size=8)
  estimator.train(parsing_input_fn, steps=1)
  estimator.evaluate(static_input_fn, steps=1)
  next(estimator.predict(lambda params: static_input_fn(params).map(
      lambda f, l: f)))
  assert shapes == [(mode, [8, 2], [8, 3, 2], [8])
                    for mode in (TRAIN, EVAL, PREDICT)]


# Ids per example (sparse input: dense ids would lose id 0 on a TPU).
_EMBEDDING_ONLY_IDS = [[0, 1], [1], [2, 2], [3]]
_EMBEDDING_ONLY_COEFFICIENTS = np.float32([[1, 2], [3, 4], [5, 6], [-1, -2]])


@pytest.mark.parametrize("side", [TF_CPU, Side("ours", False, num_shards=4),
                                  Side("ours", True, PER_HOST_V1, 4)],
                         ids=str)
@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
def test_embedding_only_loss_trains_tables(tmp_path, side, optimizer):
  """A loss of the activations alone (no dense variable), minimized by the
  model's GradientDescentOptimizer, trains the tables with the EMBEDDING
  optimizer: sum combiner, loss = sum(activation * c), so id i accumulates
  the c of every example holding it (twice for example 2's id 2). TF's CPU
  path trains the table with the model's optimizer instead."""
  column = side.api.embedding_column(
      fc.categorical_column_with_identity("x", 5), 2, combiner="sum",
      initializer=row_initializer(lambda r: 0.1 * r))

  def model_fn(features, labels, mode, params):
    del labels
    acts = v1.keras.layers.DenseFeatures([column])(features)
    loss = tf.reduce_sum(acts * _EMBEDDING_ONLY_COEFFICIENTS)
    return side.api.TPUEstimatorSpec(
        mode, loss=loss,
        train_op=train_op_for(v1.train.GradientDescentOptimizer(0.1), loss,
                              params))

  def input_fn(params):
    assert params["batch_size"] == 4
    ids = tf.SparseTensor(
        [[b, j] for b, row in enumerate(_EMBEDDING_ONLY_IDS)
         for j in range(len(row))],
        [i for row in _EMBEDDING_ONLY_IDS for i in row], [4, 2])
    return tf.data.Dataset.from_tensors({"x": ids}).repeat()

  spec_optimizer = (side.api.SGD(0.1) if optimizer == "sgd" else
                    side.api.Adagrad(0.1, initial_accumulator=0.1))
  spec = side.api.EmbeddingConfigSpec(
      feature_columns=[column], optimization_parameters=spec_optimizer)
  make_estimator(side, model_fn, spec, tmp_path,
                 train_batch_size=4).train(input_fn, steps=1)

  c = _EMBEDDING_ONLY_COEFFICIENTS.astype(np.float64)
  grads = np.zeros((5, 2))
  grads[0] = c[0]
  grads[1] = c[0] + c[1]
  grads[2] = 2 * c[2]
  grads[3] = c[3]
  initial = np.repeat(0.1 * np.arange(5)[:, None], 2, 1)
  values = read_checkpoint(tmp_path)
  table = values["dense_features/x_embedding/embedding_weights"]
  if side.is_tf or optimizer == "sgd":
    np.testing.assert_allclose(table, sgd(initial, grads, 0.1), rtol=1e-5,
                               atol=1e-7)
    return
  expected, accumulator = adagrad(initial, grads, 0.1)
  np.testing.assert_allclose(table, expected, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(
      values["dense_features/x_embedding/embedding_weights/Adagrad"],
      accumulator, rtol=1e-5)


# --- bad input: an error before any table write, no checkpoint -------------


def _bad_input_spec(case, use_dict):
  user_lr = ((lambda step: 1.0 / tf.cast(step, tf.float32))
             if case == "learning_rate_fn_inf" else None)
  multiplier = (lambda step: tf.cast(step, tf.float32) / tf.cast(
      step, tf.float32)) if case == "multiplier_nan" else None
  if use_dict:
    return es.EmbeddingConfigSpec(
        feature_to_config_dict={
            "user": es.FeatureConfig("tu"),
            "item": es.FeatureConfig("ti", weight_key="item_weight")
        },
        table_to_config_dict={
            "tu": es.TableConfig(5, 2, combiner="sum",
                                 learning_rate_fn=user_lr),
            "ti": es.TableConfig(5, 2, combiner="sum")
        },
        optimization_parameters=es.StochasticGradientDescentParameters(0.1),
        experimental_gradient_multiplier_fn=multiplier), None
  user = tec.embedding_column(
      fc.categorical_column_with_identity("user", 5), 2, combiner="sum",
      learning_rate_fn=user_lr)
  item = tec.embedding_column(
      fc.weighted_categorical_column(
          fc.categorical_column_with_identity("item", 5), "item_weight"), 2,
      combiner="sum")
  return es.EmbeddingConfigSpec(
      feature_columns=[user, item],
      optimization_parameters=es.StochasticGradientDescentParameters(0.1),
      experimental_gradient_multiplier_fn=multiplier), [user, item]


def _bad_input_fn(case):
  """Batch of 4: 'user' ids and 'item' ids with 'item_weight'."""
  user = np.array([[0, -1, -1, -1], [1, -1, -1, 3], [2, -1, -1, -1],
                   [4, -1, -1, -1]], np.int64)
  if case != "dense_shape_too_small":
    user[1, 3] = -1
  item = np.array([[1, -1], [2, 3], [4, -1], [0, -1]], np.int64)
  weights = np.array([[0.5, -1], [1.0, 2.0], [1.5, -1], [2.5, -1]],
                     np.float32)
  if case == "weights_other_positions":
    # Same number of weights (5), at positions other than the ids'.
    weights = np.array([[0.5, -1], [1.0, -1], [1.5, 2.0], [2.5, -1]],
                       np.float32)

  def sparse(dense, present, dense_shape=None):
    where = tf.where(present)
    shape = tf.shape(dense, out_type=tf.int64)
    if dense_shape is not None:
      shape = tf.stack([shape[0], dense_shape])
    return tf.SparseTensor(where, tf.gather_nd(dense, where), shape)

  def to_features(u, i, w):
    return {
        "user": sparse(u, u >= 0, 2 if case == "dense_shape_too_small" else
                       None),
        "item": sparse(i, i >= 0),
        "item_weight": sparse(w, w >= 0),
    }

  def input_fn(params):
    dataset = tf.data.Dataset.from_tensor_slices((user, item, weights))
    return dataset.repeat().batch(params["batch_size"],
                                  drop_remainder=True).map(to_features)

  return input_fn


_BAD_INPUT_CASES = {
    # case: (dict form?, words the error names)
    "weights_other_positions": (False, ["item"]),
    "weights_other_positions_dict": (True, ["item"]),
    "dense_shape_too_small": (False, ["user"]),
    "learning_rate_fn_inf": (False, ["learning_rate"]),
    "multiplier_nan": (False, ["multiplier"]),
}


@pytest.mark.parametrize("use_tpu", [False, True],
                         ids=["use_tpu_false", "use_tpu_true"])
@pytest.mark.parametrize("case", list(_BAD_INPUT_CASES))
def test_bad_input_fails_before_any_write(tmp_path, case, use_tpu):
  use_dict, words = _BAD_INPUT_CASES[case]
  input_case = case.replace("_dict", "")
  spec, columns = _bad_input_spec(input_case, use_dict)

  def model_fn(features, labels, mode, params):
    del labels
    if columns is None:
      acts = [features["user"], features["item"]]
    else:
      acts = [v1.keras.layers.DenseFeatures([c])(features) for c in columns]
    bias = v1.get_variable("bias", [], initializer=tf.zeros_initializer())
    loss = tf.add_n([tf.reduce_sum(a) for a in acts]) + bias
    return es.TPUEstimatorSpec(
        mode, loss=loss,
        train_op=train_op_for(v1.train.GradientDescentOptimizer(0.1), loss,
                              params))

  estimator = es.TPUEstimator(
      model_fn=model_fn,
      config=run_config(Side("ours", use_tpu, PER_HOST_V1), tmp_path, None),
      use_tpu=use_tpu, train_batch_size=4, embedding_config_spec=spec)
  with pytest.raises((ValueError, tf.errors.InvalidArgumentError)) as raised:
    estimator.train(_bad_input_fn(input_case), steps=1)
  message = str(raised.value)
  for word in words:
    assert word in message, message[-1500:]
  # Estimator saves the initial state (step 0) when the session starts, as
  # TF's does; the failed step saved nothing after it.
  assert only_the_initial_checkpoint(tmp_path), os.listdir(tmp_path)
