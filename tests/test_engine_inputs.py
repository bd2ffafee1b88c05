"""The host embedding engine's inputs, graph structure, errors and variables.

Graph mode throughout (one `tf.Graph` per test, a `tf.compat.v1.Session`).
Numbers are checked against the NumPy twin (`tests/numpy_twin.py`) or, for
the columns form of the spec, against a plain `DenseFeatures` lookup by the
same columns with the same table values.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import time

import numpy as np
import pytest
import tensorflow as tf

import estimator_spec as es
from estimator_spec.engine import HostEmbeddingEngine
from tests import numpy_twin as twin
from tests.ragged import sparse_value
import tpu_embedding_columns as tec

v1 = tf.compat.v1
fc = tf.feature_column
F32 = np.float32
RTOL, ATOL = 1e-5, 1e-6


def close(actual, desired, what=""):
  np.testing.assert_allclose(actual, desired, rtol=RTOL, atol=ATOL,
                             err_msg=what)


def named(*names):
  """A regex matching the quoted names in order (TF escapes the quotes of
  assertion messages as \\')."""
  return ".*".join(rf"\\?'{n}\\?'" for n in names)


def make_config(features, tables, optimizer="default", batch_size=2,
                mode=es.TRAIN, **spec_kwargs):
  if optimizer == "default":
    optimizer = es.AdagradParameters(0.1)
  spec = es.EmbeddingConfigSpec(
      feature_to_config_dict=features, table_to_config_dict=tables,
      optimization_parameters=optimizer, **spec_kwargs)
  return es.EmbeddingConfig(spec, batch_size=batch_size, mode=mode)


def init_session(sess):
  sess.run([v1.global_variables_initializer(),
            v1.local_variables_initializer(), v1.tables_initializer()])


def snapshot(sess, engine):
  """Every partition of every table and slot, by variable name."""
  variables = engine.variables()
  return dict(zip([v.name for v in variables], sess.run(variables)))


def assert_unchanged(before, after):
  assert sorted(before) == sorted(after)
  for name in before:
    np.testing.assert_array_equal(after[name], before[name], err_msg=name)


def twin_table_config(vocab, dim, combiner):
  return {"vocab": vocab, "dim": dim, "combiner": combiner, "optimizer": None,
          "learning_rate": None, "learning_rate_fn": None}


def ragged_to_sparse(rows, dtype):
  return tf.SparseTensor(*sparse_value(rows, dtype))


def ragged_to_dense(rows, dtype):
  width = max([1] + [len(row) for row in rows])
  out = np.zeros((len(rows), width), dtype)
  for b, row in enumerate(rows):
    out[b, :len(row)] = row
  return tf.constant(out)


def as_form(rows, form, dtype):
  if form == "sparse":
    return ragged_to_sparse(rows, dtype)
  if form == "ragged":
    return tf.ragged.constant(rows, dtype=tf.as_dtype(dtype),
                              row_splits_dtype=tf.int64)
  return ragged_to_dense(rows, dtype)


# ---------------------------------------------------------------------------
# Input forms.

# Ids are non-zero so that the dense form (non-zero entries are ids) can
# express them; weights are positive.
IDS = [[1, 3, 3], [], [2, 5]]
WEIGHTS = [[0.5, 2.0, 1.0], [], [1.5, 0.25]]
IDS_G = [[4], [4, 1, 9, 9], []]
FORM_CASES = [("sparse", "sparse"), ("ragged", "ragged"), ("dense", "sparse"),
              ("dense", "ragged")]


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("ids_form,weights_form", FORM_CASES,
                         ids=[f"{a}-{b}" for a, b in FORM_CASES])
def test_input_forms_lookup_and_train_like_the_twin(ids_form, weights_form,
                                                    combiner):
  vocab, dim = 10, 3
  config = make_config(
      {"f": es.FeatureConfig("t", weight_key="w"), "g": es.FeatureConfig("t")},
      {"t": es.TableConfig(vocab, dim, combiner=combiner)}, batch_size=3)
  rng = np.random.RandomState(0)
  initial = rng.randn(vocab, dim).astype(F32)
  grads = {"f": rng.randn(3, dim).astype(F32), "g": rng.randn(3, dim).astype(F32)}
  with tf.Graph().as_default():
    engine = HostEmbeddingEngine(config)
    features = {"f": as_form(IDS, ids_form, np.int64),
                "w": as_form(WEIGHTS, weights_form, np.float32),
                "g": as_form(IDS_G, ids_form, np.int32)}
    result = engine.lookup(features)
    train = engine.apply_gradients(result, grads, tf.constant(0, tf.int64))
    with v1.Session() as sess:
      init_session(sess)
      sess.run(engine.table_rows("t").assign_all(initial))
      activations = sess.run(result.activations)
      sess.run(train)
      table = sess.run(engine.table_rows("t").read_all())
      accumulator = sess.run(engine.slot_rows("t")["accumulator"].read_all())
  twin_config = {
      "tables": {"t": twin_table_config(vocab, dim, combiner)},
      "features": {"f": {"table": "t", "max_sequence_length": 0,
                         "weight_key": "w"},
                   "g": {"table": "t", "max_sequence_length": 0,
                         "weight_key": None}},
      "optimizer": es.AdagradParameters(0.1), "clipping_limit": None,
      "gradient_multiplier_fn": None,
  }
  batch = {"f": (IDS, WEIGHTS), "g": (IDS_G, None)}
  state = twin.init_state(twin_config, {"t": initial})
  expected = twin.forward(state, twin_config, batch)
  for name in ("f", "g"):
    close(activations[name], expected[name], name)
  final = twin.backward(state, twin_config, batch, grads, 0)
  close(table, final["t"]["table"])
  close(accumulator, final["t"]["slots"]["accumulator"])


@pytest.mark.parametrize("columns_form", [False, True])
@pytest.mark.parametrize("ids_form", ["sparse", "dense"])
def test_dense_weights_are_refused_when_the_graph_is_built(ids_form,
                                                          columns_form):
  # As on a TPU (TF's input path refuses dense weights with this message).
  if columns_form:
    column = tec.embedding_column(
        fc.weighted_categorical_column(
            fc.categorical_column_with_identity("f", 10), "w"), 3)
    spec = es.EmbeddingConfigSpec(
        feature_columns=[column],
        optimization_parameters=es.AdagradParameters(0.1))
    config = es.EmbeddingConfig(spec, batch_size=3)
  else:
    config = make_config({"f": es.FeatureConfig("t", weight_key="w")},
                         {"t": es.TableConfig(10, 3)}, batch_size=3)
  with tf.Graph().as_default() as graph:
    engine = HostEmbeddingEngine(config)
    features = {"f": as_form(IDS, ids_form, np.int64),
                "w": as_form(WEIGHTS, "dense", np.float32)}
    before = len(graph.get_operations())
    with pytest.raises(ValueError,
                       match="Dense weights are not supported on TPU"):
      engine.lookup(features)
    ops = graph.get_operations()[before:]
    assert not [op for op in ops if op.type == "VarHandleOp"]


@pytest.mark.parametrize("weights_dtype", [np.int32, np.int64, np.float64])
def test_integer_and_double_weights_are_taken_as_float32(weights_dtype):
  config = make_config({"f": es.FeatureConfig("t", weight_key="w")},
                       {"t": es.TableConfig(10, 2, combiner="sum")},
                       batch_size=3)
  int_weights = [[1, 2, 3], [], [4, 1]]
  initial = np.arange(20, dtype=F32).reshape(10, 2)
  with tf.Graph().as_default():
    engine = HostEmbeddingEngine(config)
    result = engine.lookup({"f": ragged_to_sparse(IDS, np.int64),
                            "w": ragged_to_sparse(int_weights,
                                                  weights_dtype)})
    with v1.Session() as sess:
      init_session(sess)
      sess.run(engine.table_rows("t").assign_all(initial))
      activation = sess.run(result.activations["f"])
  expected = np.stack([
      sum((w * initial[i] for i, w in zip(ids, ws)), np.zeros(2, F32))
      for ids, ws in zip(IDS, int_weights)])
  close(activation, expected)


@pytest.mark.parametrize("form", ["dense_rank1", "sparse"])
def test_combiner_none_activation_is_the_row(form):
  vocab, dim = 10, 2
  ids = [4, 0, 7, 4]
  config = make_config({"f": es.FeatureConfig("t")},
                       {"t": es.TableConfig(vocab, dim, combiner=None)},
                       optimizer=es.StochasticGradientDescentParameters(0.5),
                       batch_size=4)
  initial = np.arange(vocab * dim, dtype=F32).reshape(vocab, dim)
  grads = np.arange(8, dtype=F32).reshape(4, dim) / 8
  with tf.Graph().as_default():
    engine = HostEmbeddingEngine(config)
    if form == "dense_rank1":
      features = {"f": tf.constant(ids, tf.int64)}
    else:
      features = {"f": ragged_to_sparse([[i] for i in ids], np.int64)}
    result = engine.lookup(features)
    assert result.activations["f"].shape.as_list()[1:] == [dim]
    train = engine.apply_gradients(result, {"f": grads}, 0)
    with v1.Session() as sess:
      init_session(sess)
      sess.run(engine.table_rows("t").assign_all(initial))
      activation = sess.run(result.activations["f"])
      sess.run(train)
      table = sess.run(engine.table_rows("t").read_all())
  np.testing.assert_array_equal(activation, initial[ids])
  expected = initial.copy()
  for b, i in enumerate(ids):  # duplicate id 4: gradients summed
    expected[i] -= F32(0.5) * grads[b]
  close(table, expected)


def test_combiner_none_dense_ids_refuse_weights():
  config = make_config({"f": es.FeatureConfig("t", weight_key="w")},
                       {"t": es.TableConfig(10, 2, combiner=None)})
  with tf.Graph().as_default():
    engine = HostEmbeddingEngine(config)
    with pytest.raises(ValueError, match=r"'f'.*'t'.*weight"):
      engine.lookup({"f": tf.constant([1, 2], tf.int64),
                     "w": tf.constant([1.0, 2.0])})


def test_combiner_none_with_two_ids_fails_the_training_step():
  # Regression: the one-id check once guarded only the activations, so a
  # train op whose gradients do not read them trained silently.
  config = make_config({"f": es.FeatureConfig("t")},
                       {"t": es.TableConfig(10, 2, combiner=None)})
  with tf.Graph().as_default():
    engine = HostEmbeddingEngine(config)
    result = engine.lookup(
        {"f": tf.SparseTensor([[0, 0], [0, 1], [1, 0]],
                              tf.constant([1, 2, 3], tf.int64), [2, 2])})
    train = engine.apply_gradients(result, {"f": tf.ones([2, 2])}, 0)
    with v1.Session() as sess:
      init_session(sess)
      before = snapshot(sess, engine)
      try:
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=named("f", "t") + ".*one id"):
          sess.run(train)
      finally:
        assert_unchanged(before, snapshot(sess, engine))


# ---------------------------------------------------------------------------
# The columns form of the spec: raw inputs, compared with DenseFeatures.


def _vocab(key, words):
  return fc.categorical_column_with_vocabulary_list(key, words)


WORDS = ["apple", "pear", "plum", "fig", "kiwi", "lime"]


def _columns():
  p_col, q_col = tec.shared_embedding_columns(
      [_vocab("p", WORDS), _vocab("q", WORDS)], 3, combiner="sum")
  return [
      tec.embedding_column(_vocab("s", WORDS), 3, combiner="mean"),
      tec.embedding_column(fc.categorical_column_with_hash_bucket("h", 7), 2,
                           combiner="sum"),
      tec.embedding_column(
          fc.weighted_categorical_column(_vocab("c", WORDS), "c_w"), 4,
          combiner="sqrtn"),
      p_col, q_col,
  ]


def _raw_features():
  return {
      # Dense string tensors: '' is "no value"; 'durian' is out of vocabulary
      # (id -1, dropped by the safe lookup).
      "s": tf.constant([["apple", "plum", "plum"], ["durian", "", ""],
                        ["fig", "", ""]]),
      "h": tf.SparseTensor([[0, 0], [0, 1], [2, 0]],
                           tf.constant(["x", "yy", "zzz"]), [3, 2]),
      "c": tf.SparseTensor([[0, 0], [1, 0], [1, 1], [2, 0]],
                           tf.constant(["kiwi", "lime", "kiwi", "pear"]),
                           [3, 2]),
      "c_w": tf.SparseTensor([[0, 0], [1, 0], [1, 1], [2, 0]],
                             tf.constant([2.0, 0.5, 1.5, 3.0]), [3, 2]),
      "p": ragged_to_sparse([["pear"], ["pear", "apple"], []], np.str_),
      "q": tf.SparseTensor([[0, 0], [2, 0], [2, 1]],
                           tf.constant(["lime", "pear", "pear"]), [3, 2]),
  }


def _dense_features_reference(columns):
  """(outputs per feature key, variable values by name) of plain lookups."""
  with tf.Graph().as_default():
    features = _raw_features()
    outputs = {
        c.feature_key: tf.keras.layers.DenseFeatures([c])(features)
        for c in columns
    }
    with v1.Session() as sess:
      init_session(sess)
      values = {v.name[:-2]: v for v in v1.global_variables()}
      return sess.run(outputs), sess.run(values)


def _reference_value(variable_values, embedding_var_name):
  matches = [
      value for name, value in variable_values.items()
      if name == embedding_var_name or
      name.endswith(f"/{embedding_var_name}_embedding/embedding_weights")
  ]
  assert len(matches) == 1, (embedding_var_name, sorted(variable_values))
  return matches[0]


# Oracle: TF 2.15's Keras 2 feature-column layers (DenseFeatures,
# SequenceFeatures), which Keras 3 no longer has.
@pytest.mark.tf215
def test_columns_form_activations_equal_dense_features():
  columns = _columns()
  expected, variable_values = _dense_features_reference(columns)
  spec = es.EmbeddingConfigSpec(
      feature_columns=columns,
      optimization_parameters=es.AdagradParameters(0.1))
  config = es.EmbeddingConfig(spec, batch_size=3)
  assert sorted(config.model.tables) == [
      "tbl_c_weighted_by_c_w", "tbl_h", "tbl_p_q_shared_embedding", "tbl_s"]
  with tf.Graph().as_default():
    engine = HostEmbeddingEngine(config)
    features = _raw_features()
    # The engine also takes RaggedTensors (DenseFeatures does not).
    features["p"] = tf.ragged.constant([["pear"], ["pear", "apple"], []])
    result = engine.lookup(features)
    # Without `variable_names`, the engine names tables by embedding_var_name.
    assert sorted(v.name for v in engine.variables()
                  if "Adagrad" not in v.name) == [
                      "c_weighted_by_c_w/part_0:0", "h/part_0:0",
                      "p_q_shared_embedding/part_0:0", "s/part_0:0"]
    assigns = [
        engine.table_rows(name).assign_all(
            _reference_value(variable_values, table.embedding_var_name))
        for name, table in config.model.tables.items()
    ]
    with v1.Session() as sess:
      init_session(sess)
      sess.run(assigns)
      activations = sess.run(result.activations)
  assert sorted(activations) == sorted(expected)
  for key, value in expected.items():
    close(activations[key], value, key)
  # An independent check of two of them: 's' (mean; 'durian' dropped) and
  # 'p' (sum over the shared table).
  s_table = _reference_value(variable_values, "s")
  close(activations["s"][0], (s_table[0] + 2 * s_table[2]) / 3)
  np.testing.assert_array_equal(activations["s"][1], np.zeros(3))
  shared = _reference_value(variable_values, "p_q_shared_embedding")
  close(activations["p"][1], shared[1] + shared[0])


# Oracle: TF 2.15's Keras 2 feature-column layers (DenseFeatures,
# SequenceFeatures), which Keras 3 no longer has.
@pytest.mark.tf215
def test_columns_form_sequence_column_equals_sequence_features():
  column = tec.embedding_column(
      fc.sequence_categorical_column_with_identity("q", 10), 2,
      max_sequence_length=3)

  def features():
    return {"q": tf.SparseTensor([[0, 0], [0, 1], [0, 2], [0, 3], [2, 0]],
                                 tf.constant([1, 2, 3, 4, 5], tf.int64),
                                 [3, 4])}

  with tf.Graph().as_default():
    out, lengths = tf.keras.experimental.SequenceFeatures([column])(features())
    with v1.Session() as sess:
      init_session(sess)
      expected, expected_lengths, table = sess.run(
          [out, lengths, v1.global_variables()[0]])
  spec = es.EmbeddingConfigSpec(
      feature_columns=[column],
      optimization_parameters=es.AdagradParameters(0.1))
  config = es.EmbeddingConfig(spec, batch_size=3)
  with tf.Graph().as_default():
    engine = HostEmbeddingEngine(config)
    result = engine.lookup(features())
    with v1.Session() as sess:
      init_session(sess)
      sess.run(engine.table_rows("tbl_q").assign_all(table))
      activation, length = sess.run(
          [result.activations["q"], result.length_features["q_seq_length_"]])
  close(activation, expected)
  np.testing.assert_array_equal(length, expected_lengths)
  np.testing.assert_array_equal(length, [3, 0, 1])


# Oracle: TF 2.15's Keras 2 feature-column layers (DenseFeatures,
# SequenceFeatures), which Keras 3 no longer has.
@pytest.mark.tf215
@pytest.mark.parametrize("kind", ["crossed", "bucketized"])
def test_columns_form_crossed_and_bucketized_take_raw_inputs(kind):
  # Regression: the engine once required features['a_X_b'] /
  # features['x_bucketized'] instead of the columns' raw keys.
  if kind == "crossed":
    column = tec.embedding_column(
        fc.crossed_column(["a", "b"], hash_bucket_size=7), 3)

    def features():
      return {"a": tf.constant([["x"], ["y"]]), "b": tf.constant([["p"],
                                                                 ["q"]])}
  else:
    column = tec.embedding_column(
        fc.bucketized_column(fc.numeric_column("x"), [0.0, 1.0]), 3)

    def features():
      return {"x": tf.constant([[0.5], [2.0]])}

  with tf.Graph().as_default():
    out = tf.keras.layers.DenseFeatures([column])(features())
    with v1.Session() as sess:
      init_session(sess)
      expected, table = sess.run([out, v1.global_variables()[0]])
  spec = es.EmbeddingConfigSpec(
      feature_columns=[column],
      optimization_parameters=es.AdagradParameters(0.1))
  config = es.EmbeddingConfig(spec, batch_size=2)
  with tf.Graph().as_default():
    engine = HostEmbeddingEngine(config)
    result = engine.lookup(features())
    (name,) = engine.created_tables()
    with v1.Session() as sess:
      init_session(sess)
      sess.run(engine.table_rows(name).assign_all(table))
      activations = sess.run(result.activations)
  close(list(activations.values())[0], expected)


@pytest.mark.parametrize("safe", [True, False])
def test_negative_ids_from_columns(safe):
  # Out-of-vocabulary strings become id -1: dropped when
  # use_safe_embedding_lookup=True, refused when False.
  column = tec.embedding_column(_vocab("s", WORDS), 2, combiner="sum",
                                use_safe_embedding_lookup=safe)
  spec = es.EmbeddingConfigSpec(
      feature_columns=[column],
      optimization_parameters=es.AdagradParameters(0.1))
  config = es.EmbeddingConfig(spec, batch_size=2)
  initial = np.arange(12, dtype=F32).reshape(6, 2) / 10
  grads = np.array([[1.0, -2.0], [0.5, 0.25]], F32)
  with tf.Graph().as_default():
    engine = HostEmbeddingEngine(config)
    result = engine.lookup({"s": tf.constant([["pear", "durian", "pear"],
                                              ["cherry", "fig", ""]])})
    train = engine.apply_gradients(result, {"s": grads}, 0)
    with v1.Session() as sess:
      init_session(sess)
      sess.run(engine.table_rows("tbl_s").assign_all(initial))
      before = snapshot(sess, engine)
      if not safe:
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=named("s", "tbl_s") + ".*negative"):
          sess.run([result.activations, train])
        assert_unchanged(before, snapshot(sess, engine))
        return
      activations, _ = sess.run([result.activations, train])
      table = sess.run(engine.table_rows("tbl_s").read_all())
      accumulator = sess.run(engine.slot_rows("tbl_s")["accumulator"].read_all())
  # The twin without the negative ids: pear=1, pear=1 / fig=3.
  twin_config = {
      "tables": {"tbl_s": twin_table_config(6, 2, "sum")},
      "features": {"s": {"table": "tbl_s", "max_sequence_length": 0,
                         "weight_key": None}},
      "optimizer": es.AdagradParameters(0.1), "clipping_limit": None,
      "gradient_multiplier_fn": None,
  }
  batch = {"s": ([[1, 1], [3]], None)}
  state = twin.init_state(twin_config, {"tbl_s": initial})
  close(activations["s"], twin.forward(state, twin_config, batch)["s"])
  final = twin.backward(state, twin_config, batch, {"s": grads}, 0)
  close(table, final["tbl_s"]["table"])
  close(accumulator, final["tbl_s"]["slots"]["accumulator"])


# ---------------------------------------------------------------------------
# Sequence features.


@pytest.mark.parametrize("form", ["sparse", "ragged"])
def test_sequence_features_pad_truncate_and_report_lengths(form):
  L, dim = 3, 2
  config = make_config(
      {"f": es.FeatureConfig("t", max_sequence_length=L),
       "g": es.FeatureConfig("t")},
      {"t": es.TableConfig(10, dim, combiner="mean")}, batch_size=3)
  ids = [[1, 2, 3, 4, 5], [], [6]]
  initial = np.arange(20, dtype=F32).reshape(10, dim) + 1
  with tf.Graph().as_default():
    engine = HostEmbeddingEngine(config)
    result = engine.lookup({"f": as_form(ids, form, np.int64),
                            "g": as_form([[1], [2], [3]], form, np.int64)})
    assert result.activations["f"].shape.as_list()[1:] == [L, dim]
    assert result.activations["g"].shape.as_list()[1:] == [dim]
    assert sorted(result.sequence_lengths) == ["f"]
    assert sorted(result.length_features) == ["f_seq_length_"]
    with v1.Session() as sess:
      init_session(sess)
      sess.run(engine.table_rows("t").assign_all(initial))
      activation, lengths, length_feature = sess.run([
          result.activations["f"], result.sequence_lengths["f"],
          result.length_features["f_seq_length_"]
      ])
  expected = np.zeros((3, L, dim), F32)
  expected[0] = initial[[1, 2, 3]]  # truncated after L ids
  expected[2, 0] = initial[6]  # zero padding after the sequence
  np.testing.assert_array_equal(activation, expected)
  np.testing.assert_array_equal(lengths, [3, 0, 1])
  np.testing.assert_array_equal(length_feature, [3, 0, 1])


def test_sequence_feature_training_skips_truncated_ids():
  # Ids past L get no gradient: with SGD, id 9 (only at position 3) keeps
  # its row.
  config = make_config({"f": es.FeatureConfig("t", max_sequence_length=2)},
                       {"t": es.TableConfig(10, 1, combiner="sum")},
                       optimizer=es.StochasticGradientDescentParameters(1.0),
                       batch_size=1)
  with tf.Graph().as_default():
    engine = HostEmbeddingEngine(config)
    result = engine.lookup({"f": ragged_to_sparse([[1, 2, 9]], np.int64)})
    train = engine.apply_gradients(
        result, {"f": tf.constant([[[1.0], [2.0]]])}, 0)
    with v1.Session() as sess:
      init_session(sess)
      sess.run(engine.table_rows("t").assign_all(np.zeros((10, 1), F32)))
      sess.run(train)
      table = sess.run(engine.table_rows("t").read_all())[:, 0]
  expected = np.zeros(10, F32)
  expected[1], expected[2] = -1.0, -2.0
  np.testing.assert_array_equal(table, expected)


@pytest.mark.parametrize("safe", [True, False])
def test_negative_sequence_ids_drop_whatever_use_safe_embedding_lookup(safe):
  # TF's CPU path looks sequence ids up with its safe lookup whatever the
  # flag; the engine drops them too (the column's own lookup: see
  # test_conformance_columns.py::
  # test_use_safe_embedding_lookup_negative_ids_as_tensorflow_cpu).
  column = tec.embedding_column(
      fc.sequence_categorical_column_with_identity("f", 10), 1,
      combiner="sum", max_sequence_length=3, use_safe_embedding_lookup=safe)
  config = es.EmbeddingConfig(es.EmbeddingConfigSpec(
      feature_columns=[column],
      optimization_parameters=es.StochasticGradientDescentParameters(1.0)),
                              batch_size=2)
  with tf.Graph().as_default():
    engine = HostEmbeddingEngine(config)
    result = engine.lookup({"f": ragged_to_sparse([[1, -1, 2], [-3, 4]],
                                                  np.int64)})
    with v1.Session() as sess:
      init_session(sess)
      sess.run(engine.table_rows("tbl_f").assign_all(
          np.arange(10, dtype=F32)[:, None] + 1))
      activation = sess.run(result.activations["f"])
  np.testing.assert_array_equal(activation[:, :, 0], [[2, 0, 3], [0, 5, 0]])


@pytest.mark.parametrize("columns_form", [False, True])
def test_ids_past_the_sequence_length_are_dropped_before_any_check(
    columns_form):
  # As on a TPU: id 99 (out of range) and -5 (negative, refused with an
  # unsafe lookup) sit past max_sequence_length=2, so they are never looked
  # up and never checked.
  if columns_form:
    column = tec.embedding_column(
        fc.sequence_categorical_column_with_identity("f", 10), 1,
        combiner="sum", max_sequence_length=2, use_safe_embedding_lookup=False)
    config = es.EmbeddingConfig(es.EmbeddingConfigSpec(
        feature_columns=[column],
        optimization_parameters=es.StochasticGradientDescentParameters(1.0)),
                                batch_size=2)
    table_name = "tbl_f"
  else:
    config = make_config({"f": es.FeatureConfig("t", max_sequence_length=2)},
                         {"t": es.TableConfig(10, 1, combiner="sum")},
                         optimizer=es.StochasticGradientDescentParameters(1.0))
    table_name = "t"
  with tf.Graph().as_default():
    engine = HostEmbeddingEngine(config)
    result = engine.lookup({"f": ragged_to_sparse([[1, 2, 99], [3, 4, 5, -5]],
                                                  np.int64)})
    train = engine.apply_gradients(
        result, {"f": tf.ones([2, 2, 1])}, 0)
    with v1.Session() as sess:
      init_session(sess)
      sess.run(engine.table_rows(table_name).assign_all(
          np.arange(10, dtype=F32)[:, None]))
      activation, lengths, _ = sess.run(
          [result.activations["f"], result.sequence_lengths["f"], train])
      table = sess.run(engine.table_rows(table_name).read_all())[:, 0]
  np.testing.assert_array_equal(activation[:, :, 0], [[1, 2], [3, 4]])
  np.testing.assert_array_equal(lengths, [2, 2])
  expected = np.arange(10, dtype=F32)
  expected[[1, 2, 3, 4]] -= 1.0
  np.testing.assert_array_equal(table, expected)


@pytest.mark.parametrize("columns_form", [False, True])
def test_indices_outside_the_dense_shape_are_refused(columns_form):
  # Regression: a sequence feature's ids at positions past dense_shape[1]
  # once spilled into the next example's slots.
  if columns_form:
    column = tec.embedding_column(
        fc.sequence_categorical_column_with_identity("f", 10), 1,
        combiner="sum", max_sequence_length=4)
    config = es.EmbeddingConfig(es.EmbeddingConfigSpec(
        feature_columns=[column],
        optimization_parameters=es.AdagradParameters(0.1)), batch_size=2)
  else:
    config = make_config({"f": es.FeatureConfig("t", max_sequence_length=4)},
                         {"t": es.TableConfig(10, 1, combiner="sum")})
  with tf.Graph().as_default():
    engine = HostEmbeddingEngine(config)
    ids = v1.sparse_placeholder(tf.int64, [None, None])
    result = engine.lookup({"f": ids})
    train = engine.apply_gradients(result, {"f": tf.ones([2, 4, 1])}, 0)
    with v1.Session() as sess:
      init_session(sess)
      before = snapshot(sess, engine)
      bad = v1.SparseTensorValue([[0, 0], [0, 3], [1, 0]], [1, 2, 3], [2, 2])
      with pytest.raises(tf.errors.InvalidArgumentError,
                         match=r"Feature .*f.* out of bounds of its "
                         r"dense_shape"):
        sess.run([result.activations, train], {ids: bad})
      assert_unchanged(before, snapshot(sess, engine))


def test_weights_at_other_positions_are_refused_in_the_columns_form():
  column = tec.embedding_column(
      fc.weighted_categorical_column(
          fc.categorical_column_with_identity("f", 10), "w"), 2,
      combiner="sum")
  config = es.EmbeddingConfig(es.EmbeddingConfigSpec(
      feature_columns=[column],
      optimization_parameters=es.AdagradParameters(0.1)), batch_size=2)
  with tf.Graph().as_default():
    engine = HostEmbeddingEngine(config)
    ids = v1.sparse_placeholder(tf.int64, [None, None])
    weights = v1.sparse_placeholder(tf.float32, [None, None])
    result = engine.lookup({"f": ids, "w": weights})
    train = engine.apply_gradients(result, {"f": tf.ones([2, 2])}, 0)
    with v1.Session() as sess:
      init_session(sess)
      before = snapshot(sess, engine)
      good = v1.SparseTensorValue([[0, 0], [0, 1], [1, 0]], [1, 2, 3], [2, 2])
      shifted = v1.SparseTensorValue([[0, 0], [1, 0], [1, 1]],
                                     [0.5, 1.5, 2.0], [2, 2])
      with pytest.raises(tf.errors.InvalidArgumentError,
                         match=r"Feature .*f.* other positions"):
        sess.run([result.activations, train], {ids: good, weights: shifted})
      assert_unchanged(before, snapshot(sess, engine))


@pytest.mark.parametrize("columns_form", [False, True])
def test_dense_ids_are_their_non_zero_entries_as_on_a_tpu(columns_form):
  # TF's TPU input path takes the non-zero entries of a dense id tensor as
  # the ids (TF's CPU path would drop -1 and keep 0): id 0 in a dense input
  # is padding, -1 a negative id (dropped by the safe lookup). The infeed
  # reads the same ids (same parser).
  if columns_form:
    column = tec.embedding_column(
        fc.categorical_column_with_identity("f", 10), 1, combiner="sum")
    config = es.EmbeddingConfig(es.EmbeddingConfigSpec(
        feature_columns=[column],
        optimization_parameters=es.AdagradParameters(0.1)), batch_size=2)
    table_name = "tbl_f"
  else:
    config = make_config({"f": es.FeatureConfig("t")},
                         {"t": es.TableConfig(10, 1, combiner="sum")})
    table_name = "t"
  dense = np.array([[0, 3, -1], [2, 0, 0]], np.int64)
  with tf.Graph().as_default():
    engine = HostEmbeddingEngine(config)
    result = engine.lookup({"f": tf.constant(dense)})
    _, _, per_core = config.split_inputs({"f": tf.constant(dense)})
    with v1.Session() as sess:
      init_session(sess)
      sess.run(engine.table_rows(table_name).assign_all(
          np.arange(10, dtype=F32)[:, None] + 1))
      activation, enqueued = sess.run(
          [result.activations["f"], per_core[0]["f"].embedding_indices])
  np.testing.assert_array_equal(activation[:, 0], [4.0, 3.0])
  np.testing.assert_array_equal(enqueued, [3, -1, 2])


@pytest.mark.parametrize("what", ["learning_rate_fn", "multiplier"])
def test_non_finite_learning_rate_or_multiplier_changes_nothing(what):
  bad = lambda step: tf.where(step > 0, np.float32(np.inf), np.float32(0.1))
  config = make_config(
      {"f": es.FeatureConfig("t")},
      {"t": es.TableConfig(10, 2, learning_rate_fn=(
          bad if what == "learning_rate_fn" else None))},
      experimental_gradient_multiplier_fn=(
          bad if what == "multiplier" else None))
  with tf.Graph().as_default():
    engine = HostEmbeddingEngine(config)
    step = v1.placeholder(tf.int64, [])
    result = engine.lookup({"f": ragged_to_sparse([[1, 2], [3]], np.int64)})
    train = engine.apply_gradients(result, {"f": tf.ones([2, 2])}, step)
    with v1.Session() as sess:
      init_session(sess)
      sess.run(train, {step: 0})
      before = snapshot(sess, engine)
      words = ("learning_rate_fn of table .*t" if what == "learning_rate_fn"
               else "experimental_gradient_multiplier_fn")
      with pytest.raises(tf.errors.InvalidArgumentError,
                         match=words + ".* not finite"):
        sess.run(train, {step: 1})
      assert_unchanged(before, snapshot(sess, engine))


# ---------------------------------------------------------------------------
# Graph structure.


def _op_types(graph, ops=None):
  ops = graph.get_operations() if ops is None else ops
  return [op.type for op in ops]


@pytest.mark.parametrize("num_shards", [1, 3])
def test_one_gather_per_table_partition(num_shards):
  config = make_config(
      {"a1": es.FeatureConfig("ta"), "a2": es.FeatureConfig("ta", weight_key="w"),
       "a3": es.FeatureConfig("ta", max_sequence_length=2),
       "b1": es.FeatureConfig("tb"), "b2": es.FeatureConfig("tb")},
      {"ta": es.TableConfig(20, 3), "tb": es.TableConfig(30, 2,
                                                         combiner="sum")})
  with tf.Graph().as_default() as graph:
    engine = HostEmbeddingEngine(config, num_shards=num_shards)
    engine.create_variables()
    before = set(graph.get_operations())
    ids = ragged_to_sparse([[1, 2], [3]], np.int64)
    engine.lookup({"a1": ids, "a2": ids, "a3": ids, "b1": ids, "b2": ids,
                   "w": ragged_to_sparse([[1.0, 2.0], [3.0]], np.float32)})
    new_ops = [op for op in graph.get_operations() if op not in before]
    # The table's rows: TF's gather, or the engine's compiled one (with the
    # distinct ids and the combine, for a table in one partition).
    gathers = [op for op in new_ops
               if op.type in ("ResourceGather", "HostEmbeddingGatherRows",
                              "HostEmbeddingLookup")]
  # One gather per table (per partition of the table when sharded).
  assert len(gathers) == 2 * num_shards, [op.name for op in gathers]


def _shapes_with(ops, size):
  found = []
  for op in ops:
    for out in op.outputs:
      dims = out.shape.as_list() if out.shape.rank is not None else []
      if size in dims:
        found.append(f"{op.type} {op.name} {out.shape}")
  return found


def _default_optimizer(cls):
  extra = {"AdagradMomentumParameters": dict(momentum=0.9),
           "MomentumParameters": dict(momentum=0.9),
           "RMSPropParameters": dict(rho=0.9, momentum=0.5, epsilon=1e-6)}
  return cls(learning_rate=0.1, **extra.get(cls.__name__, {}))


BIG_CASES = [(_default_optimizer(c), False) for c in es.ALL_OPTIMIZERS]
BIG_CASES += [(es.AdamParameters(0.1, lazy_adam=False), True)]


@pytest.mark.parametrize("optimizer,dense", BIG_CASES,
                         ids=[type(o).__name__ + ("_nonlazy" if d else "")
                              for o, d in BIG_CASES])
def test_update_cost_grows_with_distinct_ids_not_vocabulary(optimizer, dense):
  vocab, dim = 1_000_000, 4
  config = make_config(
      {"f": es.FeatureConfig("t"), "g": es.FeatureConfig("t", weight_key="w")},
      {"t": es.TableConfig(
          vocab, dim, combiner="sqrtn",
          initializer=tf.compat.v1.zeros_initializer())},
      optimizer=optimizer.__class__(**{
          **optimizer.get_config(), "clip_weight_min": -5.0,
          "clip_gradient_max": 3.0, "weight_decay_factor": 0.01}),
      clipping_limit=2.0)
  ids = [[5, 999_999, 17], [123_456, 5, 42]]
  g_ids = [[7, 8], [9, 10, 999_999]]
  with tf.Graph().as_default() as graph:
    engine = HostEmbeddingEngine(config, num_shards=2)
    engine.create_variables()
    start = set(graph.get_operations())
    result = engine.lookup({
        "f": ragged_to_sparse(ids, np.int64),
        "g": ragged_to_sparse(g_ids, np.int64),
        "w": ragged_to_sparse([[1.0, 2.0], [0.5, 1.0, 1.0]], np.float32)})
    after_lookup = set(graph.get_operations())
    train = engine.apply_gradients(
        result, {"f": tf.ones([2, dim]), "g": -tf.ones([2, dim])},
        tf.constant(0, tf.int64))
    lookup_ops = [op for op in after_lookup if op not in start]
    update_ops = [op for op in graph.get_operations()
                  if op not in after_lookup]
    assert not _shapes_with(lookup_ops, vocab)
    found = _shapes_with(update_ops, vocab)
    if dense:
      assert found  # non-lazy Adam reads and writes every row
    else:
      assert not found, found
    with v1.Session() as sess:
      init_session(sess)
      start_time = time.time()
      sess.run(train)
      del start_time  # no timing assertion; graph inspection above
      table = sess.run(engine.table_rows("t").read_all())
  touched = sorted({i for row in ids + g_ids for i in row})
  assert np.count_nonzero(np.any(table != 0, axis=1)) <= len(touched)
  assert np.all(np.any(table[touched] != 0, axis=1))


# ---------------------------------------------------------------------------
# Bad input: the error, and no variable changed by the failed step.

GOOD_IDS = [[1, 2], [3]]
GOOD_W = [[0.5, 1.5], [2.0]]


def _bad_input_config(optimizer=None, **kw):
  return make_config(
      {"clicks": es.FeatureConfig("items", weight_key="clicks_w"),
       "views": es.FeatureConfig("items"),
       "query": es.FeatureConfig("words", max_sequence_length=2)},
      {"items": es.TableConfig(10, 3, combiner="mean"),
       "words": es.TableConfig(6, 2, combiner="sum")},
      optimizer=optimizer or es.FtrlParameters(0.1), **kw)


def _placeholders():
  return {
      "clicks": v1.sparse_placeholder(tf.int64, [None, None]),
      "clicks_w": v1.sparse_placeholder(tf.float32, [None, None]),
      "views": v1.sparse_placeholder(tf.int64, [None, None]),
      "query": v1.sparse_placeholder(tf.int64, [None, None]),
  }


def _sparse_value(rows, dtype, indices=None, dense_shape=None):
  if indices is None:
    indices = [[b, p] for b, row in enumerate(rows) for p in range(len(row))]
  values = [x for row in rows for x in row]
  width = max([1] + [len(row) for row in rows])
  return v1.SparseTensorValue(
      np.array(indices, np.int64).reshape(-1, 2), np.array(values, dtype),
      np.array(dense_shape or [len(rows), width], np.int64))


def _good_feed(ph, **overrides):
  values = {
      "clicks": _sparse_value(GOOD_IDS, np.int64),
      "clicks_w": _sparse_value(GOOD_W, np.float32),
      "views": _sparse_value([[4], [4, 5]], np.int64),
      "query": _sparse_value([[1, 2, 3], [5]], np.int64),
  }
  values.update(overrides)
  return {ph[k]: v for k, v in values.items() if k in ph}


def _grads(dim_items=3, dim_words=2, bad=None):
  grads = {"clicks": tf.fill([2, dim_items], 0.5),
           "views": tf.fill([2, dim_items], -0.25),
           "query": tf.fill([2, 2, dim_words], 0.75)}
  if bad is not None:
    grads[bad[0]] = tf.fill(tf.shape(grads[bad[0]]), bad[1])
  return grads


def _slow(x):
  time.sleep(1.0)
  return x


def _slowed(sparse, dtype):
  """The same SparseTensor, with values that arrive late (a slow input)."""
  values = tf.numpy_function(_slow, [sparse.values], dtype)
  values.set_shape(sparse.values.shape)
  return tf.SparseTensor(sparse.indices, values, sparse.dense_shape)


@pytest.mark.parametrize("case,tables", [
    ("id_too_large", "one_table"),
    ("id_too_large", "two_tables"),
    ("weights_count_differs", "one_table"),
    ("weights_count_differs", "two_tables"),
    ("batch_sizes_differ_at_run_time", "one_table"),
    ("batch_sizes_differ_at_run_time", "two_tables"),
])
def test_run_time_input_errors_change_nothing(case, tables):
  config = _bad_input_config()
  if tables == "one_table":
    config = make_config(
        {"clicks": es.FeatureConfig("items", weight_key="clicks_w"),
         "views": es.FeatureConfig("items")},
        {"items": es.TableConfig(10, 3, combiner="mean")},
        optimizer=es.FtrlParameters(0.1))
  with tf.Graph().as_default():
    engine = HostEmbeddingEngine(config)
    ph = _placeholders()
    if tables == "one_table":
      del ph["query"]
    step = v1.placeholder(tf.int64, [])
    features = dict(ph)
    # The bad feature's values arrive late, so that a missing dependency on
    # its checks shows deterministically.
    features["clicks"] = _slowed(ph["clicks"], tf.int64)
    features["clicks_w"] = _slowed(ph["clicks_w"], tf.float32)
    result = engine.lookup(features)
    grads = _grads()
    if tables == "one_table":
      del grads["query"]
    train = engine.apply_gradients(result, grads, step)

    def feed(**overrides):
      return _good_feed(ph, **overrides)

    with v1.Session() as sess:
      init_session(sess)
      sess.run(train, {**feed(), step: 0})  # non-trivial slots
      before = snapshot(sess, engine)
      if case == "id_too_large":
        bad = feed(clicks=_sparse_value([[1, 10], [3]], np.int64))
        pattern = named("clicks", "items") + ".*out of range"
      elif case == "weights_count_differs":
        bad = feed(clicks_w=_sparse_value([[0.5], [2.0]], np.float32))
        pattern = named("clicks", "items") + ".*weights"
      else:
        bad = feed(views=_sparse_value([[4], [4, 5], [1]], np.int64))
        pattern = named("clicks", "views") + ".*batch size"
      with pytest.raises(tf.errors.InvalidArgumentError, match=pattern):
        sess.run([result.activations, train], {**bad, step: 1})
      assert_unchanged(before, snapshot(sess, engine))
      # The engine still works afterwards.
      sess.run(train, {**feed(), step: 1})


def test_weights_at_other_positions_are_refused():
  # Regression: the position check was once attached to a tensor nothing
  # read, so weights were paired with ids in value order.
  config = _bad_input_config()
  with tf.Graph().as_default():
    engine = HostEmbeddingEngine(config)
    ph = _placeholders()
    result = engine.lookup(ph)
    train = engine.apply_gradients(result, _grads(), 0)
    with v1.Session() as sess:
      init_session(sess)
      before = snapshot(sess, engine)
      # ids at (0,0),(0,1),(1,0); weights at (0,0),(1,0),(1,1).
      feed = _good_feed(ph, clicks_w=_sparse_value(
          [[0.5, 1.5], [2.0]], np.float32, indices=[[0, 0], [1, 0], [1, 1]],
          dense_shape=[2, 2]))
      try:
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=named("clicks", "items") + ".*positions"):
          sess.run([result.activations, train], feed)
      finally:
        assert_unchanged(before, snapshot(sess, engine))


def test_bad_ids_in_one_table_change_no_other_table():
  # Regression: each table's update once waited only for its own input
  # checks; the slow input makes a missing dependency show deterministically.
  config = _bad_input_config()
  with tf.Graph().as_default():
    engine = HostEmbeddingEngine(config)

    def slow(x):  # a slow input pipeline for the 'query' feature
      time.sleep(1.0)
      return x

    values = tf.numpy_function(slow, [np.array([1, 99], np.int64)], tf.int64)
    values.set_shape([2])
    features = {
        "clicks": ragged_to_sparse(GOOD_IDS, np.int64),
        "clicks_w": ragged_to_sparse(GOOD_W, np.float32),
        "views": ragged_to_sparse([[4], [4, 5]], np.int64),
        "query": tf.SparseTensor([[0, 0], [1, 0]], values, [2, 2]),
    }
    result = engine.lookup(features)
    train = engine.apply_gradients(result, _grads(), 0)
    with v1.Session() as sess:
      init_session(sess)
      before = snapshot(sess, engine)
      with pytest.raises(tf.errors.InvalidArgumentError,
                         match=named("query", "words") + ".*out of range"):
        sess.run(train)
      assert_unchanged(before, snapshot(sess, engine))


@pytest.mark.parametrize("pipelining", [False, True])
def test_non_finite_gradient_in_one_table_changes_no_table(pipelining):
  config = _bad_input_config(pipeline_execution_with_tensor_core=pipelining)
  initial = {"items": np.linspace(-1, 1, 30, dtype=F32).reshape(10, 3),
             "words": np.linspace(-1, 1, 12, dtype=F32).reshape(6, 2)}
  with tf.Graph().as_default():
    engine = HostEmbeddingEngine(config)
    ph = _placeholders()
    bad_value = v1.placeholder(tf.float32, [])
    step = v1.placeholder(tf.int64, [])
    result = engine.lookup(ph)
    grads = _grads()
    # 'query' (table 'words') gets bad_value * its gradient: NaN/inf when fed.
    grads["query"] = grads["query"] * bad_value
    train = engine.apply_gradients(result, grads, step)
    flush = engine.flush()
    with v1.Session() as sess:
      init_session(sess)
      sess.run([engine.table_rows(t).assign_all(v) for t, v in initial.items()])
      sess.run(train, {**_good_feed(ph), step: 0, bad_value: 1.0})
      before = snapshot(sess, engine)
      for bad in (np.nan, np.inf):
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=named("query", "words") + ".*not finite"):
          sess.run(train, {**_good_feed(ph), step: 1, bad_value: bad})
        assert_unchanged(before, snapshot(sess, engine))
      # With pipelining, step 0's update is still held; flush applies it.
      sess.run(flush)
      tables = {t: sess.run(engine.table_rows(t).read_all()) for t in initial}
      slots = {t: {k: sess.run(s.read_all())
                   for k, s in engine.slot_rows(t).items()} for t in initial}
  twin_config = {
      "tables": {"items": twin_table_config(10, 3, "mean"),
                 "words": twin_table_config(6, 2, "sum")},
      "features": {
          "clicks": {"table": "items", "max_sequence_length": 0,
                     "weight_key": "clicks_w"},
          "views": {"table": "items", "max_sequence_length": 0,
                    "weight_key": None},
          "query": {"table": "words", "max_sequence_length": 2,
                    "weight_key": None}},
      "optimizer": es.FtrlParameters(0.1), "clipping_limit": None,
      "gradient_multiplier_fn": None,
  }
  batch = {"clicks": (GOOD_IDS, GOOD_W), "views": ([[4], [4, 5]], None),
           "query": ([[1, 2, 3], [5]], None)}
  grads = {"clicks": np.full((2, 3), 0.5, F32),
           "views": np.full((2, 3), -0.25, F32),
           "query": np.full((2, 2, 2), 0.75, F32)}
  final = twin.backward(twin.init_state(twin_config, initial), twin_config,
                        batch, grads, 0)
  for t in initial:
    close(tables[t], final[t]["table"], t)
    for k, value in final[t]["slots"].items():
      close(slots[t][k], value, f"{t}/{k}")


def test_graph_build_errors():
  config = _bad_input_config()
  with tf.Graph().as_default():
    good = {
        "clicks": ragged_to_sparse(GOOD_IDS, np.int64),
        "clicks_w": ragged_to_sparse(GOOD_W, np.float32),
        "views": ragged_to_sparse([[4], [4, 5]], np.int64),
        "query": ragged_to_sparse([[1, 2, 3], [5]], np.int64),
    }
    engine = HostEmbeddingEngine(config)
    with pytest.raises(TypeError, match=r"'views'.*'items'.*integer"):
      engine.lookup(dict(good, views=ragged_to_sparse([[4.0], [4.0, 5.0]],
                                                      np.float32)))
    with pytest.raises(TypeError, match=r"'views'.*'items'.*integer"):
      engine.lookup(dict(good, views=tf.constant([["a"], ["b"]])))
    with pytest.raises(TypeError, match=r"'views'.*'items'.*integer"):
      engine.lookup(dict(good, views=tf.constant([[4.0], [5.0]])))
    with pytest.raises(ValueError, match=r"'clicks'.*'items'.*'clicks_w'"):
      engine.lookup({k: v for k, v in good.items() if k != "clicks_w"})
    with pytest.raises(ValueError, match=r"'query'.*'words'.*missing"):
      engine.lookup({k: v for k, v in good.items() if k != "query"})
    with pytest.raises(TypeError, match=r"dict"):
      engine.lookup([good])
    result = engine.lookup(good)
    grads = {"clicks": tf.ones([2, 3]), "views": tf.ones([2, 3]),
             "query": tf.ones([2, 2, 2])}
    with pytest.raises(ValueError, match=r"no gradient.*'views'"):
      engine.apply_gradients(
          result, {k: v for k, v in grads.items() if k != "views"}, 0)
    with pytest.raises(ValueError, match=r"no gradient.*'views'"):
      engine.apply_gradients(result, dict(grads, views=None), 0)
    with pytest.raises(ValueError, match=r"'query'.*'words'.*shape"):
      engine.apply_gradients(result, dict(grads, query=tf.ones([2, 2])), 0)


def test_missing_gradient_error_names_feature_and_table():
  # Regression: the message once named the feature only.
  config = _bad_input_config()
  with tf.Graph().as_default():
    engine = HostEmbeddingEngine(config)
    result = engine.lookup({
        "clicks": ragged_to_sparse(GOOD_IDS, np.int64),
        "clicks_w": ragged_to_sparse(GOOD_W, np.float32),
        "views": ragged_to_sparse([[4], [4, 5]], np.int64),
        "query": ragged_to_sparse([[1, 2, 3], [5]], np.int64),
    })
    with pytest.raises(ValueError, match=r"'views'.*'items'"):
      engine.apply_gradients(result, {"clicks": tf.ones([2, 3]),
                                      "query": tf.ones([2, 2, 2])}, 0)


def test_static_batch_sizes_that_differ_fail_at_graph_build():
  # Regression: tf.get_static_value(dense_shape[0]) is None even for constant
  # dense shapes, so the static check once never fired.
  config = _bad_input_config()
  with tf.Graph().as_default():
    engine = HostEmbeddingEngine(config)
    features = {
        "clicks": ragged_to_sparse(GOOD_IDS, np.int64),
        "clicks_w": ragged_to_sparse(GOOD_W, np.float32),
        "views": ragged_to_sparse([[4], [4, 5], [1]], np.int64),
        "query": ragged_to_sparse([[1, 2, 3], [5]], np.int64),
    }
    with pytest.raises(ValueError, match=r"batch size.*clicks=2.*views=3"):
      engine.lookup(features)


@pytest.mark.parametrize("mode", [es.EVAL, es.PREDICT])
def test_apply_gradients_outside_training_is_refused(mode):
  config = _bad_input_config(mode=mode)
  with tf.Graph().as_default():
    engine = HostEmbeddingEngine(config)
    result = engine.lookup({
        "clicks": ragged_to_sparse(GOOD_IDS, np.int64),
        "clicks_w": ragged_to_sparse(GOOD_W, np.float32),
        "views": ragged_to_sparse([[4], [4, 5]], np.int64),
        "query": ragged_to_sparse([[1], [5]], np.int64),
    })
    # No slot variables outside training.
    assert all(not engine.slot_rows(name) for name in engine.created_tables())
    assert sorted(v.name for v in engine.variables()) == [
        "items/part_0:0", "words/part_0:0"]
    with pytest.raises(RuntimeError, match=mode):
      engine.apply_gradients(result, {
          "clicks": tf.ones([2, 3]), "views": tf.ones([2, 3]),
          "query": tf.ones([2, 2, 2])}, 0)
    with v1.Session() as sess:
      init_session(sess)
      assert sess.run(result.activations)["query"].shape == (2, 2, 2)


# ---------------------------------------------------------------------------
# Variables.

SLOT_SUFFIXES = {
    "AdagradParameters": ["Adagrad"],
    "AdagradMomentumParameters": ["AdagradMomentum/Accumulator",
                                  "AdagradMomentum/Momentum"],
    "AdamParameters": ["Adam/m", "Adam/v"],
    "FtrlParameters": ["Ftrl", "Ftrl_1"],
    "MomentumParameters": ["Momentum"],
    "ProximalAdagradParameters": ["ProximalAdagrad"],
    "ProximalYogiParameters": ["ProximalYogi", "ProximalYogi_1"],
    "RMSPropParameters": ["RMSProp/ms", "RMSProp/mom"],
    "StochasticGradientDescentParameters": [],
}


@pytest.mark.parametrize("optimizer_class", es.ALL_OPTIMIZERS,
                         ids=[c.__name__ for c in es.ALL_OPTIMIZERS])
@pytest.mark.parametrize("num_shards", [1, 2])
def test_variable_names_and_collections(optimizer_class, num_shards):
  config = make_config({"f": es.FeatureConfig("a")},
                       {"a": es.TableConfig(10, 2)},
                       optimizer=_default_optimizer(optimizer_class))
  with tf.Graph().as_default():
    engine = HostEmbeddingEngine(config, num_shards=num_shards)
    engine.lookup({"f": ragged_to_sparse([[1], [2]], np.int64)})
    expected = sorted(
        f"a/{suffix}part_{i}:0"
        for suffix in [""] + [s + "/" for s in SLOT_SUFFIXES[
            optimizer_class.__name__]]
        for i in range(num_shards))
    names = sorted(v.name for v in engine.variables())
    assert names == expected
    assert sorted(v.name for v in v1.global_variables()) == expected
    assert not v1.trainable_variables()
    # The pipelining buffers (if any) are local variables, never global.
    assert not [v for v in v1.global_variables() if "pipelined" in v.name]


def test_variable_names_option():
  config = make_config({"f": es.FeatureConfig("t"), "g": es.FeatureConfig("u")},
                       {"t": es.TableConfig(10, 2), "u": es.TableConfig(5, 2)},
                       pipeline_execution_with_tensor_core=True)
  with tf.Graph().as_default():
    engine = HostEmbeddingEngine(
        config, num_shards=2,
        variable_names={"t": "dense_features/a_embedding/embedding_weights"})
    engine.lookup({"f": ragged_to_sparse([[1], [2]], np.int64),
                   "g": ragged_to_sparse([[1], [2]], np.int64)})
    names = sorted(v.name for v in engine.variables())
    base = "dense_features/a_embedding/embedding_weights"
    assert names == sorted([
        f"{base}/part_0:0", f"{base}/part_1:0", f"{base}/Adagrad/part_0:0",
        f"{base}/Adagrad/part_1:0", "u/part_0:0", "u/part_1:0",
        "u/Adagrad/part_0:0", "u/Adagrad/part_1:0"])
    assert not v1.trainable_variables()
  with tf.Graph().as_default():
    with pytest.raises(ValueError, match="unknown tables"):
      HostEmbeddingEngine(config, variable_names={"nope": "x"})


@pytest.mark.parametrize("strategy", ["div", "mod"])
@pytest.mark.parametrize("vocab,num_shards", [(10, 3), (7, 4), (2, 4), (9, 1)])
def test_partition_layout(strategy, vocab, num_shards):
  config = make_config({"f": es.FeatureConfig("t")},
                       {"t": es.TableConfig(vocab, 2)},
                       partition_strategy=strategy)
  full = np.arange(vocab * 2, dtype=F32).reshape(vocab, 2)
  with tf.Graph().as_default():
    engine = HostEmbeddingEngine(config, num_shards=num_shards)
    engine.create_variables()
    table = engine.table_rows("t")
    accumulator = engine.slot_rows("t")["accumulator"]
    n = min(vocab, num_shards)
    assert len(table.partitions) == len(accumulator.partitions) == n
    with v1.Session() as sess:
      init_session(sess)
      sess.run([table.assign_all(full), accumulator.assign_all(-full)])
      parts = sess.run(table.partitions)
      slot_parts = sess.run(accumulator.partitions)
      np.testing.assert_array_equal(sess.run(table.read_all()), full)
      rows = sess.run(table.gather(tf.constant([vocab - 1, 0], tf.int64)))
  np.testing.assert_array_equal(rows, full[[vocab - 1, 0]])
  if strategy == "mod":
    expected_rows = [np.arange(i, vocab, n) for i in range(n)]
  else:
    base, extra = divmod(vocab, n)
    sizes = [base + (i < extra) for i in range(n)]
    starts = np.cumsum([0] + sizes)
    expected_rows = [np.arange(starts[i], starts[i + 1]) for i in range(n)]
  for i in range(n):
    np.testing.assert_array_equal(parts[i], full[expected_rows[i]])
    np.testing.assert_array_equal(slot_parts[i], -full[expected_rows[i]])


def test_shard_device_fn_places_partitions():
  # Regression: TF2's tf.device refuses device functions (RuntimeError).
  config = make_config({"f": es.FeatureConfig("t")},
                       {"t": es.TableConfig(10, 2)},
                       optimizer=es.AdamParameters(0.1))
  with tf.Graph().as_default():
    engine = HostEmbeddingEngine(config, num_shards=3,
                                 shard_device_fn=lambda t, i: f"/job:ps/task:{i}")
    engine.create_variables()
    variables = [engine.table_rows("t")] + list(engine.slot_rows("t").values())
    assert len(variables) == 3
    for rows in variables:
      assert len(rows.partitions) == 3
      for i, partition in enumerate(rows.partitions):
        assert partition.name.endswith(f"/part_{i}:0")
        device = tf.DeviceSpec.from_string(partition.device)
        assert (device.job, device.task) == ("ps", i), partition.device
        assert (tf.DeviceSpec.from_string(partition.op.device).task == i)


def _three_features_engine(safe=True):
  """Features a, b (table t, 10 rows) and c (table u, 4 rows), dict form;
  the engine, its sparse placeholders and lookup result."""
  config = make_config(
      {"a": es.FeatureConfig("t"), "b": es.FeatureConfig("t"),
       "c": es.FeatureConfig("u")},
      {"t": es.TableConfig(10, 2, combiner="sum"),
       "u": es.TableConfig(4, 2, combiner="mean")})
  engine = HostEmbeddingEngine(config)
  ph = {k: v1.sparse_placeholder(tf.int64, [None, None]) for k in "abc"}
  return engine, ph, engine.lookup(ph)


def test_one_failing_check_names_every_feature_at_fault_and_no_other():
  with tf.Graph().as_default():
    _, ph, result = _three_features_engine()
    good = {"a": [[1], [2, 3]], "b": [[4], []], "c": [[0, 1], [3]]}
    with v1.Session() as sess:
      init_session(sess)

      def run(**rows):
        values = dict(good, **rows)
        sess.run(result.activations,
                 {ph[k]: sparse_value(v, np.int64) for k, v in values.items()})

      run()
      with pytest.raises(tf.errors.InvalidArgumentError) as info:
        run(a=[[10], [2]], c=[[4], [0]])
      message = info.value.message
      assert "'a' (table 't'): id out of range [0, 10)" in message.replace(
          "\\'", "'")
      assert "'c' (table 'u'): id out of range [0, 4)" in message.replace(
          "\\'", "'")
      assert "'b'" not in message.replace("\\'", "'")
      # The failing features' smallest ids, then their largest.
      assert "[2 0] [10 4]" in message
      bad_shape = tf.compat.v1.SparseTensorValue(
          np.array([[0, 0], [2, 0]], np.int64), np.array([1, 2], np.int64),
          np.array([2, 1], np.int64))
      with pytest.raises(tf.errors.InvalidArgumentError,
                         match=named("b", "t") + ".*out of bounds of its"):
        sess.run(result.activations, {
            ph["a"]: sparse_value(good["a"], np.int64), ph["b"]: bad_shape,
            ph["c"]: sparse_value(good["c"], np.int64)})


@pytest.mark.parametrize("negative_in", ["", "a", "c", "ac"])
def test_negative_ids_drop_in_the_features_that_have_them_only(negative_in):
  rows = {"a": [[1, -1], [2, 3]], "b": [[4], [5, 5]], "c": [[0, 1], [-2]]}
  rows = {k: [[i for i in row if i >= 0 or k in negative_in] for row in r]
          for k, r in rows.items()}
  with tf.Graph().as_default():
    engine, ph, result = _three_features_engine()
    with v1.Session() as sess:
      init_session(sess)
      t, u = sess.run([engine.table_rows("t").read_all(),
                       engine.table_rows("u").read_all()])
      activations = sess.run(result.activations, {
          ph[k]: sparse_value(v, np.int64) for k, v in rows.items()})
  want = {}
  for k, table, mean in (("a", t, False), ("b", t, False), ("c", u, True)):
    kept = [[i for i in row if i >= 0] for row in rows[k]]
    want[k] = np.stack([
        (table[r].mean(0) if mean else table[r].sum(0)) if r else
        np.zeros(2, F32) for r in kept])
  for k in "abc":
    close(activations[k], want[k], k)
