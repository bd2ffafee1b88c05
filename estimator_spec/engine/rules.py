"""Each optimizer's own rule on touched rows, as TensorFlow ops.

docs/numerics.md, 'Each optimizer on a touched row': one function per
optimizer class, `(w, slots, g, lr, optimizer) -> (new w, new slots)`, on
float32 tensors [U, D] (`slots` maps slot name to rows). Gradient clipping,
weight decay and weight clipping are not done here: they are the update
pipeline's (`pipeline.py`), common to every optimizer.

Each optimizer class has ONE `Record` in `RECORDS`, registered with its rule
by `@register(cls, fused=..., compiled=...)`: the rule, and the two
shortcuts some optimizers have, which the executors (`executors.py`) use:

* `fused`: the rule and its writes as ONE of TensorFlow's sparse-apply
  kernels on a partition's variables, which reads and writes the rows under
  the variables' lock; only where TF has a kernel computing exactly the rule.
* `compiled`: the name of the compiled row update (kernels/updates.cc)
  that runs the whole pipeline with this rule.

Records belong to the exact class: a subclass is not served by its base
class's record, whose shortcuts compute the base class's rule.
"""
import dataclasses
from typing import Any, Callable, Dict, Mapping, Optional, Tuple, Type

import numpy as np
import tensorflow as tf

from estimator_spec.config import optimizers

Slots = Dict[str, Any]
Rule = Callable[[Any, Mapping[str, Any], Any, Any, Any], Tuple[Any, Slots]]
# (partition variable, {slot: slot variable}, local ids, gradients, lr) ->
# the op that updates them.
Fused = Callable[[Any, Mapping[str, Any], Any, Any, Any], Any]
OptimizerClass = Type[optimizers.OptimizationParameters]


@dataclasses.dataclass(frozen=True)
class Record:
  """What the engine runs for one optimizer class: its `rule`, TF's
  sparse-apply kernel computing exactly that rule (`fused`, or None) and
  the name of its compiled row update (`compiled`, a name of
  `kernels.row_update`, or None)."""
  rule: Rule
  fused: Optional[Fused] = None
  compiled: Optional[str] = None


RECORDS: Dict[OptimizerClass, Record] = {}


def register(cls: OptimizerClass, *, fused: Optional[Fused] = None,
             compiled: Optional[str] = None) -> Callable[[Rule], Rule]:
  """Registers the decorated function as the rule of exactly the optimizer
  class `cls`, together with its shortcuts (see `Record`); a second
  registration of `cls` replaces its whole record."""

  def add(function: Rule) -> Rule:
    RECORDS[cls] = Record(function, fused, compiled)
    return function

  return add


def record_for(optimizer: optimizers.OptimizationParameters) -> Record:
  """The record of the class of `optimizer`, exactly that class."""
  cls = type(optimizer)
  if cls in RECORDS:
    return RECORDS[cls]
  bases = [base.__name__ for base in cls.__mro__[1:] if base in RECORDS]
  inherited = (
      f" The record of its base class {bases[0]} is not inherited: its fused "
      "and compiled shortcuts compute that class's rule, not this one's."
      if bases else "")
  raise TypeError(
      f"{cls.__name__} has no update rule in the host engine; register one "
      "for this class itself with "
      f"@estimator_spec.engine.rules.register({cls.__name__}) on its rule "
      f"function.{inherited}")


def _f32(value: float) -> Any:
  """A hyper-parameter as float32, so that `1 - beta` is computed in float32
  as on the TPU (proto fields are float) and in TF's kernels."""
  return tf.constant(value, tf.float32)


def _proximal(v: Any, step: Any, l1: float, l2: float) -> Any:
  """The l1/l2 proximal step: sign(v) * max(|v| - step*l1, 0) / (1 + step*l2)."""
  return tf.sign(v) * tf.maximum(tf.abs(v) - step * l1, 0.0) / (1.0 + step * l2)


def _fused_adagrad(table: Any, slots: Mapping[str, Any], ids: Any,
                   grads: Any, lr: Any) -> Any:
  # accum += g * g; var -= lr * g / (sqrt(accum) + 0): the rule below.
  return tf.raw_ops.ResourceSparseApplyAdagradV2(
      var=table.handle, accum=slots["accumulator"].handle, lr=lr,
      epsilon=tf.constant(0.0, grads.dtype), grad=grads, indices=ids,
      use_locking=True)


@register(optimizers.AdagradParameters, fused=_fused_adagrad,
          compiled="adagrad")
def adagrad(w: Any, slots: Mapping[str, Any], g: Any, lr: Any,
            optimizer: Any) -> Tuple[Any, Slots]:
  del optimizer
  accumulator = slots["accumulator"] + g * g
  return w - lr * g / tf.sqrt(accumulator), {"accumulator": accumulator}


@register(optimizers.AdagradMomentumParameters)
def adagrad_momentum(w: Any, slots: Mapping[str, Any], g: Any, lr: Any,
                     optimizer: Any) -> Tuple[Any, Slots]:
  # As TensorFlow's TPU test of this optimizer states what the TPU
  # computes (docs/numerics.md, 'Each optimizer on a touched row'): the
  # momentum accumulates the gradient scaled by the Adagrad factor.
  # The TPU reads beta2 as a float32 proto field: compare that value.
  if np.float32(optimizer.beta2) == 1.0:
    accumulator = slots["accumulator"] + g * g
  else:
    accumulator = (optimizer.beta2 * slots["accumulator"] +
                   (1.0 - _f32(optimizer.beta2)) * g * g)
  scaled = g * tf.pow(accumulator + optimizer.epsilon,
                      -1.0 / optimizer.exponent)
  momenta = optimizer.momentum * slots["momenta"] + scaled
  update = (optimizer.momentum * momenta + scaled if optimizer.use_nesterov
            else momenta)
  return w - lr * update, {"accumulator": accumulator, "momenta": momenta}


@register(optimizers.ProximalAdagradParameters)
def proximal_adagrad(w: Any, slots: Mapping[str, Any], g: Any, lr: Any,
                     optimizer: Any) -> Tuple[Any, Slots]:
  accumulator = slots["accumulator"] + g * g
  step = lr / tf.sqrt(accumulator)
  return (_proximal(w - step * g, step, optimizer.l1_regularization_strength,
                    optimizer.l2_regularization_strength),
          {"accumulator": accumulator})


@register(optimizers.AdamParameters)
def adam(w: Any, slots: Mapping[str, Any], g: Any, lr: Any,
         optimizer: Any) -> Tuple[Any, Slots]:
  m = optimizer.beta1 * slots["m"] + (1.0 - _f32(optimizer.beta1)) * g
  v = optimizer.beta2 * slots["v"] + (1.0 - _f32(optimizer.beta2)) * g * g
  if optimizer.sum_inside_sqrt:
    step = m / tf.sqrt(v + optimizer.epsilon * optimizer.epsilon)
  else:
    step = m / (tf.sqrt(v) + optimizer.epsilon)
  return w - lr * step, {"m": m, "v": v}


@register(optimizers.FtrlParameters)
def ftrl(w: Any, slots: Mapping[str, Any], g: Any, lr: Any,
         optimizer: Any) -> Tuple[Any, Slots]:
  # Zero-safe in every case: a^(-p) is computed directly (0 stays 0) and
  # the division by `quad` happens only where the weight is non-zero.
  power = -optimizer.learning_rate_power
  l1 = optimizer.l1_regularization_strength
  l2 = optimizer.l2_regularization_strength
  accumulator = slots["accumulator"] + g * g
  grown = tf.pow(accumulator, power) - tf.pow(slots["accumulator"], power)
  if optimizer.multiply_linear_by_learning_rate:
    linear = slots["linear"] + lr * g - grown * w
    quad = tf.pow(accumulator, power) + 2.0 * l2 * lr + optimizer.beta
    threshold = l1 * lr
  else:
    linear = slots["linear"] + g - grown / lr * w
    quad = (tf.pow(accumulator, power) / lr + 2.0 * l2 +
            optimizer.beta / lr)
    threshold = l1
  shrunk = tf.sign(linear) * threshold - linear
  keep = tf.logical_and(tf.abs(linear) > threshold, quad != 0.0)
  new_w = tf.where(keep, tf.math.divide_no_nan(shrunk, quad),
                   tf.zeros_like(w))
  return new_w, {"accumulator": accumulator, "linear": linear}


@register(optimizers.ProximalYogiParameters)
def proximal_yogi(w: Any, slots: Mapping[str, Any], g: Any, lr: Any,
                  optimizer: Any) -> Tuple[Any, Slots]:
  m = optimizer.beta1 * slots["m"] + (1.0 - _f32(optimizer.beta1)) * g
  g2 = g * g
  v = slots["v"] + (1.0 - _f32(optimizer.beta2)) * tf.sign(g2 -
                                                           slots["v"]) * g2
  step = lr / (tf.sqrt(v) + optimizer.epsilon)
  return (_proximal(w - step * m, step, optimizer.l1_regularization_strength,
                    optimizer.l2_regularization_strength), {"v": v, "m": m})


@register(optimizers.MomentumParameters)
def momentum(w: Any, slots: Mapping[str, Any], g: Any, lr: Any,
             optimizer: Any) -> Tuple[Any, Slots]:
  momenta = optimizer.momentum * slots["momenta"] + g
  if optimizer.use_nesterov:
    return w - lr * (g + optimizer.momentum * momenta), {"momenta": momenta}
  return w - lr * momenta, {"momenta": momenta}


@register(optimizers.RMSPropParameters)
def rms_prop(w: Any, slots: Mapping[str, Any], g: Any, lr: Any,
             optimizer: Any) -> Tuple[Any, Slots]:
  ms = optimizer.rho * slots["ms"] + (1.0 - _f32(optimizer.rho)) * g * g
  mom = (optimizer.momentum * slots["mom"] +
         lr * g / tf.sqrt(ms + optimizer.epsilon))
  return w - mom, {"ms": ms, "mom": mom}


def _fused_sgd(table: Any, slots: Mapping[str, Any], ids: Any, grads: Any,
               lr: Any) -> Any:
  del slots
  # A resource scatter holds the variable's lock while it writes.
  return table.scatter_sub(tf.IndexedSlices(lr * grads, ids)).op


@register(optimizers.StochasticGradientDescentParameters,
          fused=_fused_sgd, compiled="sgd")
def sgd(w: Any, slots: Mapping[str, Any], g: Any, lr: Any,
        optimizer: Any) -> Tuple[Any, Slots]:
  del slots, optimizer
  return w - lr * g, {}
