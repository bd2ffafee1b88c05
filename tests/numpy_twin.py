"""NumPy twin of the TPU embedding numerics contract (docs/numerics.md, 'Where a
row lives' to 'Pipelining').

This module is an independent reference implementation used only by tests.
It imports nothing but NumPy: no TensorFlow, no project package.  All
arithmetic that the hardware does in float32 is done here in float32
(hyper-parameters are cast to float32 before they meet a float32 array) and
gradient contributions are accumulated in float32.

Layout of the module
--------------------
* sharding:      shard_layout / to_shards / from_shards          (§2)
* forward:       lookup                                          (§3)
* optimizers:    one small pure function per optimizer,
                 ``(w_rows, slot_rows, g_rows, lr, params) -> (w_rows, slot_rows)``
* pipeline:      apply_update = clip grad -> decay -> optimizer -> clip weights
                 (shared by every optimizer, optax style)        (§4 steps 4-8)
* training:      init_state / forward / backward / train_step / run_steps
                                                                  (§4, §5)

Definitions taken from outside docs/numerics.md (see the per-function comments):
* AdagradMomentum: as TensorFlow's own TPU correctness test of the
  mid-level API states it (the test runs on TPUs, so it states what the TPU
  computes): the momentum accumulates the gradient times the Adagrad scale.
  (The comment above ``message AdagradMomentumParameters`` in
  ``optimization_parameters.proto`` reads otherwise; the TPU follows the
  test.)
* ProximalYogi: the proto only names the hyper-parameters ("Yogi paper plus
  some extensions based on FTRL", lazy, no hyper-parameter/bias-correction
  update, removed sign/tanh activation).  The update rule is Algorithm 2 of
  the Yogi paper with the sign activation, followed by the FTRL-style
  l1/l2 proximal step, as in the public Yogi optimizer of TensorFlow Addons
  (same hyper-parameters and defaults), without bias correction.
* FTRL allow_zero_accumulator: the proto says the flag only changes
  internal formulas so that zero/near-zero accumulators work (newer protos:
  the flag is ignored, zero accumulators are always supported).  The twin
  therefore always uses the zero-safe form (see ``ftrl_update``); the flag
  does not change any result.
"""

import contextlib
import math

import numpy as np

F32 = np.float32

__all__ = [
    'shard_layout', 'to_shards', 'from_shards',
    'lookup', 'combiner_scales',
    'optimizer_name', 'init_slots', 'slot_names', 'OPTIMIZERS',
    'sgd_update', 'adagrad_update', 'proximal_adagrad_update', 'adam_update',
    'ftrl_update', 'pow_nudge', 'momentum_update', 'rmsprop_update',
    'adagrad_momentum_update', 'proximal_yogi_update',
    'clip_gradient', 'decay_weights', 'clip_weights', 'apply_update',
    'resolve_learning_rate',
    'init_state', 'forward', 'sequence_lengths', 'accumulate_gradients',
    'backward', 'train_step', 'run_steps',
]


def _f32(x):
  return np.asarray(x, dtype=F32)


# ---------------------------------------------------------------------------
# §2 Sharding
# ---------------------------------------------------------------------------


def shard_layout(vocab_size, num_shards, strategy):
  """Global row ids stored in each shard, in local order."""
  v, n = int(vocab_size), int(num_shards)
  if n <= 0:
    raise ValueError('num_shards must be positive')
  if strategy == 'div':
    base, extra = divmod(v, n)
    sizes = [base + 1 if i < extra else base for i in range(n)]
    starts = np.cumsum([0] + sizes)
    return [np.arange(starts[i], starts[i + 1], dtype=np.int64)
            for i in range(n)]
  if strategy == 'mod':
    return [np.arange(i, v, n, dtype=np.int64) for i in range(n)]
  raise ValueError('unknown partition strategy %r' % (strategy,))


def to_shards(table, num_shards, strategy):
  """Split a full [V, ...] table into its shards (copies)."""
  table = np.asarray(table)
  return [table[ids].copy()
          for ids in shard_layout(table.shape[0], num_shards, strategy)]


def from_shards(shards, strategy):
  """Inverse of ``to_shards``: rebuild the full table."""
  shards = [np.asarray(s) for s in shards]
  vocab = sum(s.shape[0] for s in shards)
  layout = shard_layout(vocab, len(shards), strategy)
  for ids, s in zip(layout, shards):
    if len(ids) != s.shape[0]:
      raise ValueError('shard sizes do not match the %s layout' % strategy)
  out = np.empty((vocab,) + shards[0].shape[1:], dtype=shards[0].dtype)
  for ids, s in zip(layout, shards):
    out[ids] = s
  return out


# ---------------------------------------------------------------------------
# §3 Forward
# ---------------------------------------------------------------------------


def _example_weights(ids_b, weights, b):
  if weights is None or weights[b] is None:
    return np.ones(len(ids_b), dtype=F32)
  w = _f32(list(weights[b]))
  if w.shape[0] != len(ids_b):
    raise ValueError('example %d: %d ids but %d weights'
                     % (b, len(ids_b), w.shape[0]))
  return w


def combiner_scales(weights_b, combiner):
  """The factor c of docs/numerics.md, 'The backward pass, table by table' step
  2 for one example (float32).

  For an example with no ids, or whose weights make the denominator zero,
  the twin returns 0 (activation and gradient are then zero; this last case
  is not specified by docs/numerics.md and is the twin's choice).
  """
  w = _f32(weights_b)
  if combiner == 'sum':
    return F32(1.0)
  if combiner == 'mean':
    denom = np.sum(w, dtype=F32)
  elif combiner == 'sqrtn':
    denom = np.sqrt(np.sum(w * w, dtype=F32))
  else:
    raise ValueError('unknown combiner %r' % (combiner,))
  if w.size == 0 or denom == 0:
    return F32(0.0)
  return F32(1.0) / F32(denom)


def _check_ids(ids_b, vocab):
  for i in ids_b:
    if not 0 <= int(i) < vocab:
      raise ValueError('id %r out of range [0, %d)' % (i, vocab))


def lookup(table, ids, weights=None, combiner='mean', max_sequence_length=0):
  """Embedding lookup of a ragged batch (docs/numerics.md, 'Lookup').

  Non-sequence: returns a float32 [B, D] array.
  Sequence (max_sequence_length > 0): returns ([B, L, D], [B] int lengths).
  Sequence features take no weights (the contract defines position p as the
  plain row); passing weights raises ValueError.
  """
  table = _f32(table)
  vocab, dim = table.shape
  batch = len(ids)
  L = int(max_sequence_length or 0)
  if L > 0:
    if weights is not None and any(w is not None for w in weights):
      raise ValueError('sequence features take no weights')
    acts = np.zeros((batch, L, dim), dtype=F32)
    lengths = np.zeros((batch,), dtype=np.int64)
    for b, ids_b in enumerate(ids):
      ids_b = [int(i) for i in ids_b][:L]
      _check_ids(ids_b, vocab)
      lengths[b] = len(ids_b)
      if ids_b:
        acts[b, :len(ids_b)] = table[ids_b]
    return acts, lengths
  if combiner is None:
    if weights is not None and any(w is not None for w in weights):
      raise ValueError('combiner None takes no weights')
    flat = []
    for b, ids_b in enumerate(ids):
      ids_b = [ids_b] if np.ndim(ids_b) == 0 else list(ids_b)
      if len(ids_b) != 1:
        raise ValueError('combiner None needs exactly one id per example; '
                         'example %d has %d' % (b, len(ids_b)))
      flat.append(int(ids_b[0]))
    _check_ids(flat, vocab)
    return table[flat].copy() if flat else np.zeros((0, dim), F32)
  acts = np.zeros((batch, dim), dtype=F32)
  for b, ids_b in enumerate(ids):
    ids_b = [int(i) for i in ids_b]
    _check_ids(ids_b, vocab)
    w = _example_weights(ids_b, weights, b)
    c = combiner_scales(w, combiner)
    total = np.zeros((dim,), dtype=F32)
    for i, wi in zip(ids_b, w):
      total = total + wi * table[i]
    acts[b] = total * c
  return acts


# ---------------------------------------------------------------------------
# Optimizer parameters: read the duck-typed parameter objects
# ---------------------------------------------------------------------------

_NAMES = {
    'StochasticGradientDescentParameters': 'sgd',
    'AdagradParameters': 'adagrad',
    'ProximalAdagradParameters': 'proximal_adagrad',
    'AdamParameters': 'adam',
    'FtrlParameters': 'ftrl',
    'MomentumParameters': 'momentum',
    'RMSPropParameters': 'rmsprop',
    'AdagradMomentumParameters': 'adagrad_momentum',
    'ProximalYogiParameters': 'proximal_yogi',
}


def optimizer_name(params):
  """Short optimizer name from the parameter object's class name."""
  try:
    return _NAMES[type(params).__name__]
  except KeyError:
    raise ValueError('unsupported optimizer parameters %s'
                     % type(params).__name__) from None


def _p(params, name, default=None):
  value = getattr(params, name, default)
  return default if value is None else value


def slot_names(params):
  return {
      'sgd': (),
      'adagrad': ('accumulator',),
      'proximal_adagrad': ('accumulator',),
      'adam': ('m', 'v'),
      'ftrl': ('accumulator', 'linear'),
      'momentum': ('momenta',),
      'rmsprop': ('ms', 'mom'),
      'adagrad_momentum': ('accumulator', 'momenta'),
      'proximal_yogi': ('v', 'm'),
  }[optimizer_name(params)]


def init_slots(params, vocab_size, dim):
  """Initial slot tables: dict slot_name -> float32 [V, D]."""
  name = optimizer_name(params)
  init = {
      'adagrad': {'accumulator': _p(params, 'initial_accumulator', 0.1)},
      'proximal_adagrad': {'accumulator': _p(params, 'initial_accumulator',
                                             0.1)},
      'ftrl': {'accumulator': _p(params, 'initial_accumulator_value', 0.1),
               'linear': _p(params, 'initial_linear_value', 0.0)},
      'proximal_yogi': {'v': _p(params, 'initial_accumulator_value', 1e-6),
                        'm': 0.0},
  }.get(name, {})
  return {s: np.full((vocab_size, dim), init.get(s, 0.0), dtype=F32)
          for s in slot_names(params)}


# ---------------------------------------------------------------------------
# Optimizers: (w, slots, g, lr, params) -> (w, slots), all float32 rows
# ---------------------------------------------------------------------------


def sgd_update(w, slots, g, lr, params):
  return w - lr * g, {}


def adagrad_update(w, slots, g, lr, params):
  a = slots['accumulator'] + g * g
  return w - lr * g / np.sqrt(a), {'accumulator': a}


def proximal_adagrad_update(w, slots, g, lr, params):
  l1 = F32(_p(params, 'l1_regularization_strength', 0.0))
  l2 = F32(_p(params, 'l2_regularization_strength', 0.0))
  a = slots['accumulator'] + g * g
  eta = lr / np.sqrt(a)
  v = w - eta * g
  new_w = np.sign(v) * np.maximum(np.abs(v) - eta * l1, F32(0)) / (
      F32(1) + eta * l2)
  return new_w, {'accumulator': a}


def adam_update(w, slots, g, lr, params):
  # No bias correction (docs/numerics.md, 'Each optimizer on a touched row');
  # lazy/non-lazy is handled by the pipeline, which decides which rows are
  # passed in.
  b1 = F32(_p(params, 'beta1', 0.9))
  b2 = F32(_p(params, 'beta2', 0.999))
  eps = F32(_p(params, 'epsilon', 1e-8))
  m = b1 * slots['m'] + (F32(1) - b1) * g
  v = b2 * slots['v'] + (F32(1) - b2) * g * g
  if _p(params, 'sum_inside_sqrt', True):
    step = m / np.sqrt(v + eps * eps)
  else:
    step = m / (np.sqrt(v) + eps)
  return w - lr * step, {'m': m, 'v': v}


def _safe_div(num, den):
  out = np.zeros(np.broadcast(num, den).shape, dtype=F32)
  np.divide(num, den, out=out, where=(den != 0))
  return out


# FTRL's accumulator powers a^(-p) are the one place where two float32
# implementations may legitimately differ by a unit in the last place (ulp):
# a pow function is not correctly rounded everywhere. `pow_nudge` moves the
# twin's a'^(-p) and a^(-p) by a number of ulps, so that a test can measure
# how far such a difference carries through the rest of the computation
# (the difference of the two powers is divided by the learning rate, so the
# spread grows as the learning rate and the gradient shrink).
_POW_NUDGE = {'new': 0, 'old': 0}


@contextlib.contextmanager
def pow_nudge(new_ulps, old_ulps):
  """Within the block, FTRL's a'^(-p) and a^(-p) are moved by the given
  numbers of ulps (positive: up)."""
  saved = dict(_POW_NUDGE)
  _POW_NUDGE.update(new=new_ulps, old=old_ulps)
  try:
    yield
  finally:
    _POW_NUDGE.update(saved)


def _nudge(x, ulps):
  x = _f32(x)
  direction = F32(np.inf) if ulps > 0 else F32(-np.inf)
  for _ in range(abs(ulps)):
    x = np.nextafter(x, direction).astype(F32)
  return x


def ftrl_update(w, slots, g, lr, params):
  """FTRL-proximal as in docs/numerics.md, 'Each optimizer on a touched row'
  (beta and multiply_linear_by_lr).

  Zero-safe form (used whatever allow_zero_accumulator says): the
  accumulator power a^(-p) is evaluated directly (0^k = 0 for k > 0, no
  reciprocal square root), and the weight is only divided by `quad` where
  |linear| exceeds the l1 threshold and quad != 0, otherwise it is 0.  With a
  zero accumulator and a zero gradient this gives linear unchanged and w = 0
  (or the l1-thresholded value), never NaN.
  """
  p = F32(_p(params, 'learning_rate_power', -0.5))
  l1 = F32(_p(params, 'l1_regularization_strength', 0.0))
  l2 = F32(_p(params, 'l2_regularization_strength', 0.0))
  beta = F32(_p(params, 'beta', 0.0))
  a = slots['accumulator']
  linear = slots['linear']
  a_new = a + g * g
  pow_new = _nudge(np.power(a_new, -p), _POW_NUDGE['new'])
  pow_old = _nudge(np.power(a, -p), _POW_NUDGE['old'])
  if _p(params, 'multiply_linear_by_learning_rate', False):
    linear = linear + lr * g - (pow_new - pow_old) * w
    quad = pow_new + F32(2) * l2 * lr + beta
    threshold = l1 * lr
  else:
    linear = linear + g - (pow_new - pow_old) / lr * w
    quad = pow_new / lr + F32(2) * l2 + beta / lr
    threshold = l1
  shrunk = np.sign(linear) * threshold - linear
  new_w = np.where(np.abs(linear) > threshold, _safe_div(shrunk, quad),
                   F32(0)).astype(F32)
  return new_w, {'accumulator': a_new, 'linear': linear}


def momentum_update(w, slots, g, lr, params):
  mu = F32(_p(params, 'momentum', 0.0))
  m = mu * slots['momenta'] + g
  if _p(params, 'use_nesterov', False):
    return w - lr * (g + mu * m), {'momenta': m}
  return w - lr * m, {'momenta': m}


def rmsprop_update(w, slots, g, lr, params):
  rho = F32(_p(params, 'rho', 0.9))
  mu = F32(_p(params, 'momentum', 0.0))
  eps = F32(_p(params, 'epsilon', 1e-10))
  ms = rho * slots['ms'] + (F32(1) - rho) * g * g
  mom = mu * slots['mom'] + lr * g / np.sqrt(ms + eps)
  return w - mom, {'ms': ms, 'mom': mom}


def adagrad_momentum_update(w, slots, g, lr, params):
  """Adagrad + momentum, as TF's TPU correctness test states it:

    accum = accum + g^2                      if beta2 == 1
            beta2 * accum + (1 - beta2) g^2  otherwise
    s     = (accum + epsilon) ^ (-1 / exponent)
    mom   = momentum * mom + g * s
    upd   = momentum * mom + g * s  (use_nesterov)  else  mom
    w     = w - lr * upd
  Slots start at zero (TF's AdagradMomentum slot initializers).
  """
  mu = F32(_p(params, 'momentum', 0.0))
  beta2 = F32(_p(params, 'beta2', 1.0))
  exponent = F32(_p(params, 'exponent', 2.0))
  eps = F32(_p(params, 'epsilon', 1e-10))
  if beta2 == 1:
    acc = slots['accumulator'] + g * g
  else:
    acc = beta2 * slots['accumulator'] + (F32(1) - beta2) * g * g
  s = np.power(acc + eps, F32(-1) / exponent)
  mom = mu * slots['momenta'] + g * s
  upd = mu * mom + g * s if _p(params, 'use_nesterov', False) else mom
  return w - lr * upd, {'accumulator': acc, 'momenta': mom}


def proximal_yogi_update(w, slots, g, lr, params):
  """Proximal Yogi (lazy, no bias correction; see module docstring):

    m   = beta1 * m + (1 - beta1) * g
    v   = v + (1 - beta2) * sign(g^2 - v) * g^2
    eta = lr / (sqrt(v) + epsilon)
    u   = w - eta * m
    w   = sign(u) * max(|u| - eta * l1, 0) / (1 + eta * l2)
  v starts at initial_accumulator_value, m at 0.
  """
  b1 = F32(_p(params, 'beta1', 0.9))
  b2 = F32(_p(params, 'beta2', 0.999))
  eps = F32(_p(params, 'epsilon', 1e-3))
  l1 = F32(_p(params, 'l1_regularization_strength', 0.0))
  l2 = F32(_p(params, 'l2_regularization_strength', 0.0))
  m = b1 * slots['m'] + (F32(1) - b1) * g
  g2 = g * g
  v = slots['v'] + (F32(1) - b2) * np.sign(g2 - slots['v']) * g2
  eta = lr / (np.sqrt(v) + eps)
  u = w - eta * m
  new_w = np.sign(u) * np.maximum(np.abs(u) - eta * l1, F32(0)) / (
      F32(1) + eta * l2)
  return new_w, {'v': v, 'm': m}


OPTIMIZERS = {
    'sgd': sgd_update,
    'adagrad': adagrad_update,
    'proximal_adagrad': proximal_adagrad_update,
    'adam': adam_update,
    'ftrl': ftrl_update,
    'momentum': momentum_update,
    'rmsprop': rmsprop_update,
    'adagrad_momentum': adagrad_momentum_update,
    'proximal_yogi': proximal_yogi_update,
}


# ---------------------------------------------------------------------------
# Shared step pipeline (§4 steps 4-8)
# ---------------------------------------------------------------------------


def clip_gradient(g, params, clipping_limit=None):
  """[clip_gradient_min, clip_gradient_max] intersected with [-L, L]."""
  lo = _p(params, 'clip_gradient_min', -math.inf)
  hi = _p(params, 'clip_gradient_max', math.inf)
  if clipping_limit is not None:
    lo = max(lo, -abs(clipping_limit))
    hi = min(hi, abs(clipping_limit))
  if lo == -math.inf and hi == math.inf:
    return g
  return np.clip(g, F32(lo), F32(hi)).astype(F32)


def decay_weights(w, params, lr):
  """Decoupled weight decay: w - d * w (d = factor, times lr if asked)."""
  factor = _p(params, 'weight_decay_factor', 0.0)
  if not factor:
    return w
  d = F32(factor)
  if _p(params, 'multiply_weight_decay_factor_by_learning_rate', False):
    d = d * F32(lr)
  return w - d * w


def clip_weights(w, params):
  lo = _p(params, 'clip_weight_min', -math.inf)
  hi = _p(params, 'clip_weight_max', math.inf)
  if lo == -math.inf and hi == math.inf:
    return w
  return np.clip(w, F32(lo), F32(hi)).astype(F32)


def _is_dense_update(params):
  """Non-lazy Adam updates every row of the table every step."""
  return (optimizer_name(params) == 'adam' and
          not _p(params, 'lazy_adam', True))


def apply_update(table, slots, ids, grads, params, lr, clipping_limit=None):
  """One optimizer step of one table; returns (new_table, new_slots).

  `ids`: distinct touched row ids; `grads`: their accumulated gradients
  [len(ids), D].  Pure: the inputs are not modified.
  Pipeline: gradient clip -> weight decay (touched rows) -> optimizer ->
  weight clip.  Non-lazy Adam: every row runs the optimizer (g = 0 for rows
  not touched, no gradient clip applied to those zeros); weight decay still
  touches only the rows in `ids` (docs/numerics.md, 'The backward pass, table by
  table'), weight clipping applies to every row that was updated.
  """
  table = _f32(table).copy()
  slots = {k: _f32(v).copy() for k, v in slots.items()}
  ids = np.asarray(ids, dtype=np.int64).reshape(-1)
  if len(np.unique(ids)) != len(ids):
    raise ValueError('apply_update needs distinct ids')
  grads = _f32(grads).reshape(len(ids), table.shape[1])
  lr = F32(lr)
  update_fn = OPTIMIZERS[optimizer_name(params)]

  grads = clip_gradient(grads, params, clipping_limit)
  if _is_dense_update(params):
    rows = np.arange(table.shape[0])
    g_rows = np.zeros_like(table)
    g_rows[ids] = grads
    table[ids] = decay_weights(table[ids], params, lr)
  else:
    rows = ids
    g_rows = grads
    if len(rows) == 0:
      return table, slots
    table[rows] = decay_weights(table[rows], params, lr)
  new_w, new_slots = update_fn(table[rows], {k: v[rows] for k, v in
                                              slots.items()}, g_rows, lr,
                               params)
  table[rows] = clip_weights(_f32(new_w), params)
  for k, v in new_slots.items():
    slots[k][rows] = v
  return table, slots


def resolve_learning_rate(table_cfg, params, global_step):
  """Table learning_rate, else learning_rate_fn(step), else params'."""
  if table_cfg.get('learning_rate') is not None:
    return F32(table_cfg['learning_rate'])
  if table_cfg.get('learning_rate_fn') is not None:
    return F32(table_cfg['learning_rate_fn'](global_step))
  lr = params.learning_rate
  if callable(lr):
    lr = lr(global_step)
  return F32(lr)


# ---------------------------------------------------------------------------
# §4/§5 Training loop on whole configurations
# ---------------------------------------------------------------------------


def _table_params(config, table_name):
  params = config['tables'][table_name].get('optimizer')
  return params if params is not None else config.get('optimizer')


def init_state(config, tables):
  """state: table -> {'table': [V, D] float32, 'slots': {...}}."""
  state = {}
  for name, tcfg in config['tables'].items():
    table = _f32(tables[name]).copy()
    if table.shape != (tcfg['vocab'], tcfg['dim']):
      raise ValueError('table %s has shape %s, config says %s'
                       % (name, table.shape, (tcfg['vocab'], tcfg['dim'])))
    params = _table_params(config, name)
    slots = ({} if params is None else
             init_slots(params, tcfg['vocab'], tcfg['dim']))
    state[name] = {'table': table, 'slots': slots}
  return state


def _split(batch_entry):
  if isinstance(batch_entry, tuple):
    ids, weights = batch_entry
  else:
    ids, weights = batch_entry, None
  return ids, weights


def forward(state, config, batch):
  """feature -> activations ([B, D], or [B, L, D] for sequence features)."""
  out = {}
  for feature in sorted(batch):
    fcfg = config['features'][feature]
    tcfg = config['tables'][fcfg['table']]
    ids, weights = _split(batch[feature])
    res = lookup(state[fcfg['table']]['table'], ids, weights,
                 combiner=tcfg.get('combiner', 'mean'),
                 max_sequence_length=fcfg.get('max_sequence_length', 0))
    out[feature] = res[0] if isinstance(res, tuple) else res
  return out


def sequence_lengths(config, batch):
  """feature -> [B] lengths min(len, L), for the sequence features."""
  out = {}
  for feature in sorted(batch):
    L = config['features'][feature].get('max_sequence_length', 0)
    if L:
      ids, _ = _split(batch[feature])
      out[feature] = np.array([min(len(i), L) for i in ids], dtype=np.int64)
  return out


def accumulate_gradients(config, batch, grads, multiplier=1.0):
  """§4 steps 1-3: table -> (sorted distinct ids, summed float32 grads)."""
  sums = {}
  multiplier = F32(multiplier)
  for feature in sorted(batch):
    fcfg = config['features'][feature]
    tname = fcfg['table']
    tcfg = config['tables'][tname]
    acc = sums.setdefault(tname, {})
    ids, weights = _split(batch[feature])
    grad = _f32(grads[feature]) * multiplier
    L = fcfg.get('max_sequence_length', 0)

    def add(i, contribution):
      i = int(i)
      if not 0 <= i < tcfg['vocab']:
        raise ValueError('id %d out of range for table %s' % (i, tname))
      if i in acc:
        acc[i] = acc[i] + contribution
      else:
        acc[i] = _f32(contribution).copy()

    for b, ids_b in enumerate(ids):
      if L:
        for p, i in enumerate(list(ids_b)[:L]):
          add(i, grad[b, p])
      elif tcfg.get('combiner', 'mean') is None:
        ids_b = [ids_b] if np.ndim(ids_b) == 0 else list(ids_b)
        add(ids_b[0], grad[b])
      else:
        w = _example_weights(list(ids_b), weights, b)
        c = combiner_scales(w, tcfg.get('combiner', 'mean'))
        for i, wi in zip(ids_b, w):
          add(i, grad[b] * (wi * c))
  out = {}
  for tname, acc in sums.items():
    ids = np.array(sorted(acc), dtype=np.int64)
    dim = config['tables'][tname]['dim']
    g = (np.stack([acc[i] for i in ids]).astype(F32) if len(ids) else
         np.zeros((0, dim), F32))
    out[tname] = (ids, g)
  return out


def backward(state, config, batch, grads, global_step):
  """One training update (§4 steps 1-8); returns a new state."""
  multiplier = 1.0
  if config.get('gradient_multiplier_fn') is not None:
    multiplier = config['gradient_multiplier_fn'](global_step)
  per_table = accumulate_gradients(config, batch, grads, multiplier)
  new_state = {}
  for tname, tcfg in config['tables'].items():
    params = _table_params(config, tname)
    entry = state[tname]
    if params is None:
      new_state[tname] = {'table': entry['table'].copy(),
                          'slots': dict(entry['slots'])}
      continue
    ids, g = per_table.get(
        tname, (np.zeros((0,), np.int64), np.zeros((0, tcfg['dim']), F32)))
    lr = resolve_learning_rate(tcfg, params, global_step)
    table, slots = apply_update(entry['table'], entry['slots'], ids, g,
                                params, lr, config.get('clipping_limit'))
    new_state[tname] = {'table': table, 'slots': slots}
  return new_state


def train_step(state, features, activation_grads, global_step, config):
  """Same as ``backward`` with the argument order of the engine's step."""
  return backward(state, config, features, activation_grads, global_step)


def run_steps(initial_state, config, batches, grads_fn, pipelining=None,
              start_step=0, return_activations=False):
  """Run len(batches) training steps; global step of step n = start_step + n.

  grads_fn(step, activations) -> feature -> gradient array.
  pipelining=True: the activations of step n+1 are looked up before the
  update of step n is applied (one update stale, docs/numerics.md,
  'Pipelining'). Returns the final state, or (final_state, [activations per
  step]).
  """
  if pipelining is None:
    pipelining = bool(config.get('pipelining', False))
  state = initial_state
  history = []
  batches = list(batches)
  acts = forward(state, config, batches[0]) if batches else None
  for n, batch in enumerate(batches):
    step = start_step + n
    if n > 0 and not pipelining:
      acts = forward(state, config, batch)
    history.append(acts)
    grads = grads_fn(step, acts)
    if pipelining and n + 1 < len(batches):
      acts = forward(state, config, batches[n + 1])
    state = backward(state, config, batch, grads, step)
  return (state, history) if return_activations else state
