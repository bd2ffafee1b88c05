"""End-to-end tests of the TPUEstimator drop-in on the host engine.

* Linear loss (activation gradients are known constants): the checkpointed
  tables and slots after several steps equal the NumPy twin of docs/numerics.md,
  for div/mod over 3 shards, pipelining on/off, a gradient multiplier and
  dynamic learning rates, in the columns form (plain, shared, sequence,
  weighted columns) and the dict form.
* Every column kind trains, evaluates and predicts through model_fn.
* Bad input: clear errors and nothing written to model_dir.
"""
import os

import numpy as np
import pytest
import tensorflow as tf

import estimator_spec as es
import tpu_embedding_columns as tec
from estimator_spec import TPUEstimator
from estimator_spec import TPUEstimatorSpec
from tests import numpy_twin

fc = tf.feature_column
F32 = np.float32
BATCH = 48  # divisible by 8, 16 and 24 TPU cores (1-3 hosts)
STEPS = 5
DIM = 3
VOCAB = {"a": 11, "shared": 13, "w": 7}
SEQ_LEN = 3


def _run_config(model_dir, num_shards=1, **kwargs):
  return es.RunConfig(
      model_dir=str(model_dir),
      tpu_config=es.TPUConfig(
          num_shards=8 * num_shards if num_shards > 1 else 1),
      **kwargs)


# --- the data of the linear-loss scenario -----------------------------------


def _batches(seed=0):
  """STEPS batches: per feature, a list (per example) of id lists; 'w' with
  weights. Ids repeat within and across examples and steps."""
  rng = np.random.RandomState(seed)
  batches = []
  for _ in range(STEPS):
    batch = {}
    for name, vocab, low, high in (("a", VOCAB["a"], 0, 3),
                                   ("b", VOCAB["shared"], 1, 2),
                                   ("s", VOCAB["shared"], 0, 5),
                                   ("w", VOCAB["w"], 0, 3)):
      ids = [list(rng.randint(0, min(vocab, 6), size=rng.randint(low,
                                                                  high + 1)))
             for _ in range(BATCH)]
      if name == "w":
        weights = [list(rng.uniform(0.5, 2.0, size=len(i)).astype(F32))
                   for i in ids]
        batch[name] = (ids, weights)
      else:
        batch[name] = ids
    batches.append(batch)
  return batches


def _padded(lists, width, pad, dtype):
  out = np.full((len(lists), width), pad, dtype)
  for row, values in enumerate(lists):
    out[row, :len(values)] = values
  return out


def _input_fn(batches, weight_key="w_weight"):
  """Feeds `batches` in order, as dense arrays padded with -1 (ids) / 0."""
  arrays = {}
  for name in ("a", "b", "s", "w"):
    entry = [b[name] for b in batches]
    ids = [e[0] if isinstance(e, tuple) else e for e in entry]
    arrays[name] = np.concatenate([_padded(i, 5, -1, np.int64) for i in ids])
    if name == "w":
      arrays[weight_key] = np.concatenate(
          [_padded(e[1], 5, 0.0, np.float32) for e in entry])
  labels = np.zeros((len(batches) * BATCH, 1), np.float32)

  def to_sparse(features, labels):
    out = dict(features)
    for name in ("a", "b", "s", "w"):
      positions = tf.where(features[name] >= 0)
      out[name] = tf.SparseTensor(positions,
                                  tf.gather_nd(features[name], positions),
                                  tf.shape(features[name], tf.int64))
      if name == "w":
        out[weight_key] = tf.SparseTensor(
            positions, tf.gather_nd(features[weight_key], positions),
            tf.shape(features[name], tf.int64))
    return out, labels

  def input_fn(params):
    assert params["batch_size"] == BATCH
    dataset = tf.data.Dataset.from_tensor_slices((arrays, labels))
    return dataset.batch(params["batch_size"],
                         drop_remainder=True).map(to_sparse)

  return input_fn


def _coefficients(seed=1):
  rng = np.random.RandomState(seed)
  return {
      "a": rng.uniform(-1, 1, (BATCH, DIM)).astype(F32),
      "b": rng.uniform(-1, 1, (BATCH, DIM)).astype(F32),
      "s": rng.uniform(-1, 1, (BATCH, SEQ_LEN, DIM)).astype(F32),
      "w": rng.uniform(-1, 1, (BATCH, DIM)).astype(F32),
  }


def _initial_tables(seed=2):
  rng = np.random.RandomState(seed)
  return {name: rng.uniform(-1, 1, (vocab, DIM)).astype(F32)
          for name, vocab in VOCAB.items()}


def _lr_fn_tf(step):
  return 0.2 / (1.0 + tf.cast(step, tf.float32))


def _lr_fn_np(step):
  return F32(0.2) / (F32(1.0) + F32(step))


def _multiplier_tf(step):
  return 1.0 + 0.5 * tf.cast(step, tf.float32)


def _multiplier_np(step):
  return F32(1.0) + F32(0.5) * F32(step)


OPTIMIZER = es.AdagradParameters(learning_rate=0.1, initial_accumulator=0.1,
                                 clip_weight_min=-1.5, clip_weight_max=1.5)


def _stored_initializer(table, shards, strategy):
  """Initializes a table stored in `shards` partitions (`strategy` layout)
  so that its rows in row order equal `table`."""
  layout = es.ShardLayout(table.shape[0], shards, strategy)
  stored = np.concatenate(layout.split(table))

  def initializer(shape, dtype=tf.float32, partition_info=None):
    start = partition_info.var_offset[0] if partition_info else 0
    return tf.constant(stored[start:start + shape[0]], dtype)

  return initializer


def _column_spec(tables, pipelining, strategy, multiplier, shards):
  a = tec.embedding_column(
      fc.categorical_column_with_identity("a", VOCAB["a"]), DIM,
      combiner="mean",
      initializer=_stored_initializer(tables["a"], shards, strategy),
      learning_rate_fn=_lr_fn_tf)
  b, s = tec.shared_embedding_columns(
      [fc.categorical_column_with_identity("b", VOCAB["shared"]),
       fc.sequence_categorical_column_with_identity("s", VOCAB["shared"])],
      DIM, combiner="sum",
      initializer=_stored_initializer(tables["shared"], shards, strategy),
      shared_embedding_collection_name="shared",
      max_sequence_lengths=[0, SEQ_LEN])
  w = tec.embedding_column(
      fc.weighted_categorical_column(
          fc.categorical_column_with_identity("w", VOCAB["w"]), "w_weight"),
      DIM, combiner="sqrtn",
      initializer=_stored_initializer(tables["w"], shards, strategy))
  spec = es.EmbeddingConfigSpec(
      feature_columns=[a, b, s, w],
      optimization_parameters=OPTIMIZER,
      pipeline_execution_with_tensor_core=pipelining,
      partition_strategy=strategy,
      experimental_gradient_multiplier_fn=(_multiplier_tf
                                           if multiplier else None))
  return spec, {"a": a, "b": b, "s": s, "w": w}


def _dict_spec(tables, pipelining, strategy, multiplier, shards):
  table_configs = {
      "a": es.TableConfig(VOCAB["a"], DIM, _stored_initializer(
          tables["a"], shards, strategy), "mean", learning_rate_fn=_lr_fn_tf),
      "shared": es.TableConfig(VOCAB["shared"], DIM,
                               _stored_initializer(
                                   tables["shared"], shards, strategy), "sum"),
      "w": es.TableConfig(VOCAB["w"], DIM, _stored_initializer(
          tables["w"], shards, strategy), "sqrtn"),
  }
  features = {
      "a": es.FeatureConfig("a"),
      "b": es.FeatureConfig("shared"),
      "s": es.FeatureConfig("shared", max_sequence_length=SEQ_LEN),
      "w": es.FeatureConfig("w", weight_key="w_weight"),
  }
  spec = es.EmbeddingConfigSpec(
      table_to_config_dict=table_configs, feature_to_config_dict=features,
      optimization_parameters=OPTIMIZER,
      pipeline_execution_with_tensor_core=pipelining,
      partition_strategy=strategy,
      experimental_gradient_multiplier_fn=(_multiplier_tf
                                           if multiplier else None))
  return spec, None


def _linear_model_fn(columns, coefficients, use_optimizer, quadratic=False):
  """loss = sum over features of activation * coefficient (+ a dense bias
  trained by the user's optimizer): d loss / d activation = coefficient.
  `quadratic`: coefficient * activation^2 / 2 instead, so the gradient
  (coefficient * activation) depends on the activations (pipelining shows)."""

  def model_fn(features, labels, mode, params):
    assert params["batch_size"] == BATCH and params["use_tpu"] is False
    del labels
    if columns is not None:
      acts = {
          "a": tf.compat.v1.keras.layers.DenseFeatures([columns["a"]])(
              features),
          "b": tf.compat.v1.keras.layers.DenseFeatures([columns["b"]])(
              features),
          "w": tf.compat.v1.feature_column.input_layer(features,
                                                       [columns["w"]]),
      }
      acts["s"], _ = tf.keras.experimental.SequenceFeatures([columns["s"]])(
          features)
    else:
      acts = {k: features[k] for k in "absw"}
      assert features["s_seq_length_"].dtype.is_integer
      assert "w_weight" not in features
    bias = tf.compat.v1.get_variable("bias", [], initializer=tf.zeros_initializer())
    power = (lambda x: 0.5 * x * x) if quadratic else (lambda x: x)
    loss = bias + tf.add_n([
        tf.reduce_sum(power(acts[k]) * tf.constant(coefficients[k]))
        for k in "absw"
    ])
    step = tf.compat.v1.train.get_global_step()
    if use_optimizer:
      train_op = tf.compat.v1.tpu.CrossShardOptimizer(
          tf.compat.v1.train.GradientDescentOptimizer(0.5)).minimize(
              loss, global_step=step)
    else:
      train_op = tf.compat.v1.assign_add(step, 1)
    predictions = {k: acts[k] for k in "absw"}
    return TPUEstimatorSpec(mode, loss=loss, train_op=train_op,
                            predictions=predictions)

  return model_fn


def _twin_config(pipelining, multiplier):
  return {
      "tables": {
          "a": {"vocab": VOCAB["a"], "dim": DIM, "combiner": "mean",
                "learning_rate_fn": _lr_fn_np},
          "shared": {"vocab": VOCAB["shared"], "dim": DIM, "combiner": "sum"},
          "w": {"vocab": VOCAB["w"], "dim": DIM, "combiner": "sqrtn"},
      },
      "features": {
          "a": {"table": "a"},
          "b": {"table": "shared"},
          "s": {"table": "shared", "max_sequence_length": SEQ_LEN},
          "w": {"table": "w"},
      },
      "optimizer": OPTIMIZER,
      "gradient_multiplier_fn": _multiplier_np if multiplier else None,
      "pipelining": pipelining,
  }


_TABLE_VARS = {
    "columns": {"a": "dense_features/a_embedding/embedding_weights",
                "shared": "shared", "w": "input_layer/w_weighted_by_w_weight_embedding/embedding_weights"},
    "dict": {"a": "a", "shared": "shared", "w": "w"},
}


@pytest.mark.slow
@pytest.mark.parametrize(
    "form,strategy,shards,pipelining,multiplier,use_optimizer,quadratic", [
        ("columns", "div", 1, False, False, True, False),
        ("columns", "mod", 3, True, True, True, False),
        ("columns", "div", 3, False, True, False, False),
        ("dict", "mod", 3, False, True, True, False),
        ("dict", "div", 2, True, False, True, False),
        ("columns", "mod", 2, True, True, True, True),
        ("dict", "div", 1, True, False, False, True),
        ("columns", "div", 3, False, False, True, True),
    ])
def test_linear_loss_tables_match_numpy_twin(tmp_path, form, strategy, shards,
                                             pipelining, multiplier,
                                             use_optimizer, quadratic):
  tables = _initial_tables()
  coefficients = _coefficients()
  batches = _batches()
  build = _column_spec if form == "columns" else _dict_spec
  spec, columns = build(tables, pipelining, strategy, multiplier, shards)
  estimator = TPUEstimator(
      model_fn=_linear_model_fn(columns, coefficients, use_optimizer,
                                quadratic),
      # The quadratic runs checkpoint only at the end: pipelining then runs
      # uninterrupted, as the twin does.
      config=_run_config(tmp_path, shards,
                         save_checkpoints_steps=100 if quadratic else 2),
      use_tpu=False, train_batch_size=BATCH, predict_batch_size=BATCH,
      embedding_config_spec=spec)
  estimator.train(_input_fn(batches), max_steps=STEPS)

  twin = _twin_config(pipelining, multiplier)
  state = numpy_twin.init_state(twin, tables)
  if quadratic:
    grads_fn = lambda step, acts: {k: coefficients[k] * acts[k] for k in acts}
  else:
    grads_fn = lambda step, acts: coefficients
  expected = numpy_twin.run_steps(state, twin, batches, grads_fn,
                                  pipelining=pipelining)
  _assert_checkpoint_matches(str(tmp_path), form, shards, strategy, expected,
                             STEPS)
  if not quadratic:
    # Checkpoints mid-run hold every update so far (pipelining flushes the
    # held update before saving).
    after_two = numpy_twin.run_steps(state, twin, batches[:2], grads_fn,
                                     pipelining=pipelining)
    _assert_checkpoint_matches(
        os.path.join(str(tmp_path), "model.ckpt-2"), form, shards, strategy,
        after_two, 2)
  if use_optimizer:
    # The user's optimizer trained the dense bias: d loss / d bias = 1.
    np.testing.assert_allclose(
        tf.train.load_checkpoint(str(tmp_path)).get_tensor("bias"),
        -0.5 * STEPS)

  # Lookups after training read the trained tables (predict mode).
  predictions = list(estimator.predict(_input_fn(batches[:1]),
                                       yield_single_examples=False))[0]
  twin_acts = numpy_twin.forward(expected, twin, batches[0])
  for feature in "absw":
    np.testing.assert_allclose(predictions[feature], twin_acts[feature],
                               rtol=2e-5, atol=2e-6, err_msg=feature)


def _assert_checkpoint_matches(path, form, shards, strategy, expected, step):
  reader = tf.train.load_checkpoint(path)
  assert reader.get_tensor("global_step") == step
  for table, var in _TABLE_VARS[form].items():
    stored = reader.get_tensor(var)
    layout = es.ShardLayout(VOCAB[table], shards, strategy)
    # The checkpoint holds the partitions in order: for mod, the TPU's order.
    in_row_order = layout.join(np.split(
        stored, np.cumsum(layout.sizes)[:-1]))
    np.testing.assert_allclose(in_row_order, expected[table]["table"],
                               rtol=2e-5, atol=1e-5, err_msg=table)
    accumulator = layout.join(np.split(
        reader.get_tensor(f"{var}/Adagrad"), np.cumsum(layout.sizes)[:-1]))
    np.testing.assert_allclose(accumulator,
                               expected[table]["slots"]["accumulator"],
                               rtol=2e-5, atol=1e-6, err_msg=table)


# --- every column kind through train / evaluate / predict / export ----------

_VOCAB_WORDS = ["red", "green", "blue", "cyan", "black"]


def _all_kinds_columns(vocab_file):
  """(engine columns, other columns) covering every categorical kind."""
  ident = fc.categorical_column_with_identity("ident", 20)
  columns = [
      # 'cpu' (TF: a lookup for CPU serving) is an embedding table like the
      # others; on the host its lookup and update are the engine's.
      tec.embedding_column(ident, 2, combiner="sum",
                           embedding_lookup_device="cpu"),
      tec.embedding_column(
          fc.categorical_column_with_hash_bucket("hashed", 17), 2),
      tec.embedding_column(
          fc.categorical_column_with_vocabulary_list("color", _VOCAB_WORDS),
          2, combiner="sqrtn"),
      tec.embedding_column(
          fc.categorical_column_with_vocabulary_file("word", vocab_file,
                                                     num_oov_buckets=2), 2),
      tec.embedding_column(
          fc.crossed_column(["color", "hashed"], hash_bucket_size=23), 2),
      tec.embedding_column(
          fc.bucketized_column(fc.numeric_column("price"), [1.0, 5.0, 10.0]),
          2),
      tec.embedding_column(
          fc.weighted_categorical_column(
              fc.categorical_column_with_identity("wid", 9), "wid_weight"),
          2),
      tec.embedding_column(
          fc.sequence_categorical_column_with_hash_bucket("history", 31), 2,
          max_sequence_length=4),
  ]
  columns += tec.shared_embedding_columns(
      [fc.categorical_column_with_identity("item", 15),
       fc.sequence_categorical_column_with_identity("clicks", 15)], 2,
      max_sequence_lengths=[0, 3])
  # A tensor-core column: a dense lookup the user's optimizer trains.
  tensor_core = tec.embedding_column(
      fc.categorical_column_with_identity("tc", 6), 2,
      embedding_lookup_device="tpu_tensor_core", tensor_core_shape=[None, 2])
  return columns, tensor_core


def _all_kinds_data(n):
  rng = np.random.RandomState(5)
  words = np.array(["alpha", "beta", "gamma", "zeta", ""], dtype=object)
  colors = np.array(_VOCAB_WORDS + ["pink", ""], dtype=object)
  features = {
      "ident": rng.randint(-1, 20, (n, 3)),
      "hashed": np.char.add("h", rng.randint(0, 40, (n, 2)).astype(str)
                           ).astype(object),
      "color": colors[rng.randint(0, 7, (n, 2))],
      "word": words[rng.randint(0, 5, (n, 2))],
      "price": rng.uniform(0, 12, (n, 1)).astype(np.float32),
      # No 0 ids (a dense id tensor's non-zero entries are its ids) and
      # weights at every id: sparse weights at the ids' positions.
      "wid": rng.randint(1, 9, (n, 2)),
      "wid_weight": rng.uniform(0.5, 2, (n, 2)).astype(np.float32),
      "history": np.char.add("x", rng.randint(0, 50, (n, 5)).astype(str)
                            ).astype(object),
      "item": rng.randint(0, 15, (n, 1)),
      "clicks": np.where(rng.uniform(size=(n, 4)) < 0.7,
                         rng.randint(0, 15, (n, 4)), -1),
      "tc": rng.randint(0, 6, (n, 2)),
  }
  labels = rng.randint(0, 2, (n, 1)).astype(np.float32)
  return features, labels


def _classifier_model_fn(columns, tensor_core, extra_metrics=True):
  dense = [c for c in columns if c.get_max_sequence_length() == 0]
  sequence = [c for c in columns if c.get_max_sequence_length() > 0]

  def model_fn(features, labels, mode, params, config):
    del config
    assert params["use_tpu"] is False
    parts = [tf.compat.v1.feature_column.input_layer(
        features, dense + [tensor_core])]
    for column in sequence:
      values, lengths = tf.keras.experimental.SequenceFeatures([column])(
          features)
      parts.append(tf.reduce_sum(values, 1) / tf.maximum(
          tf.cast(lengths, tf.float32), 1.0)[:, None])
    logits = tf.compat.v1.layers.dense(tf.concat(parts, 1), 1)
    if mode == es.estimator.ModeKeys.PREDICT:
      return TPUEstimatorSpec(mode, predictions={"logits": logits},
                              export_outputs={
                                  "serving_default":
                                      es.estimator.export.PredictOutput(
                                          {"logits": logits})})
    loss = tf.compat.v1.losses.sigmoid_cross_entropy(labels, logits)
    optimizer = tf.compat.v1.tpu.CrossShardOptimizer(
        tf.compat.v1.train.AdagradOptimizer(0.1))
    train_op = optimizer.minimize(loss, tf.compat.v1.train.get_global_step())
    metric_fn = lambda labels, logits: {
        "accuracy": tf.compat.v1.metrics.accuracy(labels, tf.cast(
            logits > 0, tf.float32))}
    return TPUEstimatorSpec(
        mode, loss=loss, train_op=train_op,
        eval_metrics=(metric_fn, {"labels": labels, "logits": logits}))

  return model_fn


def _numpy_input_fn(features, labels, shuffle=False, repeat=True):

  def input_fn(params):
    dataset = tf.data.Dataset.from_tensor_slices((features, labels))
    if shuffle:
      dataset = dataset.shuffle(64, seed=3)
    if repeat:
      dataset = dataset.repeat()
    # Weights are sparse, as on a TPU.
    return dataset.batch(params["batch_size"], drop_remainder=True).map(
        lambda f, l: ({**f, "wid_weight": tf.sparse.from_dense(
            f["wid_weight"])}, l))

  return input_fn


@pytest.mark.slow
@pytest.mark.parametrize("pipelining,strategy,shards", [(False, "div", 1),
                                                        (True, "mod", 2)])
def test_every_column_kind_trains_evaluates_predicts_exports(
    tmp_path, pipelining, strategy, shards):
  vocab_file = tmp_path / "words.txt"
  vocab_file.write_text("alpha\nbeta\ngamma\n")
  columns, tensor_core = _all_kinds_columns(str(vocab_file))
  spec = es.EmbeddingConfigSpec(
      feature_columns=columns + [tensor_core],
      optimization_parameters=es.AdagradParameters(0.5),
      pipeline_execution_with_tensor_core=pipelining,
      partition_strategy=strategy)
  features, labels = _all_kinds_data(64)
  model_dir = tmp_path / "model"
  estimator = TPUEstimator(
      model_fn=_classifier_model_fn(columns, tensor_core),
      config=_run_config(model_dir, shards),
      use_tpu=False, train_batch_size=16, eval_batch_size=16,
      predict_batch_size=8, embedding_config_spec=spec)
  estimator.train(_numpy_input_fn(features, labels, shuffle=True), steps=6)
  reader = tf.train.load_checkpoint(str(model_dir))
  stored = reader.get_variable_to_shape_map()
  assert reader.get_tensor("global_step") == 6
  # Every engine table trained by the spec's Adagrad: its accumulator left
  # the initial 0.1 exactly at the rows the data touched.
  for column in columns:
    var = (column.shared_embedding_collection_name if hasattr(
        column, "shared_embedding_collection_name") else
           ("sequence_features" if column.get_max_sequence_length() else
            "input_layer") + f"/{column.name}/embedding_weights")
    assert var in stored and f"{var}/Adagrad" in stored, (column.name,
                                                          sorted(stored))
    accumulator = reader.get_tensor(f"{var}/Adagrad")
    assert (accumulator > 0.1).any() and (accumulator == 0.1).any() or (
        accumulator > 0.1).all(), column.name
  # The tensor-core column is a dense variable of the user's optimizer.
  tc_var = "input_layer/tc_embedding/embedding_weights"
  assert f"{tc_var}/Adagrad" in stored

  metrics = estimator.evaluate(_numpy_input_fn(features, labels), steps=2)
  assert set(metrics) >= {"accuracy", "loss", "global_step"}
  predictions = list(estimator.predict(
      _numpy_input_fn(features, labels, repeat=False),
      yield_single_examples=False))
  first = predictions[0]["logits"]
  assert first.shape == (8, 1) and np.isfinite(first).all()

  def serving():
    inputs = {
        k: tf.compat.v1.placeholder(
            tf.string if v.dtype == object else tf.as_dtype(v.dtype),
            [None, v.shape[1]], name=k) for k, v in features.items()
        if k != "wid_weight"
    }
    inputs["wid_weight"] = tf.compat.v1.sparse_placeholder(
        tf.float32, [None, 2], name="wid_weight")
    return es.estimator.export.ServingInputReceiver(inputs, inputs)

  export_dir = estimator.export_saved_model(str(tmp_path / "export"),
                                            serving).decode()
  with tf.Graph().as_default(), tf.compat.v1.Session() as session:
    meta = tf.compat.v1.saved_model.load(session, ["serve"], export_dir)
    signature = meta.signature_def["serving_default"]
    feed = {signature.inputs[k].name: v[:8] for k, v in features.items()
            if k != "wid_weight"}
    weights = features["wid_weight"][:8]
    rows, cols = np.nonzero(weights)
    coo = signature.inputs["wid_weight"].coo_sparse
    feed[coo.indices_tensor_name] = np.stack([rows, cols], 1).astype(np.int64)
    feed[coo.values_tensor_name] = weights[rows, cols]
    feed[coo.dense_shape_tensor_name] = np.array(weights.shape, np.int64)
    served = session.run(signature.outputs["logits"].name, feed)
    names = [v.name for v in tf.compat.v1.global_variables()]
  np.testing.assert_allclose(served, first, rtol=1e-6, atol=1e-6)
  assert not [n for n in names if "Adagrad" in n or "pipelined" in n], names


# --- bad input: clear errors, nothing written -------------------------------


def _small_columns():
  a = tec.embedding_column(fc.categorical_column_with_identity("a", 10), 2)
  b = tec.embedding_column(fc.categorical_column_with_identity("b", 10), 2)
  return a, b


def _small_model_fn(used_columns, labels_shape_fn=None):

  def model_fn(features, labels, mode, params):
    del params
    x = tf.compat.v1.feature_column.input_layer(features, used_columns)
    logits = tf.compat.v1.layers.dense(x, 1)
    if mode == es.estimator.ModeKeys.PREDICT:
      return TPUEstimatorSpec(mode, predictions={"logits": logits})
    loss = tf.compat.v1.losses.mean_squared_error(labels, logits)
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
        loss, tf.compat.v1.train.get_global_step())
    return TPUEstimatorSpec(mode, loss=loss, train_op=train_op)

  return model_fn


def _small_input_fn(batch=4, keys=("a", "b"), label_rows=None,
                    drop_remainder=True, examples=8):

  def input_fn(params):
    del params
    rng = np.random.RandomState(0)
    features = {k: rng.randint(0, 10, (examples, 2)) for k in keys}
    labels = rng.uniform(size=(examples, 1)).astype(np.float32)
    dataset = tf.data.Dataset.from_tensor_slices((features, labels)).batch(
        batch, drop_remainder=drop_remainder)
    if label_rows is not None:
      dataset = dataset.map(lambda f, l: (f, l[:label_rows]))
    return dataset

  return input_fn


def _small_estimator(model_dir, model_fn, columns, **kwargs):
  spec = es.EmbeddingConfigSpec(
      feature_columns=list(columns),
      optimization_parameters=es.AdagradParameters(0.1))
  return TPUEstimator(model_fn=model_fn, model_dir=str(model_dir),
                      use_tpu=False, train_batch_size=4,
                      embedding_config_spec=spec, **kwargs)


def _nothing_written(model_dir):
  return not os.path.exists(model_dir) or not os.listdir(model_dir)


@pytest.mark.parametrize("case,error,words", [
    ("missing_feature", ValueError, ["'b'", "missing"]),
    ("wrong_batch", ValueError, ["3 examples", "train_batch_size is 4"]),
    ("label_rows", ValueError, ["labels", "2 rows", "4 examples"]),
    ("unused_column", ValueError, ["never uses", "'b'"]),
    ("column_not_in_spec", ValueError, ["'c_embedding'", "not in the"]),
    ("stopped_gradient", ValueError, ["does not depend", "'b'"]),
    # 'b' shares its table with 'a', which feeds the loss: their
    # activations are tapped together, and 'b' still has no gradient.
    ("stopped_gradient_shared", ValueError, ["does not depend", "'b'"]),
])
def test_bad_input_raises_and_writes_nothing(tmp_path, case, error, words):
  a, b = _small_columns()
  if case == "stopped_gradient_shared":
    a, b = tec.shared_embedding_columns(
        [fc.categorical_column_with_identity(k, 10) for k in ("a", "b")], 2)
  c = tec.embedding_column(fc.categorical_column_with_identity("c", 10), 2)
  model_dir = tmp_path / "model"
  model_fn = _small_model_fn([a, b])
  input_fn = _small_input_fn()
  if case == "missing_feature":
    input_fn = _small_input_fn(keys=("a",))
  elif case == "wrong_batch":
    input_fn = _small_input_fn(batch=3)
  elif case == "label_rows":
    input_fn = _small_input_fn(label_rows=2)
  elif case == "unused_column":
    model_fn = _small_model_fn([a])
  elif case == "column_not_in_spec":
    model_fn = _small_model_fn([a, b, c])
    input_fn = _small_input_fn(keys=("a", "b", "c"))
  elif case.startswith("stopped_gradient"):

    def model_fn(features, labels, mode, params):  # pylint: disable=function-redefined
      del params
      x = tf.compat.v1.feature_column.input_layer(features, [a])
      y = tf.stop_gradient(tf.compat.v1.feature_column.input_layer(
          features, [b]))
      logits = tf.compat.v1.layers.dense(tf.concat([x, y], 1), 1)
      loss = tf.compat.v1.losses.mean_squared_error(labels, logits)
      train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
          loss, tf.compat.v1.train.get_global_step())
      return TPUEstimatorSpec(mode, loss=loss, train_op=train_op)

  estimator = _small_estimator(model_dir, model_fn, [a, b])
  with pytest.raises(error) as raised:
    estimator.train(input_fn, max_steps=2)
  for word in words:
    assert word in str(raised.value), (word, str(raised.value))
  assert _nothing_written(str(model_dir)), os.listdir(model_dir)


def test_partial_training_batch_fails_without_updating_tables(tmp_path):
  """A batch of the wrong size found only at run time (no drop_remainder)
  stops training with a clear error; the failed step changes no table."""
  a, b = _small_columns()
  model_dir = tmp_path / "model"
  estimator = _small_estimator(
      model_dir, _small_model_fn([a, b]), [a, b],
      config=es.estimator.RunConfig(save_checkpoints_steps=1))
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match="train_batch_size=4"):
    estimator.train(_small_input_fn(drop_remainder=False, examples=6),
                    max_steps=5)
  reader = tf.train.load_checkpoint(str(model_dir))
  assert reader.get_tensor("global_step") == 1


def test_constructor_refusals(tmp_path):
  a, b = _small_columns()
  spec = es.EmbeddingConfigSpec(feature_columns=[a, b],
                                optimization_parameters=es.AdagradParameters(
                                    0.1))
  model_fn = _small_model_fn([a, b])
  # TF reserves 'batch_size' and 'context' (its own message); 'use_tpu' is
  # allowed (TPUEstimator overwrites it for model_fn).
  for key in ("batch_size", "context"):
    with pytest.raises(ValueError,
                       match="are reserved keys but existed in params"):
      TPUEstimator(model_fn=model_fn, params={key: 3}, use_tpu=False,
                   train_batch_size=4, embedding_config_spec=spec)
  TPUEstimator(model_fn=model_fn, params={"use_tpu": True}, use_tpu=False,
               train_batch_size=4, embedding_config_spec=spec)
  with pytest.raises(ValueError, match="train_batch_size"):
    TPUEstimator(model_fn=model_fn, use_tpu=False,
                 embedding_config_spec=spec)
  with pytest.raises(TypeError, match="EmbeddingConfigSpec"):
    TPUEstimator(model_fn=model_fn, use_tpu=False, train_batch_size=4,
                 embedding_config_spec={"a": 1})
  with pytest.raises(ValueError, match="export_to_cpu and export_to_tpu"):
    TPUEstimator(model_fn=model_fn, use_tpu=False, train_batch_size=4,
                 export_to_cpu=False, export_to_tpu=False)
  with pytest.raises(ValueError, match="train_batch_size"):
    TPUEstimator(model_fn=model_fn, use_tpu=False, train_batch_size=0)
  # A TPU named in the RunConfig: the arguments are checked before the
  # model is handed to TF's TPUEstimator (tests/test_interop_tensorflow.py).
  config = es.RunConfig(
      master="grpc://10.1.2.3:8470", model_dir=str(tmp_path / "m"))
  with pytest.raises(ValueError, match="are reserved keys"):
    TPUEstimator(model_fn=model_fn, config=config, use_tpu=True,
                 params={"context": True}, train_batch_size=4,
                 embedding_config_spec=spec)
  with pytest.raises(ValueError, match="train_batch_size"):
    TPUEstimator(model_fn=model_fn, config=config, use_tpu=True,
                 embedding_config_spec=spec)
  # The TPU topology must fit the batch: 16 cores cannot split 4 examples.
  config = es.RunConfig(
      tpu_config=es.TPUConfig(num_shards=16))
  with pytest.raises(ValueError, match="multiple of `num_cores`"):
    TPUEstimator(model_fn=model_fn, config=config, use_tpu=False,
                 train_batch_size=4, embedding_config_spec=spec)
  assert not os.path.exists(tmp_path / "m")


def test_use_tpu_true_without_a_tpu_runs_on_the_host(tmp_path):
  a, b = _small_columns()
  estimator = TPUEstimator(
      model_fn=_small_model_fn([a, b]), model_dir=str(tmp_path),
      use_tpu=True, train_batch_size=4,
      embedding_config_spec=es.EmbeddingConfigSpec(
          feature_columns=[a, b],
          optimization_parameters=es.AdagradParameters(0.1)))
  # Ours, not TF's TPUEstimator (interop.DelegatedTPUEstimator).
  assert type(estimator) is TPUEstimator and estimator.use_tpu is True
  estimator.train(_small_input_fn(), max_steps=2)
  reader = tf.train.load_checkpoint(str(tmp_path))
  assert reader.get_tensor("global_step") == 2
  assert reader.has_tensor("input_layer/a_embedding/embedding_weights/Adagrad")


def _on_tpu_estimator(model_dir, eval_on_tpu):
  a, b = _small_columns()
  return TPUEstimator(
      model_fn=_small_model_fn([a, b]), model_dir=str(model_dir),
      use_tpu=True, eval_on_tpu=eval_on_tpu, train_batch_size=4,
      eval_batch_size=4,
      embedding_config_spec=es.EmbeddingConfigSpec(
          feature_columns=[a, b],
          optimization_parameters=es.AdagradParameters(0.1)))


@pytest.mark.parametrize("steps", [None, 0, 1.5])
def test_evaluate_as_on_a_tpu_needs_a_number_of_batches(tmp_path, steps):
  # TF's TPUEstimator refuses these before evaluating on a TPU
  # (`_convert_eval_steps_to_hooks`); without a TPU it cannot get that far
  # here, so this states its rule rather than comparing with it.
  estimator = _on_tpu_estimator(tmp_path, eval_on_tpu=True)
  with pytest.raises(ValueError, match="steps` must be a positive int"):
    estimator.evaluate(_small_input_fn(), steps=steps)
  assert _nothing_written(tmp_path)
  # Evaluated on the CPU (eval_on_tpu=False): the whole input, as in TF.
  estimator = _on_tpu_estimator(tmp_path, eval_on_tpu=False)
  assert estimator.evaluate(_small_input_fn(), steps=None)["global_step"] == 0


def test_host_call_runs_every_step_and_plain_estimator_spec(tmp_path):
  """host_call's summaries are written each step; a plain EstimatorSpec is
  accepted as well."""
  a, b = _small_columns()
  calls = []

  def model_fn(features, labels, mode, params):
    del params
    x = tf.compat.v1.feature_column.input_layer(features, [a, b])
    logits = tf.compat.v1.layers.dense(x, 1)
    loss = tf.compat.v1.losses.mean_squared_error(labels, logits)
    step = tf.compat.v1.train.get_global_step()
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
        loss, step)
    if mode == es.estimator.ModeKeys.EVAL:
      return es.estimator.EstimatorSpec(mode, loss=loss)

    def host_call_fn(global_step, loss):
      calls.append(1)
      writer = tf.compat.v2.summary.create_file_writer(
          str(tmp_path / "host_call"))
      with writer.as_default(), tf.compat.v2.summary.record_if(True):
        return [tf.compat.v2.summary.scalar("host_loss", loss[0],
                                            step=global_step[0])]

    return TPUEstimatorSpec(
        mode, loss=loss, train_op=train_op,
        host_call=(host_call_fn, [tf.reshape(step, [1]),
                                  tf.reshape(loss, [1])]))

  estimator = _small_estimator(tmp_path / "model", model_fn, [a, b])
  estimator.train(_small_input_fn(examples=16), max_steps=3)
  assert calls == [1]
  events = list((tmp_path / "host_call").glob("events.*"))
  assert events
  steps = [
      e.step for path in events
      for e in tf.compat.v1.train.summary_iterator(str(path))
      if any(v.tag == "host_loss" for v in e.summary.value)
  ]
  assert sorted(steps) == [0, 1, 2]
  metrics = estimator.evaluate(_small_input_fn(), steps=1)
  assert "loss" in metrics


class _GraphProbe(tf.compat.v1.train.SessionRunHook):
  """Records the op names of the training graph."""

  def __init__(self):
    self.names = []

  def begin(self):
    self.names = [op.name for op in
                  tf.compat.v1.get_default_graph().get_operations()]


@pytest.mark.parametrize("wrap_cross_shard", [False, True])
def test_dense_backward_pass_runs_once(tmp_path, wrap_cross_shard):
  """The activation gradients come from the user's own optimizer call: the
  training graph has one backward pass (one `gradients` scope) and no
  CrossReplicaSum op."""
  a, b = _small_columns()
  probe = _GraphProbe()

  def model_fn(features, labels, mode, params):
    del params
    x = tf.compat.v1.feature_column.input_layer(features, [a, b])
    logits = tf.compat.v1.layers.dense(x, 1)
    loss = tf.compat.v1.losses.mean_squared_error(labels, logits)
    optimizer = tf.compat.v1.train.AdamOptimizer(0.1)
    if wrap_cross_shard:
      optimizer = tf.compat.v1.tpu.CrossShardOptimizer(optimizer)
    train_op = optimizer.minimize(loss, tf.compat.v1.train.get_global_step())
    return TPUEstimatorSpec(mode, loss=loss, train_op=train_op,
                            training_hooks=[probe])

  estimator = _small_estimator(tmp_path, model_fn, [a, b])
  estimator.train(_small_input_fn(), max_steps=2)
  scopes = {n.split("/")[0] for n in probe.names if n.startswith("gradients")}
  assert scopes == {"gradients"}, scopes
  assert not [n for n in probe.names if "CrossReplicaSum" in n]
  # The anchor the gradients pass through is neither saved nor trained.
  stored = tf.train.load_checkpoint(str(tmp_path)).get_variable_to_shape_map()
  assert not [n for n in stored if "anchor" in n]
  assert "input_layer/a_embedding/embedding_weights/Adagrad" in stored
  assert "input_layer/a_embedding/embedding_weights/Adam" not in stored


def test_scaffold_fn_and_prediction_hooks(tmp_path):
  a, b = _small_columns()
  initialized = []
  predicted = []

  class CountHook(tf.compat.v1.train.SessionRunHook):

    def after_run(self, run_context, run_values):
      predicted.append(1)

  def model_fn(features, labels, mode, params):
    del params
    x = tf.compat.v1.feature_column.input_layer(features, [a, b])
    logits = tf.compat.v1.layers.dense(x, 1)

    def scaffold_fn():
      return tf.compat.v1.train.Scaffold(
          init_fn=lambda scaffold, session: initialized.append(mode))

    if mode == es.estimator.ModeKeys.PREDICT:
      return TPUEstimatorSpec(mode, predictions={"logits": logits},
                              prediction_hooks=[CountHook()],
                              scaffold_fn=scaffold_fn)
    loss = tf.compat.v1.losses.mean_squared_error(labels, logits)
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
        loss, tf.compat.v1.train.get_global_step())
    return TPUEstimatorSpec(mode, loss=loss, train_op=train_op,
                            scaffold_fn=scaffold_fn)

  estimator = _small_estimator(tmp_path, model_fn, [a, b],
                               predict_batch_size=4)
  estimator.train(_small_input_fn(), max_steps=1)
  # A fresh start runs the scaffold's init_fn (a restore would not).
  assert initialized == [es.estimator.ModeKeys.TRAIN]
  outputs = list(estimator.predict(_small_input_fn(),
                                   yield_single_examples=False))
  assert len(outputs) == 2 and len(predicted) == 2
  # The scaffold keeps the user's fields and gets the layout-aware saver.
  assert outputs[0]["logits"].shape == (4, 1)
