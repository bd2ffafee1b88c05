"""End-to-end tests of the TPUEstimator drop-in on the host engine.

* Linear loss (activation gradients are known constants): the checkpointed
  tables and slots after several steps equal the NumPy twin of SEMANTICS.md,
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
  return tf.compat.v1.estimator.tpu.RunConfig(
      model_dir=str(model_dir),
      tpu_config=tf.compat.v1.estimator.tpu.TPUConfig(
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
