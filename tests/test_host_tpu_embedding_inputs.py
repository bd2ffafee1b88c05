"""HostTPUEmbedding: inputs of higher rank, as TF2's TPUEmbedding takes them.

Dense ids [..., 1] are looked up one by one: activations [..., dim].
SparseTensor ids [d0, ..., dk, n] of a non-sequence feature are combined
over their last dimension: activations [d0, ..., dk, dim]. Each is checked
against the equivalent rank-2 (or rank-1) call on a second object (same
tables, same optimizer): same activations reshaped, same tables and slots
after two updates whose gradients are given in the activations' shapes;
eagerly and in `tf.function` (also with unknown dimensions); `build`'s
input shapes give the activations their static shapes. Refused by feature
name: dense ids whose last dimension is not 1, sparse ids of rank > 2 for
sequence features, ragged ids of rank > 2, sparse ids of rank 1, gradients
of the wrong shape.

Runs in both environments (TF 2.15 and current TensorFlow).
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest
import tensorflow as tf

import estimator_spec as es
from tests.test_host_tpu_embedding import _state
from tests.test_host_tpu_embedding import _train_step

emb = tf.tpu.experimental.embedding
F32 = np.float32
D0, D1, N = 2, 3, 4   # sparse ids [D0, D1, N]; dense ids [D0, D1, 1]
VOCAB, DIM = 13, 3


def _config(combiner="mean", sequence=False):
  init = np.random.RandomState(7).uniform(-1, 1, (VOCAB, DIM)).astype(F32)
  table = emb.TableConfig(VOCAB, DIM, initializer=tf.constant_initializer(
      init), combiner=combiner, name="t")
  return {"s": emb.FeatureConfig(table),
          "d": emb.FeatureConfig(table),
          "q": emb.FeatureConfig(table, max_sequence_length=2 if sequence
                                 else 0)}


def _batch(step):
  """(sparse ids [D0, D1, N] as rows of id lists, their weights, dense ids
  [D0, D1])."""
  rng = np.random.RandomState(10 + step)
  rows, weights = [], []
  for _ in range(D0 * D1):
    count = rng.randint(0, N + 1)
    rows.append(list(rng.randint(0, VOCAB, count)))
    weights.append(list(rng.uniform(0.5, 2.0, count).astype(F32)))
  dense = rng.randint(0, VOCAB, (D0, D1))
  return rows, weights, dense


def _sparse(rows, dtype, leading):
  """A SparseTensor leading + [N] of `rows` (row-major over `leading`)."""
  indices, values = [], []
  for flat, row in enumerate(rows):
    prefix = list(np.unravel_index(flat, leading))
    for p, x in enumerate(row):
      indices.append(prefix + [p])
      values.append(x)
  return tf.SparseTensor(
      np.array(indices, np.int64).reshape(-1, len(leading) + 1),
      np.array(values, dtype), list(leading) + [N])


def _inputs(step, high_rank):
  rows, weights, dense = _batch(step)
  leading = [D0, D1] if high_rank else [D0 * D1]
  features = {
      "s": _sparse(rows, np.int64, leading),
      "d": tf.constant(dense.reshape(leading + [1]) if high_rank else
                       dense.reshape(-1), tf.int64),
      "q": _sparse(rows, np.int64, leading)}
  weight = {"s": _sparse(weights, np.float32, leading), "d": None,
            "q": None}
  return features, weight


def _grads(step, high_rank):
  rng = np.random.RandomState(30 + step)
  shape = [D0, D1, DIM] if high_rank else [D0 * D1, DIM]
  return {k: rng.uniform(-1, 1, shape).astype(F32) for k in "sdq"}


def _train(high_rank, in_function, steps=2, signature=False):
  embedding = es.HostTPUEmbedding(_config(), emb.Adagrad(0.3))
  step = _train_step(embedding, in_function)
  history = []
  for n in range(steps):
    features, weights = _inputs(n, high_rank)
    grads = {k: tf.constant(v) for k, v in _grads(n, high_rank).items()}
    if signature:
      # Unknown dimensions: the activations are shaped back at run time.
      features = {k: (tf.SparseTensor(v.indices, v.values, tf.constant(
          v.dense_shape.numpy())) if isinstance(v, tf.SparseTensor) else v)
                  for k, v in features.items()}
      spec = tf.nest.map_structure(
          lambda t: (tf.SparseTensorSpec([None] * t.shape.rank, t.dtype)
                     if isinstance(t, tf.SparseTensor) else
                     tf.TensorSpec([None] * (t.shape.rank - 1) + [
                         t.shape[-1] if t.dtype.is_integer else None],
                                   t.dtype)),
          (features, {"s": weights["s"]}, grads))
      fn = tf.function(
          lambda f, w, g: step(f, dict(w, d=None, q=None), g),
          input_signature=spec)
      acts = fn(features, {"s": weights["s"]}, grads)
    else:
      acts = step(features, weights, grads)
    history.append(({k: v.numpy() for k, v in acts.items()},
                    _state(embedding)))
  return history


@pytest.mark.parametrize("mode", ["eager", "function", "unknown_shapes"])
def test_higher_rank_equals_the_flat_call_reshaped(mode):
  flat = _train(high_rank=False, in_function=False)
  high = _train(high_rank=True, in_function=mode != "eager",
                signature=mode == "unknown_shapes")
  for (acts, state), (ref_acts, ref_state) in zip(high, flat):
    for k in "sdq":
      assert acts[k].shape == (D0, D1, DIM), k
      np.testing.assert_allclose(acts[k].reshape(-1, DIM), ref_acts[k],
                                 rtol=1e-6, atol=1e-7, err_msg=k)
    assert sorted(state) == sorted(ref_state) == ["t", "t/accumulators"]
    for k in ref_state:
      np.testing.assert_allclose(state[k], ref_state[k], rtol=1e-6,
                                 atol=1e-7, err_msg=k)
  # The comparison is not of initial values, and weights counted.
  assert not np.allclose(flat[-1][1]["t"], flat[0][1]["t"])
  assert not np.allclose(flat[0][0]["s"], flat[0][0]["q"])


def test_dense_and_sparse_values_by_hand():
  """[b, k, 1] dense: each id's row; [b, k, n] sparse: the combiner over
  each innermost row (mean of weighted rows)."""
  embedding = es.HostTPUEmbedding(_config(), emb.SGD(0.1))
  features, weights = _inputs(0, high_rank=True)
  acts = embedding(features, weights)
  table = embedding.embedding_tables[
      embedding._conversion.table_configs["t"]].numpy()
  rows, row_weights, dense = _batch(0)
  np.testing.assert_allclose(acts["d"].numpy(), table[dense], rtol=1e-6)
  expected = np.zeros((D0 * D1, DIM), F32)
  for i, (ids, w) in enumerate(zip(rows, row_weights)):
    if ids:
      expected[i] = (np.array(w)[:, None] * table[ids]).sum(0) / sum(w)
  np.testing.assert_allclose(acts["s"].numpy(), expected.reshape(D0, D1, DIM),
                             rtol=1e-5, atol=1e-6)


def test_rank_two_dense_with_last_dimension_one():
  embedding = es.HostTPUEmbedding(_config(), emb.Adagrad(0.3))
  reference = es.HostTPUEmbedding(_config(), emb.Adagrad(0.3))
  features, weights = _inputs(0, high_rank=False)
  column = dict(features, d=tf.reshape(features["d"], [-1, 1]))
  acts = embedding(column, weights)
  ref = reference(features, weights)
  assert acts["d"].shape == (D0 * D1, DIM)
  np.testing.assert_allclose(acts["d"].numpy(), ref["d"].numpy())
  grads = {k: tf.constant(v) for k, v in _grads(0, False).items()}
  embedding.apply_gradients(grads)
  reference.apply_gradients(grads)
  for k, v in _state(reference).items():
    np.testing.assert_allclose(_state(embedding)[k], v, rtol=1e-6)


def test_build_input_shapes_give_the_activations_their_shapes():
  embedding = es.HostTPUEmbedding(_config(sequence=True), emb.SGD(0.1))
  embedding.build(per_replica_input_shapes={
      "s": tf.TensorShape([D0, D1, N]), "d": tf.TensorShape([D0, D1, 1]),
      "q": tf.TensorShape([D0 * D1, N])})
  shapes = {}

  @tf.function(input_signature=[{
      "s": tf.SparseTensorSpec([None, None, None], tf.int64),
      "d": tf.TensorSpec([None, None, 1], tf.int64),
      "q": tf.SparseTensorSpec([None, None], tf.int64)}])
  def step(features):
    acts = embedding(features)
    shapes.update({k: v.shape.as_list() for k, v in acts.items()})
    embedding.apply_gradients(
        {k: tf.zeros(v.shape) for k, v in acts.items()})
    return acts

  features, _ = _inputs(0, high_rank=True)
  flat, _ = _inputs(0, high_rank=False)
  acts = step(dict(features, q=flat["q"]))
  assert shapes == {"s": [D0, D1, DIM], "d": [D0, D1, DIM],
                    "q": [D0 * D1, 2, DIM]}
  assert acts["q"].shape == (D0 * D1, 2, DIM)
  # Inputs that contradict build's shapes are refused by feature.
  wrong = dict(features, q=flat["q"], d=tf.zeros([D0, D1 + 1, 1], tf.int64))
  with pytest.raises(ValueError, match="'d'.*build"):
    embedding.enqueue(wrong)


def test_output_shape_with_higher_rank_inputs():
  config = _config()
  config["d"] = emb.FeatureConfig(config["d"].table,
                                  output_shape=[D0 * D1])
  embedding = es.HostTPUEmbedding(config, emb.SGD(0.5))
  reference = es.HostTPUEmbedding(_config(), emb.SGD(0.5))
  features, weights = _inputs(0, high_rank=True)
  acts = embedding(features, weights)
  ref = reference(features, weights)
  assert acts["d"].shape == (D0 * D1, DIM)
  np.testing.assert_allclose(acts["d"].numpy(),
                             ref["d"].numpy().reshape(-1, DIM))
  grads = _grads(0, True)
  embedding.apply_gradients(dict(grads, d=grads["d"].reshape(-1, DIM)))
  reference.apply_gradients(grads)
  for k, v in _state(reference).items():
    np.testing.assert_allclose(_state(embedding)[k], v, rtol=1e-6)


def test_refusals_name_the_feature():
  embedding = es.HostTPUEmbedding(_config(), emb.SGD(0.1))
  features, weights = _inputs(0, high_rank=True)
  with pytest.raises(ValueError, match="'d'.*\\[\\.\\.\\., 1\\]"):
    embedding.enqueue(dict(features, d=tf.zeros([D0, D1, 2], tf.int64)),
                      weights)
  with pytest.raises(ValueError, match="'d'.*\\[batch\\]"):
    embedding.enqueue(dict(features, d=tf.constant(3, tf.int64)), weights)
  with pytest.raises(ValueError, match="'s'.*rank 2"):
    embedding.enqueue(dict(features, s=tf.RaggedTensor.from_uniform_row_length(
        tf.ragged.constant([[1], [2, 3], [], [4]], tf.int64), 2)),
                      dict(weights, s=None))
  with pytest.raises(ValueError, match="'s'.*SparseTensor ids"):
    embedding.enqueue(dict(features, s=tf.SparseTensor([[0]], tf.constant(
        [1], tf.int64), [3])), dict(weights, s=None))
  flat_weights = _inputs(0, high_rank=False)[1]["s"]
  with pytest.raises(ValueError, match="'s'.*weights"):
    embedding.enqueue(features, dict(weights, s=flat_weights))
  sequence = es.HostTPUEmbedding(_config(sequence=True), emb.SGD(0.1))
  with pytest.raises(ValueError, match="'q'.*max_sequence_length"):
    sequence.enqueue(features, weights)
  # Gradients must have the activations' shapes.
  acts = embedding(features, weights)
  grads = {k: tf.zeros_like(v) for k, v in acts.items()}
  with pytest.raises(ValueError, match="'s'.*gradient"):
    embedding.apply_gradients(dict(grads, s=tf.zeros([D0 * D1, DIM])))


@pytest.mark.parametrize("use_function", [False, True])
def test_negative_ids_are_dropped_in_every_input_kind(use_function):
  # A negative id gives zeros (dense: the example's activation; sparse and
  # ragged: that id's share) and is not trained; everything else equals the
  # same call with the negative ids left out.
  def make():
    table = emb.TableConfig(VOCAB, DIM, combiner="mean", name="t",
                            initializer=tf.constant_initializer(
                                np.arange(VOCAB * DIM, dtype=F32).reshape(
                                    VOCAB, DIM) / 10.0))
    return es.HostTPUEmbedding(
        {"d": emb.FeatureConfig(table), "c": emb.FeatureConfig(table),
         "r": emb.FeatureConfig(table)}, emb.Adagrad(0.5))

  with_negative = {
      "d": tf.constant([3, -1, 5], tf.int64),
      "c": tf.constant([[-1], [2], [4]], tf.int64),
      "r": tf.ragged.constant([[1, -1], [-1], [6]], tf.int64)}
  without = {
      "d": tf.sparse.from_dense(tf.constant([[3], [0], [5]], tf.int64)),
      "c": tf.ragged.constant([[], [2], [4]], tf.int64),
      "r": tf.ragged.constant([[1], [], [6]], tf.int64)}
  # `without`'s "d" drops id 0 of example 1 the way from_dense does.
  grads = {"d": np.full((3, DIM), 0.5, F32),
           "c": np.full((3, DIM), -0.25, F32),
           "r": np.full((3, DIM), 1.0, F32)}
  results = []
  for features in (with_negative, without):
    embedding = make()
    embedding.build()

    def step(features=features, embedding=embedding):
      activations = embedding(features)
      embedding.apply_gradients(grads)
      return activations

    if use_function:
      step = tf.function(step)
    activations = {k: v.numpy() for k, v in step().items()}
    table = list(embedding.embedding_tables.values())[0].numpy()
    slots = list(embedding.slot_variables.values())[0]
    results.append((activations, table, slots["accumulators"].numpy()))
  (act, table, acc), (act_ref, table_ref, acc_ref) = results
  for k in act:
    np.testing.assert_array_equal(act[k], act_ref[k], err_msg=k)
  np.testing.assert_array_equal(act["d"][1], np.zeros(DIM, F32))
  np.testing.assert_array_equal(act["c"][0], np.zeros(DIM, F32))
  np.testing.assert_array_equal(table, table_ref)
  np.testing.assert_array_equal(acc, acc_ref)
  touched = sorted({3, 5, 2, 4, 1, 6})
  untouched = [i for i in range(VOCAB) if i not in touched]
  np.testing.assert_array_equal(acc[untouched], np.full((len(untouched), DIM),
                                                        0.1, F32))
  assert (acc[touched] > 0.1).all()


def _tuple_config():
  table = emb.TableConfig(VOCAB, DIM, name="t")
  return (emb.FeatureConfig(table, name="a"),
          emb.FeatureConfig(table, max_sequence_length=2, name="b"))


def test_build_takes_shapes_whose_flattened_structure_agrees():
  # TF compares the flattened structures: a list of shapes for a tuple of
  # features is accepted, and gives the same activation shapes as the
  # tuple itself.
  shapes = [tf.TensorShape([4, 3]), tf.TensorShape([4, 5])]
  results = []
  for given in (shapes, tuple(shapes), [[4, 3], [4, 5]], ([4, 3], [4, 5])):
    embedding = es.HostTPUEmbedding(_tuple_config(), emb.SGD(0.1))
    embedding.build(given)
    acts = embedding((tf.sparse.from_dense(tf.ones([4, 3], tf.int64)),
                      tf.sparse.from_dense(tf.ones([4, 5], tf.int64))))
    assert isinstance(acts, tuple)
    results.append([a.shape.as_list() for a in acts])
  assert results == [[[4, DIM], [4, 2, DIM]]] * 4
  # A structure of another size is refused, saying how many each holds.
  embedding = es.HostTPUEmbedding(_tuple_config(), emb.SGD(0.1))
  with pytest.raises(ValueError, match="3 shapes.*2 features.*'0', '1'"):
    embedding.build([tf.TensorShape([4, 3])] * 3)
  with pytest.raises(ValueError, match="'1'.*not a shape"):
    embedding.build({"x": tf.TensorShape([4, 3]), "y": "wide"})
  # Nothing was built by the refused calls: a good call still works.
  embedding.build([tf.TensorShape([4, 3]), tf.TensorShape([4, 5])])
  acts = embedding((tf.sparse.from_dense(tf.ones([4, 3], tf.int64)),
                    tf.sparse.from_dense(tf.ones([4, 5], tf.int64))))
  assert [a.shape.as_list() for a in acts] == [[4, DIM], [4, 2, DIM]]


def test_build_takes_an_int_as_the_batch_size_with_a_warning():
  embedding = es.HostTPUEmbedding(_tuple_config(), emb.SGD(0.1))
  with pytest.warns(FutureWarning, match="batch size"):
    embedding.build(2)
  acts = embedding((tf.sparse.from_dense(tf.ones([2, 3], tf.int64)),
                    tf.sparse.from_dense(tf.ones([2, 5], tf.int64))))
  assert [a.shape.as_list() for a in acts] == [[2, DIM], [2, 2, DIM]]
  # The batch size is checked like build's shapes.
  with pytest.raises(ValueError, match="'0'.*build"):
    embedding.enqueue((tf.sparse.from_dense(tf.ones([3, 3], tf.int64)),
                       tf.sparse.from_dense(tf.ones([2, 5], tf.int64))))
  other = es.HostTPUEmbedding(_tuple_config(), emb.SGD(0.1))
  with pytest.warns(FutureWarning), pytest.raises(ValueError,
                                                  match="two batch sizes"):
    other.build(2, per_replica_batch_size=3)
  with pytest.raises(ValueError, match="positive int"):
    other.build(per_replica_batch_size=0)
