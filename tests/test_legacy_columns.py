"""`tpu_embedding_columns.legacy`: TPU embedding columns named as TF1's.

Oracle: TF 2.15's own `tensorflow.python.tpu.feature_column` (the module
TF 1.x's `tf.compat.v1.tpu.experimental.*_embedding_column(s)` exported),
built the same way in a separate graph of the same test; numbers also from
NumPy written here. Graph mode throughout.
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import contextlib

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.feature_column import feature_column as fc_v1
from tensorflow.python.tpu import feature_column as tf1_tpu_fc

import estimator_spec as es
import tpu_embedding_columns as tec
import tpu_embedding_columns.legacy  # the submodule import users write
from tpu_embedding_columns import legacy

fc = tf.feature_column
v1 = tf.compat.v1
V, D = 6, 2  # row 5 is never looked up
IMPLS = {"ours": legacy, "tf": tf1_tpu_fc}
TABLE = np.arange(V * D, dtype=np.float32).reshape(V, D) * 1.5 - 4.0

# Example 0: a=[3], b=[0, 4]; example 1: a=[1, 2, 1], b=[] (a zero row).
A_IDS = np.array([[3, -1, -1], [1, 2, 1]], np.int64)
B_IDS = np.array([[0, 4, -1], [-1, -1, -1]], np.int64)


def _table_initializer(shape, dtype=tf.float32, partition_info=None):
  del dtype
  if partition_info is None:
    assert tuple(shape) == TABLE.shape
    return tf.constant(TABLE)
  start = partition_info.single_offset(shape)
  return tf.constant(TABLE[start:start + shape[0]])


def _mean_rows(ids):
  out = []
  for row in ids:
    kept = [i for i in row if i >= 0]
    out.append(TABLE[kept].mean(0) if kept else np.zeros(D, np.float32))
  return np.array(out)


def _features():
  return {"aaa": tf.constant(A_IDS), "bbb": tf.constant(B_IDS)}


def _columns(impl, **kwargs):
  """The group as TF's test builds it: columns given as bbb, aaa."""
  b, a = IMPLS[impl].shared_embedding_columns(
      [fc.categorical_column_with_identity("bbb", V),
       fc.categorical_column_with_identity("aaa", V)], D,
      initializer=_table_initializer, **kwargs)
  return a, b


@contextlib.contextmanager
def _scope(name, partitions=None):
  if name is None:
    yield
    return
  partitioner = (v1.fixed_size_partitioner(partitions)
                 if partitions else None)
  with v1.variable_scope(name, partitioner=partitioner):
    yield


def _run(outputs):
  with v1.Session() as sess:
    sess.run(v1.global_variables_initializer())
    return sess.run(outputs)


def _collections(graph, name):
  return {key: sorted(v.name for v in graph.get_collection(key))
          for key in (v1.GraphKeys.GLOBAL_VARIABLES,
                      v1.GraphKeys.TRAINABLE_VARIABLES,
                      v1.GraphKeys.MODEL_VARIABLES, name)}


# --- construction ------------------------------------------------------------


@pytest.mark.parametrize("collection", [None, "var_scope_name"])
def test_shared_columns_carry_tf1_names(collection):
  got = {}
  for impl in IMPLS:
    a, b = _columns(impl, shared_embedding_collection_name=collection)
    got[impl] = [(c.name, c._var_scope_name, c.shared_embedding_collection_name,
                  c.get_embedding_var_name(), c.get_feature_key_name(),
                  tuple(c._variable_shape), c._parse_example_spec)
                 for c in (a, b)]
  name = collection or "aaa_bbb_shared_embedding"
  assert [g[:4] for g in got["ours"]] == [
      ("aaa_shared_embedding", name, name, name),
      ("bbb_shared_embedding", name, name, name)]
  assert got["ours"] == got["tf"]


def test_non_shared_column_is_ours_and_named_as_tf1():
  ours = legacy.embedding_column(fc.categorical_column_with_identity("aaa", V),
                                 D)
  theirs = tf1_tpu_fc.embedding_column(
      fc.categorical_column_with_identity("aaa", V), D)
  assert type(ours) is tec.EmbeddingColumn
  assert (ours.name, ours._var_scope_name) == ("aaa_embedding",
                                              "aaa_embedding")
  assert (ours.name, ours._var_scope_name) == (theirs.name,
                                              theirs._var_scope_name)


def test_default_shared_columns_keep_tf2_naming():
  a, _ = tec.shared_embedding_columns(
      [fc.categorical_column_with_identity("bbb", V),
       fc.categorical_column_with_identity("aaa", V)], D)[::-1]
  assert type(a) is tec.SharedEmbeddingColumn
  assert a._var_scope_name == "aaa_shared_embedding"
  assert isinstance(legacy.shared_embedding_columns(
      [fc.categorical_column_with_identity("aaa", V)], D)[0],
                    tec.SharedEmbeddingColumn)


def test_legacy_functions_share_our_validation():
  cases = [
      (dict(dimension=0), ValueError, "Invalid dimension"),
      (dict(dimension=D, combiner="max"), ValueError, "combiner"),
      (dict(dimension=D, max_sequence_lengths=[1]), ValueError,
       "max_sequence_lengths and categorical_columns must be of the same"),
  ]
  columns = [fc.categorical_column_with_identity("aaa", V),
             fc.categorical_column_with_identity("bbb", V)]
  for kwargs, error, text in cases:
    for function in (legacy.shared_embedding_columns,
                     tec.shared_embedding_columns):
      with pytest.raises(error, match=text):
        function(columns, **kwargs)
  with pytest.raises(ValueError, match="same number of buckets"):
    legacy.shared_embedding_columns(
        [columns[0], fc.categorical_column_with_identity("ccc", V + 1)], D)
  with pytest.raises(ValueError, match="Invalid dimension"):
    legacy.embedding_column(columns[0], 0)


# --- the plain (CPU) lookup ------------------------------------------------


def _input_layer_graph(impl, scope, partitions):
  graph = tf.Graph()
  with graph.as_default(), _scope(scope, partitions):
    a, b = _columns(impl)
    out = v1.feature_column.input_layer(_features(), [a, b])
  return graph, out


@pytest.mark.parametrize("scope,partitions", [(None, None), ("model", None),
                                              ("model", 2)])
def test_input_layer_names_one_variable_as_tf1_with_tf1_values(
    scope, partitions):
  got = {}
  for impl in IMPLS:
    graph, out = _input_layer_graph(impl, scope, partitions)
    with graph.as_default():
      got[impl] = (_collections(graph, "aaa_bbb_shared_embedding"),
                   _run(out))
  prefix = f"{scope}/" if scope else ""
  name = prefix + "input_layer/aaa_bbb_shared_embedding/embedding_weights"
  names = ([f"{name}/part_{i}:0" for i in range(partitions)]
           if partitions else [name + ":0"])
  ours_collections, ours_values = got["ours"]
  assert ours_collections[v1.GraphKeys.GLOBAL_VARIABLES] == names
  assert ours_collections == got["tf"][0]
  expected = np.concatenate([_mean_rows(A_IDS), _mean_rows(B_IDS)], 1)
  np.testing.assert_allclose(ours_values, expected, rtol=1e-6)
  np.testing.assert_allclose(ours_values, got["tf"][1], rtol=1e-6)


def test_direct_get_dense_tensor_creates_plain_embedding_weights():
  got = {}
  for impl in IMPLS:
    with tf.Graph().as_default():
      a, b = _columns(impl)
      features = _features()
      outs = [c._get_dense_tensor(fc_v1._LazyBuilder(features))
              for c in (a, b)]
      names = [v.name for v in v1.global_variables()]
      got[impl] = (names, _run(outs))
  assert got["ours"][0] == ["embedding_weights:0"] == got["tf"][0]
  for ours, theirs, ids in zip(got["ours"][1], got["tf"][1], (A_IDS, B_IDS)):
    np.testing.assert_allclose(ours, _mean_rows(ids), rtol=1e-6)
    np.testing.assert_allclose(ours, theirs, rtol=1e-6)


def test_later_uses_in_other_scopes_reuse_the_first_variable():
  got = {}
  for impl in IMPLS:
    with tf.Graph().as_default():
      a, b = _columns(impl)
      with v1.variable_scope("tower"):
        first = v1.feature_column.input_layer(_features(), [b])
      with v1.variable_scope("other"):
        second = v1.feature_column.input_layer(_features(), [a, b])
      third = a._get_dense_tensor(fc_v1._LazyBuilder(_features()))
      names = [v.name for v in v1.global_variables()]
      got[impl] = (names, _run([first, second, third]))
  assert got["ours"][0] == [
      "tower/input_layer/aaa_bbb_shared_embedding/embedding_weights:0"
  ] == got["tf"][0]
  for ours, theirs in zip(got["ours"][1], got["tf"][1]):
    np.testing.assert_allclose(ours, theirs, rtol=1e-6)
  np.testing.assert_allclose(got["ours"][1][2], _mean_rows(A_IDS), rtol=1e-6)


def test_two_groups_with_their_own_collection_names():
  with tf.Graph().as_default():
    a, b = _columns("ours", shared_embedding_collection_name="first")
    c, d = _columns("ours", shared_embedding_collection_name="second")
    v1.feature_column.input_layer(_features(), [a, b])
    v1.feature_column.input_layer(_features(), [c, d])
    assert sorted(v.name for v in v1.global_variables()) == [
        "input_layer/first/embedding_weights:0",
        "input_layer_1/second/embedding_weights:0"]
    assert [v.name for v in v1.get_collection("first")] == [
        "input_layer/first/embedding_weights:0"]


@pytest.mark.parametrize("impl", list(IMPLS))
def test_foreign_items_in_the_collection_are_refused(impl):
  for extra, text in [((3, 3), "shape"), (None, "one variable")]:
    with tf.Graph().as_default():
      a, _ = _columns(impl)
      v1.add_to_collection("aaa_bbb_shared_embedding",
                           v1.get_variable("x", shape=extra or (V, D)))
      if extra is None:
        v1.add_to_collection("aaa_bbb_shared_embedding",
                             v1.get_variable("y", shape=(V, D)))
      with pytest.raises(ValueError, match=text):
        v1.feature_column.input_layer(_features(), [a])


def test_dense_features_and_input_layer_share_the_group_variable():
  with tf.Graph().as_default():
    a, b = _columns("ours")
    first = v1.feature_column.input_layer(_features(), [a])
    second = tf.compat.v1.keras.layers.DenseFeatures([b])(_features())
    assert [v.name for v in v1.global_variables()] == [
        "input_layer/aaa_bbb_shared_embedding/embedding_weights:0"]
    got = _run([first, second])
  np.testing.assert_allclose(got[0], _mean_rows(A_IDS), rtol=1e-6)
  np.testing.assert_allclose(got[1], _mean_rows(B_IDS), rtol=1e-6)


# --- with an engine installed ----------------------------------------------


class _Recorder(tec.ActivationSource):

  def __init__(self):
    self.registered = []

  def register_variable(self, column, variable_name):
    self.registered.append((column.name, variable_name))

  def dense_activation(self, column):
    return tf.zeros([2, column.dimension])

  def sequence_activation(self, column):
    raise AssertionError("no sequence column here")


def test_engine_registrations_name_the_first_plain_variable():
  recorder = _Recorder()
  with tf.Graph().as_default():
    a, b = _columns("ours")
    with tec.activation_source(recorder):
      with v1.variable_scope("tower"):
        v1.feature_column.input_layer(_features(), [b, a])
      v1.feature_column.input_layer(_features(), [a])
      a._get_dense_tensor(fc_v1._LazyBuilder(_features()))
    assert v1.global_variables() == []
  first = "tower/input_layer/aaa_bbb_shared_embedding/embedding_weights"
  # (input_layer takes its columns in name order.)
  assert recorder.registered == [("aaa_shared_embedding", first),
                                 ("bbb_shared_embedding", first),
                                 ("aaa_shared_embedding", first),
                                 ("aaa_shared_embedding", first)]


# --- TPUEstimator ------------------------------------------------------------


def test_tpu_estimator_checkpoint_holds_the_tf1_variable_name(tmp_path):
  a, b = _columns("ours")
  columns = [a, b]

  def model_fn(features, labels, mode, params):
    del params
    x = v1.feature_column.input_layer(features, columns)
    loss = v1.losses.mean_squared_error(labels, v1.layers.dense(x, 1))
    train_op = v1.train.GradientDescentOptimizer(0.1).minimize(
        loss, v1.train.get_global_step())
    return es.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)

  def input_fn(params):
    del params
    features = {"aaa": np.tile(A_IDS, (2, 1)), "bbb": np.tile(B_IDS, (2, 1))}
    labels = np.arange(4, dtype=np.float32).reshape(4, 1)
    return tf.data.Dataset.from_tensor_slices(
        (features, labels)).repeat().batch(2, drop_remainder=True)

  spec = es.EmbeddingConfigSpec(
      feature_columns=columns,
      optimization_parameters=es.StochasticGradientDescentParameters(0.1))
  estimator = es.TPUEstimator(model_fn=model_fn, model_dir=str(tmp_path),
                              use_tpu=False, train_batch_size=2,
                              embedding_config_spec=spec)
  estimator.train(input_fn, max_steps=3)
  name = "input_layer/aaa_bbb_shared_embedding/embedding_weights"
  stored = dict(tf.train.list_variables(str(tmp_path)))
  assert stored[name] == [V, D]
  assert not [n for n in stored if n.endswith("aaa_bbb_shared_embedding")]
  table = tf.train.load_checkpoint(str(tmp_path)).get_tensor(name)
  touched = sorted(set(A_IDS[A_IDS >= 0]) | set(B_IDS[B_IDS >= 0]))
  untouched = [i for i in range(V) if i not in touched]
  np.testing.assert_array_equal(table[untouched], TABLE[untouched])
  assert not np.allclose(table[touched], TABLE[touched])
