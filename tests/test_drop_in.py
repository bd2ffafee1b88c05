"""Drop-in fidelity of the TPUEstimator on the host: what TF's own stack
does with the same model, and what it would silently get wrong.

* params: 'use_tpu' allowed and overwritten, 'batch_size'/'context'
  reserved; params['context'] on emulated TPU runs (see also
  tests/test_tpu_programs.py for whole programs);
* a loss of embedding activations only trains (no dense variable);
* a spec of tensor-core columns only trains, evaluates and predicts;
* static activation shapes;
* TF's own TPU columns with our estimator: a clear error naming the import;
  our columns without a spec: one loud warning;
* the TPU-only settings the host ignores, reported once at train();
* experimental_host_call_every_n_steps acts;
* learning_rate_fn / multiplier returning inf or NaN: an error, no update.
"""
import logging
import os
import re

import numpy as np
import pytest
import tensorflow as tf

import estimator_spec as es
import tpu_embedding_columns as tec
from estimator_spec import TPUEstimator
from estimator_spec import TPUEstimatorSpec

fc = tf.feature_column
v1 = tf.compat.v1
TF_TPU_COLUMN = tf.compat.v1.tpu.experimental.embedding_column


def _ids_input_fn(keys=("a", "b"), examples=8, vocab=10, width=2, seed=0):
  """Sparse ids (no zeros, so dense/sparse conventions agree) and labels."""

  def input_fn(params):
    rng = np.random.RandomState(seed)
    features = {k: rng.randint(1, vocab, (examples, width)) for k in keys}
    labels = rng.uniform(size=(examples, 1)).astype(np.float32)
    dataset = tf.data.Dataset.from_tensor_slices((features, labels))
    dataset = dataset.repeat().batch(params["batch_size"], drop_remainder=True)
    return dataset.map(lambda f, y: ({
        k: tf.sparse.from_dense(v) for k, v in f.items()}, y))

  return input_fn


def _columns(dimension=2, vocab=10):
  return [tec.embedding_column(fc.categorical_column_with_identity(k, vocab),
                               dimension, combiner="sum") for k in ("a", "b")]


def _linear_model_fn(columns, optimizer=lambda: v1.train.GradientDescentOptimizer(0.1)):

  def model_fn(features, labels, mode, params):
    del params
    x = v1.feature_column.input_layer(features, columns)
    logits = v1.layers.dense(x, 1, name="out")
    if mode == es.estimator.ModeKeys.PREDICT:
      return TPUEstimatorSpec(mode, predictions={"logits": logits})
    loss = v1.losses.mean_squared_error(labels, logits)
    train_op = optimizer().minimize(loss, v1.train.get_global_step())
    return TPUEstimatorSpec(mode, loss=loss, train_op=train_op)

  return model_fn


def _spec(columns, optimizer=None, **kwargs):
  return es.EmbeddingConfigSpec(
      feature_columns=list(columns),
      optimization_parameters=optimizer or
      es.StochasticGradientDescentParameters(0.5), **kwargs)


# --- params -------------------------------------------------------------------


@pytest.mark.parametrize("use_tpu", [False, True])
def test_params_use_tpu_is_overwritten_context_only_when_emulating(
    tmp_path, use_tpu):
  columns = _columns()
  seen = {}
  inner = _linear_model_fn(columns)

  def model_fn(features, labels, mode, params):
    seen[f"model_fn {mode}"] = dict(params)
    return inner(features, labels, mode, params)

  def input_fn(params):
    seen["input_fn"] = dict(params)
    return _ids_input_fn()(params)

  estimator = TPUEstimator(
      model_fn=model_fn, model_dir=str(tmp_path), use_tpu=use_tpu,
      train_batch_size=4, params={"use_tpu": "mine", "lr": 3},
      embedding_config_spec=_spec(columns))
  estimator.train(input_fn, max_steps=1)
  model_params = seen["model_fn train"]
  assert model_params["use_tpu"] is use_tpu
  assert model_params["batch_size"] == 4 and model_params["lr"] == 3
  # input_fn: TF passes the user's params and the batch size; 'use_tpu' is
  # the user's own.
  assert seen["input_fn"]["use_tpu"] == "mine"
  assert seen["input_fn"]["batch_size"] == 4
  assert ("context" in model_params) is use_tpu
  assert ("context" in seen["input_fn"]) is use_tpu
  if use_tpu:
    context = seen["input_fn"]["context"]
    assert context.current_input_fn_deployment()[1:] == (0, 1, 1)
    assert (context.num_hosts, context.num_replicas,
            context.num_of_replicas_per_host) == (1, 1, 1)
    with pytest.raises(RuntimeError, match="must not be called from"):
      model_params["context"].current_input_fn_deployment()
    with pytest.raises(RuntimeError, match="must not be called from"):
      model_params["context"].current_host  # pylint: disable=pointless-statement


def test_use_tpu_true_needs_batch_sizes_like_tensorflow(tmp_path):
  columns = _columns()
  with pytest.raises(ValueError, match="train_batch_size.*cannot be `None`"):
    TPUEstimator(model_fn=_linear_model_fn(columns), use_tpu=True,
                 model_dir=str(tmp_path))
  estimator = TPUEstimator(model_fn=_linear_model_fn(columns), use_tpu=True,
                           train_batch_size=4, model_dir=str(tmp_path),
                           embedding_config_spec=_spec(columns))
  estimator.train(_ids_input_fn(), max_steps=1)
  with pytest.raises(ValueError, match="eval_batch_size.*cannot be `None`"):
    estimator.evaluate(_ids_input_fn(), steps=1)


# --- what trains --------------------------------------------------------------


@pytest.mark.parametrize("user_optimizer", ["sgd", "adam"])
def test_a_loss_of_activations_only_trains_the_tables(tmp_path,
                                                      user_optimizer):
  """No dense variable: the model's optimizer still minimizes (TF's TPU
  path gives it dummy variables), the tables get the embedding optimizer's
  update, and the checkpoint holds nothing of the optimizer's own."""
  column = tec.embedding_column(
      fc.categorical_column_with_identity("a", 6), 2, combiner="sum",
      initializer=tf.compat.v1.zeros_initializer())

  def model_fn(features, labels, mode, params):
    del labels, params
    activations = tf.keras.layers.DenseFeatures([column])(features)
    loss = tf.reduce_sum(activations)
    optimizer = (v1.train.GradientDescentOptimizer(0.1)
                 if user_optimizer == "sgd" else v1.train.AdamOptimizer(0.1))
    train_op = v1.tpu.CrossShardOptimizer(optimizer).minimize(
        loss, global_step=v1.train.get_global_step())
    return TPUEstimatorSpec(mode, loss=loss, train_op=train_op)

  def input_fn(params):
    ids = tf.SparseTensor([[0, 0], [1, 0], [1, 1]],
                          tf.constant([1, 1, 4], tf.int64), [2, 2])
    return tf.data.Dataset.from_tensors(({"a": ids}, tf.zeros([2, 1]))).repeat()

  estimator = TPUEstimator(
      model_fn=model_fn, model_dir=str(tmp_path), use_tpu=False,
      train_batch_size=2,
      embedding_config_spec=_spec([column], es.StochasticGradientDescentParameters(0.25)))
  estimator.train(input_fn, max_steps=3)
  reader = tf.train.load_checkpoint(str(tmp_path))
  table = reader.get_tensor("dense_features/a_embedding/embedding_weights")
  # d loss / d row: id 1 appears twice per step, id 4 once; SGD(0.25), 3 steps.
  expected = np.zeros((6, 2), np.float32)
  expected[1] = -0.25 * 2 * 3
  expected[4] = -0.25 * 1 * 3
  np.testing.assert_allclose(table, expected, rtol=1e-6)
  names = set(reader.get_variable_to_shape_map())
  assert not [n for n in names if "anchor" in n], names
  assert names == {"dense_features/a_embedding/embedding_weights",
                   "global_step", "estimator_spec/partition_strategy"} | (
                       {"beta1_power", "beta2_power"}
                       if user_optimizer == "adam" else set())


@pytest.mark.parametrize("mode", ["train", "evaluate", "predict"])
def test_a_spec_of_tensor_core_columns_only(tmp_path, mode):
  column = tec.embedding_column(
      fc.categorical_column_with_identity("tc", 6), 2,
      embedding_lookup_device="tpu_tensor_core", tensor_core_shape=[None, 2])

  def model_fn(features, labels, mode, params):
    del params
    x = tf.keras.layers.DenseFeatures([column])(features)
    logits = v1.layers.dense(x, 1)
    if mode == es.estimator.ModeKeys.PREDICT:
      return TPUEstimatorSpec(mode, predictions={"logits": logits})
    loss = v1.losses.mean_squared_error(labels, logits)
    train_op = v1.train.AdagradOptimizer(0.1).minimize(
        loss, v1.train.get_global_step())
    return TPUEstimatorSpec(mode, loss=loss, train_op=train_op)

  estimator = TPUEstimator(
      model_fn=model_fn, model_dir=str(tmp_path), use_tpu=False,
      train_batch_size=4, eval_batch_size=4, predict_batch_size=4,
      embedding_config_spec=_spec([column]))
  input_fn = _ids_input_fn(keys=("tc",), vocab=6, width=3)
  estimator.train(input_fn, max_steps=2)
  reader = tf.train.load_checkpoint(str(tmp_path))
  assert reader.get_tensor("global_step") == 2
  # The table is a dense variable of the model's own optimizer.
  assert reader.has_tensor("dense_features/tc_embedding/embedding_weights/"
                           "Adagrad")
  if mode == "evaluate":
    assert "loss" in estimator.evaluate(input_fn, steps=1)
  elif mode == "predict":
    first = next(estimator.predict(
        lambda params: input_fn(params).map(lambda f, y: f),
        yield_single_examples=False))
    assert first["logits"].shape == (4, 1)


def test_a_tensor_core_only_training_batch_must_be_whole(tmp_path):
  column = tec.embedding_column(
      fc.categorical_column_with_identity("tc", 6), 2,
      embedding_lookup_device="tpu_tensor_core", tensor_core_shape=[None, 2])
  model_fn = _linear_model_fn([column])
  estimator = TPUEstimator(
      model_fn=model_fn, model_dir=str(tmp_path / "m"), use_tpu=False,
      train_batch_size=4, embedding_config_spec=_spec([column]))

  def input_fn(params):
    del params
    ids = tf.SparseTensor([[0, 0], [2, 1]], tf.constant([1, 2], tf.int64),
                          [3, 2])
    return tf.data.Dataset.from_tensors(({"tc": ids}, tf.zeros([3, 1])))

  with pytest.raises(ValueError, match="3 examples.*train_batch_size is 4"):
    estimator.train(input_fn, max_steps=1)
  assert not os.path.exists(tmp_path / "m") or not [
      p for p in os.listdir(tmp_path / "m") if p.startswith("model.ckpt")]


@pytest.mark.parametrize("sequence", [False, True])
def test_training_activations_are_static_with_dynamic_sparse_inputs(
    tmp_path, sequence):
  """tf.data + parse_example: SparseTensors with a dynamic dense_shape. In
  TRAIN the activations are still [train_batch_size, ...] statically."""
  if sequence:
    column = tec.embedding_column(
        fc.sequence_categorical_column_with_identity("a", 10), 3,
        max_sequence_length=4)
  else:
    column = tec.embedding_column(fc.categorical_column_with_identity("a", 10),
                                  3)
  shapes = {}

  def model_fn(features, labels, mode, params):
    del params
    if sequence:
      x, lengths = tf.keras.experimental.SequenceFeatures([column])(features)
      shapes[mode] = (x.shape.as_list(), lengths.shape.as_list())
      x = tf.reshape(x, [x.shape[0], -1])  # needs the static batch
    else:
      x = tf.keras.layers.DenseFeatures([column])(features)
      shapes[mode] = (x.shape.as_list(),)
      x = tf.reshape(x, [x.shape[0], 3])
    logits = v1.layers.dense(x, 1)
    loss = v1.losses.mean_squared_error(labels, logits)
    train_op = v1.train.GradientDescentOptimizer(0.1).minimize(
        loss, v1.train.get_global_step())
    return TPUEstimatorSpec(mode, loss=loss, train_op=train_op)

  def input_fn(params):
    examples = []
    for i in range(8):
      example = tf.train.Example()
      example.features.feature["a"].int64_list.value.extend(
          list(range(1, 1 + i % 3 + 1)))
      example.features.feature["y"].float_list.value.append(float(i))
      examples.append(example.SerializeToString())
    spec = {"a": tf.io.VarLenFeature(tf.int64),
            "y": tf.io.FixedLenFeature([1], tf.float32)}
    dataset = tf.data.Dataset.from_tensor_slices(examples).repeat().batch(
        params["batch_size"], drop_remainder=True)

    def parse(serialized):
      parsed = tf.io.parse_example(serialized, spec)
      return {"a": parsed["a"]}, parsed["y"]

    return dataset.map(parse)

  estimator = TPUEstimator(
      model_fn=model_fn, model_dir=str(tmp_path), use_tpu=False,
      train_batch_size=4, embedding_config_spec=_spec([column]))
  estimator.train(input_fn, max_steps=2)
  if sequence:
    assert shapes["train"] == ([4, 4, 3], [4])
  else:
    assert shapes["train"] == ([4, 3],)


# --- TF's own columns, our columns without a spec ------------------------------


def test_tensorflows_own_columns_with_our_spec_name_the_import(tmp_path):
  ours = _columns()
  tf_column = TF_TPU_COLUMN(fc.categorical_column_with_identity("a", 10), 2)

  def model_fn(features, labels, mode, params):
    del params
    x = tf.keras.layers.DenseFeatures([tf_column, ours[1]])(features)
    logits = v1.layers.dense(x, 1)
    loss = v1.losses.mean_squared_error(labels, logits)
    train_op = v1.train.GradientDescentOptimizer(0.1).minimize(
        loss, v1.train.get_global_step())
    return TPUEstimatorSpec(mode, loss=loss, train_op=train_op)

  estimator = TPUEstimator(
      model_fn=model_fn, model_dir=str(tmp_path / "m"), use_tpu=False,
      train_batch_size=4, embedding_config_spec=_spec(ours))
  with pytest.raises(TypeError, match="TensorFlow's own TPU embedding "
                     "columns.*tpu_embedding_columns.embedding_column"):
    estimator.train(_ids_input_fn(), max_steps=1)
  assert not os.path.exists(tmp_path / "m") or not [
      p for p in os.listdir(tmp_path / "m") if p.startswith("model.ckpt")]


def test_our_columns_without_a_spec_warn_once_naming_them(tmp_path, caplog):
  columns = _columns()
  estimator = TPUEstimator(
      model_fn=_linear_model_fn(columns), model_dir=str(tmp_path),
      use_tpu=False, train_batch_size=4, eval_batch_size=4)
  with caplog.at_level(logging.WARNING, logger="tensorflow"):
    estimator.train(_ids_input_fn(), max_steps=2)
    estimator.train(_ids_input_fn(), max_steps=4)
    estimator.evaluate(_ids_input_fn(), steps=1)
  warnings = [r.getMessage() for r in caplog.records
              if "no embedding_config_spec" in r.getMessage()]
  assert len(warnings) == 1, warnings
  assert "'a_embedding'" in warnings[0] and "'b_embedding'" in warnings[0]
  # The tables trained as ordinary variables (the warning is about this).
  reader = tf.train.load_checkpoint(str(tmp_path))
  assert reader.get_tensor("global_step") == 4


def test_a_spec_silences_the_warning(tmp_path, caplog):
  columns = _columns()
  estimator = TPUEstimator(
      model_fn=_linear_model_fn(columns), model_dir=str(tmp_path),
      use_tpu=False, train_batch_size=4,
      embedding_config_spec=_spec(columns))
  with caplog.at_level(logging.WARNING, logger="tensorflow"):
    estimator.train(_ids_input_fn(), max_steps=1)
  assert not [r for r in caplog.records
              if "no embedding_config_spec" in r.getMessage()]


# --- settings that concern TPU hardware ----------------------------------------


def test_tpu_only_settings_are_reported_once_at_train(tmp_path, caplog):
  column = tec.embedding_column(fc.categorical_column_with_identity("a", 10), 2)
  (b,) = [c for c in _columns() if c.feature_key == "b"]
  spec = _spec([column, b], es.AdagradParameters(
      0.1, use_gradient_accumulation=False),
               profile_data_directory=str(tmp_path / "profile"))
  config = es.RunConfig(
      model_dir=str(tmp_path / "m"),
      tpu_config=es.TPUConfig(
          iterations_per_loop=100, initial_infeed_sleep_secs=3))
  estimator = TPUEstimator(
      model_fn=_linear_model_fn([column, b]), config=config, use_tpu=False,
      train_batch_size=4, batch_axis=(0, 0), embedding_config_spec=spec)
  with caplog.at_level(logging.WARNING, logger="tensorflow"):
    estimator.train(_ids_input_fn(), max_steps=1)
    estimator.train(_ids_input_fn(), max_steps=2)
  reports = [r.getMessage() for r in caplog.records
             if "no effect here" in r.getMessage()]
  assert len(reports) == 1
  report = reports[0]
  for words in ("iterations_per_loop=100", "initial_infeed_sleep_secs=3",
                "batch_axis=(0, 0)", "use_gradient_accumulation=False"):
    assert words in report, (words, report)
  assert "hot_id_replication" not in report
  # eval_on_tpu=True is TF's default: nothing to say about it.
  assert "eval_on_tpu" not in report
  # The host samples lookup statistics into the profile directory.
  assert "profile_data_directory" not in report


def test_tfs_defaults_and_host_behaviour_are_not_reported(tmp_path, caplog):
  """Only what the user set to something else than TF's default (and than
  what the host does anyway) is reported: a TPUConfig left at its defaults
  (iterations_per_loop=2) or set to one step per loop says nothing."""
  columns = _columns()

  def estimator(tpu_config):
    config = es.RunConfig(model_dir=str(tmp_path), tpu_config=tpu_config)
    return TPUEstimator(
        model_fn=_linear_model_fn(columns), config=config, use_tpu=False,
        train_batch_size=4, embedding_config_spec=_spec(columns))

  assert es.TPUConfig().iterations_per_loop == 2  # TF's default
  for quiet_config in (None, es.TPUConfig(), es.TPUConfig(
      iterations_per_loop=1)):
    assert es.estimator.host_only_settings(estimator(quiet_config)) == []
  with caplog.at_level(logging.WARNING, logger="tensorflow"):
    estimator(es.TPUConfig()).train(_ids_input_fn(), max_steps=1)
  assert not [r for r in caplog.records if "no effect here" in
              r.getMessage()]
  assert es.estimator.host_only_settings(
      estimator(es.TPUConfig(iterations_per_loop=3))) == [
          "tpu_config.iterations_per_loop=3: a TPU runs that many steps per "
          "session run; the host runs one step per run (hooks and logging "
          "see every step)."]


def test_hot_id_replication_is_reported(tmp_path):
  spec = es.EmbeddingConfigSpec(
      feature_to_config_dict={"a": es.FeatureConfig("t"),
                              "b": es.FeatureConfig("u")},
      table_to_config_dict={
          "t": es.TableConfig(10, 2, hot_id_replication=True),
          "u": es.TableConfig(10, 2)},
      optimization_parameters=es.AdagradParameters(0.1))
  estimator = TPUEstimator(
      model_fn=_linear_model_fn([]), model_dir=str(tmp_path), use_tpu=True,
      train_batch_size=4, embedding_config_spec=spec)
  notes = es.estimator.host_only_settings(estimator)
  assert [n for n in notes if n.startswith("hot_id_replication of tables "
                                           "['t']")]
  assert not [n for n in notes if "eval_on_tpu" in n]


def test_host_call_runs_every_n_steps(tmp_path):
  columns = _columns()
  runs = []

  def model_fn(features, labels, mode, params):
    spec = _linear_model_fn(columns)(features, labels, mode, params)
    step = v1.train.get_global_step()

    def host_call(global_step):
      return [tf.numpy_function(
          lambda s: runs.append(int(s[0])) or np.int64(0), [global_step],
          tf.int64)]

    return spec._replace(host_call=(host_call, [tf.reshape(step, [1])]))

  config = es.RunConfig(
      model_dir=str(tmp_path),
      tpu_config=es.TPUConfig(
          experimental_host_call_every_n_steps=3))
  estimator = TPUEstimator(model_fn=model_fn, config=config, use_tpu=False,
                           train_batch_size=4,
                           embedding_config_spec=_spec(columns))
  estimator.train(_ids_input_fn(), max_steps=7)
  assert runs == [0, 3, 6]


# --- learning rates and multipliers that are not finite ------------------------


@pytest.mark.parametrize("what", ["learning_rate_fn", "multiplier"])
def test_non_finite_rates_stop_the_step_and_change_nothing(tmp_path, what):
  bad = lambda step: tf.where(step >= 2, np.float32(np.nan), np.float32(0.1))
  columns = [
      tec.embedding_column(fc.categorical_column_with_identity(k, 10), 2,
                           combiner="sum",
                           learning_rate_fn=bad if what == "learning_rate_fn"
                           else None) for k in ("a", "b")]
  spec = _spec(columns, es.AdagradParameters(0.1),
               experimental_gradient_multiplier_fn=(
                   bad if what == "multiplier" else None))
  config = es.RunConfig(model_dir=str(tmp_path),
                                                save_checkpoints_steps=1)
  estimator = TPUEstimator(model_fn=_linear_model_fn(columns), config=config,
                           use_tpu=False, train_batch_size=4,
                           embedding_config_spec=spec)
  estimator.train(_ids_input_fn(), max_steps=2)
  before = tf.train.load_checkpoint(str(tmp_path))
  name = "input_layer/a_embedding/embedding_weights"
  table, accumulator = (before.get_tensor(name),
                        before.get_tensor(name + "/Adagrad"))
  words = ("learning_rate_fn of table .*tbl_" if what == "learning_rate_fn"
           else "experimental_gradient_multiplier_fn")
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=words + ".*not finite"):
    estimator.train(_ids_input_fn(), max_steps=3)
  after = tf.train.load_checkpoint(str(tmp_path))
  assert after.get_tensor("global_step") == 2
  np.testing.assert_array_equal(after.get_tensor(name), table)
  np.testing.assert_array_equal(after.get_tensor(name + "/Adagrad"),
                                accumulator)


# --- model_fn as one replica ---------------------------------------------------


def test_model_fn_is_one_replica_so_per_replica_arithmetic_holds(tmp_path):
  """On 8 emulated cores, input_fn feeds per-core batches (PER_HOST_V2) and
  model_fn runs once on the global batch: its context says one replica, and
  a model's own `cross_replica_sum(x) / num_replicas` (a TPU idiom for a
  global mean) and `batch_size * num_replicas` give the global values."""
  columns = _columns()
  seen = {}

  def model_fn(features, labels, mode, params):
    context = params["context"]
    x = v1.feature_column.input_layer(features, columns)
    logits = v1.layers.dense(x, 1, name="out")
    loss = v1.losses.mean_squared_error(labels, logits)
    mean = v1.tpu.cross_replica_sum(loss) / context.num_replicas
    seen.update(global_batch=params["batch_size"] * context.num_replicas,
                shape=x.shape.as_list())
    train_op = v1.tpu.CrossShardOptimizer(
        v1.train.GradientDescentOptimizer(0.1)).minimize(
            mean, v1.train.get_global_step())
    return TPUEstimatorSpec(mode, loss=loss, train_op=train_op,
                            training_hooks=[_Fetch(seen, loss=loss,
                                                   mean=mean)])

  def input_fn(params):
    seen["input_batch"] = params["batch_size"]
    return _ids_input_fn()(params)

  config = _eight_cores_per_host_v2(tmp_path)
  estimator = TPUEstimator(model_fn=model_fn, config=config, use_tpu=True,
                           train_batch_size=16,
                           embedding_config_spec=_spec(columns))
  estimator.train(input_fn, max_steps=1)
  assert seen["input_batch"] == 2  # per core
  assert seen["global_batch"] == 16 and seen["shape"] == [16, 4]
  assert seen["mean"] == pytest.approx(seen["loss"])


def _eight_cores_per_host_v2(model_dir):
  return es.RunConfig(
      model_dir=str(model_dir),
      tpu_config=es.TPUConfig(
          num_shards=8,
          per_host_input_for_training=(
              es.InputPipelineConfig.PER_HOST_V2)))


class _Fetch(tf.compat.v1.train.SessionRunHook):
  """Stores the values of some tensors after each run into `into`."""

  def __init__(self, into, **tensors):
    self._into = into
    self._tensors = tensors

  def before_run(self, run_context):
    return tf.compat.v1.train.SessionRunArgs(self._tensors)

  def after_run(self, run_context, run_values):
    self._into.update(run_values.results)


def test_prediction_on_emulated_cores_keeps_the_last_partial_step(tmp_path):
  """PER_HOST_V2 on 8 emulated cores: each step takes 8 per-core batches;
  in prediction the last step may have fewer (nothing is dropped), as in
  training it may not."""
  columns = _columns()
  config = _eight_cores_per_host_v2(tmp_path)
  estimator = TPUEstimator(model_fn=_linear_model_fn(columns), config=config,
                           use_tpu=True, train_batch_size=16,
                           predict_batch_size=16,
                           embedding_config_spec=_spec(columns))
  estimator.train(_ids_input_fn(), max_steps=1)

  def predict_input_fn(params):
    assert params["batch_size"] == 2  # per core
    ids = np.arange(1, 21)[:, None] % 9 + 1
    dataset = tf.data.Dataset.from_tensor_slices({"a": ids, "b": ids})
    return dataset.batch(params["batch_size"]).map(
        lambda f: {k: tf.sparse.from_dense(v) for k, v in f.items()})

  predictions = list(estimator.predict(predict_input_fn))
  assert len(predictions) == 20


def test_prediction_as_on_a_tpu_pads_steps_and_needs_a_dataset(tmp_path):
  """Prediction steps are padded to predict_batch_size (static shapes, as a
  TPU pads them) and only the real examples' predictions come out; as on a
  TPU, the input_fn must return a Dataset."""
  columns = _columns()
  shapes = []
  inner = _linear_model_fn(columns)

  def model_fn(features, labels, mode, params):
    spec = inner(features, labels, mode, params)
    if mode == es.estimator.ModeKeys.PREDICT:
      shapes.append(spec.predictions["logits"].shape.as_list())
    return spec

  estimator = TPUEstimator(model_fn=model_fn, model_dir=str(tmp_path),
                           use_tpu=True, train_batch_size=4,
                           predict_batch_size=8,
                           embedding_config_spec=_spec(columns))
  estimator.train(_ids_input_fn(), max_steps=1)

  def features(n):
    ids = np.arange(n)[:, None] % 9 + 1
    return {"a": ids, "b": ids}

  def dataset_input_fn(params):
    dataset = tf.data.Dataset.from_tensor_slices(features(11))
    return dataset.batch(params["batch_size"]).map(
        lambda f: {k: tf.sparse.from_dense(v) for k, v in f.items()})

  assert len(list(estimator.predict(dataset_input_fn))) == 11
  assert shapes == [[8, 1]]

  def tensors_input_fn(params):
    del params
    return {k: tf.sparse.from_dense(v) for k, v in features(8).items()}

  with pytest.raises(TypeError, match="must return `Dataset`"):
    next(estimator.predict(tensors_input_fn))


# --- what training writes for TensorBoard --------------------------------------


def _training_scalars(model_dir):
  """{tag: [(step, value)]} of the scalars in model_dir's training events
  (not eval/)."""
  found = {}
  for path in tf.io.gfile.glob(os.path.join(model_dir, "events.out.*")):
    for event in v1.train.summary_iterator(path):
      for value in event.summary.value:
        if value.HasField("simple_value"):
          found.setdefault(value.tag, []).append(
              (event.step, value.simple_value))
  return found


def _rate_run(model_dir, api, log_step_count_steps, save_summary_steps=100):
  if api == "tf":
    columns = [TF_TPU_COLUMN(fc.categorical_column_with_identity(k, 10), 2,
                             combiner="sum") for k in ("a", "b")]
    spec = tf.compat.v1.estimator.tpu.experimental.EmbeddingConfigSpec(
        feature_columns=columns,
        optimization_parameters=(
            tf.compat.v1.tpu.experimental.StochasticGradientDescentParameters(
                0.5)))
    estimator_class = tf.compat.v1.estimator.tpu.TPUEstimator
    spec_class = tf.compat.v1.estimator.tpu.TPUEstimatorSpec
  else:
    columns = _columns()
    spec = _spec(columns)
    estimator_class, spec_class = TPUEstimator, TPUEstimatorSpec

  def model_fn(features, labels, mode, params):
    del params
    x = v1.feature_column.input_layer(features, columns)
    logits = v1.layers.dense(x, 1, name="out")
    loss = v1.losses.mean_squared_error(labels, logits)
    train_op = v1.train.GradientDescentOptimizer(0.1).minimize(
        loss, v1.train.get_global_step())
    return spec_class(mode, loss=loss, train_op=train_op)

  config = es.RunConfig(
      model_dir=model_dir, log_step_count_steps=log_step_count_steps,
      save_summary_steps=save_summary_steps)
  estimator = estimator_class(model_fn=model_fn, config=config, use_tpu=False,
                              train_batch_size=4, embedding_config_spec=spec)
  estimator.train(_ids_input_fn(), max_steps=9)
  return _training_scalars(model_dir)


def test_training_events_hold_the_step_and_example_rates(tmp_path):
  ours = _rate_run(str(tmp_path / "ours"), "ours", log_step_count_steps=2)
  assert {"global_step/sec", "examples/sec"} <= set(ours), sorted(ours)
  # A report at every multiple of 2, its rate counted from the end of the
  # first step (which builds and starts the session).
  steps = [step for step, _ in ours["examples/sec"]]
  assert steps == [2, 4, 6, 8]
  assert all(np.isfinite(v) and v > 0 for _, v in ours["examples/sec"])


@pytest.mark.tf215
def test_training_events_hold_the_rates_tensorflow_writes(tmp_path):
  theirs = _rate_run(str(tmp_path / "tf"), "tf", log_step_count_steps=2)
  ours = _rate_run(str(tmp_path / "ours"), "ours", log_step_count_steps=2)
  assert {"global_step/sec", "examples/sec"} <= set(theirs), sorted(theirs)
  assert set(theirs) <= set(ours), (sorted(theirs), sorted(ours))


def test_rates_follow_log_step_count_steps_and_save_summary_steps(tmp_path):
  # No step counting asked for: neither rate is written.
  quiet = _rate_run(str(tmp_path / "none"), "ours", log_step_count_steps=None)
  assert not {"global_step/sec", "examples/sec"} & set(quiet), sorted(quiet)
  # No summaries: the rates are logged, not written (as Estimator does).
  unsaved = _rate_run(str(tmp_path / "unsaved"), "ours",
                      log_step_count_steps=2, save_summary_steps=0)
  assert "examples/sec" not in unsaved, sorted(unsaved)


@pytest.mark.parametrize("method", ["evaluate", "predict"])
def test_evaluate_and_predict_without_their_batch_size_say_which_argument(
    tmp_path, method):
  estimator = TPUEstimator(
      model_fn=_linear_model_fn(_columns()), model_dir=str(tmp_path),
      use_tpu=False, train_batch_size=4, embedding_config_spec=_spec(
          _columns()))
  estimator.train(_ids_input_fn(), max_steps=1)
  before = sorted(os.listdir(tmp_path))
  argument = {"evaluate": "eval_batch_size",
              "predict": "predict_batch_size"}[method]
  # An input_fn that reads params['batch_size'] learns which argument
  # gives it, in one sentence (TF: a bare KeyError: 'batch_size').
  with pytest.raises(KeyError, match=re.escape(
      f"TPUEstimator was given no {argument}; pass {argument}=... to "
      "TPUEstimator")):
    result = getattr(estimator, method)(_ids_input_fn())
    if method == "predict":
      next(result)
  assert sorted(os.listdir(tmp_path)) == before
  # An input_fn that batches by itself works without it, as on TF.
  def batched(params):
    del params
    return _ids_input_fn()({"batch_size": 4})
  if method == "evaluate":
    assert estimator.evaluate(batched, steps=1)["global_step"] == 1
  else:
    assert "logits" in next(estimator.predict(batched))


@pytest.mark.parametrize("use_tpu", [False, True])
def test_labels_for_a_model_fn_without_labels_are_refused(tmp_path, use_tpu):
  columns = _columns()
  with_labels = _linear_model_fn(columns)

  def model_fn(features, mode, params):
    return with_labels(features, None, mode, params)

  estimator = TPUEstimator(
      model_fn=model_fn, model_dir=str(tmp_path), use_tpu=use_tpu,
      train_batch_size=4, embedding_config_spec=_spec(columns))
  with pytest.raises(ValueError, match=(
      r"^TPUEstimator: input_fn returned labels but model_fn takes no "
      r"`labels` argument; add one, or return features only\.$")):
    estimator.train(_ids_input_fn(), max_steps=1)
  assert tf.train.latest_checkpoint(str(tmp_path)) is None
