"""The update pipeline of one table, built once from the config model.

docs/numerics.md, 'The backward pass, table by table' (steps 4 to 7) and
'Each optimizer on a touched row': gradient clipping, weight decay, the
optimizer's rule, weight clipping. `UpdatePipeline.of` is the one place the
bounds and their defaults (±inf where a bound is absent) are computed; every
executor (`executors.py`) reads the fields, the compiled kernel included.
"""
import dataclasses
import math
from typing import Any, Dict, Mapping, Optional, Tuple

import tensorflow as tf

from estimator_spec.config import model as model_lib
from estimator_spec.config import optimizers
from estimator_spec.engine import rules


@dataclasses.dataclass(frozen=True)
class UpdatePipeline:
  """How one table's touched rows are updated (see the module docstring).

  Bounds are floats, -inf/inf where absent; each `clips_*`/`decays` flag
  says whether its step applies at all (a step that does not apply adds no
  op). `decay` is the weight decay factor (0.0 without decay), times the
  step's learning rate when `decay_times_learning_rate`.
  """
  table: str
  optimizer: optimizers.OptimizationParameters
  rule: rules.Rule
  gradient_min: float
  gradient_max: float
  clips_gradients: bool
  decay: float
  decays: bool
  decay_times_learning_rate: bool
  weight_min: float
  weight_max: float
  clips_weights: bool
  # Whether a step changes rows it did not look up (non-lazy Adam).
  every_row: bool
  # TF's sparse-apply kernel for the rule, when the pipeline is the rule
  # alone (no clipping or decay) and TF has one; else None.
  fused: Optional[rules.Fused]
  # The compiled row update's name (kernels.row_update), or None.
  compiled: Optional[str]
  # docs/numerics.md, 'Learning rates and schedules' (evaluated per step by
  # the engine).
  learning_rate: model_lib.LearningRate

  @classmethod
  def of(cls, model: model_lib.EmbeddingModel, name: str) -> "UpdatePipeline":
    """The pipeline of table `name` of `model` (a table with an optimizer)."""
    optimizer = model.optimizer_for(name)
    if optimizer is None:
      raise ValueError(f"Table {name!r} has no optimizer; it is not trained.")
    record = rules.record_for(optimizer)
    lower, upper = model.gradient_clip_bounds(optimizer)
    low, high = optimizer.clip_weight_min, optimizer.clip_weight_max
    decay = optimizer.weight_decay_factor or 0.0
    rule_only = (lower is None and upper is None and not decay and
                 low is None and high is None)
    every_row = optimizer.updates_every_row
    return cls(
        table=name, optimizer=optimizer, rule=record.rule,
        gradient_min=_bound(lower, -math.inf),
        gradient_max=_bound(upper, math.inf),
        clips_gradients=lower is not None or upper is not None,
        decay=decay, decays=bool(decay),
        decay_times_learning_rate=bool(
            optimizer.multiply_weight_decay_factor_by_learning_rate),
        weight_min=_bound(low, -math.inf), weight_max=_bound(high, math.inf),
        clips_weights=low is not None or high is not None,
        every_row=every_row,
        fused=record.fused if rule_only and not every_row else None,
        # A compiled update runs on the touched rows only.
        compiled=None if every_row else record.compiled,
        learning_rate=model.learning_rate(name))

  def decay_factor(self, lr: Any) -> Any:
    """The decay d of step 5 for learning rate `lr`, or None without
    weight decay."""
    if not self.decays:
      return None
    if self.decay_times_learning_rate:
      return self.decay * lr
    return self.decay

  def clip_and_decay(self, rows: Any, grads: Any, lr: Any) -> Tuple[Any, Any]:
    """Steps 4 and 5 on the touched rows: (rows after decoupled weight
    decay, gradients after clipping)."""
    if self.clips_gradients:
      grads = tf.clip_by_value(grads, self.gradient_min, self.gradient_max)
    factor = self.decay_factor(lr)
    if factor is not None:
      rows = rows - factor * rows
    return rows, grads

  def clip_weights(self, rows: Any) -> Any:
    """Step 7."""
    if not self.clips_weights:
      return rows
    return tf.clip_by_value(rows, self.weight_min, self.weight_max)

  def apply_rule(self, rows: Any, slots: Mapping[str, Any], grads: Any,
                 lr: Any) -> Tuple[Any, Dict[str, Any]]:
    """Step 6: the optimizer's own rule."""
    return self.rule(rows, slots, grads, lr, self.optimizer)

  def new_rows(self, rows: Any, slots: Mapping[str, Any], grads: Any,
               lr: Any) -> Tuple[Any, Dict[str, Any]]:
    """Steps 4 to 7 on the touched rows: (new rows, {slot: new slot rows})."""
    rows, grads = self.clip_and_decay(rows, grads, lr)
    new_rows, new_slots = self.apply_rule(rows, slots, grads, lr)
    return self.clip_weights(new_rows), new_slots


def _bound(value: Optional[float], default: float) -> float:
  return default if value is None else float(value)
