"""Oracle test: our infeed (split_inputs + enqueue ops) against TF 2.15's.

For generated configurations (the recipes of test_config_proto_oracle.py:
both forms, shared tables, weighted, sequence and tensor-core columns,
several hosts and cores) and generated integer inputs for one host's batch,
both sides build their graphs on CPU in one graph:

* ours: `EmbeddingConfig.split_inputs` then `generate_enqueue_ops`;
* TF: tensorflow_estimator's `_tpu_estimator_embedding.split_inputs` then
  `tpu_embedding.TPUEmbedding.generate_enqueue_ops`.

Compared: the enqueue ops' types and attributes (N, T1, T2, T3,
device_ordinal, combiners), and, by running the producer subgraphs on CPU,
the values of every enqueue input and of the features each side adds or
leaves (sequence lengths, tensor-core padded ids and masks). TF's own
per-core `EnqueueData` lists are also fed to our `generate_enqueue_ops`
(it takes any object with those fields), sparse and ragged.
"""
import os
import types

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # pylint: disable=g-import-not-at-top
import pytest  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
from hypothesis import assume  # pylint: disable=g-import-not-at-top
from hypothesis import given  # pylint: disable=g-import-not-at-top
from hypothesis import settings  # pylint: disable=g-import-not-at-top
from hypothesis import strategies as st  # pylint: disable=g-import-not-at-top
from tensorflow.python.tpu import tpu_embedding as te  # pylint: disable=g-import-not-at-top
from tensorflow_estimator.python.estimator.tpu import _tpu_estimator_embedding as tee  # pylint: disable=g-import-not-at-top

import estimator_spec as es  # pylint: disable=g-import-not-at-top
import tpu_embedding_columns as tec  # pylint: disable=g-import-not-at-top
from estimator_spec.tpu import enqueue  # pylint: disable=g-import-not-at-top
from tests import test_config_proto_oracle as oracle  # pylint: disable=g-import-not-at-top

ATTRS = ("N", "T1", "T2", "T3", "device_ordinal", "combiners")


def session():
  """A session that places only what a run needs: the enqueue ops have no
  CPU kernel, their producer subgraphs do."""
  config = tf.compat.v1.ConfigProto()
  config.graph_options.place_pruned_graph = True
  return tf.compat.v1.Session(config=config)


def fetchable(datas):
  """EnqueueData namedtuples with None fields replaced by empty arrays."""
  return [
      type(d)(*(tf.zeros([0]) if t is None else t for t in d)) for d in datas
  ]


# --- inputs ------------------------------------------------------------------


def _sparse(rng, batch, width, vocabulary_size, *, min_count=0):
  """A canonical-order SparseTensor value [batch, width] of ids."""
  indices, values = [], []
  for row in range(batch):
    count = int(rng.integers(min_count, width + 1))
    for position in sorted(rng.choice(width, size=count, replace=False)):
      indices.append((row, int(position)))
      values.append(int(rng.integers(0, vocabulary_size)))
  indices = np.array(indices, np.int64).reshape(-1, 2)
  return tf.compat.v1.SparseTensorValue(indices, np.array(values, np.int64),
                                        np.array([batch, width], np.int64))


def make_features(config, tf_tensor_core, host_batch, seed):
  """{key: numpy-valued input} for every engine and tensor-core feature, in
  forms both sides take: sparse ids (dense rank-2 ids where no weights are
  involved; dense rank-1 ids for combiner None in the dict form)."""
  rng = np.random.default_rng(seed)
  values = {}
  for name, feature in config.features.items():
    table = config.tables[feature.table]
    vocab = table.vocabulary_size
    width = (feature.max_sequence_length + 2
             if feature.max_sequence_length else 4)
    form = rng.integers(0, 3)
    if feature.column_name is None and table.combiner is None and (
        feature.weight_key is None) and not feature.max_sequence_length and (
            form == 0):
      values[name] = rng.integers(0, vocab, size=host_batch).astype(np.int64)
      continue
    ids = _sparse(rng, host_batch, width, vocab)
    if form == 1 and feature.weight_key is None and (
        not feature.max_sequence_length) and table.combiner is not None:
      dense = np.zeros((host_batch, width), np.int64)
      dense[ids.indices[:, 0], ids.indices[:, 1]] = ids.values
      values[name] = dense
    else:
      values[name] = ids
    if feature.weight_key is not None:
      values[feature.weight_key] = tf.compat.v1.SparseTensorValue(
          ids.indices, rng.uniform(0.1, 2.0, size=len(ids.values)).astype(
              np.float32), ids.dense_shape)
  for column in tf_tensor_core:
    key = column.categorical_column.key
    values[key] = _sparse(rng, host_batch, column._tensor_core_shape[1] + 2,
                          column.categorical_column.num_buckets)
  values["dense_input"] = rng.normal(size=(host_batch, 3)).astype(np.float32)
  return values


def _to_tensors(values):
  out = {}
  for key, value in values.items():
    if isinstance(value, tf.compat.v1.SparseTensorValue):
      out[key] = tf.SparseTensor(
          tf.constant(value.indices), tf.constant(value.values),
          tf.constant(value.dense_shape))
    else:
      out[key] = tf.constant(value)
  return out


# --- comparison --------------------------------------------------------------


def _attrs(op):
  return {name: op.get_attr(name) for name in ATTRS}


def _assert_same_values(a, b, what):
  a, b = np.asarray(a), np.asarray(b)
  assert a.dtype == b.dtype, (what, a.dtype, b.dtype)
  assert a.shape == b.shape, (what, a.shape, b.shape)
  np.testing.assert_array_equal(a, b, err_msg=what)


def _colocation(op):
  """The op names an op is colocated with (TF's `_class` attribute)."""
  return sorted(op.colocation_groups())


def compare_ops(sess, ours, theirs, same_data=False):
  """Same op types, attributes and fed values; with `same_data` (both built
  from the same per-core tensors) also the same colocation."""
  assert len(ours) == len(theirs)
  for core, (a, b) in enumerate(zip(ours, theirs)):
    assert a.type == b.type == "EnqueueTPUEmbeddingArbitraryTensorBatch"
    assert _attrs(a) == _attrs(b), (core, _attrs(a), _attrs(b))
    if same_data:
      # Colocated with the first feature's ids the caller listed.
      assert _colocation(a) == _colocation(b), core
    assert len(a.inputs) == len(b.inputs)
    got_a, got_b = sess.run([list(a.inputs), list(b.inputs)])
    for i, (x, y) in enumerate(zip(got_a, got_b)):
      _assert_same_values(x, y, f"core {core} input {i}")


def _tf_context(emb, host_batch, tensor_core_columns):
  return types.SimpleNamespace(
      embedding_config=types.SimpleNamespace(tpu_embedding=emb),
      batch_size_for_input_fn=host_batch,
      tensor_core_embedding_columns=tensor_core_columns or None)


# --- the property --------------------------------------------------------------


def check_case(case, seed, mode_override):
  r = case.recipe
  with tf.Graph().as_default():
    config = case.ours()
    emb = case.tf()
    tf_tensor_core = []
    if r.form == "columns":
      _, tf_tensor_core = case.tf_embedding_core_columns()
      # TF's split_inputs reads `categorical_column.key`, which crossed
      # columns lack: TF cannot feed a crossed tensor-core column.
      assume(all(hasattr(c.categorical_column, "key") for c in tf_tensor_core))
    host_batch = r.batch_size // r.num_hosts
    values = make_features(config, tf_tensor_core, host_batch, seed)
    ours_features, _, per_core = config.split_inputs(_to_tensors(values))
    ctx = _tf_context(emb, host_batch, tf_tensor_core)
    tf_features, _, tf_per_core = tee.split_inputs(
        ctx, _to_tensors(values), None, config.num_cores_per_host)
    ours = config.generate_enqueue_ops(per_core, mode_override=mode_override)
    theirs = emb.generate_enqueue_ops(tf_per_core, mode_override=mode_override)
    # TF's own per-core data through our op builder.
    ours_from_tf = config.generate_enqueue_ops(tf_per_core,
                                               mode_override=mode_override)
    assert sorted(ours_features) == sorted(tf_features)
    with session() as sess:
      compare_ops(sess, ours, theirs)
      compare_ops(sess, ours_from_tf, theirs, same_data=True)
      keys = sorted(tf_features)
      got_ours, got_tf = sess.run([[ours_features[k] for k in keys],
                                      [tf_features[k] for k in keys]])
      for key, a, b in zip(keys, got_ours, got_tf):
        if isinstance(a, tf.compat.v1.SparseTensorValue):
          for part in range(3):
            _assert_same_values(a[part], b[part], key)
        else:
          _assert_same_values(a, b, key)
        static_a = ours_features[key].shape
        static_b = tf_features[key].shape
        assert static_a.as_list() == static_b.as_list(), key


@settings(max_examples=40, deadline=None)
@given(case=oracle.valid_cases(form="columns"), seed=st.integers(0, 2**16),
       mode_override=st.sampled_from((None, "inference", "training")))
def test_columns_form_infeed_matches_tf(case, seed, mode_override):
  check_case(case, seed, mode_override)


@settings(max_examples=40, deadline=None)
@given(case=oracle.valid_cases(form="dicts"), seed=st.integers(0, 2**16),
       mode_override=st.sampled_from((None, "backward_pass_only")))
def test_dicts_form_infeed_matches_tf(case, seed, mode_override):
  check_case(case, seed, mode_override)


def _ragged_per_core(config, seed, num_cores, form):
  rng = np.random.default_rng(seed)
  per_core = []
  for _ in range(num_cores):
    datas = {}
    for name, feature in config.features.items():
      vocab = config.tables[feature.table].vocabulary_size
      lengths = rng.integers(0, 4, size=3)
      ids = tf.RaggedTensor.from_row_lengths(
          tf.constant(rng.integers(0, vocab, size=int(lengths.sum())),
                      tf.int64), tf.constant(lengths, tf.int64))
      weights = None
      if feature.weight_key is not None:
        weights = ids.with_values(
            tf.constant(rng.uniform(size=int(lengths.sum())), tf.float32))
      if form == "tf":
        datas[name] = te.RaggedEnqueueData.from_ragged_tensor(ids, weights)
      else:
        datas[name] = enqueue.RaggedEnqueueData.from_ragged_tensor(
            ids, weights)
    per_core.append(datas)
  return per_core


@settings(max_examples=20, deadline=None)
@given(case=oracle.valid_cases(), seed=st.integers(0, 2**16))
def test_ragged_enqueue_ops_match_tf(case, seed):
  with tf.Graph().as_default():
    config = case.ours()
    emb = case.tf()
    count = config.num_cores_per_host * (1 + seed % min(2, config.num_hosts))
    theirs = emb.generate_enqueue_ops(
        _ragged_per_core(config, seed, count, "tf"), ragged=True)
    ours = config.generate_enqueue_ops(
        _ragged_per_core(config, seed, count, "ours"), ragged=True)
    ordinals = [op.get_attr("device_ordinal") for op in ours]
    assert ordinals == [i % config.num_cores_per_host for i in range(count)]
    with session() as sess:
      compare_ops(sess, ours, theirs)


# --- behaviour beyond TF's ---------------------------------------------------


def _spec(columns=None, **dicts):
  opt = es.AdagradParameters(0.1)
  if columns is not None:
    return es.EmbeddingConfigSpec(feature_columns=columns,
                                  optimization_parameters=opt)
  return es.EmbeddingConfigSpec(optimization_parameters=opt, **dicts)


def _dict_config(num_hosts=1, num_cores=2, batch_size=4, combiner="mean",
                 weight_key=None, max_sequence_length=0):
  spec = _spec(
      table_to_config_dict={
          "t": es.TableConfig(vocabulary_size=10, dimension=2,
                              combiner=combiner)
      },
      feature_to_config_dict={
          "f": es.FeatureConfig("t", max_sequence_length=max_sequence_length,
                                weight_key=weight_key)
      })
  return es.EmbeddingConfig(spec, batch_size=batch_size, num_hosts=num_hosts,
                            num_cores=num_cores)


def test_strings_are_transformed_by_the_column():
  words = ["a", "b", "c", "d"]
  cat = tf.feature_column.categorical_column_with_vocabulary_list(
      "w", words, num_oov_buckets=1)
  seq = tf.feature_column.sequence_categorical_column_with_hash_bucket(
      "s", 7)
  columns = [tec.embedding_column(cat, 3),
             tec.embedding_column(seq, 3, max_sequence_length=2)]
  config = es.EmbeddingConfig(_spec(columns), batch_size=4, num_cores=2)
  with tf.Graph().as_default():
    w = tf.SparseTensor([[0, 0], [0, 1], [1, 0], [3, 0]],
                        tf.constant(["b", "zz", "d", "a"]), [4, 2])
    s = tf.SparseTensor([[0, 0], [2, 0], [2, 1], [2, 2]],
                        tf.constant(["x", "y", "z", "x"]), [4, 3])
    features, _, per_core = config.split_inputs({"w": w, "s": s})
    assert sorted(features) == ["s_seq_length_"]
    expected_s = tf.strings.to_hash_bucket_fast(s.values, 7)
    with session() as sess:
      sess.run(tf.compat.v1.tables_initializer())
      got = sess.run([fetchable(d["w"] for d in per_core),
                      fetchable(d["s"] for d in per_core),
                      features["s_seq_length_"], expected_s])
    (w0, w1), (s0, s1), lengths, hashed = got
    np.testing.assert_array_equal(w0.embedding_indices, [1, 4, 3])
    np.testing.assert_array_equal(w0.sample_indices, [[0, 0], [0, 1], [1, 0]])
    np.testing.assert_array_equal(w1.embedding_indices, [0])
    np.testing.assert_array_equal(w1.sample_indices, [[1, 0]])
    np.testing.assert_array_equal(s0.embedding_indices, hashed[:1])
    np.testing.assert_array_equal(s1.embedding_indices, hashed[1:])
    np.testing.assert_array_equal(lengths, [1, 0, 2, 0])


def test_tensor_core_columns_padded_with_mask():
  cat = tf.feature_column.categorical_column_with_identity("tc", 9)
  plain = tf.feature_column.categorical_column_with_identity("p", 9)
  columns = [tec.embedding_column(plain, 2),
             tec.embedding_column(cat, 2, embedding_lookup_device=
                                  "tpu_tensor_core",
                                  tensor_core_shape=[None, 2])]
  config = es.EmbeddingConfig(_spec(columns), batch_size=3)
  with tf.Graph().as_default():
    tc = tf.SparseTensor([[0, 0], [0, 1], [0, 2], [2, 1]],
                         tf.constant([5, 6, 7, 8], tf.int64), [3, 3])
    p = tf.SparseTensor([[0, 0]], tf.constant([1], tf.int64), [3, 1])
    features, _, _ = config.split_inputs({"tc": tc, "p": p})
    mask_key = columns[1].tensor_core_mask_key
    assert sorted(features) == sorted(["tc", mask_key])
    with session() as sess:
      values, mask = sess.run([features["tc"], features[mask_key]])
  np.testing.assert_array_equal(values, [[5, 6], [0, 0], [0, 8]])
  np.testing.assert_array_equal(mask, [[1, 1], [0, 0], [0, 1]])
  assert values.dtype == np.int32 and mask.dtype == np.float32


def test_dense_weights_refused_and_other_dtypes_cast():
  config = _dict_config(weight_key="wt")
  with tf.Graph().as_default():
    ids = tf.SparseTensor([[0, 0], [1, 1], [3, 0]],
                          tf.constant([4, 5, 6], tf.int32), [4, 2])
    dense = tf.constant([[0.5, 0], [0, 2.0], [0, 0], [3.0, 0]], tf.float64)
    # As TF's TPU input path: dense weights are refused, with its message.
    with pytest.raises(ValueError,
                       match="Dense weights are not supported on TPU"):
      config.split_inputs({"f": ids, "wt": dense})
    for dtype, values in ((tf.float64, [0.5, 2.0, 3.0]), (tf.int64, [1, 2, 3])):
      weights = tf.SparseTensor(ids.indices, tf.constant(values, dtype),
                                ids.dense_shape)
      _, _, per_core = config.split_inputs({"f": ids, "wt": weights})
      with session() as sess:
        got = sess.run([d["f"] for d in per_core])
      np.testing.assert_array_equal(got[0].aggregation_weights, values[:2])
      np.testing.assert_array_equal(got[1].aggregation_weights, values[2:])
      assert got[0].aggregation_weights.dtype == np.float32


def test_split_inputs_checks_positions_and_bounds_when_run():
  # The same run-time checks as the host engine: weights at other positions
  # and indices outside the dense_shape fail instead of being enqueued.
  config = _dict_config(weight_key="wt")
  with tf.Graph().as_default():
    ids = tf.compat.v1.sparse_placeholder(tf.int64, [None, None])
    weights = tf.compat.v1.sparse_placeholder(tf.float32, [None, None])
    _, _, per_core = config.split_inputs({"f": ids, "wt": weights})
    fetch = [d["f"] for d in per_core]
    good = tf.compat.v1.SparseTensorValue([[0, 0], [2, 1]], [1, 2], [4, 2])
    with session() as sess:
      sess.run(fetch, {ids: good, weights: good._replace(values=[1.0, 2.0])})
      with pytest.raises(tf.errors.InvalidArgumentError,
                         match=r"feature .*f.* other positions"):
        sess.run(fetch, {ids: good, weights: good._replace(
            indices=[[0, 0], [2, 0]], values=[1.0, 2.0])})
      with pytest.raises(tf.errors.InvalidArgumentError,
                         match=r"feature .*f.* out of bounds"):
        sess.run(fetch, {ids: good._replace(dense_shape=[4, 1]),
                         weights: good._replace(values=[1.0, 2.0],
                                                dense_shape=[4, 1])})


def test_mixed_index_dtypes_are_widened():
  spec = _spec(
      table_to_config_dict={
          "t": es.TableConfig(vocabulary_size=10, dimension=2)
      },
      feature_to_config_dict={
          "a": es.FeatureConfig("t"),
          "b": es.FeatureConfig("t")
      })
  config = es.EmbeddingConfig(spec, batch_size=2)
  with tf.Graph().as_default():
    a = enqueue.EnqueueData(tf.constant([1, 2], tf.int32),
                            tf.constant([[0, 0], [1, 0]], tf.int32))
    b = enqueue.EnqueueData(tf.constant([3], tf.int64),
                            tf.constant([[1, 0]], tf.int64),
                            tf.constant([2.0], tf.float64))
    (op,) = config.generate_enqueue_ops([{"a": a, "b": b}])
    assert op.get_attr("T1") == tf.int64 and op.get_attr("T2") == tf.int64
    assert op.get_attr("T3") == tf.float32
    with session() as sess:
      inputs = sess.run(list(op.inputs))
  np.testing.assert_array_equal(inputs[2], [1, 2])  # ids of a, widened
  np.testing.assert_array_equal(inputs[4], [])  # no weights for a
  np.testing.assert_array_equal(inputs[5], [2.0])


def test_device_ordinals_over_hosts():
  config = _dict_config(num_hosts=2, num_cores=4, batch_size=8)
  with tf.Graph().as_default():
    per_core = []
    for host in range(2):
      with tf.device(f"/job:worker/task:{host}/device:CPU:0"):
        for _ in range(2):
          per_core.append({"f": tf.SparseTensor([[0, 0]], tf.constant(
              [1], tf.int64), [2, 1])})
    ops = config.generate_enqueue_ops(per_core)
    assert [op.get_attr("device_ordinal") for op in ops] == [0, 1, 0, 1]
    assert [op.get_attr("combiners") for op in ops] == [[b"mean"]] * 4
    assert ops[2].device == "/job:worker/task:1/device:CPU:0"
    # A host's cores must be contiguous.
    with pytest.raises(ValueError, match="contiguous"):
      config.generate_enqueue_ops([per_core[0], per_core[2], per_core[1],
                                   per_core[3]])


def _ids():
  return tf.SparseTensor([[0, 0]], tf.constant([1], tf.int64), [4, 1])


@pytest.mark.parametrize("bad, error, match", [
    (lambda: [{}], ValueError, "missing \\['f'\\]"),
    (lambda: [{"f": _ids(), "g": _ids()}], ValueError, "unknown \\['g'\\]"),
    (lambda: [{"f": _ids()}] * 3, ValueError, "whole hosts"),
    (lambda: [{"f": tf.constant([1])}], TypeError, "EnqueueData"),
    (lambda: {"f": _ids()}, TypeError, "non-empty list"),
    (lambda: [{"f": enqueue.EnqueueData(tf.constant([1.0]))}], TypeError,
     "int32 or int64"),
])
def test_generate_enqueue_ops_refuses_bad_input(bad, error, match):
  config = _dict_config(num_cores=1, batch_size=4)
  with tf.Graph().as_default() as graph:
    with pytest.raises(error, match=match):
      config.generate_enqueue_ops(bad())
    assert not [op for op in graph.get_operations()
                if op.type == "EnqueueTPUEmbeddingArbitraryTensorBatch"]


def test_ragged_flag_must_match_data():
  config = _dict_config(num_cores=1)
  with tf.Graph().as_default():
    with pytest.raises(TypeError, match="RaggedEnqueueData"):
      config.generate_enqueue_ops([{"f": _ids()}], ragged=True)
    ragged = tf.RaggedTensor.from_row_lengths(tf.constant([1], tf.int64),
                                              [1, 0, 0, 0])
    with pytest.raises(TypeError, match="EnqueueData or a SparseTensor"):
      config.generate_enqueue_ops([{"f": ragged}])
    (op,) = config.generate_enqueue_ops([{"f": ragged}], ragged=True)
    assert op.type == "EnqueueTPUEmbeddingArbitraryTensorBatch"


@pytest.mark.parametrize("mode_override, error", [
    ("train", ValueError), (3, TypeError)])
def test_mode_override_checked(mode_override, error):
  config = _dict_config(num_cores=1)
  with tf.Graph().as_default():
    with pytest.raises(error, match="mode_override"):
      config.generate_enqueue_ops([{"f": _ids()}], mode_override=mode_override)


def test_mode_override_tensor_passes_through():
  config = _dict_config(num_cores=1)
  with tf.Graph().as_default():
    mode = tf.compat.v1.placeholder(tf.string, [])
    (op,) = config.generate_enqueue_ops([{"f": _ids()}], mode_override=mode)
    assert op.inputs[-1] is mode


def test_split_inputs_refuses_bad_input():
  with tf.Graph().as_default():
    ids = tf.SparseTensor([[0, 0]], tf.constant([1], tf.int64), [4, 1])
    config = _dict_config()
    with pytest.raises(ValueError, match="'f'.*missing"):
      config.split_inputs({"g": ids})
    with pytest.raises(TypeError, match="must be integers"):
      config.split_inputs({"f": tf.SparseTensor([[0, 0]], ["x"], [4, 1])})
    with pytest.raises(ValueError, match="Cannot find weights wt"):
      _dict_config(weight_key="wt").split_inputs({"f": ids})
    with pytest.raises(ValueError, match="combiner None.*no weights"):
      _dict_config(combiner=None, weight_key="wt").split_inputs(
          {"f": tf.constant([1, 2, 3, 4], tf.int64), "wt": ids})
    features = {"f": ids}
    config.split_inputs(features)
    assert list(features) == ["f"]  # the caller's dict is left as it was


def test_mask_key_collision_refused():
  cat = tf.feature_column.categorical_column_with_identity("tc", 9)
  plain = tf.feature_column.categorical_column_with_identity("p", 9)
  column = tec.embedding_column(cat, 2,
                                embedding_lookup_device="tpu_tensor_core",
                                tensor_core_shape=[None, 2])
  config = es.EmbeddingConfig(
      _spec([tec.embedding_column(plain, 2), column]), batch_size=2)
  with tf.Graph().as_default():
    ids = tf.SparseTensor([[0, 0]], tf.constant([1], tf.int64), [2, 1])
    with pytest.raises(ValueError, match="already holds"):
      config.split_inputs({"p": ids, "tc": ids,
                           column.tensor_core_mask_key: ids})
