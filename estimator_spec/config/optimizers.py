"""Optimization-parameter classes for TPU embedding tables (plain data).

Each class takes the constructor arguments of the TF 2.15 class of the same
name (`tf.compat.v1.tpu.experimental.AdagradParameters`, ...), with the same
defaults, and validates them when constructed. Every class knows these things
about its optimizer and nothing else:

* its hyper-parameters, which the host engine's rule for it reads;
* which message of `OptimizationParameters` (the TPU proto) it fills, and how;
* its slot variables: name, checkpoint suffix and initial value;
* the names of its counterparts in TF's v1 API (TF 2.15's TPUEstimator) and
  in TF2's mid-level API, looked up by `estimator_spec.interop` when it
  converts.

The update rules themselves are the engine's (estimator_spec/engine/rules.py,
one per class). Gradient clipping, weight decay, weight clipping and the
learning-rate choice are common to every optimizer and are applied by one
shared pipeline (see docs/numerics.md, 'The backward pass, table by table'),
never inside an optimizer.
"""
import inspect
from typing import (Any, ClassVar, Dict, List, Mapping, NamedTuple, Optional,
                    Tuple)

from tpu_embedding_columns import checks

# A slot variable of an optimizer: `name` is the key used by the engine,
# `suffix` is appended to the table variable's name for checkpoints
# (`<var>/<suffix>`, the name TF's TPUEstimator gives it), `initial_value`
# fills every row at creation, and `mid_level` is the slot's name in TF2's
# `tf.tpu.experimental.embedding` (checkpointed as `<table>/<mid_level>`),
# None for optimizers TF2 lacks.
class SlotSpec(NamedTuple):
  """One slot variable of an optimizer (see the fields above)."""
  name: str
  suffix: str
  initial_value: float
  mid_level: Optional[str] = None

  def variable_name(self, table_variable_name: str) -> str:
    """The slot's variable (and checkpoint) name beside its table's."""
    return f"{table_variable_name}/{self.suffix}"


class OptimizationParameters:
  """Fields common to every TPU embedding optimizer.

  This constructor is the one place that names and checks the arguments
  every optimizer takes (`_COMMON_ARGUMENTS`). A subclass's constructor has
  TF's signature for its class, passes these on with
  `super().__init__(**_common_arguments(locals()))` and checks its own.
  Subclasses set `_proto_field` (the name of their message inside the
  `OptimizationParameters` proto) and implement `_fill_message` and
  `slot_specs`.
  """

  _proto_field: ClassVar[Optional[str]] = None
  # The name of TF's v1 class with this rule, in TF 2.15's
  # `tensorflow.python.tpu.tpu_embedding` (TF exports four of them as
  # `tf.compat.v1.tpu.experimental.<name>`), or None when TF has none.
  # `estimator_spec.interop` reads it from the optimizer's class itself,
  # never from a base class: a subclass's rule is its own, as the engine's
  # records are (engine/rules.py).
  tf1_class: ClassVar[Optional[str]] = None
  # The class of TF2's `tf.tpu.experimental.embedding` with this rule (its
  # name), or None when TF2 has none; `mid_level_arguments` gives its own
  # arguments (the common ones are the config model's).
  mid_level_class: ClassVar[Optional[str]] = None
  # {our attribute: the argument (and attribute) of `mid_level_class` that
  # holds it}, for this optimizer's own hyper-parameters: the one statement
  # of how the two configurations correspond, read in both directions.
  mid_level_names: ClassVar[Dict[str, str]] = {}

  def __init__(
      self, learning_rate: float, use_gradient_accumulation: bool,
      clip_weight_min: Optional[float], clip_weight_max: Optional[float],
      weight_decay_factor: Optional[float],
      multiply_weight_decay_factor_by_learning_rate: Optional[bool],
      clip_gradient_min: Optional[float] = None,
      clip_gradient_max: Optional[float] = None) -> None:
    owner = type(self).__name__
    self.learning_rate: float = checks.check_number(
        owner, "learning_rate", learning_rate, minimum=0.0)
    self.use_gradient_accumulation: bool = checks.check_bool(
        owner, "use_gradient_accumulation", use_gradient_accumulation)
    self.clip_weight_min: Optional[float] = checks.check_number(
        owner, "clip_weight_min", clip_weight_min, allow_none=True)
    self.clip_weight_max: Optional[float] = checks.check_number(
        owner, "clip_weight_max", clip_weight_max, allow_none=True)
    checks.check_range(owner, "clip_weight_min", self.clip_weight_min,
                        "clip_weight_max", self.clip_weight_max)
    self.weight_decay_factor: Optional[float] = checks.check_number(
        owner, "weight_decay_factor", weight_decay_factor, minimum=0.0,
        allow_none=True)
    self.multiply_weight_decay_factor_by_learning_rate: Optional[bool] = (
        checks.check_bool(
            owner, "multiply_weight_decay_factor_by_learning_rate",
            multiply_weight_decay_factor_by_learning_rate, allow_none=True))
    self.clip_gradient_min: Optional[float] = checks.check_number(
        owner, "clip_gradient_min", clip_gradient_min, allow_none=True)
    self.clip_gradient_max: Optional[float] = checks.check_number(
        owner, "clip_gradient_max", clip_gradient_max, allow_none=True)
    checks.check_range(owner, "clip_gradient_min", self.clip_gradient_min,
                        "clip_gradient_max", self.clip_gradient_max)
    if not self.use_gradient_accumulation and (
        self.clip_gradient_min is not None or
        self.clip_gradient_max is not None):
      raise ValueError(
          f"{owner}: `clip_gradient_min`/`clip_gradient_max` need gradient "
          "accumulation; set `use_gradient_accumulation=True` or drop the "
          "gradient clipping limits.")

  # --- what the config model and the proto need -------------------------

  def fill_proto(self, parameters_proto: Any) -> None:
    """Writes this optimizer's own message into `parameters_proto`.

    `parameters_proto` is a `tensorflow.tpu.OptimizationParameters`; the
    common fields (learning rate, clipping, decay) are written by the config
    model, which combines them with table-level settings.
    """
    assert self._proto_field is not None, type(self).__name__
    message = getattr(parameters_proto, self._proto_field)
    message.SetInParent()
    self._fill_message(message)

  def _fill_message(self, message: Any) -> None:
    del message  # Optimizers without fields only mark their message present.

  def slot_specs(self) -> Tuple[SlotSpec, ...]:
    """Returns the `SlotSpec`s of this optimizer, in checkpoint order."""
    return ()

  def mid_level_arguments(self) -> Dict[str, Any]:
    """Arguments of `mid_level_class` particular to this optimizer (the
    common ones, learning rate and clipping, are added by the caller);
    ValueError where TF2's class cannot express this configuration."""
    return {theirs: getattr(self, ours)
            for ours, theirs in self.mid_level_names.items()}

  @property
  def updates_every_row(self) -> bool:
    """True if a step changes rows that were not looked up (non-lazy Adam)."""
    return False

  # --- presentation -------------------------------------------------------

  def _arg_names(self) -> List[str]:
    return [
        name for name in inspect.signature(type(self).__init__).parameters
        if name != "self"
    ]

  def get_config(self) -> Dict[str, Any]:
    """Returns the constructor arguments as a dict (stable order)."""
    return {name: getattr(self, name) for name in self._arg_names()}

  def __repr__(self) -> str:
    args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
    return f"{type(self).__name__}({args})"

  def __eq__(self, other: object) -> bool:
    return type(self) is type(other) and self.get_config() == other.get_config()

  def __hash__(self) -> int:
    return hash((type(self).__name__, tuple(self.get_config().items())))


class AdagradParameters(OptimizationParameters):
  """Adagrad: `a += g*g; w -= lr * g / sqrt(a)`, `a` starting at
  `initial_accumulator`."""

  _proto_field = "adagrad"
  tf1_class = "AdagradParameters"
  mid_level_class = "Adagrad"
  mid_level_names = {"initial_accumulator": "initial_accumulator_value"}

  def __init__(
      self, learning_rate: float, initial_accumulator: float = 0.1,
      use_gradient_accumulation: bool = True,
      clip_weight_min: Optional[float] = None,
      clip_weight_max: Optional[float] = None,
      weight_decay_factor: Optional[float] = None,
      multiply_weight_decay_factor_by_learning_rate: Optional[bool] = None,
      clip_gradient_min: Optional[float] = None,
      clip_gradient_max: Optional[float] = None) -> None:
    super().__init__(**_common_arguments(locals()))
    self.initial_accumulator: float = checks.check_number(
        type(self).__name__, "initial_accumulator", initial_accumulator,
        above=0.0)

  def slot_specs(self) -> Tuple[SlotSpec, ...]:
    return (SlotSpec("accumulator", "Adagrad", self.initial_accumulator,
                     "accumulators"),)


class AdagradMomentumParameters(OptimizationParameters):
  """Adagrad with a momentum accumulator and a configurable exponent."""

  _proto_field = "adagrad_momentum"
  tf1_class = "AdagradMomentumParameters"
  mid_level_class = "AdagradMomentum"
  mid_level_names = {name: name for name in (
      "momentum", "use_nesterov", "exponent", "beta2", "epsilon")}

  def __init__(
      self, learning_rate: float, momentum: float, use_nesterov: bool = False,
      exponent: float = 2, beta2: float = 1, epsilon: float = 1e-10,
      use_gradient_accumulation: bool = True,
      clip_weight_min: Optional[float] = None,
      clip_weight_max: Optional[float] = None,
      weight_decay_factor: Optional[float] = None,
      multiply_weight_decay_factor_by_learning_rate: Optional[bool] = None,
      clip_gradient_min: Optional[float] = None,
      clip_gradient_max: Optional[float] = None) -> None:
    super().__init__(**_common_arguments(locals()))
    owner = type(self).__name__
    self.momentum: float = checks.check_number(owner, "momentum", momentum,
                                         minimum=0.0)
    self.use_nesterov: bool = checks.check_bool(owner, "use_nesterov",
                                                use_nesterov)
    self.exponent: float = checks.check_number(owner, "exponent", exponent,
                                         above=0.0)
    self.beta2: float = checks.check_number(owner, "beta2", beta2, minimum=0.0,
                                      maximum=1.0)
    self.epsilon: float = checks.check_number(owner, "epsilon", epsilon,
                                              above=0.0)

  def _fill_message(self, message: Any) -> None:
    message.momentum = self.momentum
    message.use_nesterov = self.use_nesterov
    message.exponent = self.exponent
    message.beta2 = self.beta2
    message.epsilon = self.epsilon

  def slot_specs(self) -> Tuple[SlotSpec, ...]:
    return (SlotSpec("accumulator", "AdagradMomentum/Accumulator", 0.0,
                     "accumulators"),
            SlotSpec("momenta", "AdagradMomentum/Momentum", 0.0, "momenta"))


class ProximalAdagradParameters(OptimizationParameters):
  """Adagrad followed by the proximal step for l1/l2 regularization."""

  _proto_field = "proximal_adagrad"
  tf1_class = "ProximalAdagradParameters"

  def __init__(
      self, learning_rate: float, initial_accumulator: float = 0.1,
      l1_regularization_strength: float = 0.0,
      l2_regularization_strength: float = 0.0,
      use_gradient_accumulation: bool = True,
      clip_weight_min: Optional[float] = None,
      clip_weight_max: Optional[float] = None,
      weight_decay_factor: Optional[float] = None,
      multiply_weight_decay_factor_by_learning_rate: Optional[bool] = None,
      clip_gradient_min: Optional[float] = None,
      clip_gradient_max: Optional[float] = None) -> None:
    super().__init__(**_common_arguments(locals()))
    owner = type(self).__name__
    self.initial_accumulator: float = checks.check_number(
        owner, "initial_accumulator", initial_accumulator, above=0.0)
    self.l1_regularization_strength: float = checks.check_number(
        owner, "l1_regularization_strength", l1_regularization_strength,
        minimum=0.0)
    self.l2_regularization_strength: float = checks.check_number(
        owner, "l2_regularization_strength", l2_regularization_strength,
        minimum=0.0)

  def _fill_message(self, message: Any) -> None:
    message.l1 = self.l1_regularization_strength
    message.l2 = self.l2_regularization_strength

  def slot_specs(self) -> Tuple[SlotSpec, ...]:
    return (SlotSpec("accumulator", "ProximalAdagrad",
                     self.initial_accumulator),)


class AdamParameters(OptimizationParameters):
  """Adam without bias correction (as the TPU computes it); lazy by default.

  For bias-corrected Adam, pass a `learning_rate_fn` that returns
  `lr * sqrt(1 - beta2**t) / (1 - beta1**t)`.
  """

  _proto_field = "adam"
  tf1_class = "AdamParameters"
  mid_level_class = "Adam"
  mid_level_names = {"beta1": "beta_1", "beta2": "beta_2",
                     "epsilon": "epsilon", "lazy_adam": "lazy_adam",
                     "sum_inside_sqrt": "sum_inside_sqrt"}

  def __init__(
      self, learning_rate: float, beta1: float = 0.9, beta2: float = 0.999,
      epsilon: float = 1e-08, lazy_adam: bool = True,
      sum_inside_sqrt: bool = True, use_gradient_accumulation: bool = True,
      clip_weight_min: Optional[float] = None,
      clip_weight_max: Optional[float] = None,
      weight_decay_factor: Optional[float] = None,
      multiply_weight_decay_factor_by_learning_rate: Optional[bool] = None,
      clip_gradient_min: Optional[float] = None,
      clip_gradient_max: Optional[float] = None) -> None:
    super().__init__(**_common_arguments(locals()))
    owner = type(self).__name__
    self.beta1: float = checks.check_number(owner, "beta1", beta1, minimum=0.0,
                                      below=1.0)
    self.beta2: float = checks.check_number(owner, "beta2", beta2, minimum=0.0,
                                      below=1.0)
    self.epsilon: float = checks.check_number(owner, "epsilon", epsilon,
                                              above=0.0)
    self.lazy_adam: bool = checks.check_bool(owner, "lazy_adam", lazy_adam)
    self.sum_inside_sqrt: bool = checks.check_bool(owner, "sum_inside_sqrt",
                                              sum_inside_sqrt)
    if not self.use_gradient_accumulation and not self.lazy_adam:
      raise ValueError(
          f"{owner}: `lazy_adam=False` needs gradient accumulation; set "
          "`use_gradient_accumulation=True` or `lazy_adam=True`.")

  def _fill_message(self, message: Any) -> None:
    message.beta1 = self.beta1
    message.beta2 = self.beta2
    message.epsilon = self.epsilon
    message.use_non_lazy_adam = not self.lazy_adam
    message.use_sum_inside_sqrt = self.sum_inside_sqrt

  def slot_specs(self) -> Tuple[SlotSpec, ...]:
    return (SlotSpec("m", "Adam/m", 0.0, "momenta"),
            SlotSpec("v", "Adam/v", 0.0, "velocities"))


  @property
  def updates_every_row(self) -> bool:
    return not self.lazy_adam


class FtrlParameters(OptimizationParameters):
  """FTRL-proximal, with `beta`, `multiply_linear_by_learning_rate` and
  `allow_zero_accumulator` as in the TPU proto."""

  _proto_field = "ftrl"
  tf1_class = "FtrlParameters"
  mid_level_class = "FTRL"
  mid_level_names = {name: name for name in (
      "learning_rate_power", "l1_regularization_strength",
      "l2_regularization_strength", "beta", "initial_accumulator_value",
      "multiply_linear_by_learning_rate", "allow_zero_accumulator")}

  def __init__(
      self, learning_rate: float, learning_rate_power: float = -0.5,
      initial_accumulator_value: float = 0.1,
      l1_regularization_strength: float = 0.0,
      l2_regularization_strength: float = 0.0,
      use_gradient_accumulation: bool = True,
      clip_weight_min: Optional[float] = None,
      clip_weight_max: Optional[float] = None,
      weight_decay_factor: Optional[float] = None,
      multiply_weight_decay_factor_by_learning_rate: Optional[bool] = None,
      multiply_linear_by_learning_rate: bool = False, beta: float = 0,
      allow_zero_accumulator: bool = False,
      clip_gradient_min: Optional[float] = None,
      clip_gradient_max: Optional[float] = None) -> None:
    super().__init__(**_common_arguments(locals()))
    owner = type(self).__name__
    self.learning_rate_power: float = checks.check_number(
        owner, "learning_rate_power", learning_rate_power, maximum=0.0)
    self.initial_accumulator_value: float = checks.check_number(
        owner, "initial_accumulator_value", initial_accumulator_value,
        minimum=0.0)
    self.initial_linear_value = 0.0
    self.l1_regularization_strength: float = checks.check_number(
        owner, "l1_regularization_strength", l1_regularization_strength,
        minimum=0.0)
    self.l2_regularization_strength: float = checks.check_number(
        owner, "l2_regularization_strength", l2_regularization_strength,
        minimum=0.0)
    self.multiply_linear_by_learning_rate: bool = checks.check_bool(
        owner, "multiply_linear_by_learning_rate",
        multiply_linear_by_learning_rate)
    self.beta: float = checks.check_number(owner, "beta", beta, minimum=0.0)
    self.allow_zero_accumulator: bool = checks.check_bool(
        owner, "allow_zero_accumulator", allow_zero_accumulator)

  def _fill_message(self, message: Any) -> None:
    message.lr_power = self.learning_rate_power
    message.l1 = self.l1_regularization_strength
    message.l2 = self.l2_regularization_strength
    message.multiply_linear_by_lr = self.multiply_linear_by_learning_rate
    message.beta = self.beta
    message.allow_zero_accumulator = self.allow_zero_accumulator

  def slot_specs(self) -> Tuple[SlotSpec, ...]:
    return (SlotSpec("accumulator", "Ftrl", self.initial_accumulator_value,
                     "accumulators"),
            SlotSpec("linear", "Ftrl_1", self.initial_linear_value, "linears"))

  def mid_level_arguments(self) -> Dict[str, Any]:
    if self.initial_accumulator_value <= 0:
      raise ValueError(
          "FtrlParameters with initial_accumulator_value=0, which TF 2.15's "
          "FTRL refuses (it must be > 0); use a small positive value.")
    return super().mid_level_arguments()


class ProximalYogiParameters(OptimizationParameters):
  """Proximal Yogi (Zaheer et al., 2018) with l1/l2 regularization."""

  _proto_field = "proximal_yogi"
  tf1_class = "ProximalYogiParameters"

  def __init__(
      self, learning_rate: float = 0.01, beta1: float = 0.9,
      beta2: float = 0.999, epsilon: float = 1e-3,
      l1_regularization_strength: float = 0.0,
      l2_regularization_strength: float = 0.0,
      initial_accumulator_value: float = 1e-6,
      use_gradient_accumulation: bool = True,
      clip_weight_min: Optional[float] = None,
      clip_weight_max: Optional[float] = None,
      weight_decay_factor: Optional[float] = None,
      multiply_weight_decay_factor_by_learning_rate: Optional[bool] = None,
      clip_gradient_min: Optional[float] = None,
      clip_gradient_max: Optional[float] = None) -> None:
    super().__init__(**_common_arguments(locals()))
    owner = type(self).__name__
    self.beta1: float = checks.check_number(owner, "beta1", beta1, minimum=0.0,
                                      below=1.0)
    self.beta2: float = checks.check_number(owner, "beta2", beta2, minimum=0.0,
                                      below=1.0)
    self.epsilon: float = checks.check_number(owner, "epsilon", epsilon,
                                              above=0.0)
    self.l1_regularization_strength: float = checks.check_number(
        owner, "l1_regularization_strength", l1_regularization_strength,
        minimum=0.0)
    self.l2_regularization_strength: float = checks.check_number(
        owner, "l2_regularization_strength", l2_regularization_strength,
        minimum=0.0)
    self.initial_accumulator_value: float = checks.check_number(
        owner, "initial_accumulator_value", initial_accumulator_value,
        minimum=0.0)

  def _fill_message(self, message: Any) -> None:
    message.beta1 = self.beta1
    message.beta2 = self.beta2
    message.epsilon = self.epsilon
    message.l1 = self.l1_regularization_strength
    message.l2 = self.l2_regularization_strength

  def slot_specs(self) -> Tuple[SlotSpec, ...]:
    return (SlotSpec("v", "ProximalYogi", self.initial_accumulator_value),
            SlotSpec("m", "ProximalYogi_1", 0.0))


class MomentumParameters(OptimizationParameters):
  """Momentum: `m = momentum * m + g; w -= lr * m` (or Nesterov)."""

  _proto_field = "momentum"
  tf1_class = "MomentumParameters"

  def __init__(
      self, learning_rate: float, momentum: float, use_nesterov: bool = False,
      use_gradient_accumulation: bool = True,
      clip_weight_min: Optional[float] = None,
      clip_weight_max: Optional[float] = None,
      weight_decay_factor: Optional[float] = None,
      multiply_weight_decay_factor_by_learning_rate: Optional[bool] = None,
      clip_gradient_min: Optional[float] = None,
      clip_gradient_max: Optional[float] = None) -> None:
    super().__init__(**_common_arguments(locals()))
    owner = type(self).__name__
    self.momentum: float = checks.check_number(owner, "momentum", momentum,
                                         minimum=0.0)
    self.use_nesterov: bool = checks.check_bool(owner, "use_nesterov",
                                                use_nesterov)

  def _fill_message(self, message: Any) -> None:
    message.momentum = self.momentum
    message.use_nesterov = self.use_nesterov

  def slot_specs(self) -> Tuple[SlotSpec, ...]:
    return (SlotSpec("momenta", "Momentum", 0.0),)


class RMSPropParameters(OptimizationParameters):
  """RMSProp with momentum: `ms = rho*ms + (1-rho)*g*g;
  mom = momentum*mom + lr*g/sqrt(ms + epsilon); w -= mom`."""

  _proto_field = "rms_prop"
  tf1_class = "RMSPropParameters"

  def __init__(
      self, learning_rate: float, rho: float, momentum: float, epsilon: float,
      use_gradient_accumulation: bool = True,
      clip_weight_min: Optional[float] = None,
      clip_weight_max: Optional[float] = None,
      weight_decay_factor: Optional[float] = None,
      multiply_weight_decay_factor_by_learning_rate: Optional[bool] = None,
      clip_gradient_min: Optional[float] = None,
      clip_gradient_max: Optional[float] = None) -> None:
    super().__init__(**_common_arguments(locals()))
    owner = type(self).__name__
    self.rho: float = checks.check_number(owner, "rho", rho, minimum=0.0,
                                    maximum=1.0)
    self.momentum: float = checks.check_number(owner, "momentum", momentum,
                                         minimum=0.0)
    self.epsilon: float = checks.check_number(owner, "epsilon", epsilon,
                                              above=0.0)

  def _fill_message(self, message: Any) -> None:
    message.rho = self.rho
    message.momentum = self.momentum
    message.epsilon = self.epsilon

  def slot_specs(self) -> Tuple[SlotSpec, ...]:
    return (SlotSpec("ms", "RMSProp/ms", 0.0),
            SlotSpec("mom", "RMSProp/mom", 0.0))


class StochasticGradientDescentParameters(OptimizationParameters):
  """Plain SGD: `w -= lr * g`; no slot variables."""

  _proto_field = "stochastic_gradient_descent"
  tf1_class = "StochasticGradientDescentParameters"
  mid_level_class = "SGD"

  def __init__(
      self, learning_rate: float, use_gradient_accumulation: bool = True,
      clip_weight_min: Optional[float] = None,
      clip_weight_max: Optional[float] = None,
      weight_decay_factor: Optional[float] = None,
      multiply_weight_decay_factor_by_learning_rate: Optional[bool] = None,
      clip_gradient_min: Optional[float] = None,
      clip_gradient_max: Optional[float] = None) -> None:
    super().__init__(**_common_arguments(locals()))


# The arguments every optimizer takes, named once: by the parameters of
# OptimizationParameters.__init__, which checks them.
_COMMON_ARGUMENTS = tuple(
    inspect.signature(OptimizationParameters.__init__).parameters)[1:]


def _common_arguments(arguments: Mapping[str, Any]) -> Dict[str, Any]:
  """The arguments every optimizer passes to OptimizationParameters, from
  its constructor's `arguments` (its `locals()`)."""
  return {name: arguments[name] for name in _COMMON_ARGUMENTS}


ALL_OPTIMIZERS = (
    AdagradParameters,
    AdagradMomentumParameters,
    AdamParameters,
    FtrlParameters,
    MomentumParameters,
    ProximalAdagradParameters,
    ProximalYogiParameters,
    RMSPropParameters,
    StochasticGradientDescentParameters,
)
