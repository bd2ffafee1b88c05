"""The engine's optimizer updates against TensorFlow's own CPU kernels.

Where TensorFlow has a kernel computing the same rule, one table trained by
the engine for a few steps must agree (rtol 1e-5) with TF's optimizer
applied to the same de-duplicated `IndexedSlices`: values = the gradients
summed per distinct id, indices = the distinct ids. The per-id sums are
computed here in NumPy from the activation gradients (docs/numerics.md, 'The
backward pass, table by table'), independently of the engine and of the NumPy
twin.

Kernels: Adagrad, ProximalAdagrad, Momentum (incl. Nesterov) and SGD through
`tf.compat.v1.train` optimizers; FTRL with `beta` through
`ResourceSparseApplyFtrlV2` (l2 + beta / (2 lr), with and without
multiply_linear_by_lr); RMSProp through `ResourceSparseApplyRMSProp` (slots
starting at zero, as on the TPU); non-lazy Adam with sum_inside_sqrt=False
through the dense `ResourceApplyAdam` with beta powers 0 (no bias
correction) and zero gradients for untouched rows.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # pylint: disable=g-import-not-at-top
import pytest
import tensorflow as tf

import estimator_spec as es
from estimator_spec.engine import HostEmbeddingEngine
from tests.ragged import sparse_value

v1 = tf.compat.v1
F32 = np.float32
RTOL, ATOL = 1e-5, 1e-6
VOCAB, DIM, BATCH = 12, 3, 3

# Three steps; ids repeat within an example, across examples and across the
# two features sharing the table; some examples are empty.
BATCHES = [
    {"f": ([[1, 3, 3], [], [7]], [[0.5, 1.0, 2.0], [], [1.5]]),
     "g": [[3, 1], [11, 0], []]},
    {"f": ([[0], [5, 5, 5], [1, 2]], [[1.0], [0.25, 0.5, 2.0], [1.0, 3.0]]),
     "g": [[2], [2, 2], [9]]},
    {"f": ([[], [3], [3, 7, 8]], [[], [2.0], [0.5, 0.5, 1.0]]),
     "g": [[1, 1, 1], [], [3]]},
]


def activation_grads(step):
  rng = np.random.RandomState(100 + step)
  return {"f": rng.uniform(-1, 1, (BATCH, DIM)).astype(F32),
          "g": rng.uniform(-1, 1, (BATCH, DIM)).astype(F32)}


def summed_gradients(batch, grads):
  """(distinct ids, per-id sums): 'f' uses combiner sum with weights, 'g'
  combiner mean; contributions are added in float32."""
  sums = {}

  def add(i, value):
    sums[i] = sums[i] + value if i in sums else value

  ids, weights = batch["f"]
  for b, (row, row_w) in enumerate(zip(ids, weights)):
    for i, w in zip(row, row_w):
      add(i, grads["f"][b] * F32(w))
  for b, row in enumerate(batch["g"]):
    for i in row:
      add(i, grads["g"][b] * (F32(1) / F32(len(row))))
  unique = np.array(sorted(sums), np.int64)
  return unique, np.stack([sums[i] for i in unique]).astype(F32)


def initial_table():
  return np.random.RandomState(7).uniform(-1, 1, (VOCAB, DIM)).astype(F32)


def run_engine(optimizer, num_shards, strategy, clipping_limit=None):
  """Tables and slots after each step."""
  # 'f' (combiner sum, weights) and 'g' share the table; 'g' is a mean
  # combiner expressed as weights 1/len (one combiner per table).
  spec = es.EmbeddingConfigSpec(
      feature_to_config_dict={"f": es.FeatureConfig("t", weight_key="fw"),
                              "g": es.FeatureConfig("t", weight_key="gw")},
      table_to_config_dict={"t": es.TableConfig(VOCAB, DIM, combiner="sum")},
      optimization_parameters=optimizer, clipping_limit=clipping_limit,
      partition_strategy=strategy)
  config = es.EmbeddingConfig(spec, batch_size=BATCH)
  history = []
  with tf.Graph().as_default():
    engine = HostEmbeddingEngine(config, num_shards=num_shards)
    ph = {k: v1.sparse_placeholder(dtype, [None, None])
          for k, dtype in [("f", tf.int64), ("fw", tf.float32),
                           ("g", tf.int64), ("gw", tf.float32)]}
    grad_ph = {k: v1.placeholder(tf.float32, [None, DIM]) for k in ("f", "g")}
    step = v1.placeholder(tf.int64, [])
    result = engine.lookup(ph)
    train = engine.apply_gradients(result, grad_ph, step)
    reads = {"table": engine.table_rows("t").read_all(),
             **{k: s.read_all() for k, s in engine.slot_rows("t").items()}}
    with v1.Session() as sess:
      sess.run([v1.global_variables_initializer(),
                v1.local_variables_initializer()])
      sess.run(engine.table_rows("t").assign_all(initial_table()))
      for n, batch in enumerate(BATCHES):
        grads = activation_grads(n)
        ids, weights = batch["f"]
        g_weights = [[1.0 / len(row) for _ in row] for row in batch["g"]]
        feed = {ph["f"]: sparse_value(ids, np.int64),
                ph["fw"]: sparse_value(weights, np.float32),
                ph["g"]: sparse_value(batch["g"], np.int64),
                ph["gw"]: sparse_value(g_weights, np.float32),
                grad_ph["f"]: grads["f"], grad_ph["g"]: grads["g"], step: n}
        sess.run(train, feed)
        history.append(sess.run(reads))
  return history


def run_tensorflow(build_update, slot_names, clip=None, dense=False):
  """TF's kernel on the same de-duplicated IndexedSlices, step by step.

  build_update(var, indices, values) -> (update op, {slot name: variable}).
  """
  history = []
  with tf.Graph().as_default():
    var = tf.Variable(initial_table(), name="t")
    indices = v1.placeholder(tf.int64, [None])
    values = v1.placeholder(tf.float32, [None, DIM])
    update, slots = build_update(var, indices, values)
    assert sorted(slots) == sorted(slot_names)
    reads = {"table": var.read_value(),
             **{k: s.read_value() for k, s in slots.items()}}
    with v1.Session() as sess:
      sess.run(v1.global_variables_initializer())
      for n, batch in enumerate(BATCHES):
        g_batch = {"f": batch["f"], "g": batch["g"]}
        ids, sums = summed_gradients(g_batch, activation_grads(n))
        if clip is not None:
          sums = np.clip(sums, F32(clip[0]), F32(clip[1]))
        if dense:
          full = np.zeros((VOCAB, DIM), F32)
          full[ids] = sums
          ids, sums = np.arange(VOCAB, dtype=np.int64), full
        sess.run(update, {indices: ids, values: sums})
        history.append(sess.run(reads))
  return history


# --- TF updates ---------------------------------------------------------------


def v1_optimizer_update(optimizer, slot_map):

  def build(var, indices, values):
    update = optimizer.apply_gradients(
        [(tf.IndexedSlices(values, indices, tf.constant([VOCAB, DIM])), var)])
    return update, {ours: optimizer.get_slot(var, theirs)
                    for ours, theirs in slot_map.items()}

  return build


def slot_variable(name, value):
  return tf.Variable(np.full((VOCAB, DIM), value, F32), name=name)


def ftrl_update(params):
  lr = params.learning_rate

  def build(var, indices, values):
    accumulator = slot_variable("accum", params.initial_accumulator_value)
    linear = slot_variable("linear", 0.0)
    update = tf.raw_ops.ResourceSparseApplyFtrlV2(
        var=var.handle, accum=accumulator.handle, linear=linear.handle,
        grad=values, indices=indices, lr=tf.constant(lr, tf.float32),
        l1=tf.constant(params.l1_regularization_strength, tf.float32),
        # beta enters the quadratic term as beta / lr = 2 * (beta / (2 lr)).
        l2=tf.constant(params.l2_regularization_strength,
                       tf.float32) + tf.constant(params.beta, tf.float32) /
        (2.0 * tf.constant(lr, tf.float32)),
        l2_shrinkage=tf.constant(0.0),
        lr_power=tf.constant(params.learning_rate_power, tf.float32),
        multiply_linear_by_lr=params.multiply_linear_by_learning_rate)
    return update, {"accumulator": accumulator, "linear": linear}

  return build


def rmsprop_update(params):

  def build(var, indices, values):
    ms = slot_variable("ms", 0.0)
    mom = slot_variable("mom", 0.0)
    update = tf.raw_ops.ResourceSparseApplyRMSProp(
        var=var.handle, ms=ms.handle, mom=mom.handle,
        lr=tf.constant(params.learning_rate, tf.float32),
        rho=tf.constant(params.rho, tf.float32),
        momentum=tf.constant(params.momentum, tf.float32),
        epsilon=tf.constant(params.epsilon, tf.float32), grad=values,
        indices=indices)
    return update, {"ms": ms, "mom": mom}

  return build


def dense_adam_update(params):
  assert not params.lazy_adam and not params.sum_inside_sqrt

  def build(var, indices, values):
    m = slot_variable("m", 0.0)
    v = slot_variable("v", 0.0)
    grad = tf.scatter_nd(tf.expand_dims(indices, 1), values, [VOCAB, DIM])
    update = tf.raw_ops.ResourceApplyAdam(
        var=var.handle, m=m.handle, v=v.handle,
        beta1_power=tf.constant(0.0), beta2_power=tf.constant(0.0),
        lr=tf.constant(params.learning_rate, tf.float32),
        beta1=tf.constant(params.beta1, tf.float32),
        beta2=tf.constant(params.beta2, tf.float32),
        epsilon=tf.constant(params.epsilon, tf.float32), grad=grad)
    return update, {"m": m, "v": v}

  return build


# --- cases ------------------------------------------------------------------


def _cases():
  cases = []
  for acc in (0.1, 0.5):
    params = es.AdagradParameters(0.3, initial_accumulator=acc)
    cases.append((f"Adagrad_acc{acc}", params, lambda p: v1_optimizer_update(
        v1.train.AdagradOptimizer(p.learning_rate,
                                  initial_accumulator_value=p.initial_accumulator),
        {"accumulator": "accumulator"}), None))
  # Gradient clipping happens on the per-id sums: clip them for TF too.
  params = es.AdagradParameters(0.3, clip_gradient_min=-0.4,
                                clip_gradient_max=0.6)
  cases.append(("Adagrad_clipped", params, lambda p: v1_optimizer_update(
      v1.train.AdagradOptimizer(p.learning_rate,
                                initial_accumulator_value=0.1),
      {"accumulator": "accumulator"}), (-0.4, 0.5)))
  for l1, l2 in ((0.0, 0.0), (0.05, 0.0), (0.02, 0.3)):
    params = es.ProximalAdagradParameters(
        0.3, initial_accumulator=0.2, l1_regularization_strength=l1,
        l2_regularization_strength=l2)
    cases.append((f"ProximalAdagrad_l1_{l1}_l2_{l2}", params,
                  lambda p: v1_optimizer_update(
                      v1.train.ProximalAdagradOptimizer(
                          p.learning_rate,
                          initial_accumulator_value=p.initial_accumulator,
                          l1_regularization_strength=(
                              p.l1_regularization_strength),
                          l2_regularization_strength=(
                              p.l2_regularization_strength)),
                      {"accumulator": "accumulator"}), None))
  for nesterov in (False, True):
    params = es.MomentumParameters(0.2, momentum=0.8, use_nesterov=nesterov)
    cases.append((f"Momentum_nesterov_{nesterov}", params,
                  lambda p: v1_optimizer_update(
                      v1.train.MomentumOptimizer(p.learning_rate, p.momentum,
                                                 use_nesterov=p.use_nesterov),
                      {"momenta": "momentum"}), None))
  params = es.StochasticGradientDescentParameters(0.7)
  cases.append(("SGD", params, lambda p: v1_optimizer_update(
      v1.train.GradientDescentOptimizer(p.learning_rate), {}), None))
  for linear_by_lr in (False, True):
    for beta, l1, l2, power, acc in ((0.5, 0.0, 0.0, -0.5, 0.1),
                                     (1.0, 0.05, 0.1, -0.5, 0.3),
                                     (0.25, 0.01, 0.02, -0.3, 0.1),
                                     (0.0, 0.02, 0.0, -0.5, 0.1)):
      params = es.FtrlParameters(
          0.2, learning_rate_power=power, initial_accumulator_value=acc,
          l1_regularization_strength=l1, l2_regularization_strength=l2,
          beta=beta, multiply_linear_by_learning_rate=linear_by_lr)
      cases.append((f"Ftrl_beta{beta}_l1_{l1}_l2_{l2}_p{power}_"
                     f"linearbylr_{linear_by_lr}", params, ftrl_update, None))
  for momentum in (0.0, 0.5):
    params = es.RMSPropParameters(0.05, rho=0.875, momentum=momentum,
                                  epsilon=1e-4)
    cases.append((f"RMSProp_momentum{momentum}", params, rmsprop_update,
                  None))
  # Dyadic betas here (exact `1 - beta` in float32 and float64); TF's
  # default-style betas in test_non_lazy_adam_default_style_betas_*.
  params = es.AdamParameters(0.1, beta1=0.875, beta2=1 - 2**-10,
                             epsilon=1e-3, lazy_adam=False,
                             sum_inside_sqrt=False)
  cases.append(("NonLazyAdam", params, dense_adam_update, None))
  return cases


CASES = _cases()


def _slot_names(params):
  return [spec.name for spec in params.slot_specs()]


def compare(engine_history, tf_history):
  for n, (ours, theirs) in enumerate(zip(engine_history, tf_history)):
    assert sorted(ours) == sorted(theirs)
    for key in ours:
      np.testing.assert_allclose(ours[key], theirs[key], rtol=RTOL, atol=ATOL,
                                 err_msg=f"{key} after step {n}")


@pytest.mark.parametrize("num_shards,strategy", [(1, "div"), (3, "mod")])
@pytest.mark.parametrize("name,params,make_update,clip", CASES,
                         ids=[c[0] for c in CASES])
def test_engine_update_equals_tensorflow_kernel(name, params, make_update,
                                                clip, num_shards, strategy):
  del name
  clipping_limit = None
  if clip is not None:
    # clip_gradient_* of the optimizer, tightened by the spec's limit.
    clipping_limit = 0.5
  ours = run_engine(params, num_shards, strategy, clipping_limit)
  theirs = run_tensorflow(make_update(params), _slot_names(params), clip=clip,
                          dense=isinstance(params, es.AdamParameters))
  compare(ours, theirs)
  # The table moved (the comparison is not vacuous).
  assert not np.allclose(ours[-1]["table"], initial_table())


def test_non_lazy_adam_default_style_betas_equal_tensorflow_kernel():
  # Regression: `1 - beta` was once computed in float64 and rounded, while
  # TF's kernel (and the TPU) compute it from float32 beta.
  params = es.AdamParameters(0.1, beta1=0.9, beta2=0.9999, epsilon=1e-3,
                             lazy_adam=False, sum_inside_sqrt=False)
  compare(run_engine(params, 1, "div"),
          run_tensorflow(dense_adam_update(params), ["m", "v"], dense=True))
