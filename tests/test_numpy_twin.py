"""Tests of the NumPy twin (tests/numpy_twin.py) itself.

Three kinds of checks:
* small cases computed by hand (plain Python floats, never via the twin),
* agreement with TensorFlow's own CPU sparse-apply kernels where TF has the
  same rule (run eagerly on de-duplicated ids and summed gradients),
* the step-level rules of docs/numerics.md, 'The backward pass, table by table'
  and 'Pipelining' (accumulation, clipping, decay,
  learning-rate choice, step numbering, pipelining).
"""

import math
import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.tpu import tpu_embedding as tf_tpu_embedding

try:
  import numpy_twin as twin
except ImportError:  # tests/ imported as a package
  from tests import numpy_twin as twin

F32 = np.float32


def P(kind, **attrs):
  """Duck-typed optimizer parameters whose class is named `kind`."""
  defaults = dict(learning_rate=0.1, use_gradient_accumulation=True,
                  clip_weight_min=None, clip_weight_max=None,
                  weight_decay_factor=None,
                  multiply_weight_decay_factor_by_learning_rate=None,
                  clip_gradient_min=None, clip_gradient_max=None)
  defaults.update(attrs)
  obj = type(kind, (), {})()
  obj.__dict__.update(defaults)
  return obj


def close(actual, expected, rtol=1e-5, atol=1e-6):
  np.testing.assert_allclose(np.asarray(actual, dtype=np.float64),
                             np.asarray(expected, dtype=np.float64),
                             rtol=rtol, atol=atol)


def one_row(params, w, slots, g, lr=None):
  """Apply one update to a 1x1 table through the shared pipeline."""
  lr = params.learning_rate if lr is None else lr
  table = np.array([[w]], F32)
  slot_tables = {k: np.array([[v]], F32) for k, v in slots.items()}
  new_t, new_s = twin.apply_update(table, slot_tables, [0], [[g]], params, lr)
  return float(new_t[0, 0]), {k: float(v[0, 0]) for k, v in new_s.items()}


# ---------------------------------------------------------------------------
# Sharding
# ---------------------------------------------------------------------------


def test_div_layout_uneven():
  layout = twin.shard_layout(10, 3, 'div')
  assert [list(x) for x in layout] == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
  layout = twin.shard_layout(11, 4, 'div')
  assert [len(x) for x in layout] == [3, 3, 3, 2]
  assert [list(x) for x in twin.shard_layout(2, 3, 'div')] == [[0], [1], []]


def test_mod_layout():
  layout = twin.shard_layout(10, 3, 'mod')
  assert [list(x) for x in layout] == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]


@pytest.mark.parametrize('strategy', ['div', 'mod'])
@pytest.mark.parametrize('vocab,n', [(10, 3), (7, 7), (5, 2), (2, 3), (12, 4)])
def test_shards_round_trip(strategy, vocab, n):
  table = np.arange(vocab * 2, dtype=F32).reshape(vocab, 2)
  shards = twin.to_shards(table, n, strategy)
  assert len(shards) == n
  np.testing.assert_array_equal(twin.from_shards(shards, strategy), table)


def test_mod_shards_contents_and_conversion():
  table = np.arange(7, dtype=F32).reshape(7, 1)
  mod = twin.to_shards(table, 3, 'mod')
  assert [s[:, 0].tolist() for s in mod] == [[0, 3, 6], [1, 4], [2, 5]]
  div = twin.to_shards(table, 3, 'div')
  assert [s[:, 0].tolist() for s in div] == [[0, 1, 2], [3, 4], [5, 6]]
  # Reading mod shards as if they were div permutes rows: layouts differ.
  assert not np.array_equal(twin.from_shards(mod, 'div'), table)
  # mod -> full -> div conversion.
  converted = twin.to_shards(twin.from_shards(mod, 'mod'), 3, 'div')
  for a, b in zip(converted, div):
    np.testing.assert_array_equal(a, b)


# ---------------------------------------------------------------------------
# Forward
# ---------------------------------------------------------------------------

TABLE = np.array([[1., 2.], [3., 4.], [5., 6.], [7., 8.]], F32)
IDS = [[0, 1], [2], []]
WEIGHTS = [[1., 3.], [2.], []]


def test_lookup_sum():
  out = twin.lookup(TABLE, IDS, WEIGHTS, combiner='sum')
  close(out, [[1 + 9, 2 + 12], [10, 12], [0, 0]])
  out = twin.lookup(TABLE, IDS, None, combiner='sum')
  close(out, [[4, 6], [5, 6], [0, 0]])


def test_lookup_mean():
  out = twin.lookup(TABLE, IDS, WEIGHTS, combiner='mean')
  close(out, [[10 / 4, 14 / 4], [5, 6], [0, 0]])
  out = twin.lookup(TABLE, [[0, 1, 1]], None, combiner='mean')
  close(out, [[7 / 3, 10 / 3]])


def test_lookup_sqrtn():
  out = twin.lookup(TABLE, IDS, WEIGHTS, combiner='sqrtn')
  s = math.sqrt(1 + 9)
  close(out, [[10 / s, 14 / s], [5, 6], [0, 0]])
  out = twin.lookup(TABLE, [[0, 1]], None, combiner='sqrtn')
  close(out, [[4 / math.sqrt(2), 6 / math.sqrt(2)]])


def test_lookup_all_empty():
  out = twin.lookup(TABLE, [[], []], None, combiner='mean')
  assert out.shape == (2, 2) and out.dtype == F32
  assert not out.any()


def test_lookup_sequence_padding_and_truncation():
  acts, lengths = twin.lookup(TABLE, [[3, 1, 2], [0], []],
                              max_sequence_length=2)
  assert acts.shape == (3, 2, 2)
  close(acts, [[[7, 8], [3, 4]], [[1, 2], [0, 0]], [[0, 0], [0, 0]]])
  assert lengths.tolist() == [2, 1, 0]
  with pytest.raises(ValueError):
    twin.lookup(TABLE, [[0]], [[1.]], max_sequence_length=2)


def test_lookup_combiner_none():
  out = twin.lookup(TABLE, [[2], [0], [2]], combiner=None)
  close(out, [[5, 6], [1, 2], [5, 6]])
  with pytest.raises(ValueError):
    twin.lookup(TABLE, [[2, 1]], combiner=None)
  with pytest.raises(ValueError):
    twin.lookup(TABLE, [[]], combiner=None)
  with pytest.raises(ValueError):
    twin.lookup(TABLE, [[2]], [[1.]], combiner=None)


def test_lookup_rejects_out_of_range():
  with pytest.raises(ValueError):
    twin.lookup(TABLE, [[4]], combiner='sum')


# ---------------------------------------------------------------------------
# Slots and dispatch
# ---------------------------------------------------------------------------


def test_init_slots_with_tf_parameter_classes():
  exp = tf_tpu_embedding  # not every class is exported under tf.compat.v1
  s = twin.init_slots(exp.AdagradParameters(0.1), 3, 2)
  assert list(s) == ['accumulator'] and s['accumulator'].shape == (3, 2)
  assert np.all(s['accumulator'] == F32(0.1))
  s = twin.init_slots(exp.FtrlParameters(0.1, initial_accumulator_value=0.5),
                      3, 2)
  assert sorted(s) == ['accumulator', 'linear']
  assert np.all(s['accumulator'] == F32(0.5)) and not s['linear'].any()
  s = twin.init_slots(exp.AdamParameters(0.1), 3, 2)
  assert sorted(s) == ['m', 'v'] and not s['m'].any() and not s['v'].any()
  s = twin.init_slots(exp.ProximalYogiParameters(0.1), 2, 2)
  assert sorted(s) == ['m', 'v'] and np.all(s['v'] == F32(1e-6))
  s = twin.init_slots(exp.ProximalAdagradParameters(0.1), 2, 2)
  assert np.all(s['accumulator'] == F32(0.1))
  assert sorted(twin.init_slots(exp.RMSPropParameters(0.1, 0.9, 0.1, 1e-6),
                                2, 2)) == ['mom', 'ms']
  assert list(twin.init_slots(exp.MomentumParameters(0.1, 0.9), 2, 2)) == [
      'momenta']
  s = twin.init_slots(exp.AdagradMomentumParameters(0.1, 0.9), 2, 2)
  assert sorted(s) == ['accumulator', 'momenta'] and not s['accumulator'].any()
  assert twin.init_slots(exp.StochasticGradientDescentParameters(0.1),
                         2, 2) == {}


def test_tf_parameter_classes_update():
  exp = tf_tpu_embedding  # not every class is exported under tf.compat.v1
  params = exp.FtrlParameters(0.1, l1_regularization_strength=0.01,
                              l2_regularization_strength=0.02, beta=0.3)
  w, _ = one_row(params, 0.5, {'accumulator': 0.1, 'linear': 0.0}, 0.5)
  assert abs(w - 0.0967953) < 1e-5


def test_unknown_parameters_rejected():
  with pytest.raises(ValueError):
    twin.init_slots(P('AdadeltaParameters'), 2, 2)


# ---------------------------------------------------------------------------
# Single-row updates against hand-derived numbers
# ---------------------------------------------------------------------------


def test_sgd_hand():
  w, slots = one_row(P('StochasticGradientDescentParameters'), 1.0, {}, 0.5)
  assert abs(w - 0.95) < 1e-6 and slots == {}


def test_adagrad_hand():
  params = P('AdagradParameters', initial_accumulator=0.1)
  w, s = one_row(params, 1.0, {'accumulator': 0.1}, 0.5)
  close(s['accumulator'], 0.35)
  close(w, 1.0 - 0.1 * 0.5 / math.sqrt(0.35))  # 0.915485
  close(w, 0.9154846)


def test_proximal_adagrad_hand():
  params = P('ProximalAdagradParameters', l1_regularization_strength=0.2,
             l2_regularization_strength=0.5)
  w, s = one_row(params, 1.0, {'accumulator': 0.1}, 0.5)
  eta = 0.1 / math.sqrt(0.35)
  v = 1.0 - eta * 0.5
  close(w, (v - eta * 0.2) / (1 + eta * 0.5))
  close(s['accumulator'], 0.35)
  # Negative pre-proximal value keeps its sign.
  w, _ = one_row(params, -1.0, {'accumulator': 0.1}, -0.5)
  close(w, -(v - eta * 0.2) / (1 + eta * 0.5))
  # l1 large enough: the weight is set to exactly zero.
  params.l1_regularization_strength = 10.0
  w, _ = one_row(params, 1.0, {'accumulator': 0.1}, 0.5)
  assert w == 0.0


def test_adam_hand_no_bias_correction():
  params = P('AdamParameters', beta1=0.9, beta2=0.999, epsilon=1e-8,
             lazy_adam=True, sum_inside_sqrt=False)
  w, s = one_row(params, 1.0, {'m': 0.0, 'v': 0.0}, 0.5)
  close(s['m'], 0.05)
  close(s['v'], 0.00025)
  close(w, 1.0 - 0.1 * 0.05 / (math.sqrt(0.00025) + 1e-8))  # 0.683772
  assert abs(w - 0.9) > 0.1  # a bias-corrected Adam would give 0.9


def test_adam_hand_epsilon_placement():
  params = P('AdamParameters', beta1=0.9, beta2=0.999, epsilon=0.1,
             lazy_adam=True, sum_inside_sqrt=True)
  w_in, _ = one_row(params, 1.0, {'m': 0.0, 'v': 0.0}, 0.5)
  close(w_in, 1.0 - 0.1 * 0.05 / math.sqrt(0.00025 + 0.01))
  params.sum_inside_sqrt = False
  w_out, _ = one_row(params, 1.0, {'m': 0.0, 'v': 0.0}, 0.5)
  close(w_out, 1.0 - 0.1 * 0.05 / (math.sqrt(0.00025) + 0.1))
  assert abs(w_in - w_out) > 1e-3


def _ftrl_hand(w, a, lin, g, lr, l1, l2, beta, power=-0.5):
  a2 = a + g * g
  sigma = (a2 ** -power - a ** -power) / lr
  lin = lin + g - sigma * w
  quad = a2 ** -power / lr + 2 * l2 + beta / lr
  new_w = (math.copysign(l1, lin) - lin) / quad if abs(lin) > l1 else 0.0
  return new_w, a2, lin


def test_ftrl_hand():
  params = P('FtrlParameters', learning_rate_power=-0.5,
             initial_accumulator_value=0.1, l1_regularization_strength=0.01,
             l2_regularization_strength=0.02, beta=0.3,
             multiply_linear_by_learning_rate=False,
             allow_zero_accumulator=False)
  w, s = one_row(params, 0.5, {'accumulator': 0.1, 'linear': 0.0}, 0.5)
  ew, ea, el = _ftrl_hand(0.5, 0.1, 0.0, 0.5, 0.1, 0.01, 0.02, 0.3)
  close(el, -0.8769)  # 0.5 - (sqrt(.35) - sqrt(.1)) / .1 * .5
  close([w, s['accumulator'], s['linear']], [ew, ea, el])
  close(w, 0.0967953)
  # lr_power other than -0.5.
  params.learning_rate_power = -0.7
  w, s = one_row(params, 0.5, {'accumulator': 0.1, 'linear': 0.2}, -0.3)
  close([w, s['linear']],
        list(_ftrl_hand(0.5, 0.1, 0.2, -0.3, 0.1, 0.01, 0.02, 0.3, -0.7)[::2]))
  # |linear| <= l1: weight is exactly zero.
  params.learning_rate_power = -0.5
  params.l1_regularization_strength = 1.0
  w, _ = one_row(params, 0.5, {'accumulator': 0.1, 'linear': 0.0}, 0.5)
  assert w == 0.0


def test_ftrl_hand_multiply_linear_by_lr():
  params = P('FtrlParameters', learning_rate_power=-0.5,
             l1_regularization_strength=0.01, l2_regularization_strength=0.02,
             beta=0.3, multiply_linear_by_learning_rate=True)
  w, s = one_row(params, 0.5, {'accumulator': 0.1, 'linear': 0.0}, 0.5)
  lin = 0.1 * 0.5 - (math.sqrt(0.35) - math.sqrt(0.1)) * 0.5
  quad = math.sqrt(0.35) + 2 * 0.02 * 0.1 + 0.3
  close(s['linear'], lin)  # = lr * the plain linear (-0.08769)
  close(w, (-0.01 * 0.1 - lin) / quad)
  close(w, 0.0967953)  # same weight as the plain form for a fixed lr


def test_ftrl_zero_accumulator_no_nan():
  for allow in (True, False):
    params = P('FtrlParameters', learning_rate_power=-0.5,
               initial_accumulator_value=0.0, l1_regularization_strength=0.01,
               l2_regularization_strength=0.0, beta=0.0,
               allow_zero_accumulator=allow,
               multiply_linear_by_learning_rate=False)
    # zero accumulator and zero gradient: quad = 0, result 0, no NaN.
    with np.errstate(all='raise'):
      w, s = one_row(params, 0.0, {'accumulator': 0.0, 'linear': 0.0}, 0.0)
    assert w == 0.0 and s['accumulator'] == 0.0 and s['linear'] == 0.0
    # zero accumulator, non-zero gradient: a' = .25, sigma = .5/.1 = 5.
    w, s = one_row(params, 0.0, {'accumulator': 0.0, 'linear': 0.0}, 0.5)
    close([w, s['accumulator'], s['linear']], [(0.01 - 0.5) / 5, 0.25, 0.5])
    params.multiply_linear_by_learning_rate = True
    with np.errstate(all='raise'):
      w, s = one_row(params, 0.0, {'accumulator': 0.0, 'linear': 0.0}, 0.0)
    assert w == 0.0


def test_momentum_hand():
  params = P('MomentumParameters', momentum=0.9, use_nesterov=False)
  w, s = one_row(params, 1.0, {'momenta': 0.2}, 0.5)
  close([w, s['momenta']], [1.0 - 0.1 * 0.68, 0.68])
  params.use_nesterov = True
  w, s = one_row(params, 1.0, {'momenta': 0.2}, 0.5)
  close([w, s['momenta']], [1.0 - 0.1 * (0.5 + 0.9 * 0.68), 0.68])  # 0.8888


def test_rmsprop_hand_two_steps():
  params = P('RMSPropParameters', rho=0.9, momentum=0.5, epsilon=0.01)
  w, s = one_row(params, 1.0, {'ms': 0.0, 'mom': 0.0}, 0.5)
  ms1 = 0.1 * 0.25
  mom1 = 0.1 * 0.5 / math.sqrt(ms1 + 0.01)
  close([w, s['ms'], s['mom']], [1.0 - mom1, ms1, mom1])
  w, s = one_row(params, w, s, -0.5)
  ms2 = 0.9 * ms1 + 0.1 * 0.25
  mom2 = 0.5 * mom1 - 0.1 * 0.5 / math.sqrt(ms2 + 0.01)
  close([w, s['ms'], s['mom']], [1.0 - mom1 - mom2, ms2, mom2])


def test_adagrad_momentum_hand():
  # The momentum accumulates g * s, s = (accum + eps)^(-1/exponent).
  params = P('AdagradMomentumParameters', momentum=0.9, use_nesterov=False,
             exponent=2.0, beta2=1.0, epsilon=1e-10)
  w, s = one_row(params, 1.0, {'accumulator': 0.0, 'momenta': 0.0}, 0.5)
  close([s['accumulator'], s['momenta']], [0.25, 0.5 * 2.0])
  close(w, 1.0 - 0.1 * 1.0)  # 0.9
  params.use_nesterov = True
  w, _ = one_row(params, 1.0, {'accumulator': 0.0, 'momenta': 0.0}, 0.5)
  close(w, 1.0 - 0.1 * (0.9 * 1.0 + 1.0))  # 0.81
  # beta2 < 1 (moving average) and exponent 4, two steps whose gradients
  # differ (where the momentum's content shows in the table).
  params = P('AdagradMomentumParameters', momentum=0.9, use_nesterov=False,
             exponent=4.0, beta2=0.5, epsilon=1e-10)
  w, s = one_row(params, 1.0, {'accumulator': 0.0, 'momenta': 0.0}, 0.5)
  acc1 = 0.5 * 0.25
  mom1 = 0.5 * acc1 ** -0.25
  close([w, s['accumulator'], s['momenta']], [1 - 0.1 * mom1, acc1, mom1])
  w, s = one_row(params, w, s, 2.0)
  acc2 = 0.5 * acc1 + 0.5 * 4.0
  mom2 = 0.9 * mom1 + 2.0 * acc2 ** -0.25
  close([w, s['accumulator'], s['momenta']],
        [1 - 0.1 * mom1 - 0.1 * mom2, acc2, mom2])


def test_adagrad_momentum_example_of_the_tpu_test():
  # One row, gradient 6 then 1, TF's TPU test's hyper-parameters: -1.1771
  # (the reading that accumulates the scale alone gave -0.9153).
  params = P('AdagradMomentumParameters', momentum=0.9, use_nesterov=True,
             exponent=3.0, beta2=0.9, epsilon=0.1)
  w, s = 0.0, {'accumulator': 0.0, 'momenta': 0.0}
  for g in (6.0, 1.0):
    w, s = one_row(params, w, s, g)
  close([w, s['accumulator'], s['momenta']], [-1.177148, 3.34, 4.153789])


def test_proximal_yogi_hand():
  params = P('ProximalYogiParameters', beta1=0.9, beta2=0.999, epsilon=1e-3,
             l1_regularization_strength=0.01, l2_regularization_strength=0.1,
             initial_accumulator_value=0.01)
  w, s = one_row(params, 1.0, {'v': 0.01, 'm': 0.0}, 0.5)
  v = 0.01 + 0.001 * 0.25  # g^2 > v: v grows
  eta = 0.1 / (math.sqrt(v) + 1e-3)
  u = 1.0 - eta * 0.05
  close([s['m'], s['v']], [0.05, v])
  close(w, (u - eta * 0.01) / (1 + eta * 0.1))
  # g^2 < v: v shrinks additively (unlike Adam's 0.999 * 1 + 0.001 * .25).
  params.l1_regularization_strength = 0.0
  params.l2_regularization_strength = 0.0
  w, s = one_row(params, 1.0, {'v': 1.0, 'm': 0.0}, 0.5)
  close(s['v'], 1.0 - 0.001 * 0.25)
  close(w, 1.0 - 0.1 / (math.sqrt(0.99975) + 1e-3) * 0.05)
  # l1 threshold zeroes the weight.
  params.l1_regularization_strength = 100.0
  w, _ = one_row(params, 1.0, {'v': 0.01, 'm': 0.0}, 0.5)
  assert w == 0.0


# ---------------------------------------------------------------------------
# Agreement with TensorFlow's CPU kernels
# ---------------------------------------------------------------------------

V, D, STEPS = 12, 4, 4


def _random_sparse_steps(seed):
  """Per step: (distinct ids, float32 summed gradients) from duplicated ids."""
  rng = np.random.RandomState(seed)
  steps = []
  for _ in range(STEPS):
    raw_ids = rng.randint(0, V, size=9)
    raw_g = rng.normal(size=(9, D)).astype(F32)
    ids = np.unique(raw_ids)
    g = np.zeros((len(ids), D), F32)
    np.add.at(g, np.searchsorted(ids, raw_ids), raw_g)
    steps.append((ids, g))
  return rng.normal(size=(V, D)).astype(F32), steps


def _run_against_tf(params, tf_apply, seed, slot_init=None):
  table, steps = _random_sparse_steps(seed)
  slots = twin.init_slots(params, V, D)
  if slot_init:
    for k, v in slot_init.items():
      slots[k] = np.full((V, D), v, F32)
  tf_var = tf.Variable(table)
  tf_slots = {k: tf.Variable(v) for k, v in slots.items()}
  lr = params.learning_rate
  for ids, g in steps:
    table, slots = twin.apply_update(table, slots, ids, g, params, lr)
    tf_apply(tf_var, tf_slots, tf.constant(ids, tf.int64), tf.constant(g))
    close(table, tf_var.numpy())
    for k in slots:
      close(slots[k], tf_slots[k].numpy())
  return table


@pytest.mark.parametrize('seed', [0, 1])
def test_tf_sgd(seed):
  params = P('StochasticGradientDescentParameters', learning_rate=0.3)

  def apply(var, slots, ids, g):
    tf.raw_ops.ResourceScatterAdd(resource=var.handle, indices=ids,
                                  updates=-F32(0.3) * g)

  _run_against_tf(params, apply, seed)


@pytest.mark.parametrize('seed', [0, 1])
def test_tf_adagrad(seed):
  params = P('AdagradParameters', learning_rate=0.2, initial_accumulator=0.1)

  def apply(var, slots, ids, g):
    tf.raw_ops.ResourceSparseApplyAdagradV2(
        var=var.handle, accum=slots['accumulator'].handle, lr=F32(0.2),
        epsilon=F32(0.0), grad=g, indices=ids)

  _run_against_tf(params, apply, seed)


@pytest.mark.parametrize('seed', [0, 1])
def test_tf_proximal_adagrad(seed):
  params = P('ProximalAdagradParameters', learning_rate=0.2,
             initial_accumulator=0.1, l1_regularization_strength=0.05,
             l2_regularization_strength=0.3)

  def apply(var, slots, ids, g):
    tf.raw_ops.ResourceSparseApplyProximalAdagrad(
        var=var.handle, accum=slots['accumulator'].handle, lr=F32(0.2),
        l1=F32(0.05), l2=F32(0.3), grad=g, indices=ids)

  _run_against_tf(params, apply, seed)


@pytest.mark.parametrize('mlr', [False, True])
@pytest.mark.parametrize('power', [-0.5, -0.7])
def test_tf_ftrl(mlr, power):
  lr, l1, l2, beta = 0.2, 0.05, 0.1, 0.4
  params = P('FtrlParameters', learning_rate=lr, learning_rate_power=power,
             initial_accumulator_value=0.1, l1_regularization_strength=l1,
             l2_regularization_strength=l2, beta=beta,
             multiply_linear_by_learning_rate=mlr,
             allow_zero_accumulator=False)

  def apply(var, slots, ids, g):
    # TF's kernels have no beta: fold it into l2 as beta / (2 lr)
    # (optimization_parameters.proto, FtrlParameters comment).
    tf.raw_ops.ResourceSparseApplyFtrlV2(
        var=var.handle, accum=slots['accumulator'].handle,
        linear=slots['linear'].handle, grad=g, indices=ids, lr=F32(lr),
        l1=F32(l1), l2=F32(l2 + beta / (2 * lr)), l2_shrinkage=F32(0.0),
        lr_power=F32(power), multiply_linear_by_lr=mlr)

  final = _run_against_tf(params, apply, seed=3)
  assert (final == 0).any() and (final != 0).any()  # l1 both ways


@pytest.mark.parametrize('nesterov', [False, True])
def test_tf_momentum(nesterov):
  params = P('MomentumParameters', learning_rate=0.2, momentum=0.8,
             use_nesterov=nesterov)

  def apply(var, slots, ids, g):
    tf.raw_ops.ResourceSparseApplyMomentum(
        var=var.handle, accum=slots['momenta'].handle, lr=F32(0.2), grad=g,
        indices=ids, momentum=F32(0.8), use_nesterov=nesterov)

  _run_against_tf(params, apply, seed=4)


def test_tf_rmsprop():
  params = P('RMSPropParameters', learning_rate=0.05, rho=0.8, momentum=0.6,
             epsilon=1e-3)

  def apply(var, slots, ids, g):
    tf.raw_ops.ResourceSparseApplyRMSProp(
        var=var.handle, ms=slots['ms'].handle, mom=slots['mom'].handle,
        lr=F32(0.05), rho=F32(0.8), momentum=F32(0.6), epsilon=F32(1e-3),
        grad=g, indices=ids)

  _run_against_tf(params, apply, seed=5)


def test_tf_non_lazy_adam_dense_kernel():
  # Non-lazy Adam without bias correction == TF's dense Adam kernel with
  # beta1_power = beta2_power = 0 (its lr_t is then exactly lr), fed the
  # scattered gradient (zeros for untouched rows).
  params = P('AdamParameters', learning_rate=0.05, beta1=0.8, beta2=0.9,
             epsilon=1e-3, lazy_adam=False, sum_inside_sqrt=False)

  def apply(var, slots, ids, g):
    dense = tf.scatter_nd(ids[:, None], g, [V, D])
    tf.raw_ops.ResourceApplyAdam(
        var=var.handle, m=slots['m'].handle, v=slots['v'].handle,
        beta1_power=F32(0), beta2_power=F32(0), lr=F32(0.05), beta1=F32(0.8),
        beta2=F32(0.9), epsilon=F32(1e-3), grad=dense)

  _run_against_tf(params, apply, seed=6)


def test_tf_lazy_adam_on_touched_rows():
  params = P('AdamParameters', learning_rate=0.05, beta1=0.8, beta2=0.9,
             epsilon=1e-3, lazy_adam=True, sum_inside_sqrt=False)

  def apply(var, slots, ids, g):
    rows = [tf.Variable(tf.gather(x, ids)) for x in
            (var, slots['m'], slots['v'])]
    tf.raw_ops.ResourceApplyAdam(
        var=rows[0].handle, m=rows[1].handle, v=rows[2].handle,
        beta1_power=F32(0), beta2_power=F32(0), lr=F32(0.05), beta1=F32(0.8),
        beta2=F32(0.9), epsilon=F32(1e-3), grad=g)
    for target, src in zip((var, slots['m'], slots['v']), rows):
      target.scatter_nd_update(ids[:, None], src)

  _run_against_tf(params, apply, seed=7)


# ---------------------------------------------------------------------------
# Step-level rules (docs/numerics.md, 'The backward pass, table by table' and
# 'Pipelining')
# ---------------------------------------------------------------------------


def _config(params, tables, features, **kw):
  cfg = {'tables': {}, 'features': features, 'optimizer': params,
         'clipping_limit': None, 'gradient_multiplier_fn': None,
         'pipelining': False}
  for name, t in tables.items():
    entry = {'combiner': 'sum', 'optimizer': None, 'learning_rate': None,
             'learning_rate_fn': None}
    entry.update(t)
    cfg['tables'][name] = entry
  cfg.update(kw)
  return cfg


def test_accumulation_across_examples_and_features():
  params = P('AdagradParameters', learning_rate=0.5, initial_accumulator=0.1)
  cfg = _config(params, {'t': {'vocab': 3, 'dim': 1, 'combiner': 'mean'}},
                {'f1': {'table': 't', 'max_sequence_length': 0,
                        'weight_key': None},
                 'f2': {'table': 't', 'max_sequence_length': 0,
                        'weight_key': None}})
  state = twin.init_state(cfg, {'t': np.array([[1.0], [2.0], [3.0]], F32)})
  batch = {'f1': ([[0, 1], [0]], None), 'f2': ([[0], [2]], None)}
  grads = {'f1': np.array([[1.0], [2.0]], F32),
           'f2': np.array([[4.0], [-1.0]], F32)}
  new = twin.backward(state, cfg, batch, grads, global_step=0)
  # id 0: 1 * 1/2 (mean of two) + 2 + 4 = 6.5 ; id 1: 0.5 ; id 2: -1.
  contributions = {0: [0.5, 2.0, 4.0], 1: [0.5], 2: [-1.0]}
  expected, per_contribution = [], []
  for i, w0 in enumerate([1.0, 2.0, 3.0]):
    g = sum(contributions[i])
    expected.append(w0 - 0.5 * g / math.sqrt(0.1 + g * g))
    w, a = w0, 0.1
    for c in contributions[i]:
      a += c * c
      w -= 0.5 * c / math.sqrt(a)
    per_contribution.append(w)
  close(new['t']['table'][:, 0], expected)
  close(new['t']['slots']['accumulator'][:, 0], [0.1 + 6.5 ** 2, 0.35, 1.1])
  assert abs(new['t']['table'][0, 0] - per_contribution[0]) > 1e-2
  # input state untouched (pure function)
  close(state['t']['table'][:, 0], [1.0, 2.0, 3.0])


def test_combiner_backward_weights():
  cfg = _config(P('StochasticGradientDescentParameters', learning_rate=1.0),
                {'s': {'vocab': 3, 'dim': 1, 'combiner': 'sqrtn'},
                 'm': {'vocab': 3, 'dim': 1, 'combiner': 'mean'}},
                {'a': {'table': 's', 'max_sequence_length': 0,
                       'weight_key': 'wa'},
                 'b': {'table': 'm', 'max_sequence_length': 0,
                       'weight_key': 'wb'}})
  zeros = np.zeros((3, 1), F32)
  state = twin.init_state(cfg, {'s': zeros, 'm': zeros})
  batch = {'a': ([[0, 1], []], [[3.0, 4.0], []]),
           'b': ([[0, 2, 2]], [[1.0, 2.0, 1.0]])}
  grads = {'a': np.array([[1.0], [7.0]], F32), 'b': np.array([[2.0]], F32)}
  new = twin.backward(state, cfg, batch, grads, 0)
  close(new['s']['table'][:, 0], [-3 / 5, -4 / 5, 0.0])
  close(new['m']['table'][:, 0], [-2 * 1 / 4, 0.0, -2 * 3 / 4])


def test_sequence_backward_and_truncation():
  cfg = _config(P('StochasticGradientDescentParameters', learning_rate=1.0),
                {'t': {'vocab': 4, 'dim': 1}},
                {'s': {'table': 't', 'max_sequence_length': 2,
                       'weight_key': None}})
  state = twin.init_state(cfg, {'t': np.zeros((4, 1), F32)})
  batch = {'s': ([[1, 1, 3], [2]], None)}
  acts = twin.forward(state, cfg, batch)
  assert acts['s'].shape == (2, 2, 1)
  assert twin.sequence_lengths(cfg, batch)['s'].tolist() == [2, 1]
  grads = {'s': np.array([[[1.0], [2.0]], [[5.0], [9.0]]], F32)}
  new = twin.backward(state, cfg, batch, grads, 0)
  # id 1 gets 1 + 2, id 2 gets 5, id 3 (truncated) and padding get nothing.
  close(new['t']['table'][:, 0], [0.0, -3.0, -5.0, 0.0])


def test_combiner_none_backward():
  cfg = _config(P('StochasticGradientDescentParameters', learning_rate=1.0),
                {'t': {'vocab': 3, 'dim': 2, 'combiner': None}},
                {'f': {'table': 't', 'max_sequence_length': 0,
                       'weight_key': None}})
  state = twin.init_state(cfg, {'t': np.zeros((3, 2), F32)})
  batch = {'f': ([[2], [2], [0]], None)}
  new = twin.backward(state, cfg, batch,
                      {'f': np.array([[1, 2], [3, 4], [5, 6]], F32)}, 0)
  close(new['t']['table'], [[-5, -6], [0, 0], [-4, -6]])


def _sgd_single(w0, g, lr=0.1, clipping_limit=None, **params):
  p = P('StochasticGradientDescentParameters', learning_rate=lr, **params)
  cfg = _config(p, {'t': {'vocab': 2, 'dim': 1}},
                {'f': {'table': 't', 'max_sequence_length': 0,
                       'weight_key': None}},
                clipping_limit=clipping_limit)
  state = twin.init_state(cfg, {'t': np.array([[w0], [5.0]], F32)})
  new = twin.backward(state, cfg, {'f': ([[0]], None)},
                      {'f': np.array([[g]], F32)}, 0)
  assert new['t']['table'][1, 0] == F32(5.0)  # untouched row
  return float(new['t']['table'][0, 0])


def test_clipping_limit_tighter_wins():
  bounds = dict(clip_gradient_min=-1.0, clip_gradient_max=1.0)
  close(_sgd_single(1.0, 5.0, clipping_limit=0.3, **bounds), 1.0 - 0.03)
  close(_sgd_single(1.0, -5.0, clipping_limit=0.3, **bounds), 1.0 + 0.03)
  close(_sgd_single(1.0, 5.0, clipping_limit=None, **bounds), 1.0 - 0.1)
  # the optimizer's bound is tighter on one side only
  close(_sgd_single(1.0, 5.0, clipping_limit=0.5, clip_gradient_min=-1.0,
                    clip_gradient_max=0.2), 1.0 - 0.02)
  close(_sgd_single(1.0, -5.0, clipping_limit=0.5, clip_gradient_min=-1.0,
                    clip_gradient_max=0.2), 1.0 + 0.05)
  close(_sgd_single(1.0, 0.1, clipping_limit=0.5), 1.0 - 0.01)  # inside


def test_weight_decay_before_update():
  # (1 - 0.1 * 0.5) * 1 - 0.5 * 0.2 = 0.85 ; decay after would give 0.855.
  close(_sgd_single(1.0, 0.2, lr=0.5, weight_decay_factor=0.1,
                    multiply_weight_decay_factor_by_learning_rate=True), 0.85)
  # without the lr multiplication: 0.9 - 0.1 = 0.8 (after would be 0.81).
  close(_sgd_single(1.0, 0.2, lr=0.5, weight_decay_factor=0.1,
                    multiply_weight_decay_factor_by_learning_rate=False), 0.8)


def test_weight_decay_before_adagrad_update():
  p = P('AdagradParameters', learning_rate=0.5, initial_accumulator=0.1,
        weight_decay_factor=0.2)
  w, _ = one_row(p, 2.0, {'accumulator': 0.1}, 0.3)
  close(w, 2.0 * 0.8 - 0.5 * 0.3 / math.sqrt(0.19))


def test_weight_clip_after_update():
  # 1 + 0.1 * 5 = 1.5 -> clipped to 1.2; the untouched 5.0 is not clipped.
  close(_sgd_single(1.0, -5.0, clip_weight_max=1.2), 1.2)
  close(_sgd_single(1.0, 5.0, clip_weight_min=0.7), 0.7)
  # clip is on the updated value, not the old one: 1.3 -> 1.3 - 0.2 = 1.1.
  close(_sgd_single(1.3, 2.0, clip_weight_max=1.2), 1.1)


def test_learning_rate_fn_and_multiplier_see_step_at_start():
  seen_lr, seen_mult = [], []

  def lr_fn(step):
    seen_lr.append(step)
    return 0.1 * (step + 1)

  def mult_fn(step):
    seen_mult.append(step)
    return step + 2.0

  p = P('StochasticGradientDescentParameters', learning_rate=99.0)
  cfg = _config(p, {'t': {'vocab': 1, 'dim': 1, 'learning_rate_fn': lr_fn}},
                {'f': {'table': 't', 'max_sequence_length': 0,
                       'weight_key': None}},
                gradient_multiplier_fn=mult_fn)
  state = twin.init_state(cfg, {'t': np.ones((1, 1), F32)})
  final = twin.run_steps(state, cfg, [{'f': [[0]]}] * 2,
                         lambda step, acts: {'f': np.ones((1, 1), F32)},
                         pipelining=False)
  assert seen_lr == [0, 1] and seen_mult == [0, 1]
  close(final['t']['table'][0, 0], 1.0 - 0.1 * 2 - 0.2 * 3)


def test_learning_rate_and_optimizer_precedence():
  glob = P('StochasticGradientDescentParameters', learning_rate=0.5)
  own = P('StochasticGradientDescentParameters', learning_rate=0.25)
  cfg = _config(glob, {
      'a': {'vocab': 1, 'dim': 1},
      'b': {'vocab': 1, 'dim': 1, 'optimizer': own},
      'c': {'vocab': 1, 'dim': 1, 'learning_rate': 0.125,
            'learning_rate_fn': lambda s: 1000.0},
      'd': {'vocab': 1, 'dim': 1, 'learning_rate_fn': lambda s: 2.0},
  }, {k: {'table': k, 'max_sequence_length': 0, 'weight_key': None}
      for k in 'abcd'})
  state = twin.init_state(cfg, {k: np.zeros((1, 1), F32) for k in 'abcd'})
  batch = {k: [[0]] for k in 'abcd'}
  new = twin.backward(state, cfg, batch,
                      {k: np.ones((1, 1), F32) for k in 'abcd'}, 0)
  close([new[k]['table'][0, 0] for k in 'abcd'], [-0.5, -0.25, -0.125, -2.0])


def test_per_table_optimizer_overrides_global():
  glob = P('StochasticGradientDescentParameters', learning_rate=0.5)
  own = P('AdagradParameters', learning_rate=0.5, initial_accumulator=0.1)
  cfg = _config(glob, {'a': {'vocab': 1, 'dim': 1},
                       'b': {'vocab': 1, 'dim': 1, 'optimizer': own}},
                {k: {'table': k, 'max_sequence_length': 0, 'weight_key': None}
                 for k in 'ab'})
  state = twin.init_state(cfg, {k: np.zeros((1, 1), F32) for k in 'ab'})
  assert state['a']['slots'] == {} and 'accumulator' in state['b']['slots']
  new = twin.backward(state, cfg, {k: [[0]] for k in 'ab'},
                      {k: np.ones((1, 1), F32) for k in 'ab'}, 0)
  close(new['a']['table'][0, 0], -0.5)
  close(new['b']['table'][0, 0], -0.5 / math.sqrt(1.1))


def _pipeline_cfg():
  p = P('StochasticGradientDescentParameters', learning_rate=0.1)
  return _config(p, {'t': {'vocab': 2, 'dim': 1}},
                 {'f': {'table': 't', 'max_sequence_length': 0,
                        'weight_key': None}})


@pytest.mark.parametrize('pipelining', [False, True])
def test_pipelining_staleness(pipelining):
  cfg = _pipeline_cfg()
  state = twin.init_state(cfg, {'t': np.array([[1.0], [3.0]], F32)})
  batches = [{'f': [[0]]}] * 3
  # loss = 0.5 * a^2 -> activation gradient = activation
  final, history = twin.run_steps(
      state, cfg, batches, lambda step, acts: {'f': acts['f']},
      pipelining=pipelining, return_activations=True)
  seen = [float(a['f'][0, 0]) for a in history]
  if pipelining:
    # step 1 looks up before update 0 is applied: stale by one update.
    close(seen, [1.0, 1.0, 0.9])
    close(final['t']['table'][0, 0], 0.9 - 0.1 - 0.09)  # 0.71
  else:
    close(seen, [1.0, 0.9, 0.81])
    close(final['t']['table'][0, 0], 0.729)
  assert final['t']['table'][1, 0] == F32(3.0)


def test_pipelining_flag_from_config():
  cfg = _pipeline_cfg()
  cfg['pipelining'] = True
  state = twin.init_state(cfg, {'t': np.array([[1.0], [3.0]], F32)})
  final = twin.run_steps(state, cfg, [{'f': [[0]]}] * 2,
                         lambda step, acts: {'f': acts['f']})
  close(final['t']['table'][0, 0], 0.8)


@pytest.mark.parametrize('lazy', [True, False])
def test_adam_lazy_vs_non_lazy_untouched_rows(lazy):
  p = P('AdamParameters', learning_rate=0.1, beta1=0.5, beta2=0.5,
        epsilon=1e-8, lazy_adam=lazy, sum_inside_sqrt=False)
  cfg = _config(p, {'t': {'vocab': 2, 'dim': 1}},
                {'f': {'table': 't', 'max_sequence_length': 0,
                       'weight_key': None}})
  state = twin.init_state(cfg, {'t': np.array([[1.0], [1.0]], F32)})
  state['t']['slots']['m'][1, 0] = 0.2
  state['t']['slots']['v'][1, 0] = 0.04
  new = twin.backward(state, cfg, {'f': [[0]]}, {'f': np.ones((1, 1), F32)}, 0)
  close(new['t']['table'][0, 0], 1.0 - 0.1 * 0.5 / math.sqrt(0.5))
  if lazy:
    assert new['t']['table'][1, 0] == F32(1.0)
    assert new['t']['slots']['m'][1, 0] == F32(0.2)
  else:
    close([new['t']['slots']['m'][1, 0], new['t']['slots']['v'][1, 0]],
          [0.1, 0.02])
    close(new['t']['table'][1, 0], 1.0 - 0.1 * 0.1 / math.sqrt(0.02))


def test_untouched_rows_and_slots_unchanged():
  p = P('FtrlParameters', learning_rate=0.1, learning_rate_power=-0.5,
        initial_accumulator_value=0.1, l1_regularization_strength=0.5,
        l2_regularization_strength=0.0, beta=0.0,
        multiply_linear_by_learning_rate=False)
  cfg = _config(p, {'t': {'vocab': 3, 'dim': 2}},
                {'f': {'table': 't', 'max_sequence_length': 0,
                       'weight_key': None}})
  init = np.arange(6, dtype=F32).reshape(3, 2) + 1
  state = twin.init_state(cfg, {'t': init})
  new = twin.backward(state, cfg, {'f': [[1]]},
                      {'f': np.ones((1, 2), F32)}, 0)
  for r in (0, 2):
    np.testing.assert_array_equal(new['t']['table'][r], init[r])
    np.testing.assert_array_equal(new['t']['slots']['accumulator'][r], 0.1)
    np.testing.assert_array_equal(new['t']['slots']['linear'][r], 0.0)
  assert not np.array_equal(new['t']['table'][1], init[1])


def test_float32_throughout():
  p = P('RMSPropParameters', learning_rate=0.1, rho=0.9, momentum=0.5,
        epsilon=1e-6)
  cfg = _config(p, {'t': {'vocab': 3, 'dim': 2, 'combiner': 'mean'}},
                {'f': {'table': 't', 'max_sequence_length': 0,
                       'weight_key': None}})
  state = twin.init_state(cfg, {'t': np.ones((3, 2))})
  acts = twin.forward(state, cfg, {'f': [[0, 1]]})
  assert acts['f'].dtype == F32
  new = twin.backward(state, cfg, {'f': [[0, 1]]},
                      {'f': np.ones((1, 2))}, 0)
  assert new['t']['table'].dtype == F32
  assert all(v.dtype == F32 for v in new['t']['slots'].values())
