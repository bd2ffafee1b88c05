"""The host embedding engine against the independent NumPy twin.

Every test builds one graph (graph mode, sparse placeholders, one session, as
in an Estimator model_fn), runs a few training steps on random batches and
compares, step by step, the activations and, at the end, every table and
every slot variable with `tests/numpy_twin.py` (docs/numerics.md, 'Where a row
lives' to 'Pipelining').

Activation gradients depend on the activations, so that the one-step
staleness of pipelining is observable: loss = sum(d * (a + c * sigmoid(a))),
differentiated with `tf.gradients` on the engine side and
d * (1 + c * s * (1 - s)), s = sigmoid(a), in NumPy on the twin side (see
`twin_gradients` for why this loss rather than a quadratic one).

Tolerances: rtol=1e-5 and atol=1e-6 everywhere (see `RTOL`/`ATOL`); the
activation gradients are built so that contributions to one row never cancel
(see `twin_gradients`), otherwise no fixed tolerance holds for optimizers that
normalize the gradient. FTRL adds, per element, the spread that one ulp in
its accumulator powers causes (see `pow_spread`).
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import hypothesis  # pylint: disable=g-import-not-at-top
from hypothesis import strategies as st
import numpy as np
import pytest
import tensorflow as tf

import estimator_spec as es
from estimator_spec.config import optimizers as opt_lib
from estimator_spec.engine import HostEmbeddingEngine
from tests import numpy_twin as twin
from tests.ragged import sparse_value

v1 = tf.compat.v1
F32 = np.float32
RTOL = 1e-5
ATOL = 1e-6


def close(actual, desired, what, rtol=RTOL, atol=ATOL, spread=None):
  """|actual - desired| <= atol + rtol * |desired| (+ `spread`, an
  elementwise tolerance derived for the case, see `pow_spread`)."""
  if spread is None:
    np.testing.assert_allclose(actual, desired, rtol=rtol, atol=atol,
                               err_msg=what)
    return
  actual = np.asarray(actual, np.float64)
  desired = np.asarray(desired, np.float64)
  assert actual.shape == desired.shape, (what, actual.shape, desired.shape)
  allowed = atol + spread + rtol * np.abs(desired)
  excess = np.abs(actual - desired) - allowed
  assert (excess <= 0).all(), (
      f"{what}: {int((excess > 0).sum())} elements differ by more than "
      f"atol + rtol * |desired| + spread; worst at "
      f"{np.unravel_index(np.argmax(excess), excess.shape)}: actual "
      f"{actual.flat[np.argmax(excess)]!r}, desired "
      f"{desired.flat[np.argmax(excess)]!r}, allowed "
      f"{allowed.flat[np.argmax(excess)]!r}")


# ---------------------------------------------------------------------------
# Functions of the global step, as (TensorFlow version, NumPy version) pairs.


def lr_fn_pair(kind, base, k):
  """A learning-rate function of the step for the engine and for the twin."""
  base32, k32 = F32(base), F32(k)
  if kind == "inverse":
    return (lambda s: base32 / (1.0 + k32 * tf.cast(s, tf.float32)),
            lambda s: base32 / (F32(1) + k32 * F32(s)))
  if kind == "linear":
    return (lambda s: base32 + k32 * tf.cast(s, tf.float32),
            lambda s: base32 + k32 * F32(s))
  # "table": a different value per step (which step is seen matters).
  values = np.array([base, base * (1 + k), base * 0.5, base * (2 + k),
                     base * 0.25, base * 3], F32)
  return (lambda s: tf.gather(tf.constant(values), tf.cast(s, tf.int32)),
          lambda s: values[int(s)])


LR_FN_KINDS = ("inverse", "linear", "table")

# ---------------------------------------------------------------------------
# Random valid optimizers.

# Betas enter the rules as `1 - beta`, computed from float32 beta (see
# test_beta_complements_are_computed_in_float32). Values that round to 1.0 in
# float32 without being 1.0 are left to test_adagrad_momentum_beta2_*.
_CLOSE_TO_ONE = 1.0 - 1e-6
beta_below_one = st.one_of(
    st.sampled_from([0.0, 0.5, 0.9, 0.99, 0.999, 0.9999]),
    st.floats(0.0, _CLOSE_TO_ONE))
beta_unit = st.one_of(beta_below_one, st.just(1.0))
# Yogi's second moment: v - (1 - beta2) * sign(v - g*g) * g*g. Where v is
# just above g*g (as when two steps' gradients are nearly equal, which this
# file's loss gives a row of one example), the difference keeps only
# beta2 * g*g of v: float32 rounding is amplified by up to 1 / beta2, then by
# lr / epsilon through the division. From 0.5 on that factor is at most 2;
# with beta2 near 0 no fixed tolerance holds (a drawn beta2 = 0: 1.1e-5).
yogi_beta2 = st.one_of(
    st.sampled_from([0.5, 0.9, 0.99, 0.999, 0.9999]),
    st.floats(0.5, _CLOSE_TO_ONE))
lr_values = st.floats(0.01, 0.5)
small_nonneg = st.one_of(st.just(0.0), st.floats(0.0, 0.1))


@st.composite
def common_args(draw):
  args = {"learning_rate": draw(lr_values)}
  if draw(st.booleans()):
    low = draw(st.one_of(st.none(), st.floats(-1.5, 0.2)))
    high = draw(st.one_of(st.none(), st.floats(-0.2, 1.5)))
    if low is not None and high is not None and high < low:
      low, high = high, low
    args["clip_weight_min"] = low
    args["clip_weight_max"] = high
  if draw(st.booleans()):
    args["weight_decay_factor"] = draw(st.floats(0.0, 0.2))
    args["multiply_weight_decay_factor_by_learning_rate"] = draw(
        st.sampled_from([None, False, True]))
  if draw(st.booleans()):
    low = draw(st.one_of(st.none(), st.floats(-1.0, 0.05)))
    high = draw(st.one_of(st.none(), st.floats(-0.05, 1.0)))
    if low is not None and high is not None and high < low:
      low, high = high, low
    args["clip_gradient_min"] = low
    args["clip_gradient_max"] = high
  return args


@st.composite
def optimizers(draw, classes=opt_lib.ALL_OPTIMIZERS):
  cls = draw(st.sampled_from(classes))
  args = draw(common_args())
  name = cls.__name__
  if name == "AdagradParameters":
    args["initial_accumulator"] = draw(st.floats(0.01, 1.0))
  elif name == "AdagradMomentumParameters":
    args.update(momentum=draw(st.floats(0.0, 0.99)),
                use_nesterov=draw(st.booleans()),
                exponent=draw(st.sampled_from([2.0, 1.0, 3.0, 4.0])),
                beta2=draw(beta_unit),
                epsilon=draw(st.floats(1e-10, 1e-3)))
  elif name == "AdamParameters":
    args.update(beta1=draw(beta_below_one), beta2=draw(beta_below_one),
                epsilon=draw(st.floats(1e-8, 1e-3)),
                lazy_adam=draw(st.booleans()),
                sum_inside_sqrt=draw(st.booleans()))
  elif name == "FtrlParameters":
    allow_zero = draw(st.booleans())
    args.update(
        learning_rate_power=draw(
            st.one_of(st.just(-0.5), st.just(0.0), st.floats(-1.0, 0.0))),
        initial_accumulator_value=draw(
            st.one_of(st.just(0.0), st.floats(0.0, 1.0))
            if allow_zero else st.floats(0.01, 1.0)),
        l1_regularization_strength=draw(small_nonneg),
        l2_regularization_strength=draw(small_nonneg),
        multiply_linear_by_learning_rate=draw(st.booleans()),
        beta=draw(st.one_of(st.just(0.0), st.floats(0.0, 1.0))),
        allow_zero_accumulator=allow_zero)
  elif name == "MomentumParameters":
    args.update(momentum=draw(st.floats(0.0, 0.99)),
                use_nesterov=draw(st.booleans()))
  elif name == "ProximalAdagradParameters":
    args.update(initial_accumulator=draw(st.floats(0.01, 1.0)),
                l1_regularization_strength=draw(small_nonneg),
                l2_regularization_strength=draw(small_nonneg))
  elif name == "ProximalYogiParameters":
    args.update(beta1=draw(beta_below_one), beta2=draw(yogi_beta2),
                epsilon=draw(st.floats(1e-4, 1e-2)),
                l1_regularization_strength=draw(small_nonneg),
                l2_regularization_strength=draw(small_nonneg),
                initial_accumulator_value=draw(st.floats(0.0, 0.1)))
  elif name == "RMSPropParameters":
    args.update(rho=draw(beta_unit), momentum=draw(st.floats(0.0, 0.99)),
                epsilon=draw(st.floats(1e-6, 1e-1)))
  return cls(**args)


# ---------------------------------------------------------------------------
# Random configurations and batches.


@st.composite
def scenarios(draw, optimizer_classes=opt_lib.ALL_OPTIMIZERS, max_tables=3,
              max_steps=4):
  n_tables = draw(st.integers(1, max_tables))
  spec_optimizer = draw(st.one_of(st.none(), optimizers(optimizer_classes)))
  tables = {}
  features = {}
  for t in range(n_tables):
    name = f"t{t}"
    own = draw(st.one_of(st.none(), optimizers(optimizer_classes)))
    if spec_optimizer is None and own is None:
      own = draw(optimizers(optimizer_classes))
    lr_kind = draw(st.sampled_from(["default", "constant", "fn"]))
    table = {
        "vocab": draw(st.integers(1, 24)),
        "dim": draw(st.integers(1, 4)),
        "combiner": draw(st.sampled_from(["sum", "mean", "sqrtn", "sum",
                                          "mean", "sqrtn", None])),
        "optimizer": own,
        "learning_rate": (draw(lr_values) if lr_kind == "constant" else None),
        "lr_fn": ((draw(st.sampled_from(LR_FN_KINDS)), draw(lr_values),
                   draw(st.floats(0.0, 1.0))) if lr_kind == "fn" else None),
    }
    tables[name] = table
    for j in range(draw(st.integers(1, 3))):
      seq = draw(st.integers(0, 4)) if draw(st.booleans()) else 0
      weighted = (not seq and table["combiner"] is not None and
                  draw(st.booleans()))
      features[f"{name}_f{j}"] = {
          "table": name,
          "max_sequence_length": seq,
          "weight_key": f"{name}_f{j}_w" if weighted else None,
      }
  multiplier = None
  if draw(st.booleans()):
    multiplier = (draw(st.sampled_from(LR_FN_KINDS)), draw(st.floats(0.5, 2.0)),
                  draw(st.floats(0.0, 1.0)))
  return {
      "tables": tables,
      "features": features,
      "optimizer": spec_optimizer,
      "clipping_limit": draw(st.one_of(st.none(), st.floats(0.05, 2.0))),
      "multiplier": multiplier,
      "pipelining": draw(st.booleans()),
      "num_shards": draw(st.integers(1, 4)),
      "strategy": draw(st.sampled_from(["div", "mod"])),
      "batch_size": draw(st.integers(1, 4)),
      "steps": draw(st.integers(2, max_steps)),
      "seed": draw(st.integers(0, 2**31 - 1)),
  }


def random_batches(scenario, rng):
  """[{feature: (ragged ids, ragged weights or None)}] for every step."""
  batches = []
  for _ in range(scenario["steps"]):
    batch = {}
    for fname, feature in scenario["features"].items():
      table = scenario["tables"][feature["table"]]
      seq = feature["max_sequence_length"]
      # A small id range forces duplicates within and across examples.
      id_range = table["vocab"] if rng.rand() < 0.5 else min(table["vocab"], 3)
      ids, weights = [], []
      for _ in range(scenario["batch_size"]):
        if table["combiner"] is None and not seq:
          n = 1
        else:
          n = rng.randint(0, (seq + 3) if seq else 5)
        ids.append([int(i) for i in rng.randint(0, id_range, size=n)])
        weights.append([float(w) for w in rng.uniform(0.1, 2.0, size=n)])
      batch[fname] = (ids, weights if feature["weight_key"] else None)
    batches.append(batch)
  return batches


def build_spec(scenario):
  tables = {}
  for name, t in scenario["tables"].items():
    lr_fn = None
    if t["lr_fn"] is not None:
      lr_fn = lr_fn_pair(*t["lr_fn"])[0]
    tables[name] = es.TableConfig(
        t["vocab"], t["dim"], combiner=t["combiner"],
        learning_rate=t["learning_rate"], learning_rate_fn=lr_fn,
        optimization_parameters=t["optimizer"])
  features = {
      name: es.FeatureConfig(f["table"], f["max_sequence_length"],
                             f["weight_key"])
      for name, f in scenario["features"].items()
  }
  multiplier = None
  if scenario["multiplier"] is not None:
    multiplier = lr_fn_pair(*scenario["multiplier"])[0]
  return es.EmbeddingConfigSpec(
      feature_to_config_dict=features,
      table_to_config_dict=tables,
      optimization_parameters=scenario["optimizer"],
      clipping_limit=scenario["clipping_limit"],
      pipeline_execution_with_tensor_core=scenario["pipelining"],
      experimental_gradient_multiplier_fn=multiplier,
      partition_strategy=scenario["strategy"])


def twin_config(scenario):
  tables = {}
  for name, t in scenario["tables"].items():
    tables[name] = {
        "vocab": t["vocab"], "dim": t["dim"], "combiner": t["combiner"],
        "optimizer": t["optimizer"], "learning_rate": t["learning_rate"],
        "learning_rate_fn": (lr_fn_pair(*t["lr_fn"])[1]
                             if t["lr_fn"] is not None else None),
    }
  return {
      "tables": tables,
      "features": {k: dict(v) for k, v in scenario["features"].items()},
      "optimizer": scenario["optimizer"],
      "clipping_limit": scenario["clipping_limit"],
      "gradient_multiplier_fn": (lr_fn_pair(*scenario["multiplier"])[1]
                                 if scenario["multiplier"] else None),
      "pipelining": scenario["pipelining"],
  }


def activation_shape(scenario, fname):
  f = scenario["features"][fname]
  dim = scenario["tables"][f["table"]]["dim"]
  if f["max_sequence_length"]:
    return (scenario["batch_size"], f["max_sequence_length"], dim)
  return (scenario["batch_size"], dim)


def session_config(fast):
  """Grappler off (`fast`) saves ~half the time of small graphs run a few
  times; the deterministic tests keep TensorFlow's default rewrites."""
  config = v1.ConfigProto()
  if fast:
    config.graph_options.rewrite_options.disable_meta_optimizer = True
  return config


def twin_gradients(coefficients, activations):
  """d loss / d activation of loss = sum(d * (a + c * sigmoid(a))).

  With |c| <= 2 the factor 1 + c * s * (1 - s) lies in [0.5, 1.5], so the
  gradient has the sign of d; the random tests give d one sign per (table,
  dimension), so contributions to one row never cancel. (With a quadratic
  loss, contributions of both signs can sum to ~0, and optimizers that
  normalize the gradient (Adam, AdagradMomentum, RMSProp, Yogi) amplify the
  float32 rounding of such a sum by up to lr / epsilon: no fixed tolerance
  holds.)
  """
  out = {}
  for f, a in activations.items():
    c, d = coefficients[f]
    with np.errstate(over="ignore"):
      s = F32(1) / (F32(1) + np.exp(-np.asarray(a, F32)))
    out[f] = (d * (F32(1) + c * (s * (F32(1) - s)))).astype(F32)
  return out


def run_engine(scenario, batches, initial_tables, coefficients, fast=False):
  """Runs the engine; returns (tables, slots, activations, lengths per step,
  initial slots)."""
  spec = build_spec(scenario)
  config = es.EmbeddingConfig(spec, batch_size=scenario["batch_size"])
  with tf.Graph().as_default():
    engine = HostEmbeddingEngine(config, num_shards=scenario["num_shards"])
    placeholders = {}
    for fname, f in scenario["features"].items():
      placeholders[fname] = v1.sparse_placeholder(tf.int64, [None, None],
                                                  name=fname)
      if f["weight_key"]:
        placeholders[f["weight_key"]] = v1.sparse_placeholder(
            tf.float32, [None, None], name=f["weight_key"])
    step = v1.placeholder(tf.int64, [], name="global_step")
    result = engine.lookup(placeholders)
    names = list(result.activations)
    assert sorted(names) == sorted(scenario["features"])
    loss = tf.add_n([
        tf.reduce_sum(coefficients[n][1] *
                      (result.activations[n] +
                       coefficients[n][0] * tf.sigmoid(result.activations[n])))
        for n in names
    ])
    grads = dict(
        zip(names, tf.gradients(loss, [result.activations[n] for n in names])))
    train = engine.apply_gradients(result, grads, step)
    flush = engine.flush()
    assigns = [engine.table_rows(t).assign_all(initial_tables[t])
               for t in initial_tables]
    read_tables = {t: engine.table_rows(t).read_all() for t in initial_tables}
    read_slots = {t: {k: s.read_all() for k, s in engine.slot_rows(t).items()}
                  for t in initial_tables}
    activations, lengths = [], []
    with v1.Session(config=session_config(fast)) as sess:
      sess.run([v1.global_variables_initializer(),
                v1.local_variables_initializer()])
      sess.run(assigns)
      initial_slots = sess.run(read_slots)
      for n, batch in enumerate(batches):
        feed = {step: n}
        for fname, (ids, weights) in batch.items():
          feed[placeholders[fname]] = sparse_value(ids, np.int64)
          key = scenario["features"][fname]["weight_key"]
          if key:
            feed[placeholders[key]] = sparse_value(weights, np.float32)
        acts, lens, _ = sess.run(
            [result.activations, result.sequence_lengths, train], feed)
        activations.append(acts)
        lengths.append(lens)
      sess.run(flush)
      tables, slots = sess.run([read_tables, read_slots])
  return tables, slots, activations, lengths, initial_slots


def check_against_twin(scenario):
  rng = np.random.RandomState(scenario["seed"] % (2**32))
  batches = random_batches(scenario, rng)
  initial_tables = {
      name: (rng.randn(t["vocab"], t["dim"]) * 0.5).astype(F32)
      for name, t in scenario["tables"].items()
  }
  signs = {name: rng.choice([-1.0, 1.0], t["dim"])
           for name, t in scenario["tables"].items()}
  coefficients = {}
  for fname, f in scenario["features"].items():
    shape = activation_shape(scenario, fname)
    coefficients[fname] = (
        rng.uniform(-2, 2, shape).astype(F32),
        (signs[f["table"]] * rng.uniform(0.5, 1.5, shape)).astype(F32))
  tables, slots, acts, lengths, initial_slots = run_engine(
      scenario, batches, initial_tables, coefficients, fast=True)

  config = twin_config(scenario)
  state = twin.init_state(config, initial_tables)
  for name in scenario["tables"]:
    assert sorted(initial_slots[name]) == sorted(state[name]["slots"])
    for k, value in state[name]["slots"].items():
      np.testing.assert_array_equal(initial_slots[name][k], value)

  def grads_fn(step, activations):
    del step
    return twin_gradients(coefficients, activations)

  def run_twin():
    return twin.run_steps(state, config, batches, grads_fn,
                          pipelining=scenario["pipelining"],
                          return_activations=True)

  final, history = run_twin()
  spread = pow_spread(scenario, run_twin, final, history)
  for n, (expected, actual) in enumerate(zip(history, acts)):
    for fname in scenario["features"]:
      close(actual[fname], expected[fname], f"activation {fname} step {n}",
            spread=spread.get(("activation", n, fname)))
    expected_lengths = twin.sequence_lengths(config, batches[n])
    assert sorted(lengths[n]) == sorted(expected_lengths)
    for fname, value in expected_lengths.items():
      np.testing.assert_array_equal(lengths[n][fname], value)
  for name in scenario["tables"]:
    close(tables[name], final[name]["table"], f"table {name}",
          spread=spread.get(("table", name)))
    assert sorted(slots[name]) == sorted(final[name]["slots"])
    for k, value in final[name]["slots"].items():
      close(slots[name][k], value, f"slot {name}/{k}",
            spread=spread.get(("slot", name, k)))


def _uses_ftrl(scenario):
  optimizers = [scenario["optimizer"]] + [
      t["optimizer"] for t in scenario["tables"].values()]
  return any(isinstance(o, es.FtrlParameters) for o in optimizers)


def pow_spread(scenario, run_twin, final, history):
  """How far one ulp in FTRL's accumulator powers moves each result.

  TF's float32 pow and NumPy's power may differ by one ulp, and FTRL
  divides the difference of two powers by the learning rate: at small
  learning rates and gradients that one ulp moves `linear` (and the weights
  and activations after it) by far more than a fixed tolerance allows. The
  twin is run again with the two powers moved by one ulp in opposite
  directions (the worst case for their difference); twice the largest
  change of each element is its extra tolerance. Empty without FTRL."""
  if not _uses_ftrl(scenario):
    return {}
  values = {}

  def record(result, into):
    state, acts = result
    for name, entry in state.items():
      into.setdefault(("table", name), []).append(entry["table"])
      for k, v in entry["slots"].items():
        into.setdefault(("slot", name, k), []).append(v)
    for n, step in enumerate(acts):
      for fname, v in step.items():
        into.setdefault(("activation", n, fname), []).append(v)

  record((final, history), values)
  for new_ulps, old_ulps in ((1, -1), (-1, 1)):
    with twin.pow_nudge(new_ulps, old_ulps):
      record(run_twin(), values)
  return {
      key: 2 * np.max([np.abs(np.asarray(v, np.float64) - arrays[0])
                       for v in arrays[1:]], axis=0)
      for key, arrays in values.items()
  }


# ---------------------------------------------------------------------------
# Random tests.


@hypothesis.settings(max_examples=50, deadline=None)
@hypothesis.given(scenarios())
def test_random_configurations_agree_with_twin(scenario):
  check_against_twin(scenario)


@pytest.mark.parametrize(
    "optimizer_class", opt_lib.ALL_OPTIMIZERS,
    ids=[c.__name__ for c in opt_lib.ALL_OPTIMIZERS])
def test_each_optimizer_agrees_with_twin(optimizer_class):
  # A few examples per optimizer, one table per example, so that every
  # optimizer (and its flags) is exercised whatever the big test draws.

  @hypothesis.settings(max_examples=8, deadline=None)
  @hypothesis.given(
      scenarios(optimizer_classes=(optimizer_class,), max_tables=1,
                max_steps=3))
  def run(scenario):
    check_against_twin(scenario)

  run()


# ---------------------------------------------------------------------------
# Deterministic tests.


def _one_table_scenario(optimizer, pipelining=False, num_shards=1,
                        strategy="div"):
  return {
      "tables": {"t": {"vocab": 10, "dim": 3, "combiner": "sum",
                       "optimizer": None, "learning_rate": None,
                       "lr_fn": None}},
      "features": {"f": {"table": "t", "max_sequence_length": 0,
                         "weight_key": None}},
      "optimizer": optimizer,
      "clipping_limit": None,
      "multiplier": None,
      "pipelining": pipelining,
      "num_shards": num_shards,
      "strategy": strategy,
      "batch_size": 2,
      "steps": 2,
  }


def _tiny_gradient_ftrl_scenario(seed, lr):
  # Gradients clipped to 3e-4: a'^(-p) - a^(-p) is a few ulps of a^(-p),
  # divided by a small learning rate. One ulp of pow moves `linear` by far
  # more than atol here (every such case failed with the fixed tolerance).
  optimizer = es.FtrlParameters(lr, initial_accumulator_value=0.5,
                                clip_gradient_min=-3e-4,
                                clip_gradient_max=3e-4)
  scenario = _one_table_scenario(optimizer)
  scenario.update(seed=seed, steps=3, batch_size=4)
  return scenario


@pytest.mark.parametrize("seed,lr", [(0, 0.01), (1, 0.003), (2, 0.01)])
def test_ftrl_with_tiny_gradients_agrees_within_the_pow_spread(seed, lr):
  check_against_twin(_tiny_gradient_ftrl_scenario(seed, lr))


def test_the_pow_spread_still_catches_a_wrong_ftrl_update(monkeypatch):
  # The derived tolerance is not a blanket: a twin whose FTRL takes 1.5
  # times the gradient disagrees with the engine beyond it (in this regime
  # the ulp noise of sigma * w is about as large as sigma * w itself, but
  # the gradient term of `linear` is well above it).
  right = twin.OPTIMIZERS["ftrl"]
  monkeypatch.setitem(twin.OPTIMIZERS, "ftrl",
                      lambda w, slots, g, lr, params: right(
                          w, slots, g * np.float32(1.5), lr, params))
  with pytest.raises(AssertionError, match="differ by more than"):
    check_against_twin(_tiny_gradient_ftrl_scenario(0, 0.01))


def _default_instance(cls):
  extra = {"AdagradMomentumParameters": dict(momentum=0.9),
           "MomentumParameters": dict(momentum=0.9),
           "RMSPropParameters": dict(rho=0.875, momentum=0.5, epsilon=1e-6)}
  return cls(learning_rate=0.1, **extra.get(cls.__name__, {}))


UNTOUCHED_CASES = [(_default_instance(c), c.__name__)
                   for c in opt_lib.ALL_OPTIMIZERS]
UNTOUCHED_CASES += [
    (es.AdamParameters(0.1, lazy_adam=False), "NonLazyAdam"),
    (es.AdamParameters(0.1, lazy_adam=False, sum_inside_sqrt=False,
                       clip_weight_min=-0.3, clip_weight_max=0.3),
     "NonLazyAdamClipped"),
    (es.AdagradParameters(0.1, weight_decay_factor=0.1, clip_weight_min=-0.3,
                          clip_weight_max=0.3, clip_gradient_min=-0.5,
                          clip_gradient_max=0.5), "AdagradAllKnobs"),
]


@pytest.mark.parametrize("optimizer,label", UNTOUCHED_CASES,
                         ids=[c[1] for c in UNTOUCHED_CASES])
def test_untouched_rows_and_slots(optimizer, label):
  # Step 0 touches rows {1, 2}; step 1 touches row {3} only. Row values lie
  # outside [-0.3, 0.3] so that weight clipping would move them if applied.
  scenario = _one_table_scenario(optimizer, num_shards=3, strategy="mod")
  initial = {"t": (np.arange(30, dtype=F32).reshape(10, 3) / 10 - 1.5)}
  batches = [{"f": ([[1, 2], [2]], None)}, {"f": ([[3], []], None)}]
  # d < 0: rows move up, so that rows clipped to -0.3 at step 0 can move
  # at step 1.
  coefficients = {"f": (np.full((2, 3), 0.5, F32), np.full((2, 3), -0.25,
                                                               F32))}
  # Run one step, then both steps, to see what the second step changes.
  after_one = run_engine(dict(scenario, steps=1), batches[:1], initial,
                         coefficients)
  after_two = run_engine(scenario, batches, initial, coefficients)
  table1, slots1, _, _, initial_slots = after_one
  table2, slots2 = after_two[0], after_two[1]
  never = [0, 4, 5, 6, 7, 8, 9]
  # Rows never touched: bit-identical, slots too (non-lazy Adam: m = v = 0
  # give a zero step, but weight clipping still applies to every row).
  non_lazy = label.startswith("NonLazyAdam")
  clipped_every_row = label == "NonLazyAdamClipped"
  expected_never = initial["t"][never]
  if clipped_every_row:
    expected_never = np.clip(expected_never, F32(-0.3), F32(0.3))
  np.testing.assert_array_equal(table2["t"][never], expected_never)
  for k in slots2["t"]:
    np.testing.assert_array_equal(slots2["t"][k][never],
                                  initial_slots["t"][k][never])
  # Rows 1 and 2 were touched at step 0 only.
  moved_in_step_two = not np.array_equal(table2["t"][[1, 2]],
                                         table1["t"][[1, 2]])
  slots_moved = any(
      not np.array_equal(slots2["t"][k][[1, 2]], slots1["t"][k][[1, 2]])
      for k in slots2["t"])
  if non_lazy:
    assert moved_in_step_two and slots_moved
  else:
    assert not moved_in_step_two and not slots_moved
  # Row 3 was touched at step 1 and moved.
  assert not np.array_equal(table2["t"][3], table1["t"][3])
  # And the twin agrees with all of it.
  check_against_twin_fixed(scenario, batches, initial, coefficients,
                           after_two)


def check_against_twin_fixed(scenario, batches, initial, coefficients,
                             engine_result):
  tables, slots, acts, _, _ = engine_result
  config = twin_config(scenario)
  state = twin.init_state(config, initial)
  final, history = twin.run_steps(
      state, config, batches,
      lambda step, a: twin_gradients(coefficients, a),
      pipelining=scenario["pipelining"], return_activations=True)
  for n, expected in enumerate(history):
    for f, value in expected.items():
      close(acts[n][f], value, f"activation {f} step {n}")
  for name in scenario["tables"]:
    close(tables[name], final[name]["table"], f"table {name}")
    for k, value in final[name]["slots"].items():
      close(slots[name][k], value, f"slot {name}/{k}")


def test_pipelining_staleness_is_observable():
  # The same id in two consecutive steps: with pipelining, step 1 sees the
  # weights before step 0's update; without, after it.
  results = {}
  for pipelining in (False, True):
    scenario = _one_table_scenario(es.StochasticGradientDescentParameters(0.5),
                                   pipelining=pipelining)
    initial = {"t": np.ones((10, 3), F32)}
    batches = [{"f": ([[1], [2]], None)}, {"f": ([[1], [2]], None)}]
    coefficients = {"f": (np.zeros((2, 3), F32), np.ones((2, 3), F32))}
    result = run_engine(scenario, batches, initial, coefficients)
    check_against_twin_fixed(scenario, batches, initial, coefficients, result)
    results[pipelining] = result
  # d loss / d act = 1: each step subtracts 0.5 from rows 1 and 2.
  np.testing.assert_array_equal(results[False][2][1]["f"], np.full((2, 3),
                                                                   0.5))
  np.testing.assert_array_equal(results[True][2][1]["f"], np.ones((2, 3)))
  for pipelining in (False, True):
    np.testing.assert_array_equal(results[pipelining][0]["t"][[1, 2]],
                                  np.zeros((2, 3)))


def test_learning_rate_fn_sees_the_step_at_the_start_of_the_step():
  # lr(step) = [1, 0.5, 0.25][step]; SGD with d loss / d act = 1 on row 0.
  values = np.array([1.0, 0.5, 0.25], F32)
  spec = es.EmbeddingConfigSpec(
      feature_to_config_dict={"f": es.FeatureConfig("t")},
      table_to_config_dict={"t": es.TableConfig(
          4, 1, combiner="sum",
          learning_rate_fn=lambda s: tf.gather(values, s))},
      optimization_parameters=es.StochasticGradientDescentParameters(0.0),
      experimental_gradient_multiplier_fn=(
          lambda s: tf.cast(s, tf.float32) + 1.0))
  config = es.EmbeddingConfig(spec, batch_size=1)
  with tf.Graph().as_default():
    engine = HostEmbeddingEngine(config)
    step = v1.placeholder(tf.int64, [])
    result = engine.lookup({"f": tf.SparseTensor([[0, 0]], [0], [1, 1])})
    train = engine.apply_gradients(result, {"f": tf.ones([1, 1])}, step)
    with v1.Session() as sess:
      sess.run(v1.global_variables_initializer())
      sess.run(engine.table_rows("t").assign_all(np.zeros((4, 1), F32)))
      row0 = []
      for n in range(3):
        sess.run(train, {step: n})
        row0.append(sess.run(engine.table_rows("t").read_all())[0, 0])
  # Step n subtracts lr(n) * multiplier(n) = values[n] * (n + 1).
  np.testing.assert_allclose(row0, np.cumsum(-values * np.arange(1, 4)),
                             rtol=1e-6)


# ---------------------------------------------------------------------------
# Float32 hyper-parameters: the TPU receives them as float32 proto fields.


def _single_step_slots(optimizer, grad_value):
  scenario = _one_table_scenario(optimizer)
  scenario["steps"] = 1
  initial = {"t": np.zeros((10, 3), F32)}
  batches = [{"f": ([[1], [2]], None)}]
  # d loss / d act = d (c = 0): a constant gradient.
  coefficients = {"f": (np.zeros((2, 3), F32), np.full((2, 3), grad_value,
                                                       F32))}
  result = run_engine(scenario, batches, initial, coefficients)
  config = twin_config(scenario)
  state = twin.init_state(config, initial)
  final = twin.run_steps(state, config, batches,
                         lambda s, a: {"f": coefficients["f"][1]})
  return result, final


@pytest.mark.parametrize("optimizer,slot", [
    (es.AdamParameters(0.1, beta2=0.9999), "v"),
    (es.RMSPropParameters(0.1, rho=0.9999, momentum=0.0, epsilon=1e-6), "ms"),
    (es.ProximalYogiParameters(0.1, beta2=0.9999), "v"),
    (es.AdagradMomentumParameters(0.1, momentum=0.5, beta2=0.9999),
     "accumulator"),
], ids=["Adam", "RMSProp", "ProximalYogi", "AdagradMomentum"])
def test_beta_complements_are_computed_in_float32(optimizer, slot):
  result, final = _single_step_slots(optimizer, 3.0)
  np.testing.assert_allclose(result[1]["t"][slot], final["t"]["slots"][slot],
                             rtol=1e-5, atol=0)


def test_adagrad_momentum_beta2_that_rounds_to_one_accumulates():
  optimizer = es.AdagradMomentumParameters(0.1, momentum=0.5,
                                           beta2=1 - 1e-9)
  result, final = _single_step_slots(optimizer, 3.0)
  for slot in ("accumulator", "momenta"):
    np.testing.assert_allclose(result[1]["t"][slot],
                               final["t"]["slots"][slot], rtol=1e-5, atol=0)
  close(result[0]["t"], final["t"]["table"], "table")
