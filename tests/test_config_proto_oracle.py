"""Oracle test: our TPUEmbeddingConfiguration proto against TF 2.15's.

`estimator_spec.EmbeddingConfig(spec, ...).config_proto` must equal the proto
that TF 2.15's own `tpu_embedding.TPUEmbedding` builds for the same tables,
features, optimizers and topology (docs/numerics.md, 'Tables and features' and
'Where a row lives'). TensorFlow's implementation is used here only as a test
oracle.

Every generated configuration is a *recipe*: plain data plus the objects that
both sides must share (the same categorical columns, the same
`learning_rate_fn` function objects, the same initializer objects). A `Case`
holds one recipe and builds both sides from it:

* ours: `tpu_embedding_columns.embedding_column` / `shared_embedding_columns`
  or `estimator_spec.TableConfig` / `FeatureConfig`, then
  `estimator_spec.EmbeddingConfigSpec` and `estimator_spec.EmbeddingConfig`;
* TF: `tf.compat.v1.tpu.experimental.embedding_column` /
  `shared_embedding_columns` + `get_configs_from_feature_columns`, or
  `te.TableConfig` / `te.FeatureConfig`, then `te.TPUEmbedding(...,
  device_config=te.DeviceConfig(...))`. TF's proto is always built through
  `te.TPUEmbedding` directly: TF's `EmbeddingConfigSpec` refuses
  AdagradMomentum/ProximalYogi as the global optimizer with feature columns,
  although `TPUEmbedding` accepts them (and so do we).

Properties:
* valid recipes (built constructively, no `assume`): both sides accept and the
  protos are equal after exactly the deliberate adjustments listed below;
* invalid recipes (one defect that TF itself refuses injected into a valid
  recipe): both sides raise.

Deliberate differences, the only adjustments made to TF's proto
(`adjusted_tf_proto`):
1. `clipping_limit` (spec level, L > 0): TF 2.15 accepts and ignores it; ours
   writes it into every table's `gradient_clipping_limits` as
   lower = max(clip_gradient_min, -L) (-L when unset) and
   upper = min(clip_gradient_max, L) (L when unset), in TRAIN and in
   inference. TF's proto gets the same bounds before comparing.
2. FTRL: ours always marks the `ftrl` message present. TF only assigns its
   fields and never calls SetInParent, so with a protobuf runtime that does
   not mark a message present on assigning default values, an all-zero FTRL
   (lr_power=0, l1=l2=0, beta=0, flags False) leaves the optimizer oneof
   empty. If TF's proto lacks the oneof for a table whose optimizer is such an
   FTRL, `.ftrl.SetInParent()` is called on TF's side. (The protobuf 4.25/upb
   runtime installed here marks the message present on the first field
   assignment, so this does not fire today; all-zero FTRL tables are still
   generated, and the adjustment asserts that it only ever applies to one.)
3. Dynamic learning-rate tags: TF numbers the distinct `learning_rate_fn`s in
   `set` order (not deterministic), ours in sorted-table order of first use
   (`config.model.learning_rate_fns`, tag = index). TF's tags are mapped to
   ours through the function objects (`emb._learning_rate_fn_to_tag`), then
   the whole protos are compared with ==.
4. Our validation is stricter in documented places (TableConfig.learning_rate
   must be > 0, FeatureConfig.table_id must be a string, optimizer numbers
   must be finite and in range, clip min <= max, tensor_core_shape only with
   'tpu_tensor_core', combiner checked when the column is created,
   `clipping_limit` refused when an optimizer disables gradient accumulation,
   two column groups mapping to one table name refused, ...). Valid recipes
   therefore stay inside what ours accepts; invalid recipes only use defects
   TF itself refuses. `test_documented_stricter_validation` pins a few of the
   stricter cases (ours refuses, TF accepts) so that they stay deliberate.
"""
import dataclasses
import inspect
import os
from typing import Any, Optional, Tuple

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
from google.protobuf import text_format  # pylint: disable=g-import-not-at-top
from hypothesis import event  # pylint: disable=g-import-not-at-top
from hypothesis import given  # pylint: disable=g-import-not-at-top
from hypothesis import settings  # pylint: disable=g-import-not-at-top
from hypothesis import strategies as st  # pylint: disable=g-import-not-at-top
from tensorflow.python.tpu import feature_column_v2 as tpu_fc_v2  # pylint: disable=g-import-not-at-top
from tensorflow.python.tpu import tpu_embedding as te  # pylint: disable=g-import-not-at-top
from tensorflow_estimator.python.estimator.tpu import _tpu_estimator_embedding as tee  # pylint: disable=g-import-not-at-top

import estimator_spec as es  # pylint: disable=g-import-not-at-top
import tpu_embedding_columns as tec  # pylint: disable=g-import-not-at-top

fc = tf.feature_column
OURS = "ours"
TF = "tf"

# --- shared objects: the same function / initializer objects on both sides --


def lr_constant(step):
  del step
  return 0.05


def lr_decay(step):
  return 0.1 / (1.0 + tf.cast(step, tf.float32))


def lr_staircase(step):
  return tf.where(step < 100, 0.1, 0.01)


def grad_multiplier(step):
  del step
  return 2.0


LR_FNS = (lr_constant, lr_decay, lr_staircase)
INITIALIZERS = (
    tf.compat.v1.zeros_initializer(),
    tf.compat.v1.truncated_normal_initializer(mean=0.0, stddev=0.05),
    tf.compat.v1.random_uniform_initializer(-0.1, 0.1),
)

# Floats exactly representable in float32 (0.1 and 0.01 are not, but both
# sides write the same Python float into the same float32 proto field).
POSITIVE = (0.5, 0.25, 0.125, 1.0, 2.0, 0.1, 0.01)
NON_NEGATIVE = (0.0,) + POSITIVE
UNIT = (0.0, 0.5, 0.875, 0.9, 0.999)  # in [0, 1)
CLIP_VALUES = (-4.0, -1.0, -0.5, -0.125, 0.0, 0.125, 0.5, 1.0, 4.0)
CLIPPING_LIMITS = (0.25, 0.5, 1.0, 2.0, 100.0)

# Names: a permutation of fixed distinct lowercase names, consumed one by
# one, so table and feature names are unique and their sort order varies.
# (Derived names contain '_' or 'X' and therefore never equal a base name.)
BASE_NAMES = tuple(
    list("abcdefghijklmnop") +
    ["aa", "ab", "ba", "bb", "ca", "cc", "dd", "ee", "fa", "gb", "hz", "zz"] +
    ["abc", "abd", "bcd", "cab", "zed", "yak", "xyz", "wox", "vex", "uno"] +
    ["kilo", "lima", "mike", "nova", "oslo", "papa", "quad", "romeo"])

OPT_NAMES = tuple(cls.__name__ for cls in es.ALL_OPTIMIZERS)

# --- recipes -------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class OptSpec:
  """An optimizer: class name (same in estimator_spec and te) and kwargs."""
  name: str
  kwargs: Tuple[Tuple[str, Any], ...]

  def build(self, side):
    module = es if side == OURS else te
    return getattr(module, self.name)(**dict(self.kwargs))

  def get(self, key, default=None):
    return dict(self.kwargs).get(key, default)

  def replace(self, **updates):
    kwargs = dict(self.kwargs)
    kwargs.update(updates)
    return OptSpec(self.name, tuple(kwargs.items()))


@dataclasses.dataclass(frozen=True)
class ColumnGroup:
  """One embedding_column call (shared=False) or one shared group."""
  cats: Tuple[Any, ...]
  shared: bool
  dimension: Any
  combiner: Any
  initializer: Any
  # embedding_column: the int max_sequence_length; shared: the
  # max_sequence_lengths argument (None, [] or a list).
  max_seq: Any
  learning_rate_fn: Any
  device: Any
  tensor_core_shape: Any
  collection_name: Any
  use_safe: bool

  def build(self, side):
    if side == OURS:
      single, shared = tec.embedding_column, tec.shared_embedding_columns
    else:
      single = tf.compat.v1.tpu.experimental.embedding_column
      shared = tf.compat.v1.tpu.experimental.shared_embedding_columns
    common = dict(
        dimension=self.dimension,
        combiner=self.combiner,
        initializer=self.initializer,
        learning_rate_fn=self.learning_rate_fn,
        embedding_lookup_device=self.device,
        tensor_core_shape=_copy_list(self.tensor_core_shape),
        use_safe_embedding_lookup=self.use_safe)
    if not self.shared:
      return [single(self.cats[0], max_sequence_length=self.max_seq, **common)]
    return list(
        shared(
            list(self.cats),
            shared_embedding_collection_name=self.collection_name,
            max_sequence_lengths=_copy_list(self.max_seq),
            **common))

  @property
  def is_tensor_core(self):
    return self.device == "tpu_tensor_core"


@dataclasses.dataclass(frozen=True)
class TableSpec:
  vocabulary_size: Any
  dimension: Any
  initializer: Any
  combiner: Any
  hot_id_replication: bool
  learning_rate: Any
  learning_rate_fn: Any
  optimizer: Optional[OptSpec]

  def build(self, side):
    cls = es.TableConfig if side == OURS else te.TableConfig
    return cls(
        vocabulary_size=self.vocabulary_size,
        dimension=self.dimension,
        initializer=self.initializer,
        combiner=self.combiner,
        hot_id_replication=self.hot_id_replication,
        learning_rate=self.learning_rate,
        learning_rate_fn=self.learning_rate_fn,
        optimization_parameters=(None if self.optimizer is None else
                                 self.optimizer.build(side)))


@dataclasses.dataclass(frozen=True)
class FeatureSpec:
  table_id: Any
  max_sequence_length: Any
  weight_key: Any

  def build(self, side):
    cls = es.FeatureConfig if side == OURS else te.FeatureConfig
    return cls(self.table_id, self.max_sequence_length, self.weight_key)


@dataclasses.dataclass(frozen=True)
class Recipe:
  form: str  # "columns" or "dicts"
  groups: Tuple[ColumnGroup, ...]  # columns form
  column_order: Tuple[int, ...]  # permutation of the flattened columns
  tables: Tuple[Tuple[str, TableSpec], ...]  # dicts form
  features: Tuple[Tuple[str, FeatureSpec], ...]  # dicts form
  optimizer: Optional[OptSpec]  # the spec's global optimizer
  clipping_limit: Any
  pipelining: bool
  partition_strategy: Any
  profile_data_directory: Any
  gradient_multiplier_fn: Any
  batch_size: int
  num_hosts: int
  num_cores: int
  mode: str
  spare_names: Tuple[str, ...]  # unused names, for mutations


class Case:
  """A recipe and the two constructions, ours and TF's, that it describes."""

  def __init__(self, recipe, label="valid"):
    self.recipe = recipe
    self.label = label

  def __repr__(self):
    return f"Case({self.label!r}, {self.recipe!r})"

  # ours -----------------------------------------------------------------

  def ours(self):
    """Our EmbeddingConfig (raises TypeError/ValueError when refused)."""
    r = self.recipe
    optimizer = None if r.optimizer is None else r.optimizer.build(OURS)
    settings_ = dict(
        optimization_parameters=optimizer,
        clipping_limit=r.clipping_limit,
        pipeline_execution_with_tensor_core=r.pipelining,
        experimental_gradient_multiplier_fn=r.gradient_multiplier_fn,
        partition_strategy=r.partition_strategy,
        profile_data_directory=r.profile_data_directory)
    if r.form == "columns":
      spec = es.EmbeddingConfigSpec(
          feature_columns=_ordered_columns(r, OURS), **settings_)
    else:
      spec = es.EmbeddingConfigSpec(
          table_to_config_dict={n: t.build(OURS) for n, t in r.tables},
          feature_to_config_dict={n: f.build(OURS) for n, f in r.features},
          **settings_)
    return es.EmbeddingConfig(
        spec,
        batch_size=r.batch_size,
        num_hosts=r.num_hosts,
        num_cores=r.num_cores,
        mode=r.mode)

  # TF -------------------------------------------------------------------

  def tf_embedding_core_columns(self):
    """TF's columns without the tensor-core ones (as TF's spec splits them)
    and the names of the tensor-core ones."""
    columns = _ordered_columns(self.recipe, TF)
    tensor_core = [c for c in columns if _is_tf_tensor_core(c)]
    return [c for c in columns if not _is_tf_tensor_core(c)], tensor_core

  def tf(self):
    """TF's TPUEmbedding (raises when TF refuses the recipe)."""
    r = self.recipe
    # The user constructs the optimizer whatever the mode; TF's
    # EmbeddingConfig then passes None to TPUEmbedding in EVAL/PREDICT.
    optimizer = None if r.optimizer is None else r.optimizer.build(TF)
    if r.form == "columns":
      columns, _ = self.tf_embedding_core_columns()
      t2c, f2c = tee.get_configs_from_feature_columns(columns)
    else:
      t2c = {n: t.build(TF) for n, t in r.tables}
      f2c = {n: f.build(TF) for n, f in r.features}
    training = r.mode == es.TRAIN
    return te.TPUEmbedding(
        t2c,
        f2c,
        r.batch_size,
        te.TRAINING if training else te.INFERENCE,
        master=None,
        optimization_parameters=optimizer if training else None,
        device_config=te.DeviceConfig(r.num_hosts, r.num_cores, "worker"),
        pipeline_execution_with_tensor_core=r.pipelining,
        partition_strategy=r.partition_strategy,
        profile_data_directory=r.profile_data_directory)


def _copy_list(value):
  return list(value) if isinstance(value, (list, tuple)) else value


def _ordered_columns(recipe, side):
  columns = [c for group in recipe.groups for c in group.build(side)]
  order = recipe.column_order
  if sorted(order) != list(range(len(columns))):  # mutated recipes
    order = range(len(columns))
  return [columns[i] for i in order]


def _is_tf_tensor_core(column):
  # The test TF's own EmbeddingConfigSpec applies to split columns.
  return (isinstance(column, tee._TPU_DEVICE_SPECIFIC_EMBEDDING_COLUMNS) and
          column._embedding_lookup_device ==
          tpu_fc_v2.EmbeddingDevice.TPU_TENSOR_CORE)


# --- strategies: optimizers ------------------------------------------------


@st.composite
def bounds(draw):
  """(min, max), each None or a value, min <= max when both are set."""
  low = draw(st.none() | st.sampled_from(CLIP_VALUES))
  high = draw(st.none() | st.sampled_from(CLIP_VALUES))
  if low is not None and high is not None and low > high:
    low, high = high, low
  return low, high


@st.composite
def optimizer_specs(draw, name=None, accumulation_required=False,
                    clipping_limit=None):
  """A valid optimizer of any class in ALL_OPTIMIZERS (or of class `name`).

  With a spec `clipping_limit` L, the gradient bounds are kept overlapping
  [-L, L] (ours refuses disjoint ones: difference 4).
  """
  name = name or draw(st.sampled_from(OPT_NAMES))
  kw = {"learning_rate": draw(st.sampled_from(NON_NEGATIVE))}
  accumulate = accumulation_required or draw(st.booleans())
  if not accumulate or draw(st.booleans()):
    kw["use_gradient_accumulation"] = accumulate
  kw["clip_weight_min"], kw["clip_weight_max"] = draw(bounds())
  if accumulate:
    low, high = draw(bounds())
    if clipping_limit is not None:
      low = None if low is None else min(low, clipping_limit)
      high = None if high is None else max(high, -clipping_limit)
    kw["clip_gradient_min"], kw["clip_gradient_max"] = low, high
  kw["weight_decay_factor"] = draw(st.sampled_from((None, 0.0, 0.5, 0.01)))
  kw["multiply_weight_decay_factor_by_learning_rate"] = draw(
      st.sampled_from((None, False, True)))
  pick = lambda values: draw(st.sampled_from(values))
  keep = set()  # arguments not to leave at their defaults
  if name == "AdagradParameters":
    kw["initial_accumulator"] = pick(POSITIVE)
  elif name == "AdagradMomentumParameters":
    kw.update(momentum=pick(NON_NEGATIVE), use_nesterov=pick((False, True)),
              exponent=pick((0.5, 1.0, 2.0, 4.0)),
              beta2=pick((0.0, 0.5, 0.999, 1.0)),
              epsilon=pick((1e-10, 1e-3, 0.5)))
  elif name == "AdamParameters":
    kw.update(beta1=pick(UNIT), beta2=pick(UNIT),
              epsilon=pick((1e-8, 1e-3, 0.5)),
              lazy_adam=True if not accumulate else pick((False, True)),
              sum_inside_sqrt=pick((False, True)))
  elif name == "FtrlParameters":
    if draw(st.booleans()):  # all-zero FTRL message (difference 2)
      keep = {"learning_rate_power"}  # its default is -0.5
      kw.update(learning_rate_power=0.0, l1_regularization_strength=0.0,
                l2_regularization_strength=0.0, beta=pick((0, 0.0)),
                multiply_linear_by_learning_rate=False,
                allow_zero_accumulator=False,
                initial_accumulator_value=pick((0.0, 0.1)))
    else:
      kw.update(learning_rate_power=pick((-0.5, -1.0, -0.25, 0.0)),
                initial_accumulator_value=pick(NON_NEGATIVE),
                l1_regularization_strength=pick(NON_NEGATIVE),
                l2_regularization_strength=pick(NON_NEGATIVE),
                multiply_linear_by_learning_rate=pick((False, True)),
                beta=pick(NON_NEGATIVE),
                allow_zero_accumulator=pick((False, True)))
  elif name == "MomentumParameters":
    kw.update(momentum=pick(NON_NEGATIVE), use_nesterov=pick((False, True)))
  elif name == "ProximalAdagradParameters":
    kw.update(initial_accumulator=pick(POSITIVE),
              l1_regularization_strength=pick(NON_NEGATIVE),
              l2_regularization_strength=pick(NON_NEGATIVE))
  elif name == "ProximalYogiParameters":
    kw.update(beta1=pick(UNIT), beta2=pick(UNIT),
              epsilon=pick((1e-3, 1e-6, 0.5)),
              l1_regularization_strength=pick(NON_NEGATIVE),
              l2_regularization_strength=pick(NON_NEGATIVE),
              initial_accumulator_value=pick(NON_NEGATIVE))
  elif name == "RMSPropParameters":
    kw.update(rho=pick((0.0, 0.5, 0.9, 1.0)), momentum=pick(NON_NEGATIVE),
              epsilon=pick((1e-10, 1e-3, 0.5)))
  else:
    assert name == "StochasticGradientDescentParameters", name
  # Leave some arguments at their defaults (both sides share the defaults).
  optional = [k for k in kw if k not in _required_args(name) | keep]
  dropped = draw(st.sets(st.sampled_from(optional))) if optional else set()
  if "use_gradient_accumulation" in kw and not accumulate:
    dropped.discard("use_gradient_accumulation")
  if name == "AdamParameters" and not accumulate:
    dropped.discard("lazy_adam")
  return OptSpec(name, tuple((k, v) for k, v in kw.items() if k not in dropped))


def _required_args(name):
  signature = inspect.signature(getattr(es, name).__init__)
  return {p.name for p in signature.parameters.values()
          if p.default is inspect.Parameter.empty and p.name != "self"}


# Defects TF refuses in an optimizer constructor: (class, {arg: bad values}).
_OPTIMIZER_DEFECTS = (
    ("AdagradParameters", "initial_accumulator", (0.0, -0.1)),
    ("ProximalAdagradParameters", "initial_accumulator", (0.0, -1.0)),
    ("ProximalAdagradParameters", "l1_regularization_strength", (-0.5,)),
    ("ProximalAdagradParameters", "l2_regularization_strength", (-0.5,)),
    ("AdamParameters", "beta1", (1.0, 1.5, -0.1)),
    ("AdamParameters", "beta2", (1.0, -0.5)),
    ("AdamParameters", "epsilon", (0.0, -1e-8)),
    ("FtrlParameters", "learning_rate_power", (0.5, 1.0)),
    ("FtrlParameters", "initial_accumulator_value", (-0.1,)),
    ("FtrlParameters", "l1_regularization_strength", (-1.0,)),
    ("FtrlParameters", "l2_regularization_strength", (-1.0,)),
    ("AdagradMomentumParameters", "epsilon", (0.0, -1.0)),
    ("AdagradMomentumParameters", "exponent", (0.0, -2.0)),
    ("ProximalYogiParameters", "beta1", (1.0, -0.1)),
    ("ProximalYogiParameters", "beta2", (1.0,)),
    ("ProximalYogiParameters", "epsilon", (0.0,)),
    ("ProximalYogiParameters", "l1_regularization_strength", (-1.0,)),
    ("ProximalYogiParameters", "l2_regularization_strength", (-1.0,)),
    ("*", "clip_gradient_without_accumulation", None),
    ("AdamParameters", "non_lazy_without_accumulation", None),
)


@st.composite
def invalid_optimizer_specs(draw):
  name, arg, bad_values = draw(st.sampled_from(_OPTIMIZER_DEFECTS))
  if name == "*":
    name = draw(st.sampled_from(OPT_NAMES))
  spec = draw(optimizer_specs(name=name))
  if arg == "clip_gradient_without_accumulation":
    low, high = draw(bounds().filter(lambda b: b != (None, None)))
    spec = spec.replace(use_gradient_accumulation=False,
                        clip_gradient_min=low, clip_gradient_max=high)
    if name == "AdamParameters":
      spec = spec.replace(lazy_adam=True)
    return spec
  if arg == "non_lazy_without_accumulation":
    return spec.replace(use_gradient_accumulation=False, lazy_adam=False,
                        clip_gradient_min=None, clip_gradient_max=None)
  return spec.replace(**{arg: draw(st.sampled_from(bad_values))})


# --- strategies: columns ---------------------------------------------------

NON_SEQUENCE_KINDS = ("identity", "hash", "vocabulary", "crossed",
                      "bucketized", "weighted")
SEQUENCE_KINDS = ("seq_identity", "seq_hash", "seq_vocabulary")
# Kinds whose construction is cheap for any vocabulary size.
LARGE_KINDS = ("identity", "hash", "crossed", "weighted", "seq_identity",
               "seq_hash")
VOCAB_SIZES = st.integers(1, 12) | st.sampled_from((16, 31, 64, 1000, 2**20))


class NamePool:

  def __init__(self, names):
    self.names = list(names)

  def pop(self):
    return self.names.pop()


def _kinds(vocabulary_size, *, sequence=True, weighted=True, plain=True):
  kinds = []
  if plain:
    kinds += [k for k in NON_SEQUENCE_KINDS if k != "weighted"]
  if weighted:
    kinds.append("weighted")
  if sequence:
    kinds += list(SEQUENCE_KINDS)
  if vocabulary_size > 64:
    kinds = [k for k in kinds if k in LARGE_KINDS]
  if vocabulary_size < 2:
    kinds = [k for k in kinds if k != "bucketized"]
  return kinds


def make_categorical(draw, pool, kind, size):
  """A tf.feature_column categorical column of `kind` with `size` buckets."""
  if kind in ("vocabulary", "seq_vocabulary"):
    oov = draw(st.integers(0, min(2, size - 1)))
    words = [f"w{i}" for i in range(size - oov)]
  if kind == "identity":
    return fc.categorical_column_with_identity(pool.pop(), size)
  if kind == "hash":
    return fc.categorical_column_with_hash_bucket(pool.pop(), size)
  if kind == "vocabulary":
    return fc.categorical_column_with_vocabulary_list(
        pool.pop(), words, num_oov_buckets=oov)
  if kind == "crossed":
    return fc.crossed_column([pool.pop(), pool.pop()], size)
  if kind == "bucketized":
    return fc.bucketized_column(
        fc.numeric_column(pool.pop()), [float(i) for i in range(size - 1)])
  if kind == "weighted":
    inner = make_categorical(
        draw, pool, draw(st.sampled_from(
            [k for k in ("identity", "hash", "vocabulary")
             if size <= 64 or k != "vocabulary"])), size)
    return fc.weighted_categorical_column(inner, "wt_" + inner.name)
  if kind == "seq_identity":
    return fc.sequence_categorical_column_with_identity(pool.pop(), size)
  if kind == "seq_hash":
    return fc.sequence_categorical_column_with_hash_bucket(pool.pop(), size)
  if kind == "seq_vocabulary":
    return fc.sequence_categorical_column_with_vocabulary_list(
        pool.pop(), words, num_oov_buckets=oov)
  raise AssertionError(kind)


def _is_sequence(cat):
  return isinstance(cat, tec.columns.SequenceCategoricalColumn)


def _is_weighted(cat):
  return isinstance(cat, tec.columns.WeightedCategoricalColumn)


_DRAW = object()  # "draw this argument"


def draw_group(draw, pool, *, shared, allow_tensor_core=True, cats=None,
               device=_DRAW, need_sequence=False, need_plain=False):
  """A valid ColumnGroup; `cats` forces its categorical columns."""
  if device is _DRAW:
    devices = [None, None, "cpu", "tpu_embedding_core"]
    if allow_tensor_core and cats is None and not need_sequence:
      devices.append("tpu_tensor_core")
    device = draw(st.sampled_from(devices))
  tensor_core = device == "tpu_tensor_core"
  if cats is None:
    size = draw(VOCAB_SIZES)
    count = draw(st.integers(2, 3)) if shared else 1
    cats = []
    for i in range(count):
      forced_seq = need_sequence and i == 0
      forced_plain = need_plain and i == count - 1
      kinds = _kinds(
          size,
          sequence=not tensor_core and not forced_plain,
          weighted=not tensor_core and not forced_seq,
          plain=not forced_seq)
      cats.append(make_categorical(draw, pool, draw(st.sampled_from(kinds)),
                                   size))
  cats = tuple(cats)
  if tensor_core:
    combiner = draw(st.sampled_from(("sum", "mean")))
    tensor_core_shape = [draw(st.sampled_from((None, -1, 8))),
                         draw(st.integers(1, 5))]
  else:
    combiners = ["sum", "mean", "sqrtn"]
    if not any(_is_weighted(c) for c in cats):
      combiners.append(None)
    combiner = draw(st.sampled_from(combiners))
    tensor_core_shape = None
  lengths = [draw(st.integers(1, 6)) if _is_sequence(c) else 0 for c in cats]
  if not shared:
    max_seq = lengths[0]
    collection_name = None
  else:
    if any(lengths):
      max_seq = lengths
    else:
      max_seq = draw(st.sampled_from((None, "empty", "zeros")))
      max_seq = {None: None, "empty": [], "zeros": lengths}[max_seq]
    collection_name = draw(st.sampled_from((None, "", "custom")))
    if collection_name == "custom":
      collection_name = "coll_" + pool.pop()
  return ColumnGroup(
      cats=cats,
      shared=shared,
      dimension=draw(st.integers(1, 16) | st.sampled_from((64, 100))),
      combiner=combiner,
      initializer=draw(st.sampled_from((None,) + INITIALIZERS)),
      max_seq=max_seq,
      learning_rate_fn=draw(st.sampled_from((None,) + LR_FNS)),
      device=device,
      tensor_core_shape=tensor_core_shape,
      collection_name=collection_name,
      use_safe=draw(st.booleans()))


# --- strategies: recipes ---------------------------------------------------


@st.composite
def recipes(draw, form=None):
  """A valid recipe (columns form or dicts form)."""
  form = form or draw(st.sampled_from(("columns", "dicts")))
  names = list(BASE_NAMES)
  draw(st.randoms(use_true_random=False)).shuffle(names)
  pool = NamePool(names)
  mode = draw(st.sampled_from((es.TRAIN, es.EVAL, es.PREDICT)))
  clipping_limit = draw(st.none() | st.sampled_from(CLIPPING_LIMITS))
  # Ours refuses clipping_limit with an optimizer that disables gradient
  # accumulation (difference 4): keep accumulation on when it is set.
  opt = optimizer_specs(accumulation_required=clipping_limit is not None,
                        clipping_limit=clipping_limit)
  groups, order, tables, features = (), (), (), ()
  if form == "columns":
    groups = [draw_group(draw, pool, shared=draw(st.booleans()),
                         allow_tensor_core=False)]
    for _ in range(draw(st.integers(0, 4))):
      groups.append(draw_group(draw, pool, shared=draw(st.booleans())))
    groups = tuple(groups)
    count = sum(len(g.cats) for g in groups)
    order = tuple(draw(st.permutations(range(count))))
    optimizer = draw(opt)  # ours needs it with columns, even in inference
  else:
    table_list, feature_list = [], []
    for _ in range(draw(st.integers(1, 5))):
      name = pool.pop()
      rate = draw(st.sampled_from(("optimizer", "rate", "fn")))
      table_list.append((name, TableSpec(
          vocabulary_size=draw(VOCAB_SIZES),
          dimension=draw(st.integers(1, 16) | st.sampled_from((64, 100))),
          initializer=draw(st.sampled_from((None,) + INITIALIZERS)),
          combiner=draw(st.sampled_from(("mean", "sum", "sqrtn", None))),
          hot_id_replication=draw(st.booleans()),
          learning_rate=(draw(st.sampled_from(POSITIVE))
                         if rate == "rate" else None),
          learning_rate_fn=(draw(st.sampled_from(LR_FNS))
                            if rate == "fn" else None),
          optimizer=draw(st.none() | opt))))
      for i in range(draw(st.integers(1, 3))):
        # A feature may carry its table's name (separate namespaces).
        feature = name if i == 0 and draw(st.booleans()) else pool.pop()
        feature_list.append((feature, FeatureSpec(
            table_id=name,
            max_sequence_length=draw(st.sampled_from((0, 0, 1, 2, 5))),
            weight_key=draw(st.sampled_from((None, "wt_" + feature))))))
    tables = tuple(draw(st.permutations(table_list)))
    features = tuple(draw(st.permutations(feature_list)))
    needs_global = mode == es.TRAIN and any(
        t.optimizer is None for _, t in tables)
    optimizer = draw(opt) if needs_global else draw(st.none() | opt)
  num_hosts = draw(st.integers(1, 8))
  num_cores = num_hosts * draw(st.integers(1, 4))
  return Recipe(
      form=form,
      groups=groups,
      column_order=order,
      tables=tables,
      features=features,
      optimizer=optimizer,
      clipping_limit=clipping_limit,
      pipelining=draw(st.booleans()),
      partition_strategy=draw(st.sampled_from(("div", "mod"))),
      profile_data_directory=draw(
          st.sampled_from((None, "/tmp/tpu_profile", "gs://bucket/prof"))),
      gradient_multiplier_fn=draw(st.sampled_from((None, grad_multiplier))),
      batch_size=num_cores * draw(st.integers(1, 16)),
      num_hosts=num_hosts,
      num_cores=num_cores,
      mode=mode,
      spare_names=tuple(pool.names))


@st.composite
def valid_cases(draw, form=None):
  return Case(draw(recipes(form)))


# --- invalid recipes: one defect TF itself refuses --------------------------


def _pick(draw, items):
  items = list(items)
  return items[draw(st.integers(0, len(items) - 1))]


def _add_group(recipe, group):
  return dataclasses.replace(recipe, groups=recipe.groups + (group,),
                             column_order=())


def _replace_group(draw, recipe, **updates):
  index = draw(st.integers(0, len(recipe.groups) - 1))
  groups = list(recipe.groups)
  groups[index] = dataclasses.replace(groups[index], **updates)
  return dataclasses.replace(recipe, groups=tuple(groups))


def _replace_table(draw, recipe, fn):
  index = draw(st.integers(0, len(recipe.tables) - 1))
  tables = list(recipe.tables)
  name, table = tables[index]
  tables[index] = (name, fn(table))
  return dataclasses.replace(recipe, tables=tuple(tables))


def _batch_not_divisible(draw, r, pool):
  del pool
  num_cores = r.num_cores if r.num_cores > 1 else 2 * r.num_hosts
  batch = num_cores * draw(st.integers(0, 8)) + draw(
      st.integers(1, num_cores - 1))
  return dataclasses.replace(r, num_cores=num_cores, batch_size=batch)


def _cores_not_divisible(draw, r, pool):
  del pool
  hosts = max(r.num_hosts, 2)
  cores = hosts * draw(st.integers(1, 4)) + draw(st.integers(1, hosts - 1))
  return dataclasses.replace(r, num_hosts=hosts, num_cores=cores,
                             batch_size=cores * draw(st.integers(1, 4)))


def _bad_partition(draw, r, pool):
  del pool
  return dataclasses.replace(r, partition_strategy=draw(
      st.sampled_from(("DIV", "Mod", "", "sharded", None))))


def _bad_global_optimizer(draw, r, pool):
  del pool
  return dataclasses.replace(r, optimizer=draw(invalid_optimizer_specs()))


def _bad_dimension(draw, r, pool):
  del pool
  dimension = draw(st.sampled_from((0, -2, None)))
  if r.form == "columns":
    return _replace_group(draw, r, dimension=dimension)
  return _replace_table(draw, r,
                        lambda t: dataclasses.replace(t, dimension=dimension))


def _initializer_not_callable(draw, r, pool):
  del pool
  initializer = draw(st.sampled_from(("truncated_normal", 0.5)))
  if r.form == "columns":
    return _replace_group(draw, r, initializer=initializer)
  return _replace_table(
      draw, r, lambda t: dataclasses.replace(t, initializer=initializer))


def _sequence_length_zero(draw, r, pool):
  group = draw_group(draw, pool, shared=draw(st.booleans()),
                     allow_tensor_core=False, need_sequence=True)
  if group.shared:
    lengths = list(group.max_seq)
    lengths[0] = 0
    return _add_group(r, dataclasses.replace(group, max_seq=lengths))
  return _add_group(r, dataclasses.replace(group, max_seq=0))


def _non_sequence_length_positive(draw, r, pool):
  group = draw_group(draw, pool, shared=draw(st.booleans()), need_plain=True)
  length = draw(st.integers(1, 5))
  if group.shared:
    lengths = [0 if not _is_sequence(c) else 1 for c in group.cats]
    lengths[-1] = length
    return _add_group(r, dataclasses.replace(group, max_seq=lengths))
  return _add_group(r, dataclasses.replace(group, max_seq=length))


def _duplicate_feature(draw, r, pool):
  """A second column for a feature that already has one (TF: 'used with
  multiple embeddings')."""
  existing = [c for g in r.groups if not g.is_tensor_core for c in g.cats]
  cat = _pick(draw, existing)
  choices = [cat]
  if _is_weighted(cat):
    choices.append(cat.categorical_column)  # same feature key, unweighted
  elif not _is_sequence(cat):
    choices.append(fc.weighted_categorical_column(cat, "dup_weights"))
  cat = _pick(draw, choices)
  group = draw_group(draw, pool, shared=False, cats=[cat],
                     device=draw(st.sampled_from((None, "cpu"))))
  return _add_group(r, group)


def _shared_duplicate_member(draw, r, pool):
  size = draw(VOCAB_SIZES)
  cat = make_categorical(draw, pool, draw(st.sampled_from(_kinds(size))), size)
  group = draw_group(draw, pool, shared=True, cats=[cat, cat], device="cpu")
  return _add_group(r, group)


def _shared_bucket_mismatch(draw, r, pool):
  size = draw(st.integers(1, 12))
  other = size + draw(st.integers(1, 5))
  cats = [make_categorical(draw, pool, draw(st.sampled_from(_kinds(s))), s)
          for s in (size, other)]
  return _add_group(r, draw_group(draw, pool, shared=True, cats=cats,
                                  device=draw(st.sampled_from((None, "cpu")))))


def _shared_lengths_wrong_count(draw, r, pool):
  group = draw_group(draw, pool, shared=True, allow_tensor_core=False)
  lengths = [draw(st.integers(1, 3)) if _is_sequence(c) else 0
             for c in group.cats]
  if draw(st.booleans()):
    lengths.append(0)
  else:
    lengths.pop()
  return _add_group(r, dataclasses.replace(group, max_seq=lengths))


def _tensor_core_without_shape(draw, r, pool):
  group = draw_group(draw, pool, shared=draw(st.booleans()),
                     device="tpu_tensor_core")
  return _add_group(r, dataclasses.replace(group, tensor_core_shape=None))


def _tensor_core_sequence(draw, r, pool):
  group = draw_group(draw, pool, shared=draw(st.booleans()),
                     allow_tensor_core=False, need_sequence=True)
  return _add_group(r, dataclasses.replace(
      group, device="tpu_tensor_core",
      combiner=draw(st.sampled_from(("sum", "mean"))),
      tensor_core_shape=[None, draw(st.integers(1, 4))]))


def _tensor_core_bad_shape(draw, r, pool):
  group = draw_group(draw, pool, shared=draw(st.booleans()),
                     device=draw(st.sampled_from(("tpu_tensor_core", None))))
  shape = draw(st.sampled_from(([4], [None, 2, 3], [8, 1, 1, 1])))
  return _add_group(r, dataclasses.replace(group, tensor_core_shape=shape))


def _bad_device(draw, r, pool):
  group = draw_group(draw, pool, shared=draw(st.booleans()))
  return _add_group(r, dataclasses.replace(
      group, device=draw(st.sampled_from(("gpu", "tpu", "TPU_TENSOR_CORE"))),
      tensor_core_shape=None))


def _bad_column_combiner(draw, r, pool):
  # Not on a tensor-core column: TF drops those before it checks combiners.
  group = draw_group(draw, pool, shared=draw(st.booleans()),
                     allow_tensor_core=False)
  return _add_group(r, dataclasses.replace(
      group, combiner=draw(st.sampled_from(("max", "avg", "SUM")))))


def _feature_without_table(draw, r, pool):
  feature = (pool.pop(), FeatureSpec(table_id="missing_" + pool.pop(),
                                     max_sequence_length=0, weight_key=None))
  return dataclasses.replace(r, features=r.features + (feature,))


def _unused_table(draw, r, pool):
  table = (pool.pop(), TableSpec(
      vocabulary_size=draw(VOCAB_SIZES), dimension=draw(st.integers(1, 8)),
      initializer=None, combiner="mean", hot_id_replication=False,
      learning_rate=None, learning_rate_fn=None,
      optimizer=draw(st.none() | optimizer_specs())))
  return dataclasses.replace(r, tables=r.tables + (table,))


def _rate_and_fn(draw, r, pool):
  del pool
  rate = draw(st.sampled_from(POSITIVE))
  fn = draw(st.sampled_from(LR_FNS))
  return _replace_table(draw, r, lambda t: dataclasses.replace(
      t, learning_rate=rate, learning_rate_fn=fn))


def _bad_vocabulary_size(draw, r, pool):
  del pool
  size = draw(st.sampled_from((0, -1, 3.0)))
  return _replace_table(
      draw, r, lambda t: dataclasses.replace(t, vocabulary_size=size))


def _negative_sequence_length(draw, r, pool):
  del pool
  index = draw(st.integers(0, len(r.features) - 1))
  features = list(r.features)
  name, feature = features[index]
  features[index] = (name, dataclasses.replace(
      feature, max_sequence_length=draw(st.sampled_from((-1, -5)))))
  return dataclasses.replace(r, features=tuple(features))


def _training_without_optimizer(draw, r, pool):
  del pool
  r = _replace_table(draw, r, lambda t: dataclasses.replace(t, optimizer=None))
  return dataclasses.replace(r, mode=es.TRAIN, optimizer=None)


def _bad_table_combiner(draw, r, pool):
  del pool
  combiner = draw(st.sampled_from(("max", "avg", "")))
  return _replace_table(draw, r,
                        lambda t: dataclasses.replace(t, combiner=combiner))


def _bad_table_optimizer(draw, r, pool):
  del pool
  bad = draw(invalid_optimizer_specs())
  return _replace_table(draw, r, lambda t: dataclasses.replace(t, optimizer=bad))


COMMON_DEFECTS = (_batch_not_divisible, _cores_not_divisible, _bad_partition,
                  _bad_global_optimizer, _bad_dimension,
                  _initializer_not_callable)
COLUMN_DEFECTS = (_sequence_length_zero, _non_sequence_length_positive,
                  _duplicate_feature, _shared_duplicate_member,
                  _shared_bucket_mismatch, _shared_lengths_wrong_count,
                  _tensor_core_without_shape, _tensor_core_sequence,
                  _tensor_core_bad_shape, _bad_device, _bad_column_combiner)
DICT_DEFECTS = (_feature_without_table, _unused_table, _rate_and_fn,
                _bad_vocabulary_size, _negative_sequence_length,
                _training_without_optimizer, _bad_table_combiner,
                _bad_table_optimizer)


ALL_DEFECTS = COMMON_DEFECTS + COLUMN_DEFECTS + DICT_DEFECTS


@st.composite
def invalid_cases(draw, defect):
  """A valid recipe of a form `defect` applies to, with `defect` injected."""
  if defect in COLUMN_DEFECTS:
    form = "columns"
  elif defect in DICT_DEFECTS:
    form = "dicts"
  else:
    form = None
  recipe = draw(recipes(form))
  pool = NamePool(recipe.spare_names)
  recipe = defect(draw, recipe, pool)
  recipe = dataclasses.replace(recipe, spare_names=tuple(pool.names))
  return Case(recipe, label=defect.__name__.lstrip("_"))


# --- comparison ------------------------------------------------------------


def _is_all_zero_ftrl(optimizer):
  return (isinstance(optimizer, te.FtrlParameters) and
          optimizer.learning_rate_power == 0 and
          optimizer.l1_regularization_strength == 0 and
          optimizer.l2_regularization_strength == 0 and
          optimizer.beta == 0 and
          not optimizer.multiply_linear_by_learning_rate and
          not optimizer.allow_zero_accumulator)


def adjusted_tf_proto(case, emb, config):
  """TF's proto with exactly the deliberate differences 1-3 applied."""
  proto = type(emb.config_proto)()
  proto.CopyFrom(emb.config_proto)

  # 3. Dynamic learning-rate tags: TF's set order -> ours, via the fns.
  tf_tags = emb._learning_rate_fn_to_tag
  our_fns = config.model.learning_rate_fns
  assert set(tf_tags) == set(our_fns), (tf_tags, our_fns)
  assert len(our_fns) == len(set(our_fns)), our_fns
  tf_to_ours = {tag: our_fns.index(fn) for fn, tag in tf_tags.items()}

  limit = case.recipe.clipping_limit
  for table in proto.table_descriptor:
    params = table.optimization_parameters
    if params.learning_rate.WhichOneof("learning_rate") == "dynamic":
      params.learning_rate.dynamic.tag = tf_to_ours[
          params.learning_rate.dynamic.tag]

    # 2. FTRL message presence.
    if params.WhichOneof("parameters") is None:
      handler = emb._optimizer_handler_dict[table.name]
      assert _is_all_zero_ftrl(handler.get_optimization_parameters()), table
      params.ftrl.SetInParent()

    # 1. clipping_limit, which TF ignores, tightens gradient_clipping_limits.
    if limit is not None:
      clip = params.gradient_clipping_limits
      lower = clip.lower.value if clip.HasField("lower") else None
      upper = clip.upper.value if clip.HasField("upper") else None
      clip.lower.value = -limit if lower is None else max(lower, -limit)
      clip.upper.value = limit if upper is None else min(upper, limit)
  return proto


def _diff_message(ours, expected):
  return ("protos differ\n--- ours\n" + text_format.MessageToString(ours) +
          "--- TF (adjusted)\n" + text_format.MessageToString(expected))


def _events(case, config, emb, expected):
  """Coverage statistics (pytest --hypothesis-show-statistics)."""
  r = case.recipe
  event(f"form={r.form} mode={r.mode}")
  if r.clipping_limit is not None:
    event("clipping_limit set (difference 1)")
  if expected != emb.config_proto:
    event("TF proto adjusted")
  if len(config.model.learning_rate_fns) >= 2:
    event("2+ dynamic learning-rate tags (difference 3)")
  if any(t.vocabulary_size < r.num_hosts for t in config.model.tables.values()):
    event("vocabulary padded to num_hosts")
  if any(_is_all_zero_ftrl(h.get_optimization_parameters())
         for h in emb._optimizer_handler_dict.values()):
    event("all-zero FTRL table (difference 2)")
  if any(f.is_sequence for f in config.model.features.values()):
    event("sequence feature")
  if r.form == "columns":
    if config.spec.tensor_core_feature_columns:
      event("tensor-core column left out")
    if any(g.shared for g in r.groups):
      event("shared group")
    if any(g.shared and len({_is_sequence(c) for c in g.cats}) == 2
           for g in r.groups):
      event("shared group mixing sequence and non-sequence")


def check_valid(case, record_events=False):
  config = case.ours()
  emb = case.tf()  # ours accepted, so TF must accept too
  ours = config.config_proto
  expected = adjusted_tf_proto(case, emb, config)
  assert ours == expected, _diff_message(ours, expected)
  if record_events:
    _events(case, config, emb, expected)
  if case.recipe.form == "columns":
    # Tensor-core columns are in neither proto; ours keeps them apart.
    _, tf_tensor_core = case.tf_embedding_core_columns()
    ours_tensor_core = config.spec.tensor_core_feature_columns
    assert sorted(c.name for c in ours_tensor_core) == sorted(
        c.name for c in tf_tensor_core)


# --- the properties --------------------------------------------------------


@settings(max_examples=200)
@given(case=valid_cases(form="columns"))
def test_columns_form_proto_matches_tf(case):
  check_valid(case, record_events=True)


@settings(max_examples=200)
@given(case=valid_cases(form="dicts"))
def test_dicts_form_proto_matches_tf(case):
  check_valid(case, record_events=True)


# Parametrized by defect so that every defect gets the same share of the
# (at least 25 x 25 = 625) generated invalid recipes.
@pytest.mark.parametrize("defect", ALL_DEFECTS,
                         ids=[d.__name__.lstrip("_") for d in ALL_DEFECTS])
@settings(max_examples=25)
@given(data=st.data())
def test_invalid_recipes_refused_by_both(defect, data):
  case = data.draw(invalid_cases(defect), label="case")
  with pytest.raises((TypeError, ValueError)):
    case.ours()
  with pytest.raises((TypeError, ValueError)):
    case.tf()


# --- deterministic anchors -------------------------------------------------


def test_dynamic_tags_follow_sorted_table_order():
  """Ours numbers fns in sorted-table order of first use (docs/numerics.md,
  'Learning rates and schedules')."""
  a = fc.categorical_column_with_identity("a", 4)
  b = fc.categorical_column_with_identity("b", 4)
  c = fc.categorical_column_with_identity("c", 4)
  columns = [
      tec.embedding_column(c, 2, learning_rate_fn=lr_constant),
      tec.embedding_column(b, 2),
      tec.embedding_column(a, 2, learning_rate_fn=lr_decay),
  ]
  spec = es.EmbeddingConfigSpec(
      feature_columns=columns,
      optimization_parameters=es.AdagradParameters(0.5))
  config = es.EmbeddingConfig(spec, batch_size=4)
  assert config.model.learning_rate_fns == (lr_decay, lr_constant)
  tags = [t.optimization_parameters.learning_rate.WhichOneof("learning_rate")
          for t in config.config_proto.table_descriptor]
  assert tags == ["dynamic", "constant", "dynamic"]


def test_clipping_limit_adjustment_example():
  """Difference 1 on one table, spelled out."""
  case = Case(Recipe(
      form="dicts", groups=(), column_order=(),
      tables=(("t", TableSpec(3, 2, None, "sum", False, None, None, None)),),
      features=(("f", FeatureSpec("t", 0, None)),),
      optimizer=OptSpec("AdagradParameters", (("learning_rate", 0.5),
                                              ("clip_gradient_min", -4.0),
                                              ("clip_gradient_max", 0.5))),
      clipping_limit=1.0, pipelining=False, partition_strategy="div",
      profile_data_directory=None, gradient_multiplier_fn=None, batch_size=8,
      num_hosts=2, num_cores=8, mode=es.TRAIN, spare_names=()))
  config = case.ours()
  clip = config.config_proto.table_descriptor[0].optimization_parameters
  assert (clip.gradient_clipping_limits.lower.value,
          clip.gradient_clipping_limits.upper.value) == (-1.0, 0.5)
  assert config.config_proto.table_descriptor[0].vocabulary_size == 3
  emb = case.tf()
  tf_clip = emb.config_proto.table_descriptor[0].optimization_parameters
  assert (tf_clip.gradient_clipping_limits.lower.value,
          tf_clip.gradient_clipping_limits.upper.value) == (-4.0, 0.5)
  check_valid(case)


def _tf_accepts_shared_groups_with_one_name():
  a = fc.categorical_column_with_identity("a", 4)
  b = fc.categorical_column_with_identity("b", 4)
  c = fc.categorical_column_with_identity("c", 7)
  d = fc.categorical_column_with_identity("d", 7)
  shared = tf.compat.v1.tpu.experimental.shared_embedding_columns
  columns = (shared([a, b], 2, shared_embedding_collection_name="same") +
             shared([c, d], 3, shared_embedding_collection_name="same"))
  t2c, f2c = tee.get_configs_from_feature_columns(columns)
  te.TPUEmbedding(t2c, f2c, 8, te.TRAINING, master=None,
                  optimization_parameters=te.AdagradParameters(0.1),
                  device_config=te.DeviceConfig(1, 1, "worker"))
  return t2c


def _ours_shared_groups_with_one_name():
  a = fc.categorical_column_with_identity("a", 4)
  b = fc.categorical_column_with_identity("b", 4)
  c = fc.categorical_column_with_identity("c", 7)
  d = fc.categorical_column_with_identity("d", 7)
  columns = (
      tec.shared_embedding_columns([a, b], 2,
                                   shared_embedding_collection_name="same") +
      tec.shared_embedding_columns([c, d], 3,
                                   shared_embedding_collection_name="same"))
  es.EmbeddingConfigSpec(feature_columns=columns,
                         optimization_parameters=es.AdagradParameters(0.1))


def _id_column():
  return fc.categorical_column_with_identity("a", 4)


# (description, ours: raises, TF: accepts). Difference 4, pinned.
STRICTER = (
    ("TableConfig learning_rate=0",
     lambda: es.TableConfig(4, 2, learning_rate=0.0),
     lambda: te.TableConfig(4, 2, learning_rate=0.0)),
    ("TableConfig learning_rate<0",
     lambda: es.TableConfig(4, 2, learning_rate=-0.5),
     lambda: te.TableConfig(4, 2, learning_rate=-0.5)),
    ("FeatureConfig table_id not a string",
     lambda: es.FeatureConfig(3), lambda: te.FeatureConfig(3)),
    ("optimizer learning_rate<0",
     lambda: es.AdagradParameters(-1.0), lambda: te.AdagradParameters(-1.0)),
    ("optimizer number not finite",
     lambda: es.AdagradParameters(0.1, initial_accumulator=float("nan")),
     lambda: te.AdagradParameters(0.1, initial_accumulator=float("nan"))),
    ("Momentum momentum<0",
     lambda: es.MomentumParameters(0.1, momentum=-0.5),
     lambda: te.MomentumParameters(0.1, momentum=-0.5)),
    ("RMSProp rho>1",
     lambda: es.RMSPropParameters(0.1, rho=1.5, momentum=0.0, epsilon=1e-3),
     lambda: te.RMSPropParameters(0.1, rho=1.5, momentum=0.0, epsilon=1e-3)),
    ("clip_weight_min > clip_weight_max",
     lambda: es.StochasticGradientDescentParameters(
         0.1, clip_weight_min=1.0, clip_weight_max=-1.0),
     lambda: te.StochasticGradientDescentParameters(
         0.1, clip_weight_min=1.0, clip_weight_max=-1.0)),
    ("tensor_core_shape without 'tpu_tensor_core'",
     lambda: tec.embedding_column(_id_column(), 2, tensor_core_shape=[None, 2]),
     lambda: tf.compat.v1.tpu.experimental.embedding_column(
         _id_column(), 2, tensor_core_shape=[None, 2])),
    ("combiner checked at column creation",
     lambda: tec.embedding_column(_id_column(), 2, combiner="max"),
     lambda: tf.compat.v1.tpu.experimental.embedding_column(
         _id_column(), 2, combiner="max")),
    ("two shared groups with one collection name (TF merges them silently)",
     _ours_shared_groups_with_one_name, _tf_accepts_shared_groups_with_one_name),
)


@pytest.mark.parametrize("ours, theirs", [s[1:] for s in STRICTER],
                         ids=[s[0] for s in STRICTER])
def test_documented_stricter_validation(ours, theirs):
  theirs()  # TF accepts (and fails later, or ignores it)
  with pytest.raises((TypeError, ValueError)):
    ours()
