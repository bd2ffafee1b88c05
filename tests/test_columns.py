"""Behaviour tests of `tpu_embedding_columns` as ordinary feature columns.

Graph mode throughout (like an Estimator model_fn): every test builds in a
`tf.Graph().as_default()` and runs a `tf.compat.v1.Session`. References:
* variable names and config accessors: TF 2.15's own
  `tf.compat.v1.tpu.experimental.embedding_column` / `shared_embedding_columns`
  on their CPU path, built the same way in a separate graph;
* numbers: NumPy computations written here from docs/numerics.md, 'Lookup', and
  TF's own CPU path where the two semantics agree (no empty rows, no negative
  ids, positive weights).
Expensive graphs are built once per module and reused (placeholders + feeds).
"""

import contextlib
import math
import os
import re

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import hypothesis
from hypothesis import strategies as st
import numpy as np
import pytest
import tensorflow as tf

import tpu_embedding_columns as tec

fc = tf.feature_column
v1 = tf.compat.v1
TF_TPU = tf.compat.v1.tpu.experimental
F32 = np.float32
V = 10  # vocabulary size
D = 3  # dimension
L = 3  # max_sequence_length
COMBINERS = ("sum", "mean", "sqrtn")

IMPLS = {
    "ours": (tec.embedding_column, tec.shared_embedding_columns),
    "tf": (TF_TPU.embedding_column, TF_TPU.shared_embedding_columns),
}


# ---------------------------------------------------------------------------
# Helpers.


def ident(key, buckets=V):
  return fc.categorical_column_with_identity(key, buckets)


def seq_ident(key, buckets=V):
  return fc.sequence_categorical_column_with_identity(key, buckets)


def sparse_value(rows, dtype=np.int64):
  """A SparseTensorValue from ragged rows (row b, position p)."""
  indices, values = [], []
  for b, row in enumerate(rows):
    for p, value in enumerate(row):
      indices.append([b, p])
      values.append(value)
  width = max([len(r) for r in rows] + [1])
  return v1.SparseTensorValue(
      np.array(indices, np.int64).reshape(-1, 2), np.array(values, dtype),
      np.array([len(rows), width], np.int64))


def sparse_const(rows, dtype=np.int64):
  value = sparse_value(rows, dtype)
  return tf.sparse.SparseTensor(value.indices, value.values, value.dense_shape)


def sparse_ph(dtype=tf.int64):
  return v1.sparse_placeholder(dtype, shape=[None, None])


def var_names():
  return sorted(v.name for v in v1.global_variables())


def get_var(name):
  found = [v for v in v1.global_variables() if v.op.name == name]
  assert len(found) == 1, (name, var_names())
  return found[0]


def table_value(seed, vocab=V, dim=D):
  # Multiples of 1/16 keep float32 sums exact enough for tight tolerances.
  rng = np.random.RandomState(seed)
  return (rng.randint(-32, 33, size=(vocab, dim)) / 16.0).astype(F32)


def assign(sess, name, value):
  sess.run(get_var(name).assign(value))


def np_combine(table, rows, weights=None, combiner="sum"):
  """docs/numerics.md, 'Lookup', non-sequence; negative ids dropped."""
  out = np.zeros((len(rows), table.shape[1]), np.float64)
  for b, ids in enumerate(rows):
    ws = [1.0] * len(ids) if weights is None else weights[b]
    pairs = [(i, float(w)) for i, w in zip(ids, ws) if i >= 0]
    if not pairs:
      continue
    total = sum(w * table[i].astype(np.float64) for i, w in pairs)
    if combiner == "sum":
      out[b] = total
    elif combiner == "mean":
      out[b] = total / sum(w for _, w in pairs)
    elif combiner == "sqrtn":
      out[b] = total / math.sqrt(sum(w * w for _, w in pairs))
    else:
      raise AssertionError(combiner)
  return out


def np_sequence(table, rows, max_len):
  out = np.zeros((len(rows), max_len, table.shape[1]), np.float64)
  for b, ids in enumerate(rows):
    for p, i in enumerate(ids[:max_len]):
      out[b, p] = table[i]
  lengths = np.array([min(len(r), max_len) for r in rows], np.int64)
  return out, lengths


def close(actual, expected, rtol=1e-5, atol=1e-5):
  np.testing.assert_allclose(
      np.asarray(actual, np.float64), np.asarray(expected, np.float64),
      rtol=rtol, atol=atol)


def assert_names_feature_and_table(message, feature, table):
  assert table in message, message
  rest = message.replace(table, "")
  assert re.search(r"(?<![A-Za-z0-9_])" + re.escape(feature) +
                   r"(?![A-Za-z0-9_])", rest), message


@contextlib.contextmanager
def maybe_scope(scope):
  if scope is None:
    yield
  else:
    with v1.variable_scope(scope):
      yield


def names_in_fresh_graph(build):
  with tf.Graph().as_default():
    build()
    return var_names()


def expected(prefix_scope, *names):
  prefix = f"{prefix_scope}/" if prefix_scope else ""
  return sorted(f"{prefix}{n}:0" for n in names)


def id_features(*keys, batch=2):
  return {k: sparse_const([[1], [2]][:batch]) for k in keys}


# ---------------------------------------------------------------------------
# 1. Variable names equal TF 2.15's CPU path.


@pytest.mark.parametrize("layer_class", [
    tf.keras.layers.DenseFeatures, tf.compat.v1.keras.layers.DenseFeatures
], ids=["keras", "compat_v1"])
@pytest.mark.parametrize("scope", [None, "model"])
def test_dense_features_variable_names_match_tensorflow(scope, layer_class):

  def build(impl):
    emb, shared = IMPLS[impl]
    feats = id_features("a", "b", "c", "d", "e", "f")
    feats["f_w"] = sparse_const([[1.0], [2.0]], F32)
    columns = [
        emb(ident("a"), D),
        emb(fc.weighted_categorical_column(ident("f"), "f_w"), D)
    ]
    columns += shared([ident("b"), ident("c")], D)
    columns += shared([ident("d"), ident("e")], D,
                      shared_embedding_collection_name="custom_tbl")
    with maybe_scope(scope):
      layer_class(columns)(feats)

  ours = names_in_fresh_graph(lambda: build("ours"))
  assert ours == names_in_fresh_graph(lambda: build("tf"))
  assert ours == expected(scope, "dense_features/a_embedding/embedding_weights",
                          "dense_features/f_weighted_by_f_w_embedding/"
                          "embedding_weights", "b_c_shared_embedding",
                          "custom_tbl")


@pytest.mark.parametrize("scope", [None, "model"])
def test_input_layer_variable_names_match_tensorflow(scope):

  def build(impl):
    emb, _ = IMPLS[impl]
    feats = id_features("a", "b")
    with maybe_scope(scope):
      v1.feature_column.input_layer(feats, [emb(ident("a"), D),
                                            emb(ident("b"), D, "sum")])

  ours = names_in_fresh_graph(lambda: build("ours"))
  assert ours == names_in_fresh_graph(lambda: build("tf"))
  assert ours == expected(scope, "input_layer/a_embedding/embedding_weights",
                          "input_layer/b_embedding/embedding_weights")


def test_trainable_and_collections_match_tensorflow():
  # Two input_layer towers (one untrainable, with weight_collections) and two
  # DenseFeatures layers (one untrainable) over the same columns.
  def build(impl):
    emb, shared = IMPLS[impl]
    feats = id_features("a", "b", "c", "d")
    a, b = emb(ident("a"), D), emb(ident("b"), D)
    shared_cols = shared([ident("c"), ident("d")], D)
    v1.feature_column.input_layer(feats, [a], trainable=False,
                                  weight_collections=["mine"])
    v1.feature_column.input_layer(feats, [a, b])
    tf.keras.layers.DenseFeatures(shared_cols + [a])(feats)
    tf.keras.layers.DenseFeatures(shared_cols + [b], trainable=False)(feats)
    return [sorted(v.name for v in v1.get_collection(k))
            for k in (v1.GraphKeys.GLOBAL_VARIABLES,
                      v1.GraphKeys.TRAINABLE_VARIABLES, "mine")]

  results = {}
  for impl in IMPLS:
    with tf.Graph().as_default():
      results[impl] = build(impl)
  assert results["ours"] == results["tf"]
  global_vars, trainable, mine = results["ours"]
  assert mine == ["input_layer/a_embedding/embedding_weights:0"]
  assert "input_layer/a_embedding/embedding_weights:0" not in trainable
  assert "dense_features_1/b_embedding/embedding_weights:0" not in trainable
  assert "c_d_shared_embedding:0" in trainable
  assert len(global_vars) == 6


@pytest.mark.parametrize("scope", [None, "model"])
def test_sequence_features_variable_names_match_tensorflow(scope):

  def build(impl):
    emb, shared = IMPLS[impl]
    feats = id_features("s", "t", "u")
    seq = emb(seq_ident("s"), D, max_sequence_length=L)
    t_col, u_col = shared([seq_ident("t"), ident("u")], D,
                          max_sequence_lengths=[L, 0])
    with maybe_scope(scope):
      tf.keras.experimental.SequenceFeatures([seq, t_col])(feats)
      tf.keras.layers.DenseFeatures([u_col])(feats)

  ours = names_in_fresh_graph(lambda: build("ours"))
  assert ours == names_in_fresh_graph(lambda: build("tf"))
  assert ours == expected(scope, "sequence_features/s_embedding/"
                          "embedding_weights", "t_u_shared_embedding")


def test_input_layer_refuses_shared_in_tensorflow_but_not_here():
  with tf.Graph().as_default():
    cols = TF_TPU.shared_embedding_columns([ident("a"), ident("b")], D)
    with pytest.raises(ValueError):
      v1.feature_column.input_layer(id_features("a", "b"), cols)


@pytest.mark.parametrize("scope", [None, "model"])
def test_shared_columns_in_input_layer_use_one_variable_named_like_dense_features(
    scope):
  with tf.Graph().as_default():
    feats = id_features("a", "b", "c", "d")
    a_col, b_col = tec.shared_embedding_columns([ident("a"), ident("b")], D)
    c_col, d_col = tec.shared_embedding_columns(
        [ident("c"), ident("d")], D, shared_embedding_collection_name="cd_tbl")
    plain = tec.embedding_column(ident("a"), D)
    with maybe_scope(scope):
      out1 = v1.feature_column.input_layer(feats, [a_col, b_col, c_col, plain])
      # A second tower and a DenseFeatures layer in the same scope reuse the
      # same shared table.
      out2 = v1.feature_column.input_layer(feats, [b_col, d_col])
      out3 = tf.keras.layers.DenseFeatures([a_col, d_col])(feats)
    assert var_names() == expected(scope, "a_b_shared_embedding", "cd_tbl",
                                   "input_layer/a_embedding/embedding_weights")
    prefix = f"{scope}/" if scope else ""
    ab, cd = table_value(1), table_value(2)
    with v1.Session() as sess:
      sess.run(v1.global_variables_initializer())
      assign(sess, prefix + "a_b_shared_embedding", ab)
      assign(sess, prefix + "cd_tbl", cd)
      r1, r2, r3 = sess.run([out1, out2, out3])
  # Columns are concatenated in name order: a_embedding, a_shared, b_shared,
  # c_shared / b_shared, d_shared / a_shared, d_shared. Ids are 1 and 2.
  rows = ab[[1, 2]]
  close(r1[:, D:2 * D], rows)
  close(r1[:, 2 * D:3 * D], rows)
  close(r1[:, 3 * D:], cd[[1, 2]])
  close(r2, np.concatenate([rows, cd[[1, 2]]], axis=1))
  close(r3, np.concatenate([rows, cd[[1, 2]]], axis=1))


def test_shared_table_names_under_partitioner_match_tensorflow():

  def build(impl):
    emb, shared = IMPLS[impl]
    columns = [emb(ident("a"), D)] + shared([ident("a"), ident("b")], D)
    with v1.variable_scope(
        "model", partitioner=v1.fixed_size_partitioner(2)):
      tf.keras.layers.DenseFeatures(columns)(id_features("a", "b"))

  assert names_in_fresh_graph(lambda: build("ours")) == names_in_fresh_graph(
      lambda: build("tf"))


def test_input_layer_partitioned_table_matches_tensorflow_names_and_numbers():
  # A partitioner on the enclosing scope (parameter-server training) gives
  # `div`-partitioned variables, as in TF's CPU path.
  part_tables = [table_value(5, 5), table_value(6, 5)]
  results = {}
  for impl in ("ours", "tf"):
    emb, _ = IMPLS[impl]
    with tf.Graph().as_default():
      feats = {"a": sparse_const([[1, 7], [9], [4, 5, 0]])}
      with v1.variable_scope(
          "model", partitioner=v1.fixed_size_partitioner(2)):
        out = v1.feature_column.input_layer(
            feats, [emb(ident("a"), D, combiner="sum")])
      names = var_names()
      with v1.Session() as sess:
        sess.run(v1.global_variables_initializer())
        for i, value in enumerate(part_tables):
          assign(sess, f"model/input_layer/a_embedding/embedding_weights/"
                 f"part_{i}", value)
        results[impl] = (names, sess.run(out))
  assert results["ours"][0] == results["tf"][0]
  assert results["ours"][0] == [
      "model/input_layer/a_embedding/embedding_weights/part_0:0",
      "model/input_layer/a_embedding/embedding_weights/part_1:0"
  ]
  full = np.concatenate(part_tables)
  close(results["ours"][1], np_combine(full, [[1, 7], [9], [4, 5, 0]]))
  close(results["ours"][1], results["tf"][1])


# ---------------------------------------------------------------------------
# 2. Numerics of non-sequence columns.


class Numerics:
  """One graph with every non-sequence numeric case, fed per test."""

  def __init__(self, impl="ours", with_extra=True, tables_by_name=None):
    emb, _ = IMPLS[impl]
    self.graph = tf.Graph()
    self.outputs = {}
    self.tables = {}
    with self.graph.as_default():
      self.ids = sparse_ph()
      self.weights = sparse_ph(tf.float32)
      self.one = v1.placeholder(tf.int64, [None])
      self.many = sparse_ph()
      feats = {"item": self.ids, "item_w": self.weights, "one": self.one,
               "many": self.many}
      var_of = {}
      for comb in COMBINERS:
        plain = emb(ident("item"), D, combiner=comb)
        weighted = emb(fc.weighted_categorical_column(ident("item"), "item_w"),
                       D, combiner=comb)
        for weighted_flag, col in ((False, plain), (True, weighted)):
          name = f"df_{comb}_{int(weighted_flag)}"
          self.outputs[("df", comb, weighted_flag)] = (
              tf.keras.layers.DenseFeatures([col], name=name)(feats))
          var_of[("df", comb, weighted_flag)] = (
              f"{name}/{col.name}/embedding_weights")
          if with_extra:
            scope = f"il_{comb}_{int(weighted_flag)}"
            with v1.variable_scope(scope):
              self.outputs[("il", comb, weighted_flag)] = (
                  v1.feature_column.input_layer(feats, [col]))
            var_of[("il", comb, weighted_flag)] = (
                f"{scope}/input_layer/{col.name}/embedding_weights")
      if with_extra:
        unsafe = emb(ident("item"), D, combiner="sum",
                     use_safe_embedding_lookup=False)
        self.outputs["unsafe"] = tf.keras.layers.DenseFeatures(
            [unsafe], name="df_unsafe")(feats)
        var_of["unsafe"] = "df_unsafe/item_embedding/embedding_weights"
        for key in ("one", "many"):
          col = emb(ident(key), D, combiner=None)
          self.outputs[("none", key)] = tf.keras.layers.DenseFeatures(
              [col], name=f"df_none_{key}")(feats)
          var_of[("none", key)] = (
              f"df_none_{key}/{key}_embedding/embedding_weights")
      self.var_of = var_of
      self.sess = v1.Session(graph=self.graph)
      self.sess.run(v1.global_variables_initializer())
      for seed, (key, name) in enumerate(sorted(var_of.items(), key=str)):
        if tables_by_name is None:
          self.tables[key] = table_value(100 + seed)
        else:
          self.tables[key] = tables_by_name[name]
        assign(self.sess, name, self.tables[key])
    self.graph.finalize()

  def tables_by_name(self):
    return {self.var_of[k]: v for k, v in self.tables.items()}

  def run(self, key, rows=None, weights=None, one=None, many=None):
    feed = {}
    if rows is not None:
      feed[self.ids] = sparse_value(rows)
      if weights is None:
        weights = [[1.0] * len(r) for r in rows]
      feed[self.weights] = sparse_value(weights, F32)
    if one is not None:
      feed[self.one] = np.asarray(one, np.int64)
    if many is not None:
      feed[self.many] = sparse_value(many)
    return self.sess.run(self.outputs[key], feed)


@pytest.fixture(scope="module")
def numerics():
  n = Numerics()
  yield n
  n.sess.close()


# Duplicates, an empty example, negative ids, an example with only a negative
# id, the vocabulary's last id.
ROWS = [[1, 1, 4], [], [-1, 3], [9, 0, 0, 2], [-2], [5]]
WEIGHTS = [[0.5, 2.0, 1.0], [], [3.0, 0.25], [1.0, 1.5, 0.5, 2.0], [4.0], [3.0]]


@pytest.mark.parametrize("layer", ["df", "il"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("combiner", COMBINERS)
def test_combiners_match_numpy(numerics, layer, combiner, weighted):
  key = (layer, combiner, weighted)
  out = numerics.run(key, ROWS, WEIGHTS if weighted else None)
  assert out.shape == (len(ROWS), D)
  close(out, np_combine(numerics.tables[key], ROWS,
                        WEIGHTS if weighted else None, combiner))
  # Empty example and an example whose only id is negative give zeros.
  assert not out[1].any() and not out[4].any()


def test_dense_output_has_static_dimension(numerics):
  for key, out in numerics.outputs.items():
    assert out.shape.as_list() == [None, D], key


def test_table_variables_are_used_as_assigned(numerics):
  # Each id alone, sum combiner: the output is exactly the assigned row.
  out = numerics.run(("df", "sum", False), [[i] for i in range(V)])
  close(out, numerics.tables[("df", "sum", False)], rtol=0, atol=0)


def test_unsafe_lookup_without_negative_ids_matches_numpy(numerics):
  rows = [[1, 1, 4], [], [9, 0]]
  close(numerics.run("unsafe", rows),
        np_combine(numerics.tables["unsafe"], rows))


def test_unsafe_lookup_refuses_negative_ids_naming_feature_and_table(numerics):
  with pytest.raises(tf.errors.InvalidArgumentError) as info:
    numerics.run("unsafe", [[1], [-1, 2]])
  assert_names_feature_and_table(info.value.message, "item", "tbl_item")


@pytest.mark.parametrize("key", [("df", "sum", False), ("df", "mean", True),
                                 ("il", "sqrtn", False), "unsafe"])
@pytest.mark.parametrize("bad_id", [V, V + 7])
def test_ids_past_the_vocabulary_fail_naming_feature_and_table(
    numerics, key, bad_id):
  with pytest.raises(tf.errors.InvalidArgumentError) as info:
    numerics.run(key, [[1], [2, bad_id]])
  weighted = isinstance(key, tuple) and key[2]
  table = "tbl_item_weighted_by_item_w" if weighted else "tbl_item"
  assert_names_feature_and_table(info.value.message, "item", table)


def test_combiner_none_dense_one_id_per_example_gives_the_row(numerics):
  table = numerics.tables[("none", "one")]
  ids = [3, 0, 9, 3]
  close(numerics.run(("none", "one"), one=ids), table[ids], rtol=0, atol=0)
  table = numerics.tables[("none", "many")]
  close(numerics.run(("none", "many"), many=[[4], [7]]), table[[4, 7]],
        rtol=0, atol=0)


def test_combiner_none_two_ids_in_one_example_fail(numerics):
  with pytest.raises(tf.errors.InvalidArgumentError) as info:
    numerics.run(("none", "many"), many=[[4], [7, 8]])
  assert_names_feature_and_table(info.value.message, "many", "tbl_many")


@hypothesis.settings(max_examples=25, deadline=None)
@hypothesis.given(
    data=st.lists(
        st.lists(
            st.tuples(
                st.integers(-2, V - 1),
                st.floats(0.125, 4.0, width=32)), max_size=5),
        min_size=1, max_size=6),
    combiner=st.sampled_from(COMBINERS),
    weighted=st.booleans(),
    layer=st.sampled_from(["df", "il"]))
def test_random_ids_and_weights_match_numpy(numerics, data, combiner, weighted,
                                            layer):
  rows = [[i for i, _ in r] for r in data]
  weights = [[w for _, w in r] for r in data] if weighted else None
  key = (layer, combiner, weighted)
  close(numerics.run(key, rows, weights),
        np_combine(numerics.tables[key], rows, weights, combiner),
        rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def tf_oracle_numerics(numerics):
  oracle = Numerics("tf", with_extra=False,
                    tables_by_name=numerics.tables_by_name())
  yield oracle
  oracle.sess.close()


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("combiner", COMBINERS)
def test_dense_features_match_tensorflow_cpu_path(numerics, tf_oracle_numerics,
                                                  combiner, weighted):
  # Where the semantics agree: no empty rows, no negative ids, weights > 0.
  rows = [[1, 1, 4], [3], [9, 0, 0, 2], [5, 6]]
  weights = [[0.5, 2.0, 1.0], [0.25], [1.0, 1.5, 0.5, 2.0], [3.0, 1.0]]
  key = ("df", combiner, weighted)
  ours = numerics.run(key, rows, weights if weighted else None)
  theirs = tf_oracle_numerics.run(key, rows, weights if weighted else None)
  close(ours, theirs)
  close(ours, np_combine(numerics.tables[key], rows,
                         weights if weighted else None, combiner))


# ---------------------------------------------------------------------------
# 3. Sequence columns.


@pytest.fixture(scope="module")
def sequence_graph():
  graph = tf.Graph()
  with graph.as_default():
    ids = sparse_ph()
    col = tec.embedding_column(seq_ident("clicks"), D, max_sequence_length=L)
    dense, lengths = tf.keras.experimental.SequenceFeatures([col])(
        {"clicks": ids})
    sess = v1.Session(graph=graph)
    sess.run(v1.global_variables_initializer())
    table = table_value(7)
    assign(sess, "sequence_features/clicks_embedding/embedding_weights", table)
  graph.finalize()

  def run(rows):
    return sess.run([dense, lengths], {ids: sparse_value(rows)})

  yield dense, lengths, table, run
  sess.close()


def test_sequence_features_output_has_static_shape(sequence_graph):
  dense, lengths, _, _ = sequence_graph
  assert dense.shape.as_list() == [None, L, D]
  assert lengths.shape.as_list() == [None]


def test_sequence_activations_pad_truncate_and_report_lengths(sequence_graph):
  _, _, table, run = sequence_graph
  rows = [[1, 2], [], [3, 4, 5, 6, 7], [7], [0, 0, 0], [9, 9, 9, 9]]
  dense, lengths = run(rows)
  want, want_lengths = np_sequence(table, rows, L)
  assert dense.shape == (len(rows), L, D)
  close(dense, want, rtol=0, atol=0)
  np.testing.assert_array_equal(lengths, want_lengths)
  np.testing.assert_array_equal(lengths, [2, 0, 3, 1, 3, 3])
  assert not dense[0, 2].any() and not dense[1].any() and not dense[3, 1:].any()


@hypothesis.settings(max_examples=25, deadline=None)
@hypothesis.given(
    rows=st.lists(
        st.lists(st.integers(0, V - 1), max_size=6), min_size=1, max_size=5))
def test_random_sequences_match_numpy(sequence_graph, rows):
  _, _, table, run = sequence_graph
  dense, lengths = run(rows)
  want, want_lengths = np_sequence(table, rows, L)
  close(dense, want, rtol=0, atol=0)
  np.testing.assert_array_equal(lengths, want_lengths)


def test_non_sequence_column_in_sequence_features_raises_naming_it():
  with tf.Graph().as_default():
    col = tec.embedding_column(ident("plainfeat"), D)
    with pytest.raises(ValueError, match="plainfeat"):
      tf.keras.experimental.SequenceFeatures([col])(id_features("plainfeat"))


@pytest.mark.parametrize("layer", ["df", "il"])
def test_sequence_column_in_dense_layers_raises_naming_it(layer):
  with tf.Graph().as_default():
    col = tec.embedding_column(seq_ident("seqfeat"), D, max_sequence_length=L)
    feats = id_features("seqfeat")
    with pytest.raises(ValueError, match="seqfeat"):
      if layer == "df":
        tf.keras.layers.DenseFeatures([col])(feats)
      else:
        v1.feature_column.input_layer(feats, [col])


def test_shared_sequence_column_in_dense_features_raises_naming_it():
  with tf.Graph().as_default():
    seq, _ = tec.shared_embedding_columns([seq_ident("seqfeat"), ident("x")],
                                          D, max_sequence_lengths=[L, 0])
    with pytest.raises(ValueError, match="seqfeat"):
      tf.keras.layers.DenseFeatures([seq])(id_features("seqfeat"))


# ---------------------------------------------------------------------------
# 4. Raw features through vocabulary-list, hash, crossed, bucketized columns.


def test_raw_feature_columns_match_lookup_of_their_own_ids():
  vocab = ["apple", "banana", "cherry"]
  categoricals = [
      fc.categorical_column_with_vocabulary_list("word", vocab,
                                                 num_oov_buckets=1),
      # default_value=-1: out-of-vocabulary words give -1, which is dropped.
      fc.categorical_column_with_vocabulary_list("word2", vocab),
      fc.categorical_column_with_hash_bucket("tag", 7),
      fc.crossed_column(["word", "tag"], 11),
      fc.bucketized_column(fc.numeric_column("price"), [1.0, 2.0, 5.0]),
  ]
  words = [["apple", "kiwi", "cherry"], [], ["banana", "banana"]]
  tags = [["x", "y"], ["z"], ["x"]]
  prices = [[0.5], [3.0], [7.5]]
  with tf.Graph().as_default():
    word = sparse_ph(tf.string)
    tag = sparse_ph(tf.string)
    price = v1.placeholder(tf.float32, [None, 1])
    feats = {"word": word, "word2": word, "tag": tag, "price": price}
    columns = [tec.embedding_column(c, D, combiner="mean")
               for c in categoricals]
    out_df = tf.keras.layers.DenseFeatures(columns)(feats)
    with v1.variable_scope("raw"):
      out_il = v1.feature_column.input_layer(feats, columns)
    cache = tf.__internal__.feature_column.FeatureTransformationCache(feats)
    id_tensors = [c.get_sparse_tensors(cache, None).id_tensor
                  for c in categoricals]
    feed = {word: sparse_value(words, object), tag: sparse_value(tags, object),
            price: np.array(prices, F32)}
    tables = {}
    with v1.Session() as sess:
      sess.run([v1.global_variables_initializer(), v1.tables_initializer()])
      for seed, col in enumerate(columns):
        tables[col.name] = table_value(200 + seed, vocab=col.vocabulary_size)
        assign(sess, f"dense_features/{col.name}/embedding_weights",
               tables[col.name])
        assign(sess, f"raw/input_layer/{col.name}/embedding_weights",
               tables[col.name])
      got_df, got_il, ids = sess.run([out_df, out_il, id_tensors], feed)
  by_hand = {}
  for col, sparse in zip(columns, ids):
    rows = [[] for _ in range(3)]
    for (b, _), i in zip(sparse.indices, sparse.values):
      rows[b].append(int(i))
    by_hand[col.name] = np_combine(tables[col.name], rows, combiner="mean")
  # The transforms really produced ids: OOV, hashing, crossing, bucketing.
  assert by_hand["word2_embedding"][0].any()
  assert [c.vocabulary_size for c in columns] == [4, 3, 7, 11, 4]
  want = np.concatenate([by_hand[n] for n in sorted(by_hand)], axis=1)
  close(got_df, want)
  close(got_il, want)
  # word2: 'kiwi' is -1 and dropped, so the mean is over apple and cherry.
  idx = sorted(by_hand).index("word2_embedding")
  close(got_df[0, idx * D:(idx + 1) * D],
        (tables["word2_embedding"][0] + tables["word2_embedding"][2]) / 2)


# ---------------------------------------------------------------------------
# 5. Tensor-core columns.


@pytest.mark.parametrize("layer", ["df", "il"])
def test_tensor_core_columns_ignore_ids_past_k(layer):
  k = 2
  rows = [[1, 2, 3], [4], [], [5, 6, 7, 8], [6, 6, 6]]
  with tf.Graph().as_default():
    feats = {"tc": sparse_const(rows)}
    cols = [tec.embedding_column(ident("tc"), D, combiner=comb,
                                 embedding_lookup_device="tpu_tensor_core",
                                 tensor_core_shape=[None, k])
            for comb in ("sum", "mean")]
    outs = []
    for i, col in enumerate(cols):
      if layer == "df":
        outs.append(tf.keras.layers.DenseFeatures([col], name=f"s{i}")(feats))
      else:
        with v1.variable_scope(f"s{i}"):
          outs.append(v1.feature_column.input_layer(feats, [col]))
    prefix = "" if layer == "df" else "/input_layer"
    table = table_value(11)
    with v1.Session() as sess:
      sess.run(v1.global_variables_initializer())
      for i in range(2):
        assign(sess, f"s{i}{prefix}/tc_embedding/embedding_weights", table)
      got_sum, got_mean = sess.run(outs)
  truncated = [r[:k] for r in rows]
  close(got_sum, np_combine(table, truncated, combiner="sum"))
  close(got_mean, np_combine(table, truncated, combiner="mean"))
  assert not np.allclose(got_sum, np_combine(table, rows, combiner="sum"))


# ---------------------------------------------------------------------------
# 6. Shared columns.


def test_shared_columns_look_up_rows_of_one_table():
  q_rows = [[1, 2], [], [9, 9, 0]]
  t_rows = [[2], [3, -1], [4]]
  with tf.Graph().as_default():
    feats = {"q": sparse_const(q_rows), "t": sparse_const(t_rows)}
    q_col, t_col = tec.shared_embedding_columns(
        [ident("q"), ident("t")], D, combiner="sum",
        shared_embedding_collection_name="qt")
    out_df = tf.keras.layers.DenseFeatures([t_col, q_col])(feats)
    out_il = v1.feature_column.input_layer(feats, [q_col, t_col])
    assert var_names() == ["qt:0"]
    table = table_value(12)
    with v1.Session() as sess:
      sess.run(v1.global_variables_initializer())
      assign(sess, "qt", table)
      got_df, got_il = sess.run([out_df, out_il])
  want = np.concatenate([np_combine(table, q_rows), np_combine(table, t_rows)],
                        axis=1)
  close(got_df, want)
  close(got_il, want)


@pytest.mark.parametrize("kind", ["dense", "sequence"])
def test_shared_ids_past_the_vocabulary_fail_naming_feature_and_table(kind):
  with tf.Graph().as_default():
    query = sparse_ph()  # fed, so the check runs when the graph runs
    feats = {"query": query, "title": sparse_const([[1]])}
    if kind == "dense":
      q_col, _ = tec.shared_embedding_columns(
          [ident("query"), ident("title")], D,
          shared_embedding_collection_name="vocab")
      out = tf.keras.layers.DenseFeatures([q_col])(feats)
    else:
      q_col, _ = tec.shared_embedding_columns(
          [seq_ident("query"), ident("title")], D,
          shared_embedding_collection_name="vocab",
          max_sequence_lengths=[L, 0])
      out = tf.keras.experimental.SequenceFeatures([q_col])(feats)[0]
    with v1.Session() as sess:
      sess.run(v1.global_variables_initializer())
      sess.run(out, {query: sparse_value([[1], [V - 1]])})
      with pytest.raises(tf.errors.InvalidArgumentError) as info:
        sess.run(out, {query: sparse_value([[1], [V]])})
  assert_names_feature_and_table(info.value.message, "query", "tbl_vocab")


def test_shared_group_mixing_sequence_and_non_sequence_members():
  s_rows = [[1, 2, 3, 4], [5]]
  d_rows = [[1, 5], [8]]
  with tf.Graph().as_default():
    feats = {"sq": sparse_const(s_rows), "dn": sparse_const(d_rows)}
    sq_col, dn_col = tec.shared_embedding_columns(
        [seq_ident("sq"), ident("dn")], D, combiner="mean",
        max_sequence_lengths=[L, 0])
    dense, lengths = tf.keras.experimental.SequenceFeatures([sq_col])(feats)
    out_df = tf.keras.layers.DenseFeatures([dn_col])(feats)
    out_il = v1.feature_column.input_layer(feats, [dn_col])
    assert var_names() == ["dn_sq_shared_embedding:0"]
    assert dense.shape.as_list()[1:] == [L, D]
    table = table_value(13)
    with v1.Session() as sess:
      sess.run(v1.global_variables_initializer())
      assign(sess, "dn_sq_shared_embedding", table)
      got = sess.run([dense, lengths, out_df, out_il])
  want_seq, want_len = np_sequence(table, s_rows, L)
  close(got[0], want_seq)
  np.testing.assert_array_equal(got[1], want_len)
  close(got[2], np_combine(table, d_rows, combiner="mean"))
  close(got[3], np_combine(table, d_rows, combiner="mean"))


# ---------------------------------------------------------------------------
# 7. The engine hook.


CODES = {"a_embedding": 1, "a_shared_embedding": 2, "b_shared_embedding": 3,
         "s_embedding": 4, "w_weighted_by_w_w_embedding": 5,
         "t_shared_embedding": 6, "cpu_embedding": 7}
BATCH = 2


def fake_value(column, shape):
  return (CODES[column.name] * 100 + np.arange(np.prod(shape)).reshape(shape)
         ).astype(F32)


class FakeSource(tec.ActivationSource):
  """Records registrations and hands out constant activations."""

  def __init__(self):
    self.registered = []
    self.calls = []

  def register_variable(self, column, variable_name):
    self.registered.append((column.name, variable_name))

  def dense_activation(self, column):
    self.calls.append(("dense", column.name))
    return tf.constant(fake_value(column, (BATCH, column.dimension)))

  def sequence_activation(self, column):
    self.calls.append(("sequence", column.name))
    return (tf.constant(
        fake_value(column, (BATCH, column.max_sequence_length,
                            column.dimension))),
            tf.constant(np.array([1, 3], np.int64)))


def hook_columns():
  a = tec.embedding_column(ident("a"), D)
  w = tec.embedding_column(fc.weighted_categorical_column(ident("w"), "w_w"), D)
  sa, sb = tec.shared_embedding_columns([ident("a"), ident("b")], D)
  s = tec.embedding_column(seq_ident("s"), D, max_sequence_length=L)
  return a, w, sa, sb, s


@pytest.mark.parametrize("scope", [None, "model"])
def test_activation_source_feeds_all_layers_without_variables(scope):
  fake = FakeSource()
  with tf.Graph().as_default():
    feats = id_features("a", "b", "s", "w")
    feats["w_w"] = sparse_const([[1.0], [2.0]], F32)
    a, w, sa, sb, s = hook_columns()
    with tec.activation_source(fake), maybe_scope(scope):
      out_df = tf.keras.layers.DenseFeatures([sb, a, w, sa])(feats)
      out_il = v1.feature_column.input_layer(feats, [a, sa, sb])
      dense, lengths = tf.keras.experimental.SequenceFeatures([s])(feats)
    assert v1.global_variables() == []
    assert dense.shape.as_list()[1:] == [L, D]
    with v1.Session() as sess:
      got_df, got_il, got_dense, got_len = sess.run(
          [out_df, out_il, dense, lengths])
  by_name = {c.name: fake_value(c, (BATCH, D)) for c in (a, w, sa, sb)}
  close(got_df, np.concatenate([by_name[n] for n in sorted(by_name)], axis=1),
        rtol=0, atol=0)
  close(got_il, np.concatenate(
      [by_name[n] for n in ("a_embedding", "a_shared_embedding",
                            "b_shared_embedding")], axis=1), rtol=0, atol=0)
  close(got_dense, fake_value(s, (BATCH, L, D)), rtol=0, atol=0)
  np.testing.assert_array_equal(got_len, [1, 3])
  p = f"{scope}/" if scope else ""
  # Shared tables and input_layer register the names a plain lookup creates.
  # (tf.keras.layers.DenseFeatures' non-shared names: see the regression
  # test below.)
  registered = set(fake.registered)
  assert {
      ("a_shared_embedding", p + "a_b_shared_embedding"),
      ("b_shared_embedding", p + "a_b_shared_embedding"),
      ("a_embedding", p + "input_layer/a_embedding/embedding_weights"),
      ("s_embedding", p + "sequence_features/s_embedding/embedding_weights"),
  } <= registered
  assert {c for c, _ in registered} == {"a_embedding", "a_shared_embedding",
                                        "b_shared_embedding", "s_embedding",
                                        "w_weighted_by_w_w_embedding"}
  assert {c for _, c in fake.calls} == {"a_embedding", "a_shared_embedding",
                                        "b_shared_embedding", "s_embedding",
                                        "w_weighted_by_w_w_embedding"}


# Regression: tf.keras.layers.DenseFeatures (dense_features_v2) opens only a
# name_scope around create_state, so the registered name must follow the name
# scope there (it once followed the variable scope and lost the layer name).


@pytest.mark.parametrize("scope", [None, "model"])
def test_keras_dense_features_registers_the_plain_lookup_name(scope):
  fake = FakeSource()
  with tf.Graph().as_default():
    feats = id_features("a")
    a = tec.embedding_column(ident("a"), D)
    with tec.activation_source(fake), maybe_scope(scope):
      tf.keras.layers.DenseFeatures([a])(feats)
  p = f"{scope}/" if scope else ""
  assert set(fake.registered) == {
      ("a_embedding", p + "dense_features/a_embedding/embedding_weights")}


@pytest.mark.parametrize("scope", [None, "model"])
def test_v1_dense_features_registers_the_plain_lookup_name(scope):
  def build():
    a, w, sa, _, _ = hook_columns()
    feats = id_features("a", "b", "w")
    feats["w_w"] = sparse_const([[1.0], [2.0]], F32)
    with maybe_scope(scope):
      tf.compat.v1.keras.layers.DenseFeatures([a, w, sa])(feats)

  plain = names_in_fresh_graph(build)
  assert plain == expected(
      scope, "dense_features/a_embedding/embedding_weights",
      "dense_features/w_weighted_by_w_w_embedding/embedding_weights",
      "a_b_shared_embedding")
  fake = FakeSource()
  with tf.Graph().as_default():
    with tec.activation_source(fake):
      build()
    assert v1.global_variables() == []
  assert sorted({n + ":0" for _, n in fake.registered}) == plain


@pytest.mark.parametrize("scope", [None, "model"])
def test_sequence_features_register_the_plain_lookup_names(scope):
  def build():
    feats = id_features("s", "t", "u")
    s = tec.embedding_column(seq_ident("s"), D, max_sequence_length=L)
    t_col, _ = tec.shared_embedding_columns([seq_ident("t"), ident("u")], D,
                                            max_sequence_lengths=[L, 0])
    with maybe_scope(scope):
      return tf.keras.experimental.SequenceFeatures([s, t_col])(feats)

  plain = names_in_fresh_graph(build)
  assert plain == expected(scope,
                           "sequence_features/s_embedding/embedding_weights",
                           "t_u_shared_embedding")
  fake = FakeSource()
  with tf.Graph().as_default():
    with tec.activation_source(fake):
      dense, lengths = build()
    assert v1.global_variables() == []
    with v1.Session() as sess:
      got, got_len = sess.run([dense, lengths])
  assert sorted({n + ":0" for _, n in fake.registered}) == plain
  assert {c for c, _ in fake.registered} == {"s_embedding",
                                            "t_shared_embedding"}
  assert got.shape == (BATCH, L, 2 * D)
  np.testing.assert_array_equal(got_len, [1, 3])


def test_registered_names_equal_plain_lookup_names():
  # The same model built without a source creates exactly the variables the
  # source was told about.
  def build():
    feats = id_features("a", "b", "s", "w")
    feats["w_w"] = sparse_const([[1.0], [2.0]], F32)
    a, w, sa, sb, s = hook_columns()
    with v1.variable_scope("tower"):
      tf.keras.layers.DenseFeatures([a, w, sa])(feats)
      v1.feature_column.input_layer(feats, [a, sb])
      tf.keras.experimental.SequenceFeatures([s])(feats)

  plain = names_in_fresh_graph(build)
  fake = FakeSource()
  with tf.Graph().as_default():
    with tec.activation_source(fake):
      build()
    assert v1.global_variables() == []
  assert sorted({n + ":0" for _, n in fake.registered}) == plain


def test_tensor_core_columns_ignore_the_source_cpu_columns_use_it():
  fake = FakeSource()
  rows = [[1, 2, 3], [4]]
  with tf.Graph().as_default():
    feats = {"a": sparse_const([[1], [2]]), "tc": sparse_const(rows),
             "cpu": sparse_const(rows)}
    a = tec.embedding_column(ident("a"), D)
    tc = tec.embedding_column(ident("tc"), D, combiner="sum",
                              embedding_lookup_device="tpu_tensor_core",
                              tensor_core_shape=[None, 2])
    cpu = tec.embedding_column(ident("cpu"), D, combiner="sum",
                               embedding_lookup_device="cpu")
    with tec.activation_source(fake):
      out = tf.keras.layers.DenseFeatures([a, tc, cpu])(feats)
      with v1.variable_scope("v1"):
        out_il = v1.feature_column.input_layer(feats, [tc, cpu])
    assert var_names() == [
        "dense_features/tc_embedding/embedding_weights:0",
        "v1/input_layer/tc_embedding/embedding_weights:0",
    ]
    assert {c for _, c in fake.calls} == {"a_embedding", "cpu_embedding"}
    assert {c for c, _ in fake.registered} == {"a_embedding", "cpu_embedding"}
    t_tc = table_value(21)
    with v1.Session() as sess:
      sess.run(v1.global_variables_initializer())
      for prefix in ("dense_features", "v1/input_layer"):
        assign(sess, f"{prefix}/tc_embedding/embedding_weights", t_tc)
      got, got_il = sess.run([out, out_il])
  want_tc = np_combine(t_tc, [r[:2] for r in rows])
  close(got[:, :D], fake_value(a, (BATCH, D)), rtol=0, atol=0)
  close(got[:, 2 * D:], want_tc)
  close(got[:, D:2 * D], fake_value(cpu, (BATCH, D)), rtol=0, atol=0)
  close(got_il[:, D:], want_tc)
  close(got_il[:, :D], fake_value(cpu, (BATCH, D)), rtol=0, atol=0)


def test_source_is_gone_after_the_with_block_and_is_per_graph():
  fake = FakeSource()
  with tf.Graph().as_default() as graph:
    feats = id_features("a")
    with tec.activation_source(fake):
      with tf.Graph().as_default():  # another graph does not see the source
        tf.keras.layers.DenseFeatures([tec.embedding_column(ident("a"), D)])(
            id_features("a"))
        assert var_names() == ["dense_features/a_embedding/embedding_weights:0"]
      assert fake.registered == [] and fake.calls == []
    out = tf.keras.layers.DenseFeatures([tec.embedding_column(ident("a"), D)])(
        feats)
    assert fake.registered == [] and fake.calls == []
    assert var_names() == ["dense_features/a_embedding/embedding_weights:0"]
    assert graph is tf.compat.v1.get_default_graph()
    table = table_value(23)
    with v1.Session() as sess:
      sess.run(v1.global_variables_initializer())
      assign(sess, "dense_features/a_embedding/embedding_weights", table)
      close(sess.run(out), table[[1, 2]])


def test_innermost_source_wins_and_outer_is_restored():
  outer, inner = FakeSource(), FakeSource()
  with tf.Graph().as_default():
    feats = id_features("a")
    with tec.activation_source(outer):
      with tec.activation_source(inner):
        tf.keras.layers.DenseFeatures([tec.embedding_column(ident("a"), D)])(
            feats)
      assert inner.calls and not outer.calls
      tf.keras.layers.DenseFeatures([tec.embedding_column(ident("a"), D)])(
          feats)
      assert outer.calls
    assert v1.global_variables() == []


def test_activation_source_refuses_other_objects():
  with tf.Graph().as_default():
    with pytest.raises(TypeError):
      with tec.activation_source(object()):
        pass


# ---------------------------------------------------------------------------
# 8. Config-facing properties and TF-compatible accessors.


def lr_fn(step):
  return 0.1 * tf.cast(step, tf.float32)


def make_column(impl, kind):
  emb, shared = IMPLS[impl]
  if kind == "plain":
    return emb(ident("a", 12), 4, combiner="sum", learning_rate_fn=lr_fn)
  if kind == "weighted":
    return emb(fc.weighted_categorical_column(ident("a", 12), "a_w"), 4)
  if kind == "sequence":
    return emb(seq_ident("s", 12), 4, max_sequence_length=5)
  if kind == "shared":
    return shared([ident("a", 12), ident("b", 12)], 4, combiner="sqrtn")[1]
  if kind == "shared_weighted_named":
    return shared([fc.weighted_categorical_column(ident("b", 12), "b_w"),
                   ident("a", 12)], 4,
                  shared_embedding_collection_name="ab_table")[0]
  if kind == "shared_sequence":
    return shared([ident("c", 12), seq_ident("s", 12)], 4,
                  max_sequence_lengths=[0, 6])[1]
  raise AssertionError(kind)


EXPECTED_PROPERTIES = {
    # feature_key, weight_key, embedding_var_name, seq length, sequence key
    "plain": ("a", None, "a", 0),
    "weighted": ("a", "a_w", "a_weighted_by_a_w", 0),
    "sequence": ("s", None, "s", 5),
    "shared": ("b", None, "a_b_shared_embedding", 0),
    "shared_weighted_named": ("b", "b_w", "ab_table", 0),
    "shared_sequence": ("s", None, "c_s_shared_embedding", 6),
}


@pytest.mark.parametrize("kind", sorted(EXPECTED_PROPERTIES))
def test_config_properties(kind):
  col = make_column("ours", kind)
  feature, weight, var_name, max_len = EXPECTED_PROPERTIES[kind]
  assert col.feature_key == feature
  assert col.weight_key == weight
  assert col.embedding_var_name == var_name
  assert col.table_name == "tbl_" + var_name
  assert col.vocabulary_size == 12
  assert col.dimension == 4
  assert col.max_sequence_length == max_len
  assert col.sequence_length_feature_key == feature + "_seq_length_"


@pytest.mark.parametrize("kind", sorted(EXPECTED_PROPERTIES))
def test_tf_compatible_accessors_equal_tensorflow(kind):
  ours, theirs = make_column("ours", kind), make_column("tf", kind)
  for accessor in ("get_feature_key_name", "get_weight_key_name",
                   "get_embedding_var_name", "get_embedding_table_size",
                   "get_combiner", "get_max_sequence_length",
                   "is_sequence_column", "is_categorical_column_weighted",
                   "get_sequence_length_feature_key_name",
                   "get_learning_rate_fn"):
    assert getattr(ours, accessor)() == getattr(theirs, accessor)(), accessor
  assert ours.name == theirs.name
  assert ours.parse_example_spec == theirs.parse_example_spec
  assert ours.variable_shape == theirs.variable_shape
  assert ours.get_embedding_table_size() == (12, 4)


def test_custom_initializer_is_used_and_returned():
  init = tf.compat.v1.constant_initializer(0.25)
  col = tec.embedding_column(ident("a"), D, initializer=init)
  assert col.get_initializer() is init
  with tf.Graph().as_default():
    out = tf.keras.layers.DenseFeatures([col])(id_features("a"))
    with v1.Session() as sess:
      sess.run(v1.global_variables_initializer())
      close(sess.run(out), np.full((2, D), 0.25))


def test_default_initializer_is_truncated_normal_with_stddev_one_over_sqrt_d():
  dim = 16
  with tf.Graph().as_default():
    col = tec.embedding_column(ident("a", 2000), dim)
    tf.keras.layers.DenseFeatures([col])(id_features("a"))
    with v1.Session() as sess:
      sess.run(v1.global_variables_initializer())
      value = sess.run(get_var("dense_features/a_embedding/embedding_weights"))
  stddev = 1 / math.sqrt(dim)
  assert np.abs(value).max() <= 2 * stddev + 1e-6  # truncated at 2 stddev
  # A normal truncated at 2 sigma has std ~0.88 sigma.
  assert 0.85 * stddev < value.std() < 0.91 * stddev
  assert abs(value.mean()) < 0.05 * stddev


# ---------------------------------------------------------------------------
# 9. Training in a plain Estimator-style graph.


def test_gradient_descent_changes_only_looked_up_rows():
  rows = [[1, 1, 4], [2], [], [4, -1]]
  weights = [[1.0, 2.0, 0.5], [3.0], [], [2.0, 7.0]]
  lr = 0.5
  grad_out = np.random.RandomState(3).uniform(-1, 1, (len(rows), D)).astype(F32)
  with tf.Graph().as_default():
    feats = {"item": sparse_const(rows), "item_w": sparse_const(weights, F32)}
    col = tec.embedding_column(
        fc.weighted_categorical_column(ident("item"), "item_w"), D,
        combiner="mean")
    out = tf.keras.layers.DenseFeatures([col])(feats)
    loss = tf.reduce_sum(out * grad_out)
    train = v1.train.GradientDescentOptimizer(lr).minimize(loss)
    name = "dense_features/item_weighted_by_item_w_embedding/embedding_weights"
    table_var = get_var(name)
    assert table_var in v1.trainable_variables()
    table = table_value(31)
    with v1.Session() as sess:
      sess.run(v1.global_variables_initializer())
      assign(sess, name, table)
      sess.run(train)
      after = sess.run(table_var)
  want = table.astype(np.float64).copy()
  for b, (ids, ws) in enumerate(zip(rows, weights)):
    kept = [(i, w) for i, w in zip(ids, ws) if i >= 0]
    total = sum(w for _, w in kept)
    for i, w in kept:
      want[i] -= lr * grad_out[b] * w / total
  close(after, want)
  untouched = [r for r in range(V) if r not in (1, 2, 4)]
  np.testing.assert_array_equal(after[untouched], table[untouched])
  assert not np.array_equal(after[[1, 2, 4]], table[[1, 2, 4]])


def test_shared_table_in_input_layer_trains_with_summed_gradients():
  q_rows = [[1, 3], [2]]
  t_rows = [[3], [3, 5]]
  lr = 0.25
  with tf.Graph().as_default():
    feats = {"q": sparse_const(q_rows), "t": sparse_const(t_rows)}
    cols = tec.shared_embedding_columns([ident("q"), ident("t")], D,
                                        combiner="sum")
    with v1.variable_scope("model"):
      out = v1.feature_column.input_layer(feats, cols)
    loss = tf.reduce_sum(out)
    global_step = v1.train.get_or_create_global_step()
    train = v1.train.GradientDescentOptimizer(lr).minimize(
        loss, global_step=global_step)
    table_var = get_var("model/q_t_shared_embedding")
    assert v1.trainable_variables() == [table_var]
    table = table_value(32)
    with v1.Session() as sess:
      sess.run(v1.global_variables_initializer())
      assign(sess, "model/q_t_shared_embedding", table)
      sess.run(train)
      after = sess.run(table_var)
  counts = np.zeros(V)
  for ids in q_rows + t_rows:
    for i in ids:
      counts[i] += 1
  close(after, table - lr * counts[:, None])


def test_sequence_training_leaves_truncated_ids_untouched():
  rows = [[1, 2, 3, 8, 9], [2]]  # 8 and 9 lie past max_sequence_length
  lr = 0.5
  with tf.Graph().as_default():
    col = tec.embedding_column(seq_ident("clicks"), D, max_sequence_length=L)
    dense, _ = tf.keras.experimental.SequenceFeatures([col])(
        {"clicks": sparse_const(rows)})
    train = v1.train.GradientDescentOptimizer(lr).minimize(
        tf.reduce_sum(dense))
    name = "sequence_features/clicks_embedding/embedding_weights"
    table = table_value(33)
    with v1.Session() as sess:
      sess.run(v1.global_variables_initializer())
      assign(sess, name, table)
      sess.run(train)
      after = sess.run(get_var(name))
  counts = np.zeros(V)
  for ids in rows:
    for i in ids[:L]:
      counts[i] += 1
  close(after, table - lr * counts[:, None])
  np.testing.assert_array_equal(after[[0, 4, 5, 6, 7, 8, 9]],
                                table[[0, 4, 5, 6, 7, 8, 9]])
