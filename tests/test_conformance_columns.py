"""Conformance of `tpu_embedding_columns` with TF 2.15's TPU feature-column tests.

One test (or one parametrized test) per scenario of TF 2.15's
`tensorflow/python/tpu/feature_column_test.py` (v1 file) and
`tensorflow/python/tpu/feature_column_v2_test.py` (v2 file), written anew for
this project. Each scenario runs against both implementations where
TensorFlow's own classes can run it on CPU:

* impl "tf":   `tf.compat.v1.tpu.experimental.embedding_column` /
               `shared_embedding_columns` (TF 2.15's public columns);
* impl "ours": `tpu_embedding_columns.embedding_column` /
               `shared_embedding_columns`.

Both sides are checked against the same expected values, computed here with
NumPy from the table the test installs (docs/numerics.md, 'Lookup'), never
copied from a run. TF's TPU-only paths (a TPU shard or TPU inference context)
run for both where TF's context managers work on CPU; otherwise only ours runs.

Errors: where TF raises for an input, ours must raise the same exception type
(or `errors.ArgumentTypeError`, a TypeError that is also a ValueError) with
a message containing TF's own key phrase.

Deliberate, documented differences (README) are asserted as such: ours
accepts hashed/crossed/bucketized columns, shared columns in `input_layer`,
pads/truncates sequence outputs to `max_sequence_length`, refuses
`tensor_core_shape` for devices other than 'tpu_tensor_core', checks the
combiner when a column is built, and treats 'cpu' columns as ordinary tables.

Section "Extensions" holds behaviours the project requires beyond TF's
tests: the attributes user code reads, integer weights, and ids past
`max_sequence_length` dropped before any id check.
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import contextlib  # pylint: disable=g-import-not-at-top
import copy
import math

import numpy as np
import pytest
import tensorflow as tf
# TF internals the TF tests themselves use: the v1 lazy builder, TF's TPU
# contexts, the private v1 TPU module (denylist) and the private column
# class (bypass_scope_validation).
from tensorflow.python.feature_column import feature_column as tf_fc_v1
from tensorflow.python.feature_column import feature_column_v2 as tf_fc_v2
from tensorflow.python.tpu import feature_column as tf_tpu_fc_v1
from tensorflow.python.tpu import feature_column_v2 as tf_tpu_fc_v2
from tensorflow.python.tpu import tpu as tf_tpu
from tensorflow.python.tpu import tpu_function

import estimator_spec as es
from estimator_spec.interop import _tpu as interop_tpu
import tpu_embedding_columns as tec
from tpu_embedding_columns import errors

fc = tf.feature_column
v1 = tf.compat.v1
TF_TPU = tf.compat.v1.tpu.experimental
F32 = np.float32

IMPLS = ("tf", "ours")
CONSTRUCTORS = {
    "tf": (TF_TPU.embedding_column, TF_TPU.shared_embedding_columns),
    "ours": (tec.embedding_column, tec.shared_embedding_columns),
}


def embedding_column(impl, *args, **kwargs):
  return CONSTRUCTORS[impl][0](*args, **kwargs)


def shared_embedding_columns(impl, *args, **kwargs):
  return CONSTRUCTORS[impl][1](*args, **kwargs)


# ---------------------------------------------------------------------------
# Helpers.


def ident(key, buckets=3):
  return fc.categorical_column_with_identity(key, buckets)


def seq_ident(key, buckets=3):
  return fc.sequence_categorical_column_with_identity(key, buckets)


def lr_fn(global_step):
  return 0.5 / (1.0 + tf.cast(global_step, tf.float32))


class TableInitializer:
  """An initializer that returns a fixed table and records how it was called
  (TF's tests check the shape, the dtype and that no partition is asked)."""

  def __init__(self, values):
    self.values = np.asarray(values, F32)
    self.calls = []

  def __call__(self, shape, dtype=None, partition_info=None):
    self.calls.append((tuple(tf.TensorShape(shape).as_list()),
                       None if dtype is None else tf.as_dtype(dtype),
                       partition_info))
    return self.values

  def assert_called_for_the_table(self):
    assert self.calls, "the initializer was never called"
    for shape, dtype, partition_info in self.calls:
      assert shape == list(self.values.shape) or shape == tuple(
          self.values.shape), shape
      assert dtype in (None, tf.float32), dtype
      assert partition_info is None


def table(vocabulary_size, dimension, seed):
  """Multiples of 1/4: sums and means below are exact in float32."""
  rng = np.random.RandomState(seed)
  return (rng.randint(-20, 21, size=(vocabulary_size, dimension)) /
          4.0).astype(F32)


def sparse_value(entries, dense_shape, dtype=np.int64):
  """A SparseTensorValue from (example, position, value) triples."""
  indices = np.array([[b, p] for b, p, _ in entries], np.int64).reshape(-1, 2)
  values = np.array([v for _, _, v in entries], dtype)
  return v1.SparseTensorValue(indices, values,
                              np.array(dense_shape, np.int64))


def sparse_tensor(entries, dense_shape, dtype=tf.int64):
  value = sparse_value(entries, dense_shape, dtype.as_numpy_dtype)
  return tf.SparseTensor(value.indices, tf.constant(value.values, dtype),
                         value.dense_shape)


def rows_of(entries, batch, max_position=None):
  """Per example: the (position, value) pairs, in position order."""
  rows = [[] for _ in range(batch)]
  for b, p, v in sorted(entries):
    if max_position is None or p < max_position:
      rows[b].append((p, v))
  return rows


def np_dense(values, rows, weights=None, combiner="mean"):
  """docs/numerics.md, 'Lookup', non-sequence: combine the rows of the ids per
  example; an example without ids gives zeros. `rows[b]` lists ids; `weights[b]`
  the matching weights (default 1)."""
  values = np.asarray(values, np.float64)
  out = np.zeros((len(rows), values.shape[1]))
  for b, ids in enumerate(rows):
    ws = [1.0] * len(ids) if weights is None else [float(w) for w in weights[b]]
    if not ids:
      continue
    total = sum(w * values[i] for i, w in zip(ids, ws))
    if combiner == "sum":
      out[b] = total
    elif combiner == "mean":
      out[b] = total / sum(ws)
    elif combiner == "sqrtn":
      out[b] = total / math.sqrt(sum(w * w for w in ws))
    else:
      raise AssertionError(combiner)
  return out


def np_sequence(values, rows, width):
  """docs/numerics.md, 'Lookup', sequence: position p of example b holds row(id
  at p) for p < width; later positions are zeros. `rows[b]` lists (p, id)."""
  values = np.asarray(values, np.float64)
  out = np.zeros((len(rows), width, values.shape[1]))
  for b, pairs in enumerate(rows):
    for p, i in pairs:
      if p < width:
        out[b, p] = values[i]
  return out


def ids_only(rows):
  return [[v for _, v in pairs] for pairs in rows]


def evaluate(fetches):
  with v1.Session() as sess:
    sess.run([v1.global_variables_initializer(), v1.tables_initializer()])
    return sess.run(fetches)


def global_variable_names():
  return sorted(v.name for v in v1.global_variables())


def variable_shapes():
  return {v.name: tuple(v.shape.as_list()) for v in v1.global_variables()}


def assert_close(actual, expected):
  np.testing.assert_allclose(np.asarray(actual, np.float64),
                             np.asarray(expected, np.float64), rtol=1e-6,
                             atol=1e-6)


@contextlib.contextmanager
def raises_like_tensorflow(error_type, phrase):
  """The exception TF raises (`error_type`) whose message contains TF's key
  `phrase`. Ours may raise `ArgumentTypeError` (a TypeError and a
  ValueError) where TF raises either."""
  with pytest.raises(Exception) as info:
    yield info
  error = info.value
  assert isinstance(error, error_type), (
      f"expected {error_type.__name__}, got {type(error).__name__}: {error}")
  if isinstance(error, errors.ArgumentTypeError):
    assert isinstance(error, TypeError) and isinstance(error, ValueError)
  assert phrase in str(error), (
      f"message lacks TensorFlow's phrase {phrase!r}: {error}")


@contextlib.contextmanager
def tpu_inference_context(shard=False):
  """TF's TPU inference context (as TF's tests enter it), optionally inside
  a one-core TPU shard context."""
  context = tf_tpu._TPUInferenceContext("tpu_inference")
  context.Enter()
  try:
    if shard:
      with tpu_function.tpu_shard_context(1):
        yield
    else:
      yield
  finally:
    context.Exit()


def default_initializer_config(dimension):
  return {"mean": 0.0, "stddev": 1.0 / math.sqrt(dimension), "seed": None,
          "dtype": "float32"}


def initializer_config(initializer):
  config = dict(initializer.get_config())
  if "dtype" in config:
    config["dtype"] = tf.as_dtype(config["dtype"]).name
  return config


def device_name(column):
  return column._embedding_lookup_device.name


# ===========================================================================
# feature_column_test.py (v1 file)
# ===========================================================================


# EmbeddingColumnTest.test_defaults
@pytest.mark.parametrize("impl", IMPLS)
def test_v1_embedding_column_defaults(impl):
  categorical = ident("aaa", 3)
  column = embedding_column(impl, categorical, dimension=2)
  assert column.categorical_column is categorical
  assert column.dimension == 2
  assert column.combiner == "mean"
  assert column.name == "aaa_embedding"
  assert column._var_scope_name == "aaa_embedding"
  assert tuple(column._variable_shape.as_list()) == (2,)
  assert column._parse_example_spec == {"aaa": tf.io.VarLenFeature(tf.int64)}
  assert initializer_config(
      column.get_initializer()) == default_initializer_config(2)


# EmbeddingColumnTest.test_denylisted_column
@pytest.mark.parametrize("kind", ["hashed", "crossed", "bucketized"])
@pytest.mark.parametrize("impl", IMPLS)
def test_v1_denylisted_categorical_columns(impl, kind):
  """TF's v1 TPU module refuses hashed/crossed/bucketized columns with a
  TypeError (the TF test); TF 2.15's public v2 function builds them, and ours
  accepts them by design and looks up the ids the column makes."""
  categorical = {
      "hashed": fc.categorical_column_with_hash_bucket("word", 7),
      "crossed": fc.crossed_column(["word", "tag"], 11),
      "bucketized": fc.bucketized_column(fc.numeric_column("price"),
                                         [1.0, 2.0, 5.0]),
  }[kind]
  with pytest.raises(TypeError):
    tf_tpu_fc_v1.embedding_column(categorical, dimension=2)

  words = [(0, 0, "apple"), (0, 1, "kiwi"), (2, 0, "plum")]
  tags = [(0, 0, "x"), (1, 0, "y"), (2, 0, "x"), (2, 1, "z")]
  values = table(categorical.num_buckets, 2, seed=1)
  with tf.Graph().as_default():
    features = {
        "word": sparse_tensor(words, [3, 2], tf.string),
        "tag": sparse_tensor(tags, [3, 2], tf.string),
        "price": tf.constant([[0.5], [3.0], [9.0]]),
    }
    column = embedding_column(impl, categorical, dimension=2, combiner="sum",
                              initializer=TableInitializer(values))
    out = v1.keras.layers.DenseFeatures([column])(features)
    cache = tf.__internal__.feature_column.FeatureTransformationCache(features)
    ids = categorical.get_sparse_tensors(cache, None).id_tensor
    got, id_value = evaluate([out, ids])
  rows = [[] for _ in range(3)]
  for (b, _), i in zip(id_value.indices, id_value.values):
    rows[b].append(int(i))
  assert sum(len(r) for r in rows) > 0
  assert_close(got, np_dense(values, rows, combiner="sum"))


def make_modulo_column(key, buckets):
  """A user-defined categorical column (v2 CategoricalColumn subclass in no
  allowlist): id = raw value mod buckets."""
  base = tf_fc_v2.CategoricalColumn

  class _Modulo(base):

    @property
    def _is_v2_column(self):
      return True

    @property
    def name(self):
      return key

    @property
    def parents(self):
      return [key]

    @property
    def parse_example_spec(self):
      return {key: tf.io.VarLenFeature(tf.int64)}

    @property
    def _parse_example_spec(self):
      return self.parse_example_spec

    @property
    def num_buckets(self):
      return buckets

    @property
    def _num_buckets(self):
      return buckets

    def transform_feature(self, transformation_cache, state_manager):
      raw = transformation_cache.get(key, state_manager)
      return tf.SparseTensor(raw.indices, tf.math.floormod(raw.values, buckets),
                             raw.dense_shape)

    def get_sparse_tensors(self, transformation_cache, state_manager):
      return base.IdWeightPair(transformation_cache.get(self, state_manager),
                               None)

  return _Modulo()


# EmbeddingColumnTest.test_custom_column
@pytest.mark.parametrize("impl", IMPLS)
def test_v1_custom_categorical_column(impl):
  categorical = make_modulo_column("mmm", 5)
  values = table(5, 2, seed=2)
  column = embedding_column(impl, categorical, dimension=2,
                            initializer=TableInitializer(values))
  assert column.categorical_column is categorical
  assert column.dimension == 2
  assert column.combiner == "mean"
  assert column.name == "mmm_embedding"
  assert column._var_scope_name == "mmm_embedding"
  assert tuple(column._variable_shape.as_list()) == (2,)
  assert column._parse_example_spec == {"mmm": tf.io.VarLenFeature(tf.int64)}
  raw = [(0, 0, 7), (0, 1, 12), (1, 0, 4), (3, 0, 5)]
  with tf.Graph().as_default():
    out = v1.keras.layers.DenseFeatures([column])(
        {"mmm": sparse_tensor(raw, [4, 2])})
    assert variable_shapes() == {
        "dense_features/mmm_embedding/embedding_weights:0": (5, 2)}
    got = evaluate(out)
  rows = [[r % 5 for r in ids] for ids in ids_only(rows_of(raw, 4))]
  assert_close(got, np_dense(values, rows))


# EmbeddingColumnTest.test_all_constructor_args
@pytest.mark.parametrize("impl", IMPLS)
def test_v1_embedding_column_all_constructor_args(impl):
  categorical = ident("aaa", 3)
  column = embedding_column(impl, categorical, dimension=2, combiner="sqrtn",
                            initializer=lambda: "my_initializer")
  assert column.categorical_column is categorical
  assert column.dimension == 2
  assert column.combiner == "sqrtn"
  assert column.get_initializer()() == "my_initializer"
  assert column.name == "aaa_embedding"
  assert column._var_scope_name == "aaa_embedding"
  assert tuple(column._variable_shape.as_list()) == (2,)
  assert column._parse_example_spec == {"aaa": tf.io.VarLenFeature(tf.int64)}
  # TF's test passes combiner='my_combiner', which TF accepts unchecked; ours
  # checks the combiner when the column is built (README, stricter).
  if impl == "tf":
    assert embedding_column(impl, categorical, 2,
                            combiner="my_combiner").combiner == "my_combiner"
  else:
    with pytest.raises(ValueError, match="combiner"):
      embedding_column(impl, categorical, 2, combiner="my_combiner")


LOOKUP_TABLE = np.array([[1.0, 2.0], [3.0, 5.0], [7.0, 11.0]], F32)


# EmbeddingColumnTest.test_get_dense_tensor
@pytest.mark.parametrize("impl", IMPLS)
def test_v1_embedding_get_dense_tensor(impl):
  # Ids [2], [0, 1] (at positions 0 and 4), [], [1].
  entries = [(0, 0, 2), (1, 0, 0), (1, 4, 1), (3, 0, 1)]
  init = TableInitializer(LOOKUP_TABLE)
  column = embedding_column(impl, ident("aaa", 3), dimension=2,
                            initializer=init)
  with tf.Graph().as_default():
    lookup = column._get_dense_tensor(
        tf_fc_v1._LazyBuilder({"aaa": sparse_value(entries, [4, 5])}))
    assert global_variable_names() == ["embedding_weights:0"]
    variable, got = evaluate([v1.global_variables()[0], lookup])
  init.assert_called_for_the_table()
  assert_close(variable, LOOKUP_TABLE)
  assert_close(got, np_dense(LOOKUP_TABLE, ids_only(rows_of(entries, 4))))


def shared_pair(impl, **kwargs):
  """(column of 'aaa', column of 'bbb'), built from [bbb, aaa] as in TF's
  tests (the order given is the order returned)."""
  a, b = ident("aaa", 3), ident("bbb", 3)
  column_b, column_a = shared_embedding_columns(impl, [b, a], **kwargs)
  assert column_a.categorical_column is a
  assert column_b.categorical_column is b
  return column_a, column_b


# SharedEmbeddingColumnTest.test_defaults
@pytest.mark.parametrize("impl", IMPLS)
def test_v1_shared_embedding_columns_defaults(impl):
  column_a, column_b = shared_pair(impl, dimension=2)
  for column, key in ((column_a, "aaa"), (column_b, "bbb")):
    assert column.get_embedding_table_size() == (3, 2)
    assert column.combiner == "mean"
    assert column.get_initializer() is not None
    assert column._shared_embedding_collection_name == (
        "aaa_bbb_shared_embedding")
    assert column.get_embedding_var_name() == "aaa_bbb_shared_embedding"
    assert column.name == f"{key}_shared_embedding"
    # TF 2.15's public shared columns scope by their own name (TF's private
    # v1 module used the collection name).
    assert column._var_scope_name == column.name
    assert tuple(column.variable_shape.as_list()) == (2,)
    assert column.parse_example_spec == {key: tf.io.VarLenFeature(tf.int64)}
    # The v1 (input_layer) protocol: TF's shared columns refuse it; ours
    # serves it (README: shared columns work in input_layer).
    if impl == "tf":
      with pytest.raises(ValueError, match="input_layer"):
        column._variable_shape  # pylint: disable=pointless-statement
      with pytest.raises(ValueError, match="input_layer"):
        column._parse_example_spec  # pylint: disable=pointless-statement
    else:
      assert tuple(column._variable_shape.as_list()) == (2,)
      assert column._parse_example_spec == {
          key: tf.io.VarLenFeature(tf.int64)}
  assert initializer_config(
      column_a.get_initializer()) == default_initializer_config(2)


# SharedEmbeddingColumnTest.test_all_constructor_args
@pytest.mark.parametrize("impl", IMPLS)
def test_v1_shared_embedding_columns_all_constructor_args(impl):
  a, b = ident("aaa", 3), ident("bbb", 3)
  column_a, column_b = shared_embedding_columns(
      impl, [a, b], dimension=2, combiner="sum",
      initializer=lambda: "my_initializer",
      shared_embedding_collection_name="var_scope_name")
  for column, key in ((column_a, "aaa"), (column_b, "bbb")):
    assert column.combiner == "sum"
    assert column.get_initializer()() == "my_initializer"
    assert column._shared_embedding_collection_name == "var_scope_name"
    assert column.get_embedding_var_name() == "var_scope_name"
    assert column.name == f"{key}_shared_embedding"
    assert column.get_embedding_table_size() == (3, 2)
    assert tuple(column.variable_shape.as_list()) == (2,)
    assert column.parse_example_spec == {key: tf.io.VarLenFeature(tf.int64)}
  assert column_a.categorical_column is a
  assert column_b.categorical_column is b
  if impl == "tf":
    assert shared_embedding_columns(
        impl, [a, b], 2, combiner="my_combiner")[0].combiner == "my_combiner"
  else:
    with pytest.raises(ValueError, match="combiner"):
      shared_embedding_columns(impl, [a, b], 2, combiner="my_combiner")


# SharedEmbeddingColumnTest.test_get_dense_tensor
@pytest.mark.parametrize("impl", IMPLS)
def test_v1_shared_get_dense_tensor_and_input_layer(impl):
  """Dense id inputs padded with -1 through the v1 protocol. TF's public
  shared columns refuse the v1 protocol (and input_layer); ours serves both
  from one table named after the collection (README)."""
  input_a = np.array([[2, -1, -1], [0, 1, -1]])
  input_b = np.array([[0, -1, -1], [-1, -1, -1]])
  features = {"aaa": input_a, "bbb": input_b}
  init = TableInitializer(LOOKUP_TABLE)
  a, b = ident("aaa", 3), ident("bbb", 3)
  column_a, column_b = shared_embedding_columns(impl, [a, b], dimension=2,
                                                initializer=init)
  want_a = np_dense(LOOKUP_TABLE, [[2], [0, 1]])
  want_b = np_dense(LOOKUP_TABLE, [[0], []])
  with tf.Graph().as_default():
    if impl == "tf":
      with pytest.raises(ValueError, match="input_layer"):
        column_a._get_dense_tensor(tf_fc_v1._LazyBuilder(features))
      with pytest.raises(ValueError, match="input_layer"):
        v1.feature_column.input_layer(features, [column_a, column_b])
      return
    lookup_a = column_a._get_dense_tensor(tf_fc_v1._LazyBuilder(features))
    lookup_b = column_b._get_dense_tensor(tf_fc_v1._LazyBuilder(features))
    assert global_variable_names() == ["aaa_bbb_shared_embedding:0"]
    with v1.variable_scope("tower"):
      layer = v1.feature_column.input_layer(features, [column_b, column_a])
    variable, got_a, got_b, got_layer = evaluate(
        [v1.global_variables()[0], lookup_a, lookup_b, layer])
    names = global_variable_names()
  init.assert_called_for_the_table()
  assert_close(variable, LOOKUP_TABLE)
  assert_close(got_a, want_a)
  assert_close(got_b, want_b)
  # input_layer orders columns by name: aaa, bbb.
  assert_close(got_layer, np.concatenate([want_a, want_b], axis=1))
  assert names == ["aaa_bbb_shared_embedding:0",
                   "tower/aaa_bbb_shared_embedding:0"]


# ===========================================================================
# feature_column_v2_test.py
# ===========================================================================


# EmbeddingColumnTestV2.test_defaults
@pytest.mark.parametrize("impl", IMPLS)
def test_v2_embedding_column_defaults(impl):
  categorical = ident("aaa", 3)
  column = embedding_column(impl, categorical, dimension=2)
  assert column.categorical_column is categorical
  assert column.dimension == 2
  assert column.combiner == "mean"
  assert column.name == "aaa_embedding"
  assert tuple(column.variable_shape.as_list()) == (2,)
  assert column.parse_example_spec == {"aaa": tf.io.VarLenFeature(tf.int64)}
  assert column.get_max_sequence_length() == 0
  assert column.get_learning_rate_fn() is None
  assert column.use_safe_embedding_lookup is True
  assert not column.is_sequence_column()
  assert not column.is_categorical_column_weighted()
  assert initializer_config(
      column.get_initializer()) == default_initializer_config(2)


# EmbeddingColumnTestV2.test_all_constructor_args
@pytest.mark.parametrize("impl", IMPLS)
def test_v2_embedding_column_all_constructor_args(impl):
  categorical = seq_ident("aaa", 3)
  column = embedding_column(impl, categorical, dimension=2, combiner="sum",
                            initializer=lambda: "my_initializer",
                            max_sequence_length=4, learning_rate_fn=lr_fn,
                            use_safe_embedding_lookup=False)
  assert column.categorical_column is categorical
  assert column.dimension == 2
  assert column.combiner == "sum"
  assert column.initializer() == "my_initializer"
  assert column.get_initializer()() == "my_initializer"
  assert column.name == "aaa_embedding"
  assert tuple(column.variable_shape.as_list()) == (2,)
  assert column._parse_example_spec == {"aaa": tf.io.VarLenFeature(tf.int64)}
  assert column.get_max_sequence_length() == 4
  assert column.get_learning_rate_fn() is lr_fn
  assert column.use_safe_embedding_lookup is False
  assert column.is_sequence_column()
  assert column.get_sequence_length_feature_key_name() == "aaa_seq_length_"


# EmbeddingColumnTestV2.test_feature_layer_cpu
@pytest.mark.parametrize("use_safe_embedding_lookup", [True, False],
                         ids=["safe", "unsafe"])
@pytest.mark.parametrize("impl", IMPLS)
def test_v2_feature_layer_cpu(impl, use_safe_embedding_lookup):
  # Ids [2], [0, 1], [], [1]; the sequence column reads the same input.
  entries = [(0, 0, 2), (1, 0, 0), (1, 1, 1), (3, 0, 1)]
  init = TableInitializer(LOOKUP_TABLE)
  dense_column = embedding_column(
      impl, ident("aaa", 3), dimension=2, initializer=init,
      use_safe_embedding_lookup=use_safe_embedding_lookup)
  sequence_column = embedding_column(
      impl, seq_ident("bbb", 3), dimension=2, initializer=init,
      max_sequence_length=2,
      use_safe_embedding_lookup=use_safe_embedding_lookup)
  with tf.Graph().as_default():
    value = sparse_value(entries, [4, 2])
    features = {"aaa": value, "bbb": value}
    dense = v1.keras.layers.DenseFeatures([dense_column])(features)
    sequence, lengths = tf.keras.experimental.SequenceFeatures(
        [sequence_column])(features)
    assert variable_shapes() == {
        "dense_features/aaa_embedding/embedding_weights:0": (3, 2),
        "sequence_features/bbb_embedding/embedding_weights:0": (3, 2),
    }
    variable, got_dense, got_sequence, got_lengths = evaluate(
        [v1.global_variables()[0], dense, sequence, lengths])
  init.assert_called_for_the_table()
  rows = rows_of(entries, 4)
  assert_close(variable, LOOKUP_TABLE)
  assert_close(got_dense, np_dense(LOOKUP_TABLE, ids_only(rows)))
  assert_close(got_sequence, np_sequence(LOOKUP_TABLE, rows, 2))
  np.testing.assert_array_equal(got_lengths, [1, 2, 0, 1])


def deepcopy_kinds(impl):
  tensor_core = dict(embedding_lookup_device="tpu_tensor_core",
                     tensor_core_shape=[None, 3])
  return {
      "plain": lambda: embedding_column(impl, ident("aaa", 3), dimension=2),
      "sequence": lambda: embedding_column(
          impl, seq_ident("aaa", 3), dimension=2, max_sequence_length=5,
          learning_rate_fn=lr_fn),
      "tensor_core": lambda: embedding_column(
          impl, ident("aaa", 3), dimension=2, combiner="sum", **tensor_core),
      "cpu_device": lambda: embedding_column(
          impl, ident("aaa", 3), dimension=2, embedding_lookup_device="cpu"),
  }


ACCESSORS = ("get_combiner", "get_embedding_table_size",
             "get_feature_key_name", "get_weight_key_name",
             "get_embedding_var_name", "is_categorical_column_weighted",
             "is_sequence_column", "get_max_sequence_length",
             "get_learning_rate_fn", "get_sequence_length_feature_key_name")


# EmbeddingColumnTestV2.test_deepcopy
@pytest.mark.parametrize("kind", ["plain", "sequence", "tensor_core",
                                  "cpu_device"])
@pytest.mark.parametrize("impl", IMPLS)
def test_v2_deepcopy(impl, kind):
  column = deepcopy_kinds(impl)[kind]()
  column_copy = copy.deepcopy(column)
  assert column_copy is not column
  assert type(column_copy) is type(column)
  assert column_copy.dimension == column.dimension
  assert column_copy._max_sequence_length == column._max_sequence_length
  assert column_copy._learning_rate_fn is column._learning_rate_fn
  assert column_copy.name == column.name
  for accessor in ACCESSORS:
    assert getattr(column_copy, accessor)() == getattr(column, accessor)(), (
        accessor)
  if kind == "tensor_core":
    assert list(column_copy._tensor_core_shape) == [None, 3]
    assert device_name(column_copy) == "TPU_TENSOR_CORE"
  if kind == "cpu_device":
    assert device_name(column_copy) == "CPU"
  if kind == "sequence":
    assert column_copy._max_sequence_length == 5


def tower_model_fn(columns):
  """Uses `columns` in DenseFeatures layers under two variable scopes."""

  def model_fn(features, labels, mode, params):
    del labels, params
    outputs = []
    for scope in ("tower1/scope1", "tower2/scope2"):
      with v1.variable_scope(scope):
        outputs.append(v1.keras.layers.DenseFeatures(columns)(features))
    model_fn.outputs = outputs
    return es.TPUEstimatorSpec(mode, loss=tf.add_n(
        [tf.reduce_sum(o) for o in outputs]), train_op=tf.no_op())

  return model_fn


def run_on_tpu_shard(impl, columns, features):
  """Runs tower_model_fn(columns) inside a TPU training computation: TF's
  columns directly; ours through the model_fn TF's TPUEstimator would call
  (estimator_spec's delegation to TF's TPUEstimator)."""
  model_fn = tower_model_fn(columns)
  with tpu_function.tpu_shard_context(1):
    if impl == "tf":
      model_fn(features, None, es.estimator.ModeKeys.TRAIN, {})
    else:
      spec = es.EmbeddingConfigSpec(
          feature_columns=list(columns),
          optimization_parameters=es.AdagradParameters(0.1))
      interop_tpu.wrap_model_fn(model_fn, spec)(
          features, tf.zeros([2, 1]), es.estimator.ModeKeys.TRAIN,
          {"batch_size": 2}, None)
  return model_fn.outputs


# EmbeddingColumnTestV2.test_with_scope_validation
@pytest.mark.parametrize("impl", IMPLS)
def test_v2_scope_validation_on_tpu(impl):
  """On a TPU, a non-shared column's table has one variable scope: using the
  column under a second scope is refused."""
  column = embedding_column(impl, ident("aaa", 3), dimension=2)
  with tf.Graph().as_default():
    features = {"aaa": tf.ones([2, 2])}
    with raises_like_tensorflow(ValueError,
                                "the variable scope name is different"):
      run_on_tpu_shard(impl, [column], features)


# EmbeddingColumnTestV2.test_bypass_scope_validation
@pytest.mark.parametrize("impl,case", [("tf", "bypass_flag"), ("tf", "shared"),
                                       ("ours", "shared")])
def test_v2_bypass_scope_validation(impl, case):
  """Scope validation is skipped for TF's private bypass flag (not part of
  the public signature, so TF only) and for shared columns, whose table is
  one variable wherever it is used: a TPU computation may use them under two
  variable scopes; the table is recorded once, under the first scope."""
  with tf.Graph().as_default() as graph:
    features = {"aaa": tf.constant([[1.0, 2.0], [3.0, 4.0]])}
    if case == "bypass_flag":
      columns = [tf_tpu_fc_v2._TPUEmbeddingColumnV2(
          categorical_column=ident("aaa", 3), dimension=2,
          bypass_scope_validation=True)]
      recorded_name = "aaa"
      want = ("tower1/scope1/dense_features/aaa_embedding",
              "embedding_weights")
    else:
      columns = shared_embedding_columns(impl, [ident("aaa", 3),
                                                ident("bbb", 3)], dimension=2)
      recorded_name = "aaa_bbb_shared_embedding"
      want = ("tower1/scope1", "aaa_bbb_shared_embedding")
      columns = columns[:1]
    outputs = run_on_tpu_shard(impl, columns, features)
    recorded = graph.get_collection(tf_tpu_fc_v1._TPU_FC_TO_SCOPE)[0]
    assert recorded == {recorded_name: want}
    assert not v1.global_variables()
    got = evaluate(outputs)
  for value in got:
    assert_close(value, [[1.0, 2.0], [3.0, 4.0]])


# SharedEmbeddingColumnTestV2.test_defaults
@pytest.mark.parametrize("impl", IMPLS)
def test_v2_shared_embedding_columns_defaults(impl):
  column_a, column_b = shared_pair(impl, dimension=2)
  for column, key in ((column_a, "aaa"), (column_b, "bbb")):
    assert column.get_embedding_table_size() == (3, 2)
    assert column.combiner == "mean"
    assert column.get_initializer() is not None
    assert column.get_embedding_var_name() == "aaa_bbb_shared_embedding"
    assert column.name == f"{key}_shared_embedding"
    assert tuple(column.variable_shape.as_list()) == (2,)
    assert column.get_max_sequence_length() == 0
    assert column.get_feature_key_name() == key
    assert column.get_weight_key_name() is None
  assert column_a.get_initializer() is column_b.get_initializer()


# SharedEmbeddingColumnTestV2.test_all_constructor_args
@pytest.mark.parametrize("impl", IMPLS)
def test_v2_shared_embedding_columns_all_constructor_args(impl):
  a, b = ident("aaa", 3), seq_ident("bbb", 3)
  column_a, column_b = shared_embedding_columns(
      impl, [a, b], dimension=2, combiner="sqrtn",
      initializer=lambda: "my_initializer",
      shared_embedding_collection_name="var_scope_name",
      max_sequence_lengths=[0, 6], learning_rate_fn=lr_fn,
      use_safe_embedding_lookup=False)
  assert column_a.categorical_column is a
  assert column_b.categorical_column is b
  for column, key in ((column_a, "aaa"), (column_b, "bbb")):
    assert column.get_embedding_table_size() == (3, 2)
    assert column.combiner == "sqrtn"
    assert column.get_initializer()() == "my_initializer"
    assert column.get_embedding_var_name() == "var_scope_name"
    assert column.name == f"{key}_shared_embedding"
    assert tuple(column.variable_shape.as_list()) == (2,)
    assert column.get_learning_rate_fn() is lr_fn
    assert column.use_safe_embedding_lookup is False
  assert column_a.get_max_sequence_length() == 0
  assert column_b.get_max_sequence_length() == 6
  assert not column_a.is_sequence_column() and column_b.is_sequence_column()


# SharedEmbeddingColumnTestV2.test_feature_layer_cpu
@pytest.mark.parametrize("use_safe_embedding_lookup", [True, False],
                         ids=["safe", "unsafe"])
@pytest.mark.parametrize("impl", IMPLS)
def test_v2_shared_feature_layer_cpu(impl, use_safe_embedding_lookup):
  """A dense and a sequence column of one table, with different batch
  sizes (2 and 3)."""
  entries_a = [(0, 0, 2), (1, 0, 0), (1, 1, 1)]
  entries_b = [(0, 0, 2), (1, 0, 0), (1, 1, 1)]
  init = TableInitializer(LOOKUP_TABLE)
  column_a, column_b = shared_embedding_columns(
      impl, [ident("aaa", 3), seq_ident("bbb", 3)], dimension=2,
      initializer=init, max_sequence_lengths=[0, 2],
      use_safe_embedding_lookup=use_safe_embedding_lookup)
  with tf.Graph().as_default():
    features = {"aaa": sparse_value(entries_a, [2, 2]),
                "bbb": sparse_value(entries_b, [3, 2])}
    dense = v1.keras.layers.DenseFeatures([column_a])(features)
    sequence, lengths = tf.keras.experimental.SequenceFeatures([column_b])(
        features)
    assert variable_shapes() == {"aaa_bbb_shared_embedding:0": (3, 2)}
    variable, got_dense, got_sequence, got_lengths = evaluate(
        [v1.global_variables()[0], dense, sequence, lengths])
  init.assert_called_for_the_table()
  assert_close(variable, LOOKUP_TABLE)
  assert_close(got_dense,
               np_dense(LOOKUP_TABLE, ids_only(rows_of(entries_a, 2))))
  assert_close(got_sequence,
               np_sequence(LOOKUP_TABLE, rows_of(entries_b, 3), 2))
  np.testing.assert_array_equal(got_lengths, [1, 2, 0])


# What use_safe_embedding_lookup controls, beyond TF's test above (which
# counts TF's SparseFillEmptyRows ops: 2 with the flag, 1 without; our lookup
# is our own and builds none either way). TF 2.15's CPU path is the oracle:
# valid ids give the same values either way; a negative id is dropped with
# True and fails the lookup with False, except in sequence columns, which TF
# looks up safely whatever the flag.
@pytest.mark.parametrize("shared", [False, True], ids=["own", "shared"])
@pytest.mark.parametrize("use_safe_embedding_lookup", [True, False],
                         ids=["safe", "unsafe"])
def test_use_safe_embedding_lookup_negative_ids_as_tensorflow_cpu(
    use_safe_embedding_lookup, shared):
  # Dense ids [2], [-1, 1], [], [1]; sequence ids [2], [0, -1], [], [1].
  dense_entries = [(0, 0, 2), (1, 0, -1), (1, 1, 1), (3, 0, 1)]
  sequence_entries = [(0, 0, 2), (1, 0, 0), (1, 1, -1), (3, 0, 1)]
  kept_dense = [(b, p, v) for b, p, v in dense_entries if v >= 0]
  kept_sequence = [(b, p, v) for b, p, v in sequence_entries if v >= 0]

  def run(impl, dense_ids, sequence_ids):
    init = TableInitializer(LOOKUP_TABLE)
    kwargs = dict(initializer=init,
                  use_safe_embedding_lookup=use_safe_embedding_lookup)
    if shared:
      dense_column, sequence_column = shared_embedding_columns(
          impl, [ident("aaa"), seq_ident("bbb")], dimension=2,
          max_sequence_lengths=[0, 2], **kwargs)
    else:
      dense_column = embedding_column(impl, ident("aaa"), dimension=2,
                                      **kwargs)
      sequence_column = embedding_column(impl, seq_ident("bbb"), dimension=2,
                                         max_sequence_length=2, **kwargs)
    with tf.Graph().as_default():
      features = {"aaa": sparse_value(dense_ids, [4, 2]),
                  "bbb": sparse_value(sequence_ids, [4, 2])}
      dense = v1.keras.layers.DenseFeatures([dense_column])(features)
      sequence, lengths = tf.keras.experimental.SequenceFeatures(
          [sequence_column])(features)
      try:
        return evaluate([dense, sequence, lengths])
      except tf.errors.InvalidArgumentError as error:
        return error

  expected_dense = np_dense(LOOKUP_TABLE, ids_only(rows_of(kept_dense, 4)))
  expected_sequence = np_sequence(LOOKUP_TABLE, rows_of(kept_sequence, 4), 2)
  # Valid ids: the same values with either setting.
  for impl in IMPLS:
    got_dense, got_sequence, _ = run(impl, kept_dense, kept_sequence)
    assert_close(got_dense, expected_dense)
    assert_close(got_sequence, expected_sequence)
  # A negative id in the sequence column: dropped with either setting (its
  # position stays, as zeros, and counts in the length).
  lengths = {}
  for impl in IMPLS:
    got_dense, got_sequence, lengths[impl] = run(impl, kept_dense,
                                                 sequence_entries)
    assert_close(got_dense, expected_dense)
    assert_close(got_sequence, expected_sequence)
  np.testing.assert_array_equal(lengths["ours"], [1, 2, 0, 1])
  np.testing.assert_array_equal(lengths["ours"], lengths["tf"])
  # A negative id in the non-sequence column.
  results = {impl: run(impl, dense_entries, kept_sequence) for impl in IMPLS}
  if use_safe_embedding_lookup:
    for impl in IMPLS:
      assert_close(results[impl][0], expected_dense)
    return
  assert isinstance(results["tf"], tf.errors.InvalidArgumentError)
  assert isinstance(results["ours"], tf.errors.InvalidArgumentError)
  table = "tbl_aaa_bbb_shared_embedding" if shared else "tbl_aaa"
  # (TF's assert message escapes the quotes around the names.)
  message = results["ours"].message.replace("\\'", "'")
  assert f"Feature 'aaa' (table '{table}')" in message, message
  assert ("negative ids are refused with use_safe_embedding_lookup=False"
          in message), message


@pytest.mark.parametrize("impl", IMPLS)
def test_unsafe_lookup_keeps_trailing_examples_without_ids(impl):
  """use_safe_embedding_lookup=False with the last examples of a batch
  without ids: TF's CPU lookup returns rows only up to the last example that
  has ids (2 rows for a batch of 4); ours gives every example its row (zeros
  for no ids), as with the flag on and as on a TPU."""
  column = embedding_column(impl, ident("aaa"), dimension=2,
                            initializer=TableInitializer(LOOKUP_TABLE),
                            use_safe_embedding_lookup=False)
  entries = [(0, 0, 2), (1, 0, 0), (1, 1, 1)]
  with tf.Graph().as_default():
    dense = v1.keras.layers.DenseFeatures([column])(
        {"aaa": sparse_value(entries, [4, 2])})
    (got,) = evaluate([dense])
  if impl == "tf":
    assert got.shape == (2, 2)
    return
  assert_close(got, np_dense(LOOKUP_TABLE, ids_only(rows_of(entries, 4))))


@pytest.mark.parametrize("combiner", ["mean", "sqrtn"])
@pytest.mark.parametrize("use_safe_embedding_lookup", [True, False],
                         ids=["safe", "unsafe"])
def test_non_positive_weights_count_as_given(use_safe_embedding_lookup,
                                             combiner):
  """A negative weight with 'mean'/'sqrtn': ours combines the weights as
  given, with either setting (docs/numerics.md, 'Lookup'); TF's CPU path
  agrees without the safe lookup, and with it drops the id (its safe lookup
  prunes weights <= 0 except for 'sum')."""
  entries = [(0, 0, 2), (1, 0, 0), (1, 1, 1)]
  weights = [1.0, -0.5, 2.0]
  got = {}
  for impl in IMPLS:
    column = embedding_column(
        impl, fc.weighted_categorical_column(ident("aaa", 3), "aaa_w"),
        dimension=2, combiner=combiner,
        initializer=TableInitializer(LOOKUP_TABLE),
        use_safe_embedding_lookup=use_safe_embedding_lookup)
    with tf.Graph().as_default():
      features = {"aaa": sparse_value(entries, [2, 2]),
                  "aaa_w": sparse_value(
                      [(b, p, w) for (b, p, _), w in zip(entries, weights)],
                      [2, 2], np.float32)}
      (got[impl],) = evaluate(
          [v1.keras.layers.DenseFeatures([column])(features)])
  as_given = np_dense(LOOKUP_TABLE, [[2], [0, 1]], [[1.0], [-0.5, 2.0]],
                      combiner)
  pruned = np_dense(LOOKUP_TABLE, [[2], [1]], [[1.0], [2.0]], combiner)
  assert_close(got["ours"], as_given)
  assert_close(got["tf"], pruned if use_safe_embedding_lookup else as_given)


# SharedEmbeddingColumnTestV2.test_deepcopy
@pytest.mark.parametrize("kind", ["plain", "tensor_core", "sequence"])
@pytest.mark.parametrize("impl", IMPLS)
def test_v2_shared_deepcopy(impl, kind):
  a, b = ident("aaa", 3), ident("bbb", 3)
  kwargs = {}
  if kind == "tensor_core":
    kwargs = dict(combiner="sum", embedding_lookup_device="tpu_tensor_core",
                  tensor_core_shape=[None, 3])
  if kind == "sequence":
    b = seq_ident("bbb", 3)
    kwargs = dict(max_sequence_lengths=[4, 0], learning_rate_fn=lr_fn,
                  shared_embedding_collection_name="my_table")
  columns = shared_embedding_columns(impl, [b, a], dimension=2, **kwargs)
  copies = copy.deepcopy(columns)
  assert [c._shared_embedding_collection_name for c in copies] == [
      c._shared_embedding_collection_name for c in columns]
  for original, column_copy in zip(columns, copies):
    assert column_copy is not original
    assert column_copy.name == original.name
    assert column_copy._max_sequence_length == original._max_sequence_length
    for accessor in ACCESSORS:
      assert getattr(column_copy, accessor)() == getattr(original,
                                                         accessor)(), accessor
    if kind == "tensor_core":
      assert list(column_copy._tensor_core_shape) == [None, 3]
      assert device_name(column_copy) == "TPU_TENSOR_CORE"


# DeviceSpecificEmbeddingColumnTestV2.test_invalid_cases
@pytest.mark.parametrize("with_tensor_core_shape", [True, False],
                         ids=["tensor_core_shape", "no_shape"])
@pytest.mark.parametrize("case", ["cpu_in_training",
                                  "embedding_core_in_inference"])
@pytest.mark.parametrize("shared", [False, True], ids=["single", "shared"])
@pytest.mark.parametrize("impl", IMPLS)
def test_v2_device_specific_invalid_cases(impl, shared, case,
                                          with_tensor_core_shape):
  """TF refuses a 'cpu' lookup outside TPU inference ("training"), and a
  'tpu_embedding_core' lookup inside TPU inference. TF's test also passes
  tensor_core_shape=[None, 3] to these devices; ours refuses that when the
  column is built (README, stricter). Ours treats 'cpu' columns as ordinary
  tables (README): their plain lookup works."""
  device = "cpu" if case == "cpu_in_training" else "tpu_embedding_core"
  kwargs = dict(dimension=2, embedding_lookup_device=device,
                initializer=TableInitializer(LOOKUP_TABLE))
  if with_tensor_core_shape:
    kwargs["tensor_core_shape"] = [None, 3]
  categorical = ident("inp", 3)

  def build():
    if shared:
      return shared_embedding_columns(impl, [categorical], **kwargs)
    return [embedding_column(impl, categorical, **kwargs)]

  entries = [(0, 0, 2), (1, 0, 0), (1, 1, 1), (1, 4, 1)]
  with tf.Graph().as_default():
    features = {"inp": sparse_value(entries, [2, 5])}
    if impl == "ours" and with_tensor_core_shape:
      with pytest.raises(ValueError, match="tensor_core_shape"):
        build()
      return
    columns = build()
    if case == "cpu_in_training":
      if impl == "tf":
        with raises_like_tensorflow(
            ValueError, 'embedding_lookup_device="cpu" during training is '
            "not supported"):
          v1.keras.layers.DenseFeatures(columns)(features)
        return
      out = v1.keras.layers.DenseFeatures(columns)(features)
      got = evaluate(out)
      assert_close(got, np_dense(LOOKUP_TABLE, ids_only(rows_of(entries, 2))))
      return
    with tpu_inference_context():
      with raises_like_tensorflow(
          ValueError, "Using embedding_lookup_device=tpu_embedding_core "
          "during inference is not supported"):
        v1.keras.layers.DenseFeatures(columns)(features)


TENSOR_CORE_TABLE = np.array([[1.0, 2.0], [3.0, 5.0], [7.0, 11.0],
                              [13.0, 17.0]], F32)


def tensor_core_columns(impl, shared, combiner, initializer):
  kwargs = dict(dimension=2, initializer=initializer, combiner=combiner,
                embedding_lookup_device="tpu_tensor_core",
                tensor_core_shape=[None, 3])
  categorical = ident("inp", 4)
  if shared:
    return shared_embedding_columns(impl, [categorical], **kwargs)
  return [embedding_column(impl, categorical, **kwargs)]


# DeviceSpecificEmbeddingColumnTestV2.test_dense_embedding_lookup
@pytest.mark.parametrize("context", ["tpu_inference", "cpu"])
@pytest.mark.parametrize("combiner", ["mean", "sum", "sqrtn"])
@pytest.mark.parametrize("shared", [False, True], ids=["single", "shared"])
@pytest.mark.parametrize("impl", IMPLS)
def test_v2_tensor_core_dense_lookup(impl, shared, combiner, context):
  """Tensor-core lookups: ids at positions >= tensor_core_shape[1] are not
  looked up (example 1 has id 3 at position 4); 'sqrtn' is refused. In TF's
  TPU inference context both sides agree. Off the TPU, TF falls back to its
  full CPU lookup (all ids, any combiner), while ours keeps the tensor-core
  semantics everywhere and refuses 'sqrtn' when the column is built
  (README)."""
  entries = [(0, 0, 2), (1, 0, 0), (1, 1, 1), (1, 4, 3)]
  init = TableInitializer(TENSOR_CORE_TABLE)
  scope = (tpu_inference_context(shard=True) if context == "tpu_inference"
           else contextlib.nullcontext())
  with tf.Graph().as_default():
    features = {"inp": sparse_value(entries, [2, 5])}
    if combiner == "sqrtn" and (impl == "ours" or context == "tpu_inference"):
      with raises_like_tensorflow(ValueError, "does not support combiner"):
        with scope:
          columns = tensor_core_columns(impl, shared, combiner, init)
          v1.keras.layers.DenseFeatures(columns)(features)
      return
    columns = tensor_core_columns(impl, shared, combiner, init)
    with scope:
      out = v1.keras.layers.DenseFeatures(columns)(features)
    want_name = ("inp_shared_embedding:0" if shared else
                 "dense_features/inp_embedding/embedding_weights:0")
    assert variable_shapes() == {want_name: (4, 2)}
    variable, got = evaluate([v1.global_variables()[0], out])
  init.assert_called_for_the_table()
  assert_close(variable, TENSOR_CORE_TABLE)
  full = impl == "tf" and context == "cpu"
  rows = ids_only(rows_of(entries, 2, max_position=None if full else 3))
  assert_close(got, np_dense(TENSOR_CORE_TABLE, rows, combiner=combiner))
  if not full:
    assert not np.allclose(
        got, np_dense(TENSOR_CORE_TABLE, ids_only(rows_of(entries, 2)),
                      combiner=combiner))


# DeviceSpecificEmbeddingColumnTestV2.test_empty_row
@pytest.mark.parametrize("impl", IMPLS)
def test_v2_tensor_core_empty_row(impl):
  entries = [(1, 0, 0), (1, 1, 1), (1, 4, 3)]
  init = TableInitializer(TENSOR_CORE_TABLE)
  columns = tensor_core_columns(impl, False, "mean", init)
  with tf.Graph().as_default():
    features = {"inp": sparse_value(entries, [2, 5])}
    with tpu_inference_context(shard=True):
      out = v1.keras.layers.DenseFeatures(columns)(features)
    assert global_variable_names() == [
        "dense_features/inp_embedding/embedding_weights:0"]
    got = evaluate(out)
  want = np_dense(TENSOR_CORE_TABLE, ids_only(rows_of(entries, 2, 3)))
  assert not want[0].any()
  assert_close(got, want)


# DeviceSpecificEmbeddingColumnTestV2.test_error_dense_shape_invalid
@pytest.mark.parametrize("device", [None, "tpu_tensor_core"])
@pytest.mark.parametrize("shared", [True, False], ids=["shared", "single"])
@pytest.mark.parametrize("impl", IMPLS)
def test_v2_tensor_core_shape_must_be_size_2(impl, shared, device):
  categorical = ident("inp", 5)
  kwargs = dict(dimension=20, tensor_core_shape=[None, 20, 15])
  if device:
    kwargs["embedding_lookup_device"] = device
  with raises_like_tensorflow(ValueError, "tensor_core_shape must be size 2"):
    if shared:
      shared_embedding_columns(impl, [categorical], **kwargs)
    else:
      embedding_column(impl, categorical, **kwargs)


# ===========================================================================
# Extensions: constructor errors, attributes, documented differences and
# required behaviours.
# ===========================================================================

TC = dict(embedding_lookup_device="tpu_tensor_core")

# (name, shared?, kwargs builder, TF's exception type, TF's key phrase).
INVALID_ARGUMENTS = [
    ("not_categorical", False,
     lambda: dict(categorical_column=fc.numeric_column("x"), dimension=2),
     TypeError, "must be type CategoricalColumn"),
    ("not_categorical", True,
     lambda: dict(categorical_columns=[fc.numeric_column("x")], dimension=2),
     TypeError, "must be type CategoricalColumn"),
    ("dimension_0", False, lambda: dict(categorical_column=ident("a"),
                                        dimension=0),
     ValueError, "Invalid dimension"),
    ("dimension_None", False, lambda: dict(categorical_column=ident("a"),
                                           dimension=None),
     ValueError, "Invalid dimension"),
    ("dimension_negative", True,
     lambda: dict(categorical_columns=[ident("a")], dimension=-1),
     ValueError, "Invalid dimension"),
    ("initializer_not_callable", False,
     lambda: dict(categorical_column=ident("a"), dimension=2, initializer=1.0),
     ValueError, "initializer must be callable if specified"),
    ("initializer_not_callable", True,
     lambda: dict(categorical_columns=[ident("a")], dimension=2,
                  initializer="x"),
     ValueError, "initializer must be callable if specified"),
    ("unknown_device", False,
     lambda: dict(categorical_column=ident("a"), dimension=2,
                  embedding_lookup_device="gpu"),
     ValueError, "embedding_lookup_device must be in"),
    ("unknown_device", True,
     lambda: dict(categorical_columns=[ident("a")], dimension=2,
                  embedding_lookup_device="gpu"),
     ValueError, "embedding_lookup_device must be in"),
    ("tensor_core_without_shape", False,
     lambda: dict(categorical_column=ident("a"), dimension=2, **TC),
     ValueError, "requires tensor_core_shape to be set"),
    ("tensor_core_without_shape", True,
     lambda: dict(categorical_columns=[ident("a")], dimension=2, **TC),
     ValueError, "requires tensor_core_shape to be set"),
    ("tensor_core_sequence", False,
     lambda: dict(categorical_column=seq_ident("s"), dimension=2,
                  max_sequence_length=2, tensor_core_shape=[None, 2], **TC),
     ValueError, "does not support sequence columns"),
    ("tensor_core_sequence", True,
     lambda: dict(categorical_columns=[seq_ident("s"), ident("a")],
                  dimension=2, max_sequence_lengths=[2, 0],
                  tensor_core_shape=[None, 2], **TC),
     ValueError, "does not support sequence columns"),
    ("sequence_length_0", False,
     lambda: dict(categorical_column=seq_ident("s"), dimension=2),
     ValueError,
     "max_sequence_length must be greater than 0 for sequence columns"),
    ("sequence_length_0", True,
     lambda: dict(categorical_columns=[seq_ident("s"), ident("a")],
                  dimension=2, max_sequence_lengths=[0, 0]),
     ValueError,
     "max_sequence_length must be greater than 0 for sequence columns"),
    ("non_sequence_length_3", False,
     lambda: dict(categorical_column=ident("a"), dimension=2,
                  max_sequence_length=3),
     ValueError, "Non zero max_seq_length"),
    ("non_sequence_length_3", True,
     lambda: dict(categorical_columns=[ident("a"), ident("b")], dimension=2,
                  max_sequence_lengths=[3, 0]),
     ValueError, "Non zero max_seq_length"),
    ("sequence_lengths_of_other_length", True,
     lambda: dict(categorical_columns=[ident("a"), ident("b")], dimension=2,
                  max_sequence_lengths=[0]),
     ValueError, "must be of the same length"),
    ("different_buckets", True,
     lambda: dict(categorical_columns=[ident("a", 3), ident("b", 4)],
                  dimension=2),
     ValueError,
     "all categorical_columns must have the same number of buckets"),
]


# The raise statements of TF's embedding_column_v2 /
# shared_embedding_columns_v2 / _TPUBaseEmbeddingColumn (the v2 tests'
# "invalid-argument errors"; TF's test file checks only the tensor-core one).
@pytest.mark.parametrize(
    "case", INVALID_ARGUMENTS,
    ids=[f"{'shared' if c[1] else 'single'}-{c[0]}" for c in INVALID_ARGUMENTS])
@pytest.mark.parametrize("impl", IMPLS)
def test_invalid_arguments_raise_tensorflows_error(impl, case):
  _, shared, kwargs, error_type, phrase = case
  with raises_like_tensorflow(error_type, phrase):
    if shared:
      shared_embedding_columns(impl, **kwargs())
    else:
      embedding_column(impl, **kwargs())


CAT_A = ident("a", 12)
CAT_B = ident("b", 12)
CAT_S = seq_ident("s", 12)
WEIGHTED_A = fc.weighted_categorical_column(CAT_A, "a_w")
INIT = tf.compat.v1.constant_initializer(0.5)


def attribute_kinds(impl):
  return {
      "plain": lambda: embedding_column(impl, CAT_A, 4, combiner="sum",
                                        initializer=INIT,
                                        learning_rate_fn=lr_fn),
      "weighted": lambda: embedding_column(impl, WEIGHTED_A, 4,
                                           initializer=INIT),
      "sequence": lambda: embedding_column(impl, CAT_S, 4, initializer=INIT,
                                           max_sequence_length=5,
                                           use_safe_embedding_lookup=False),
      "tensor_core": lambda: embedding_column(
          impl, CAT_A, 4, combiner="sum", initializer=INIT,
          embedding_lookup_device="tpu_tensor_core",
          tensor_core_shape=[None, 7]),
      "cpu": lambda: embedding_column(impl, CAT_A, 4, initializer=INIT,
                                      embedding_lookup_device="cpu"),
      "embedding_core": lambda: embedding_column(
          impl, CAT_A, 4, initializer=INIT,
          embedding_lookup_device="tpu_embedding_core"),
      "shared": lambda: shared_embedding_columns(
          impl, [CAT_A, CAT_B], 4, combiner="sqrtn", initializer=INIT,
          learning_rate_fn=lr_fn)[1],
      "shared_sequence_named": lambda: shared_embedding_columns(
          impl, [WEIGHTED_A, CAT_S], 4, initializer=INIT,
          shared_embedding_collection_name="ab_table",
          max_sequence_lengths=[0, 6])[1],
      "shared_tensor_core": lambda: shared_embedding_columns(
          impl, [CAT_A, CAT_B], 4, combiner="mean", initializer=INIT,
          embedding_lookup_device="tpu_tensor_core",
          tensor_core_shape=[8, 3])[0],
      "shared_cpu": lambda: shared_embedding_columns(
          impl, [CAT_A, CAT_B], 4, initializer=INIT,
          embedding_lookup_device="cpu")[0],
  }


COMMON_ATTRIBUTES = ("name", "combiner", "_max_sequence_length",
                     "_learning_rate_fn", "_var_scope_name", "max_norm",
                     "parse_example_spec", "variable_shape",
                     "use_safe_embedding_lookup")
NON_SHARED_ATTRIBUTES = ("dimension", "initializer", "trainable",
                         "ckpt_to_load_from", "tensor_name_in_ckpt",
                         "_variable_shape", "_parse_example_spec")
SHARED_ATTRIBUTES = ("_shared_embedding_collection_name", "_initializer")


# The attributes user code reads (EmbeddingColumnTestV2.test_defaults /
# test_deepcopy read several; the rest are read by estimator-era code).
@pytest.mark.parametrize("kind", sorted(attribute_kinds("tf")))
def test_attributes_user_code_reads_equal_tensorflow(kind):
  theirs = attribute_kinds("tf")[kind]()
  ours = attribute_kinds("ours")[kind]()
  shared = kind.startswith("shared")
  names = COMMON_ATTRIBUTES + (SHARED_ATTRIBUTES
                               if shared else NON_SHARED_ATTRIBUTES)
  mismatches = {}
  for name in names:
    expected = getattr(theirs, name)
    try:
      actual = getattr(ours, name)
    except AttributeError as error:
      mismatches[name] = f"missing ({error})"
      continue
    if actual != expected:
      mismatches[name] = f"{actual!r} != TF's {expected!r}"
  for accessor in ACCESSORS + ("get_initializer",):
    actual, expected = getattr(ours, accessor)(), getattr(theirs, accessor)()
    if actual != expected:
      mismatches[accessor] = f"{actual!r} != TF's {expected!r}"
  if getattr(ours, "_tpu_categorical_column", None) is not (
      theirs._tpu_categorical_column):
    mismatches["_tpu_categorical_column"] = "missing or another object"
  if ours.categorical_column is not theirs.categorical_column:
    mismatches["categorical_column"] = "another object"
  if "tensor_core" in kind or kind in ("cpu", "embedding_core", "shared_cpu"):
    try:
      if device_name(ours) != device_name(theirs):
        mismatches["_embedding_lookup_device"] = (
            f"{device_name(ours)} != TF's {device_name(theirs)}")
    except AttributeError as error:
      mismatches["_embedding_lookup_device"] = f"missing ({error})"
  if "tensor_core" in kind:
    shape = getattr(ours, "_tensor_core_shape", "missing")
    if shape == "missing" or list(shape) != list(theirs._tensor_core_shape):
      mismatches["_tensor_core_shape"] = (
          f"{shape!r} != TF's {theirs._tensor_core_shape!r}")
  assert not mismatches, "ours differs from TF's column:\n" + "\n".join(
      f"  {name}: {problem}" for name, problem in sorted(mismatches.items()))
  assert theirs.max_norm is None
  if not shared:
    assert theirs.trainable is True and theirs.ckpt_to_load_from is None


# Documented difference (README): sequence outputs outside an engine.
@pytest.mark.parametrize("shared", [False, True], ids=["single", "shared"])
@pytest.mark.parametrize("impl", IMPLS)
def test_sequence_outputs_are_padded_and_truncated_to_max_sequence_length(
    impl, shared):
  """Ours: [batch, L, D] with a static L, ids past L dropped, lengths
  min(length, L). TF's CPU path: the batch's own width, all ids, full
  lengths."""
  long_entries = [(0, 0, 1), (0, 1, 2), (0, 2, 0), (0, 3, 2), (1, 0, 2),
                  (3, 0, 0), (3, 1, 1), (3, 2, 1)]
  short_entries = [(0, 0, 2), (2, 0, 1)]
  init = TableInitializer(LOOKUP_TABLE)
  if shared:
    long_col, short_col = shared_embedding_columns(
        impl, [seq_ident("long", 3), seq_ident("short", 3)], dimension=2,
        initializer=init, max_sequence_lengths=[2, 3])
  else:
    long_col = embedding_column(impl, seq_ident("long", 3), dimension=2,
                                initializer=init, max_sequence_length=2)
    short_col = embedding_column(impl, seq_ident("short", 3), dimension=2,
                                 initializer=init, max_sequence_length=3)
  with tf.Graph().as_default():
    features = {"long": sparse_value(long_entries, [4, 4]),
                "short": sparse_value(short_entries, [3, 1])}
    long_out, long_len = tf.keras.experimental.SequenceFeatures(
        [long_col], name="long_layer")(features)
    short_out, short_len = tf.keras.experimental.SequenceFeatures(
        [short_col], name="short_layer")(features)
    if impl == "ours":
      assert long_out.shape.as_list()[1:] == [2, 2]
      assert short_out.shape.as_list()[1:] == [3, 2]
    got = evaluate([long_out, long_len, short_out, short_len])
  long_rows, short_rows = rows_of(long_entries, 4), rows_of(short_entries, 3)
  long_width, short_width = (4, 1) if impl == "tf" else (2, 3)
  assert_close(got[0], np_sequence(LOOKUP_TABLE, long_rows, long_width))
  assert_close(got[2], np_sequence(LOOKUP_TABLE, short_rows, short_width))
  full_lengths = [len(r) for r in long_rows]
  np.testing.assert_array_equal(
      got[1], full_lengths if impl == "tf" else
      [min(n, 2) for n in full_lengths])
  np.testing.assert_array_equal(got[3], [len(r) for r in short_rows])


# Required behaviour: integer weights of a weighted categorical column.
@pytest.mark.parametrize("layer", ["dense_features", "input_layer"])
@pytest.mark.parametrize("dtype", [tf.int32, tf.int64])
@pytest.mark.parametrize("impl", IMPLS)
def test_integer_weights_are_cast_to_float32(impl, dtype, layer):
  """Ours: integer weights act as their float32 values. TF's CPU path
  refuses them when the layer is built (ValueError, "Bad dtype")."""
  entries = [(0, 0, 2), (1, 0, 0), (1, 1, 1), (3, 0, 1), (3, 1, 1)]
  weight_entries = [(0, 0, 3), (1, 0, 2), (1, 1, 5), (3, 0, 4), (3, 1, 1)]
  values = table(3, 2, seed=5)
  column = embedding_column(
      impl, fc.weighted_categorical_column(ident("aaa", 3), "aaa_w"),
      dimension=2, combiner="mean", initializer=TableInitializer(values))
  with tf.Graph().as_default():
    features = {"aaa": sparse_tensor(entries, [4, 2]),
                "aaa_w": sparse_tensor(weight_entries, [4, 2], dtype)}

    def build():
      if layer == "dense_features":
        return v1.keras.layers.DenseFeatures([column])(features)
      return v1.feature_column.input_layer(features, [column])

    if impl == "tf":
      with pytest.raises(ValueError, match="dtype"):
        build()
      return
    got = evaluate(build())
  rows = ids_only(rows_of(entries, 4))
  weights = ids_only(rows_of(weight_entries, 4))
  assert_close(got, np_dense(values, rows, weights, combiner="mean"))


# Required behaviour: ids past max_sequence_length are never checked.
@pytest.mark.parametrize("impl,kind,bad_id", [
    ("tf", "single", 7),
    ("ours", "single", 7),
    ("ours", "single", -4),
    ("ours", "shared", 7),
    ("ours", "shared", -4),
])
def test_ids_past_max_sequence_length_are_dropped_before_id_checks(
    impl, kind, bad_id):
  """An out-of-range id (or, with use_safe_embedding_lookup=False, a
  negative one) at a position >= max_sequence_length is dropped, not
  refused. TF's CPU path does not truncate, so it looks the id up and
  fails."""
  entries = [(0, 0, 1), (0, 1, 2), (0, 2, bad_id), (1, 0, 0), (1, 3, bad_id)]
  init = TableInitializer(LOOKUP_TABLE)
  kwargs = dict(dimension=2, initializer=init,
                use_safe_embedding_lookup=False)
  if kind == "shared":
    column, _ = shared_embedding_columns(
        impl, [seq_ident("s", 3), ident("other", 3)],
        max_sequence_lengths=[2, 0], **kwargs)
  else:
    column = embedding_column(impl, seq_ident("s", 3), max_sequence_length=2,
                              **kwargs)
  with tf.Graph().as_default():
    features = {"s": sparse_value(entries, [2, 4])}
    out, lengths = tf.keras.experimental.SequenceFeatures([column])(features)
    if impl == "tf":
      with pytest.raises(tf.errors.InvalidArgumentError):
        evaluate(out)
      return
    got, got_lengths = evaluate([out, lengths])
  rows = rows_of(entries, 2, max_position=2)
  assert_close(got, np_sequence(LOOKUP_TABLE, rows, 2))
  np.testing.assert_array_equal(got_lengths, [2, 2])
