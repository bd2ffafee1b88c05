"""Every validation rule of the user-facing constructors, one test each.

Each refusal is checked for its exception type (wrong-type arguments raise
`errors.ArgumentTypeError`, a TypeError that is also a ValueError) and for a
message naming the offending argument -- plus the column, table or feature
where one is involved. A few tests check that a refusal loses nothing: no
TensorFlow ops or variables appear, and the objects passed in stay usable.

The tests at the end were written (as strict xfails) for gaps found while
writing this file; the library now passes them and they guard against
regressions.
"""
import copy
import re

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.feature_column import feature_column as fc_v1
from tensorflow.python.tpu import feature_column as tpu_fc_v1
from tensorflow.python.tpu import tpu_embedding as tf_tpu_embedding

import estimator_spec as es
import tpu_embedding_columns as tec
from tpu_embedding_columns import errors

fc = tf.feature_column


def names(*parts):
  """A `match=` regex requiring every part (literally), in any order."""
  return "(?s)" + "".join(f"(?=.*{re.escape(p)})" for p in parts)


# --- columns shared by the tests (building them creates no TF state) -------

CAT_A = fc.categorical_column_with_identity("a", 10)
CAT_B = fc.categorical_column_with_identity("b", 10)
CAT_C = fc.categorical_column_with_identity("c", 10)
CAT_D = fc.categorical_column_with_identity("d", 10)
CAT_BIG = fc.categorical_column_with_identity("big", 11)
WEIGHTED_A = fc.weighted_categorical_column(CAT_A, "w")
SEQ_S = fc.sequence_categorical_column_with_identity("s", 10)
NUMERIC_X = fc.numeric_column("x")

TENSOR_CORE = dict(embedding_lookup_device="tpu_tensor_core",
                   tensor_core_shape=[None, 3])


def adagrad():
  return es.AdagradParameters(0.1)


def column_spec(*columns, **kwargs):
  kwargs.setdefault("optimization_parameters", adagrad())
  return es.EmbeddingConfigSpec(feature_columns=list(columns), **kwargs)


def dict_spec(features=None, tables=None, **kwargs):
  features = {"f": es.FeatureConfig("t")} if features is None else features
  tables = {"t": es.TableConfig(10, 4)} if tables is None else tables
  return es.EmbeddingConfigSpec(feature_to_config_dict=features,
                                table_to_config_dict=tables, **kwargs)


def test_argument_type_error_is_type_and_value_error():
  assert issubclass(errors.ArgumentTypeError, TypeError)
  assert issubclass(errors.ArgumentTypeError, ValueError)


# =============================================================================
# embedding_column
# =============================================================================


@pytest.mark.parametrize("column", [NUMERIC_X, "a", None],
                         ids=["numeric_column", "string", "None"])
def test_embedding_column_refuses_non_categorical_column(column):
  with pytest.raises(TypeError, match=names("`categorical_column`")):
    tec.embedding_column(column, 4)


@pytest.mark.parametrize("dimension,error", [
    (None, ValueError),
    (0, ValueError),
    (-1, ValueError),
    (2.5, TypeError),
    ("3", TypeError),
    (True, TypeError),
])
def test_embedding_column_refuses_bad_dimension(dimension, error):
  with pytest.raises(error, match=names("`dimension`", "'a'")):
    tec.embedding_column(CAT_A, dimension)


def test_embedding_column_accepts_numpy_dimension():
  column = tec.embedding_column(CAT_A, np.int64(4))
  assert column.dimension == 4 and type(column.dimension) is int


@pytest.mark.parametrize("combiner", ["max", "", 1])
def test_embedding_column_refuses_bad_combiner(combiner):
  with pytest.raises(ValueError, match=names("`combiner`", "'a'")):
    tec.embedding_column(CAT_A, 4, combiner=combiner)


def test_embedding_column_refuses_combiner_none_with_weighted_column():
  with pytest.raises(ValueError, match=names("combiner", "'a_weighted_by_w'")):
    tec.embedding_column(WEIGHTED_A, 4, combiner=None)


def test_embedding_column_refuses_non_callable_initializer():
  with pytest.raises(TypeError, match=names("`initializer`", "'a'")):
    tec.embedding_column(CAT_A, 4, initializer=0.5)


def test_embedding_column_refuses_max_sequence_length_for_non_sequence():
  with pytest.raises(ValueError, match=names("`max_sequence_length`", "'a'")):
    tec.embedding_column(CAT_A, 4, max_sequence_length=5)


def test_embedding_column_refuses_zero_max_sequence_length_for_sequence():
  with pytest.raises(ValueError, match=names("`max_sequence_length`", "'s'")):
    tec.embedding_column(SEQ_S, 4, max_sequence_length=0)


@pytest.mark.parametrize("length,error", [(2.0, TypeError), ("3", TypeError),
                                          (True, TypeError), (None, TypeError),
                                          (-1, ValueError)])
def test_embedding_column_refuses_bad_max_sequence_length_value(length, error):
  with pytest.raises(error, match=names("`max_sequence_length`", "'s'")):
    tec.embedding_column(SEQ_S, 4, max_sequence_length=length)


def test_embedding_column_refuses_non_callable_learning_rate_fn():
  with pytest.raises(TypeError, match=names("`learning_rate_fn`", "'a'")):
    tec.embedding_column(CAT_A, 4, learning_rate_fn=0.1)


@pytest.mark.parametrize("device", ["gpu", "TPU_TENSOR_CORE", ""])
def test_embedding_column_refuses_bad_embedding_lookup_device(device):
  with pytest.raises(ValueError, match=names("`embedding_lookup_device`",
                                             "'a'")):
    tec.embedding_column(CAT_A, 4, embedding_lookup_device=device)


def test_embedding_column_tensor_core_needs_tensor_core_shape():
  with pytest.raises(ValueError, match=names("`tensor_core_shape`",
                                             "tpu_tensor_core", "'a'")):
    tec.embedding_column(CAT_A, 4, embedding_lookup_device="tpu_tensor_core")


@pytest.mark.parametrize("shape", [[3], [None, 2, 3], []])
def test_embedding_column_refuses_tensor_core_shape_of_wrong_length(shape):
  with pytest.raises(ValueError, match=names("`tensor_core_shape`", "'a'")):
    tec.embedding_column(CAT_A, 4, embedding_lookup_device="tpu_tensor_core",
                         tensor_core_shape=shape)


@pytest.mark.parametrize("shape,arg,error", [
    ([None, 0], "tensor_core_shape[1]", ValueError),
    ([None, -2], "tensor_core_shape[1]", ValueError),
    ([None, 2.5], "tensor_core_shape[1]", TypeError),
    ([0, 3], "tensor_core_shape[0]", ValueError),
])
def test_embedding_column_refuses_non_positive_tensor_core_shape(
    shape, arg, error):
  with pytest.raises(error, match=names(f"`{arg}`", "'a'")):
    tec.embedding_column(CAT_A, 4, embedding_lookup_device="tpu_tensor_core",
                         tensor_core_shape=shape)


@pytest.mark.parametrize("device", [None, "cpu", "tpu_embedding_core"])
def test_embedding_column_refuses_tensor_core_shape_with_other_device(device):
  with pytest.raises(ValueError, match=names("`tensor_core_shape`",
                                             "embedding_lookup_device", "'a'")):
    tec.embedding_column(CAT_A, 4, embedding_lookup_device=device,
                         tensor_core_shape=[None, 3])


def test_embedding_column_refuses_tensor_core_with_sequence_column():
  with pytest.raises(ValueError, match=names("embedding_lookup_device",
                                             "'s'")):
    tec.embedding_column(SEQ_S, 4, max_sequence_length=3, **TENSOR_CORE)


def test_embedding_column_refuses_tensor_core_with_weighted_column():
  with pytest.raises(ValueError, match=names("embedding_lookup_device",
                                             "'a_weighted_by_w'")):
    tec.embedding_column(WEIGHTED_A, 4, **TENSOR_CORE)


@pytest.mark.parametrize("combiner", ["sqrtn", None])
def test_embedding_column_refuses_tensor_core_with_other_combiner(combiner):
  with pytest.raises(ValueError, match=names("`combiner`", "tpu_tensor_core",
                                             "'a'")):
    tec.embedding_column(CAT_A, 4, combiner=combiner, **TENSOR_CORE)


@pytest.mark.parametrize("value", [1, "yes", None])
def test_embedding_column_refuses_non_bool_use_safe_embedding_lookup(value):
  with pytest.raises(TypeError, match=names("`use_safe_embedding_lookup`",
                                            "'a'")):
    tec.embedding_column(CAT_A, 4, use_safe_embedding_lookup=value)


# =============================================================================
# shared_embedding_columns
# =============================================================================


@pytest.mark.parametrize("columns", [CAT_A, "a", {"a": CAT_A}, None],
                         ids=["column", "string", "dict", "None"])
def test_shared_refuses_categorical_columns_not_a_list(columns):
  with pytest.raises(TypeError, match=names("`categorical_columns`")):
    tec.shared_embedding_columns(columns, 4)


@pytest.mark.parametrize("columns", [[], ()])
def test_shared_refuses_empty_categorical_columns(columns):
  with pytest.raises(ValueError, match=names("`categorical_columns`")):
    tec.shared_embedding_columns(columns, 4)


def test_shared_refuses_non_categorical_member():
  with pytest.raises(TypeError, match=names("`categorical_columns`",
                                            "NumericColumn(key='x'")):
    tec.shared_embedding_columns([CAT_A, NUMERIC_X], 4)


def test_shared_refuses_duplicate_member():
  with pytest.raises(ValueError, match=names("`categorical_columns`", "'a'")):
    tec.shared_embedding_columns([CAT_A, CAT_B, CAT_A], 4)


@pytest.mark.parametrize("lengths", [[0], [0, 0, 0]])
def test_shared_refuses_max_sequence_lengths_of_wrong_length(lengths):
  with pytest.raises(ValueError, match=names("`max_sequence_lengths`")):
    tec.shared_embedding_columns([CAT_A, CAT_B], 4,
                                 max_sequence_lengths=lengths)


def test_shared_refuses_max_sequence_lengths_not_a_list():
  with pytest.raises(TypeError, match=names("`max_sequence_lengths`")):
    tec.shared_embedding_columns([CAT_A, CAT_B], 4, max_sequence_lengths=3)


@pytest.mark.parametrize("lengths,culprit,error", [
    ([0, 0], "'s'", ValueError),   # sequence member needs > 0
    ([2, 3], "'a'", ValueError),   # non-sequence member needs 0
    ([0, -1], "'s'", ValueError),
    ([0, 2.0], "'s'", TypeError),
])
def test_shared_refuses_wrong_max_sequence_length_per_member(
    lengths, culprit, error):
  with pytest.raises(error, match=names("`max_sequence_lengths`", culprit)):
    tec.shared_embedding_columns([CAT_A, SEQ_S], 4,
                                 max_sequence_lengths=lengths)


def test_shared_refuses_different_num_buckets():
  with pytest.raises(ValueError, match=names("categorical_columns", "'a'",
                                             "'big'", "10", "11")):
    tec.shared_embedding_columns([CAT_A, CAT_BIG], 4)


@pytest.mark.parametrize("name", [5, b"group", ["group"]])
def test_shared_refuses_non_string_collection_name(name):
  with pytest.raises(TypeError,
                     match=names("`shared_embedding_collection_name`")):
    tec.shared_embedding_columns([CAT_A, CAT_B], 4,
                                 shared_embedding_collection_name=name)


@pytest.mark.parametrize("dimension,error", [(None, ValueError),
                                             (0, ValueError),
                                             (-1, ValueError),
                                             (2.5, TypeError),
                                             ("3", TypeError)])
def test_shared_refuses_bad_dimension(dimension, error):
  with pytest.raises(error, match=names("`dimension`", "'a'", "'b'")):
    tec.shared_embedding_columns([CAT_A, CAT_B], dimension)


def test_shared_refuses_bad_combiner():
  with pytest.raises(ValueError, match=names("`combiner`", "'a'", "'b'")):
    tec.shared_embedding_columns([CAT_A, CAT_B], 4, combiner="max")


def test_shared_refuses_combiner_none_with_weighted_member():
  with pytest.raises(ValueError, match=names("combiner", "'a_weighted_by_w'")):
    tec.shared_embedding_columns([WEIGHTED_A, CAT_B], 4, combiner=None)


def test_shared_refuses_non_callable_initializer():
  with pytest.raises(TypeError, match=names("`initializer`", "'a'", "'b'")):
    tec.shared_embedding_columns([CAT_A, CAT_B], 4, initializer="zeros")


def test_shared_refuses_non_callable_learning_rate_fn():
  with pytest.raises(TypeError, match=names("`learning_rate_fn`")):
    tec.shared_embedding_columns([CAT_A, CAT_B], 4, learning_rate_fn=1.0)


def test_shared_refuses_tensor_core_with_sequence_member():
  with pytest.raises(ValueError, match=names("embedding_lookup_device", "'s'")):
    tec.shared_embedding_columns([CAT_A, SEQ_S], 4,
                                 max_sequence_lengths=[0, 3], **TENSOR_CORE)


def test_shared_refuses_non_bool_use_safe_embedding_lookup():
  with pytest.raises(TypeError, match=names("`use_safe_embedding_lookup`")):
    tec.shared_embedding_columns([CAT_A, CAT_B], 4,
                                 use_safe_embedding_lookup="no")


# =============================================================================
# Optimizers
# =============================================================================

_REQUIRED = {
    es.AdagradMomentumParameters: dict(momentum=0.9),
    es.MomentumParameters: dict(momentum=0.9),
    es.RMSPropParameters: dict(rho=0.9, momentum=0.0, epsilon=1e-7),
}


def make(cls, **kwargs):
  args = dict(learning_rate=0.1)
  args.update(_REQUIRED.get(cls, {}))
  args.update(kwargs)
  return cls(**args)


def _own_rules():
  cases = [
      (es.AdagradParameters, dict(initial_accumulator=0.0), ValueError),
      (es.AdagradParameters, dict(initial_accumulator=-1.0), ValueError),
      (es.AdagradParameters, dict(initial_accumulator="0.1"), TypeError),
      (es.AdagradMomentumParameters, dict(epsilon=0.0), ValueError),
      (es.AdagradMomentumParameters, dict(epsilon=-1e-8), ValueError),
      (es.AdagradMomentumParameters, dict(exponent=0), ValueError),
      (es.AdagradMomentumParameters, dict(exponent=-2), ValueError),
      (es.AdagradMomentumParameters, dict(beta2=-0.1), ValueError),
      (es.AdagradMomentumParameters, dict(beta2=1.1), ValueError),
      (es.AdagradMomentumParameters, dict(momentum=-0.1), ValueError),
      (es.AdagradMomentumParameters, dict(momentum=None), TypeError),
      (es.AdagradMomentumParameters, dict(use_nesterov=1), TypeError),
      (es.ProximalAdagradParameters, dict(initial_accumulator=0.0), ValueError),
      (es.ProximalAdagradParameters, dict(l1_regularization_strength=-0.1),
       ValueError),
      (es.ProximalAdagradParameters, dict(l2_regularization_strength=-0.1),
       ValueError),
      (es.AdamParameters, dict(beta1=-0.1), ValueError),
      (es.AdamParameters, dict(beta1=1.0), ValueError),
      (es.AdamParameters, dict(beta2=-0.1), ValueError),
      (es.AdamParameters, dict(beta2=1.0), ValueError),
      (es.AdamParameters, dict(epsilon=0.0), ValueError),
      (es.AdamParameters, dict(lazy_adam="no"), TypeError),
      (es.AdamParameters, dict(sum_inside_sqrt=0), TypeError),
      (es.FtrlParameters, dict(learning_rate_power=0.5), ValueError),
      (es.FtrlParameters, dict(initial_accumulator_value=-0.1), ValueError),
      (es.FtrlParameters, dict(l1_regularization_strength=-1.0), ValueError),
      (es.FtrlParameters, dict(l2_regularization_strength=-1.0), ValueError),
      (es.FtrlParameters, dict(beta=-0.5), ValueError),
      (es.FtrlParameters, dict(multiply_linear_by_learning_rate=1), TypeError),
      (es.FtrlParameters, dict(allow_zero_accumulator="yes"), TypeError),
      (es.ProximalYogiParameters, dict(beta1=-0.1), ValueError),
      (es.ProximalYogiParameters, dict(beta1=1.0), ValueError),
      (es.ProximalYogiParameters, dict(beta2=-0.1), ValueError),
      (es.ProximalYogiParameters, dict(beta2=1.0), ValueError),
      (es.ProximalYogiParameters, dict(epsilon=0.0), ValueError),
      (es.ProximalYogiParameters, dict(l1_regularization_strength=-0.1),
       ValueError),
      (es.ProximalYogiParameters, dict(l2_regularization_strength=-0.1),
       ValueError),
      (es.ProximalYogiParameters, dict(initial_accumulator_value=-1e-6),
       ValueError),
      (es.MomentumParameters, dict(momentum=-0.1), ValueError),
      (es.MomentumParameters, dict(momentum="0.9"), TypeError),
      (es.MomentumParameters, dict(use_nesterov="yes"), TypeError),
      (es.RMSPropParameters, dict(rho=-0.1), ValueError),
      (es.RMSPropParameters, dict(rho=1.1), ValueError),
      (es.RMSPropParameters, dict(epsilon=0.0), ValueError),
      (es.RMSPropParameters, dict(epsilon=-1.0), ValueError),
      (es.RMSPropParameters, dict(momentum=-0.1), ValueError),
  ]
  for cls, kwargs, error in cases:
    (arg, value), = kwargs.items()
    yield pytest.param(cls, kwargs, error, id=f"{cls.__name__}-{arg}={value!r}")


@pytest.mark.parametrize("cls,kwargs,error", list(_own_rules()))
def test_optimizer_refuses_own_bad_argument(cls, kwargs, error):
  (arg,) = kwargs
  with pytest.raises(error, match=names(cls.__name__, f"`{arg}`")):
    make(cls, **kwargs)


@pytest.mark.parametrize("cls,kwargs", [
    (es.AdagradMomentumParameters, dict(beta2=0.0)),
    (es.AdagradMomentumParameters, dict(beta2=1.0)),
    (es.AdagradMomentumParameters, dict(momentum=0.0)),
    (es.ProximalAdagradParameters, dict(l1_regularization_strength=0.0)),
    (es.AdamParameters, dict(beta1=0.0, beta2=0.0)),
    (es.FtrlParameters, dict(learning_rate_power=0.0,
                             initial_accumulator_value=0.0, beta=0.0)),
    (es.ProximalYogiParameters, dict(beta1=0.0, beta2=0.0,
                                     initial_accumulator_value=0.0)),
    (es.MomentumParameters, dict(momentum=0.0)),
    (es.RMSPropParameters, dict(rho=0.0)),
    (es.RMSPropParameters, dict(rho=1.0)),
], ids=lambda x: x.__name__ if isinstance(x, type) else repr(x))
def test_optimizer_accepts_boundary_values(cls, kwargs):
  optimizer = make(cls, **kwargs)
  for arg, value in kwargs.items():
    assert getattr(optimizer, arg) == value


def test_adam_refuses_non_lazy_without_gradient_accumulation():
  with pytest.raises(ValueError, match=names("AdamParameters", "`lazy_adam",
                                             "use_gradient_accumulation")):
    es.AdamParameters(0.1, lazy_adam=False, use_gradient_accumulation=False)


@pytest.mark.parametrize("value,error", [
    (-0.1, ValueError),
    (float("nan"), ValueError),
    (float("inf"), ValueError),
    (np.float32("nan"), ValueError),
    ("0.1", TypeError),
    (True, TypeError),
    (None, TypeError),
], ids=["negative", "nan", "inf", "np-nan", "string", "bool", "None"])
@pytest.mark.parametrize("cls", es.ALL_OPTIMIZERS, ids=lambda c: c.__name__)
def test_optimizer_refuses_bad_learning_rate(cls, value, error):
  with pytest.raises(error, match=names(cls.__name__, "`learning_rate`")):
    make(cls, learning_rate=value)


@pytest.mark.parametrize("cls", es.ALL_OPTIMIZERS, ids=lambda c: c.__name__)
def test_optimizer_accepts_zero_and_numpy_learning_rate(cls):
  assert make(cls, learning_rate=0).learning_rate == 0.0
  assert make(cls, learning_rate=np.float32(0.5)).learning_rate == 0.5


@pytest.mark.parametrize("cls", es.ALL_OPTIMIZERS, ids=lambda c: c.__name__)
def test_optimizer_refuses_clip_weight_min_above_max(cls):
  with pytest.raises(ValueError, match=names(cls.__name__, "`clip_weight_min`",
                                             "`clip_weight_max`")):
    make(cls, clip_weight_min=1.0, clip_weight_max=-1.0)


@pytest.mark.parametrize("cls", es.ALL_OPTIMIZERS, ids=lambda c: c.__name__)
def test_optimizer_refuses_clip_gradient_min_above_max(cls):
  with pytest.raises(ValueError, match=names(cls.__name__,
                                             "`clip_gradient_min`",
                                             "`clip_gradient_max`")):
    make(cls, clip_gradient_min=2.0, clip_gradient_max=1.0)


@pytest.mark.parametrize("limits", [dict(clip_gradient_min=-1.0),
                                    dict(clip_gradient_max=1.0)],
                         ids=["min", "max"])
@pytest.mark.parametrize("cls", es.ALL_OPTIMIZERS, ids=lambda c: c.__name__)
def test_optimizer_refuses_gradient_clipping_without_accumulation(cls, limits):
  with pytest.raises(ValueError, match=names(cls.__name__, "clip_gradient_",
                                             "use_gradient_accumulation")):
    make(cls, use_gradient_accumulation=False, **limits)


@pytest.mark.parametrize("cls", es.ALL_OPTIMIZERS, ids=lambda c: c.__name__)
def test_optimizer_refuses_negative_weight_decay_factor(cls):
  with pytest.raises(ValueError, match=names(cls.__name__,
                                             "`weight_decay_factor`")):
    make(cls, weight_decay_factor=-0.01)


@pytest.mark.parametrize("arg,value", [
    ("clip_weight_min", "a"), ("clip_weight_max", True),
    ("clip_gradient_min", [1.0]), ("clip_gradient_max", "1"),
    ("weight_decay_factor", "0.1"),
])
@pytest.mark.parametrize("cls", es.ALL_OPTIMIZERS, ids=lambda c: c.__name__)
def test_optimizer_refuses_non_number_common_argument(cls, arg, value):
  with pytest.raises(TypeError, match=names(cls.__name__, f"`{arg}`")):
    make(cls, **{arg: value})


@pytest.mark.parametrize("arg,value", [
    ("use_gradient_accumulation", 1),
    ("use_gradient_accumulation", None),
    ("multiply_weight_decay_factor_by_learning_rate", "yes"),
])
@pytest.mark.parametrize("cls", es.ALL_OPTIMIZERS, ids=lambda c: c.__name__)
def test_optimizer_refuses_non_bool_flag(cls, arg, value):
  with pytest.raises(TypeError, match=names(cls.__name__, f"`{arg}`")):
    make(cls, **{arg: value})


def test_optimizer_repr_shows_class_and_arguments():
  text = repr(es.AdagradParameters(0.1))
  assert text.startswith("AdagradParameters(")
  for part in ("learning_rate=0.1", "initial_accumulator=0.1",
               "use_gradient_accumulation=True", "clip_weight_min=None",
               "clip_gradient_max=None"):
    assert part in text


# =============================================================================
# TableConfig
# =============================================================================


@pytest.mark.parametrize("size,error", [(0, ValueError), (-5, ValueError),
                                        (10.0, TypeError), ("10", TypeError),
                                        (None, TypeError), (True, TypeError)])
def test_table_config_refuses_bad_vocabulary_size(size, error):
  with pytest.raises(error, match=names("TableConfig", "`vocabulary_size`")):
    es.TableConfig(size, 4)


def test_table_config_accepts_numpy_int_sizes():
  table = es.TableConfig(np.int64(10), np.int32(4))
  assert (table.vocabulary_size, table.dimension) == (10, 4)
  assert type(table.vocabulary_size) is int and type(table.dimension) is int


@pytest.mark.parametrize("dimension,error", [(0, ValueError),
                                             (-1, ValueError),
                                             (2.5, TypeError),
                                             ("3", TypeError),
                                             (None, TypeError)])
def test_table_config_refuses_bad_dimension(dimension, error):
  with pytest.raises(error, match=names("TableConfig", "`dimension`")):
    es.TableConfig(10, dimension)


def test_table_config_refuses_non_callable_initializer():
  with pytest.raises(TypeError, match=names("TableConfig", "`initializer`")):
    es.TableConfig(10, 4, initializer="zeros")


@pytest.mark.parametrize("combiner", ["max", "", 0])
def test_table_config_refuses_bad_combiner(combiner):
  with pytest.raises(ValueError, match=names("TableConfig", "`combiner`")):
    es.TableConfig(10, 4, combiner=combiner)


@pytest.mark.parametrize("rate,error", [(0, ValueError), (-0.1, ValueError),
                                        (float("nan"), ValueError),
                                        ("0.1", TypeError)])
def test_table_config_refuses_non_positive_learning_rate(rate, error):
  with pytest.raises(error, match=names("TableConfig", "`learning_rate`")):
    es.TableConfig(10, 4, learning_rate=rate)


def test_table_config_refuses_learning_rate_with_learning_rate_fn():
  with pytest.raises(ValueError, match=names("TableConfig", "`learning_rate`",
                                             "`learning_rate_fn`")):
    es.TableConfig(10, 4, learning_rate=0.1, learning_rate_fn=lambda step: 0.1)


def test_table_config_refuses_non_callable_learning_rate_fn():
  with pytest.raises(TypeError, match=names("TableConfig",
                                            "`learning_rate_fn`")):
    es.TableConfig(10, 4, learning_rate_fn=0.1)


@pytest.mark.parametrize("value", [1, "true", None])
def test_table_config_refuses_non_bool_hot_id_replication(value):
  with pytest.raises(TypeError, match=names("TableConfig",
                                            "`hot_id_replication`")):
    es.TableConfig(10, 4, hot_id_replication=value)


@pytest.mark.parametrize("value", [
    tf.compat.v1.tpu.experimental.AdagradParameters(0.1),
    "adagrad",
    tf.keras.optimizers.legacy.Adagrad(0.1),
], ids=["tf-AdagradParameters", "string", "keras-optimizer"])
def test_table_config_refuses_wrong_optimization_parameters(value):
  with pytest.raises(TypeError, match=names("TableConfig",
                                            "`optimization_parameters`",
                                            "estimator_spec")):
    es.TableConfig(10, 4, optimization_parameters=value)


# =============================================================================
# FeatureConfig
# =============================================================================


@pytest.mark.parametrize("table_id,error", [(None, TypeError),
                                            (3, TypeError),
                                            (b"t", TypeError),
                                            ("", ValueError)])
def test_feature_config_refuses_bad_table_id(table_id, error):
  with pytest.raises(error, match=names("FeatureConfig", "`table_id`")):
    es.FeatureConfig(table_id)


@pytest.mark.parametrize("length,error", [(-1, ValueError), (2.0, TypeError),
                                          ("3", TypeError), (None, TypeError),
                                          (True, TypeError)])
def test_feature_config_refuses_bad_max_sequence_length(length, error):
  with pytest.raises(error, match=names("FeatureConfig",
                                        "`max_sequence_length`")):
    es.FeatureConfig("t", max_sequence_length=length)


@pytest.mark.parametrize("key", [3, b"w", ["w"]])
def test_feature_config_refuses_non_string_weight_key(key):
  with pytest.raises(TypeError, match=names("FeatureConfig", "`weight_key`")):
    es.FeatureConfig("t", weight_key=key)


# =============================================================================
# EmbeddingConfigSpec
# =============================================================================


def test_spec_refuses_neither_form():
  with pytest.raises(ValueError, match=names("EmbeddingConfigSpec",
                                             "`feature_columns`",
                                             "feature_to_config_dict",
                                             "table_to_config_dict",
                                             "neither")):
    es.EmbeddingConfigSpec(optimization_parameters=adagrad())


def test_spec_refuses_both_forms():
  with pytest.raises(ValueError, match=names("EmbeddingConfigSpec",
                                             "`feature_columns`",
                                             "feature_to_config_dict",
                                             "both")):
    es.EmbeddingConfigSpec(
        feature_columns=[tec.embedding_column(CAT_A, 4)],
        optimization_parameters=adagrad(),
        feature_to_config_dict={"f": es.FeatureConfig("t")},
        table_to_config_dict={"t": es.TableConfig(10, 4)})


@pytest.mark.parametrize("given,missing", [
    ("feature_to_config_dict", "table_to_config_dict"),
    ("table_to_config_dict", "feature_to_config_dict"),
])
def test_spec_refuses_only_one_of_the_dicts(given, missing):
  value = {"feature_to_config_dict": {"f": es.FeatureConfig("t")},
           "table_to_config_dict": {"t": es.TableConfig(10, 4)}}[given]
  with pytest.raises(ValueError, match=names("EmbeddingConfigSpec",
                                             f"`{given}`", f"`{missing}`")):
    es.EmbeddingConfigSpec(optimization_parameters=adagrad(), **{given: value})


@pytest.mark.parametrize("strategy", ["DIV", "round_robin", None])
def test_spec_refuses_bad_partition_strategy(strategy):
  with pytest.raises(ValueError, match=names("EmbeddingConfigSpec",
                                             "`partition_strategy`")):
    dict_spec(partition_strategy=strategy)
  # TF's own text (the value unquoted), which callers match.
  tf_text = (f"Invalid partition_strategy {strategy}. Must be one of \"mod\" "
             "or \"div\".")
  with pytest.raises(ValueError, match=re.escape(tf_text)):
    dict_spec(partition_strategy=strategy)


@pytest.mark.parametrize("limit,error", [(0, ValueError), (-1.0, ValueError),
                                         (float("inf"), ValueError),
                                         ("1.0", TypeError), (True, TypeError)])
def test_spec_refuses_bad_clipping_limit(limit, error):
  with pytest.raises(error, match=names("EmbeddingConfigSpec",
                                        "`clipping_limit`")):
    dict_spec(optimization_parameters=adagrad(), clipping_limit=limit)


def test_spec_refuses_non_callable_gradient_multiplier_fn():
  with pytest.raises(TypeError, match=names(
      "EmbeddingConfigSpec", "`experimental_gradient_multiplier_fn`")):
    dict_spec(experimental_gradient_multiplier_fn=2.0)


@pytest.mark.parametrize("value", [1, "True", None])
def test_spec_refuses_non_bool_pipelining(value):
  with pytest.raises(TypeError, match=names(
      "EmbeddingConfigSpec", "`pipeline_execution_with_tensor_core`")):
    dict_spec(pipeline_execution_with_tensor_core=value)


@pytest.mark.parametrize("directory", [3, b"/tmp/profile"])
def test_spec_refuses_non_string_profile_data_directory(directory):
  with pytest.raises(TypeError, match=names("EmbeddingConfigSpec",
                                            "`profile_data_directory`")):
    dict_spec(profile_data_directory=directory)


def test_spec_refuses_columns_without_optimization_parameters():
  with pytest.raises(ValueError, match=names("EmbeddingConfigSpec",
                                             "`optimization_parameters`",
                                             "`feature_columns`")):
    column_spec(tec.embedding_column(CAT_A, 4), optimization_parameters=None)


@pytest.mark.parametrize("value", [
    tf.compat.v1.tpu.experimental.AdagradParameters(0.1),
    "adagrad",
    0.1,
], ids=["tf-AdagradParameters", "string", "number"])
def test_spec_refuses_wrong_optimization_parameters_type(value):
  with pytest.raises(TypeError, match=names("EmbeddingConfigSpec",
                                            "`optimization_parameters`")):
    column_spec(tec.embedding_column(CAT_A, 4), optimization_parameters=value)


def test_spec_refuses_feature_columns_not_a_list():
  column = tec.embedding_column(CAT_A, 4)
  with pytest.raises(TypeError, match=names("EmbeddingConfigSpec",
                                            "`feature_columns`")):
    es.EmbeddingConfigSpec(feature_columns={"a": column},
                           optimization_parameters=adagrad())


def test_spec_refuses_non_tpu_column():
  with pytest.raises(TypeError, match=names("EmbeddingConfigSpec",
                                            "`feature_columns`",
                                            "NumericColumn", "key='x'")):
    column_spec(tec.embedding_column(CAT_A, 4), NUMERIC_X)


def _tf1_tpu_columns(shared):
  """TF 1.x's TPU columns (`tf.contrib.tpu`), of TF 1.x's categorical
  columns."""
  b, c = (fc_v1._categorical_column_with_identity(k, 10) for k in "bc")
  if shared:
    return tpu_fc_v1.shared_embedding_columns([b, c], 4)[0]
  return tpu_fc_v1.embedding_column(b, 4)


TF_TPU = tf.compat.v1.tpu.experimental
# A program half migrated: one of TensorFlow's own TPU columns left in our
# spec. (TF's column, its name, the function that builds ours.)
TF_TPU_COLUMNS = {
    "embedding_column": (lambda: TF_TPU.embedding_column(CAT_B, 4),
                         "'b_embedding'", "embedding_column"),
    "shared_embedding_columns": (
        lambda: TF_TPU.shared_embedding_columns([CAT_B, CAT_C], 4)[0],
        "'b_shared_embedding'", "shared_embedding_columns"),
    "weighted": (
        lambda: TF_TPU.embedding_column(
            fc.weighted_categorical_column(CAT_B, "w"), 4),
        "'b_weighted_by_w_embedding'", "embedding_column"),
    "lookup-device-cpu": (
        lambda: TF_TPU.shared_embedding_columns(
            [CAT_B, CAT_C], 4, embedding_lookup_device="cpu")[0],
        "'b_shared_embedding'", "shared_embedding_columns"),
    "tf1-embedding_column": (lambda: _tf1_tpu_columns(shared=False),
                             "'b_embedding'", "embedding_column"),
    # TF 1.x's shared columns name their table as `legacy`'s do.
    "tf1-shared_embedding_columns": (lambda: _tf1_tpu_columns(shared=True),
                                     "'b_shared_embedding'",
                                     "legacy.shared_embedding_columns"),
}


@pytest.mark.parametrize("kind", sorted(TF_TPU_COLUMNS))
def test_spec_refuses_tensorflows_own_tpu_column_in_one_sentence(kind):
  make, name, function = TF_TPU_COLUMNS[kind]
  with pytest.raises(errors.ArgumentTypeError) as raised:
    column_spec(tec.embedding_column(CAT_A, 4), make())
  assert str(raised.value) == (
      "EmbeddingConfigSpec: `feature_columns` holds TensorFlow's own TPU "
      f"embedding column {name} (feature 'b'); build it with "
      f"tpu_embedding_columns.{function}, or run `python -m estimator_spec "
      "migrate` on the program (docs/migration.md).")


@pytest.mark.parametrize("arg,key,value", [
    ("feature_to_config_dict", "f", es.TableConfig(10, 4)),
    ("feature_to_config_dict", "f", tf_tpu_embedding.FeatureConfig("t")),
    ("feature_to_config_dict", "f", "t"),
    ("table_to_config_dict", "t", es.FeatureConfig("t")),
    ("table_to_config_dict", "t", tf_tpu_embedding.TableConfig(10, 4)),
    ("table_to_config_dict", "t", (10, 4)),
], ids=["feature-TableConfig", "feature-tf-FeatureConfig", "feature-str",
        "table-FeatureConfig", "table-tf-TableConfig", "table-tuple"])
def test_spec_refuses_dict_value_of_wrong_type(arg, key, value):
  dicts = {"feature_to_config_dict": {"f": es.FeatureConfig("t")},
           "table_to_config_dict": {"t": es.TableConfig(10, 4)}}
  dicts[arg][key] = value
  with pytest.raises(TypeError, match=names("EmbeddingConfigSpec",
                                            f"`{arg}[{key!r}]`")):
    es.EmbeddingConfigSpec(**dicts)


@pytest.mark.parametrize("arg", ["feature_to_config_dict",
                                 "table_to_config_dict"])
def test_spec_refuses_dict_that_is_not_a_mapping(arg):
  dicts = {"feature_to_config_dict": {"f": es.FeatureConfig("t")},
           "table_to_config_dict": {"t": es.TableConfig(10, 4)}}
  dicts[arg] = list(dicts[arg].values())
  with pytest.raises(TypeError, match=names("EmbeddingConfigSpec", f"`{arg}`")):
    es.EmbeddingConfigSpec(**dicts)


@pytest.mark.parametrize("key,error", [(3, TypeError), ("", TypeError)])
def test_spec_refuses_bad_dict_key(key, error):
  with pytest.raises(error, match=names("EmbeddingConfigSpec",
                                        "`feature_to_config_dict`")):
    dict_spec(features={key: es.FeatureConfig("t")})


def test_spec_refuses_feature_referring_to_unknown_table():
  with pytest.raises(ValueError, match=names("feature_to_config_dict",
                                             "'f'", "'missing'",
                                             "table_to_config_dict")):
    dict_spec(features={"f": es.FeatureConfig("missing")})


def test_spec_refuses_unused_table():
  with pytest.raises(ValueError, match=names("table_to_config_dict",
                                             "'unused'")):
    dict_spec(tables={"t": es.TableConfig(10, 4),
                      "unused": es.TableConfig(5, 2)})


def test_spec_refuses_same_feature_in_two_columns():
  with pytest.raises(ValueError, match=names("multiple embeddings",
                                             "feature_columns", "'a'",
                                             "'a_embedding'",
                                             "'a_weighted_by_w_embedding'")):
    column_spec(tec.embedding_column(CAT_A, 4),
                tec.embedding_column(WEIGHTED_A, 4))


def test_spec_refuses_two_shared_groups_with_same_collection_name():
  group1 = tec.shared_embedding_columns(
      [CAT_A, CAT_B], 4, shared_embedding_collection_name="grp")
  group2 = tec.shared_embedding_columns(
      [CAT_C, CAT_D], 4, shared_embedding_collection_name="grp")
  with pytest.raises(ValueError, match=names("feature_columns", "'tbl_grp'",
                                             "'a_shared_embedding'",
                                             "'c_shared_embedding'",
                                             "shared_embedding_collection_name")):
    column_spec(*group1, *group2)


def test_spec_refuses_shared_collection_name_equal_to_other_columns_table():
  plain = tec.embedding_column(CAT_A, 4)  # table 'tbl_a'
  shared = tec.shared_embedding_columns(
      [CAT_B, CAT_C], 4, shared_embedding_collection_name="a")
  with pytest.raises(ValueError, match=names("feature_columns", "'tbl_a'",
                                             "'a_embedding'",
                                             "'b_shared_embedding'")):
    column_spec(plain, *shared)


@pytest.mark.parametrize("form", ["columns", "dicts-global", "dicts-table"])
def test_spec_refuses_clipping_limit_without_gradient_accumulation(form):
  no_accumulation = es.StochasticGradientDescentParameters(
      0.1, use_gradient_accumulation=False)
  with pytest.raises(ValueError, match=names("`clipping_limit`", "'tbl_a'"
                                             if form == "columns" else "'t'",
                                             "use_gradient_accumulation")):
    if form == "columns":
      column_spec(tec.embedding_column(CAT_A, 4), clipping_limit=1.0,
                  optimization_parameters=no_accumulation)
    elif form == "dicts-global":
      dict_spec(clipping_limit=1.0, optimization_parameters=no_accumulation)
    else:
      dict_spec(tables={"t": es.TableConfig(
          10, 4, optimization_parameters=no_accumulation)},
                clipping_limit=1.0, optimization_parameters=adagrad())


# =============================================================================
# EmbeddingConfig
# =============================================================================


@pytest.fixture(name="spec")
def _spec():
  return column_spec(tec.embedding_column(CAT_A, 4),
                     *tec.shared_embedding_columns([CAT_B, CAT_C], 8))


@pytest.mark.parametrize("value", [
    None, {"f": es.FeatureConfig("t")},
    tf.compat.v1.estimator.tpu.experimental.EmbeddingConfigSpec(
        feature_to_config_dict={"f": tf_tpu_embedding.FeatureConfig("t")},
        table_to_config_dict={"t": tf_tpu_embedding.TableConfig(10, 4)},
        optimization_parameters=tf.compat.v1.tpu.experimental
        .AdagradParameters(0.1)),
], ids=["None", "dict", "tf-EmbeddingConfigSpec"])
def test_embedding_config_refuses_non_spec(value):
  with pytest.raises(TypeError, match=names("EmbeddingConfig", "`spec`")):
    es.EmbeddingConfig(value, batch_size=8)


def test_embedding_config_refuses_batch_size_not_divisible_by_num_cores(spec):
  with pytest.raises(ValueError, match=names("EmbeddingConfig", "`batch_size`",
                                             "`num_cores`")):
    es.EmbeddingConfig(spec, batch_size=10, num_hosts=1, num_cores=4)


def test_embedding_config_refuses_num_cores_not_divisible_by_num_hosts(spec):
  with pytest.raises(ValueError, match=names("EmbeddingConfig", "`num_cores`",
                                             "`num_hosts`")):
    es.EmbeddingConfig(spec, batch_size=24, num_hosts=4, num_cores=6)


@pytest.mark.parametrize("arg", ["batch_size", "num_hosts", "num_cores"])
@pytest.mark.parametrize("value,error", [(0, ValueError), (-8, ValueError),
                                         (8.0, TypeError), ("8", TypeError),
                                         (None, TypeError), (True, TypeError)])
def test_embedding_config_refuses_bad_topology_number(spec, arg, value, error):
  args = dict(batch_size=8, num_hosts=1, num_cores=1)
  args[arg] = value
  with pytest.raises(error, match=names("EmbeddingConfig", f"`{arg}`")):
    es.EmbeddingConfig(spec, **args)


@pytest.mark.parametrize("mode", ["training", "TRAIN", None, 1])
def test_embedding_config_refuses_bad_mode(spec, mode):
  with pytest.raises(ValueError, match=names("EmbeddingConfig", "`mode`")):
    es.EmbeddingConfig(spec, batch_size=8, mode=mode)


def _spec_without_global_optimizer():
  return dict_spec(
      features={"f1": es.FeatureConfig("t1"), "f2": es.FeatureConfig("t2"),
                "f3": es.FeatureConfig("t3")},
      tables={"t1": es.TableConfig(10, 4),
              "t2": es.TableConfig(10, 4, optimization_parameters=adagrad()),
              "t3": es.TableConfig(6, 2)},
      optimization_parameters=None)


def test_embedding_config_training_refuses_tables_without_optimizer():
  spec = _spec_without_global_optimizer()
  with pytest.raises(ValueError, match=names("EmbeddingConfig",
                                             "optimization_parameters",
                                             "'t1'", "'t3'")) as info:
    es.EmbeddingConfig(spec, batch_size=8, mode=es.TRAIN)
  assert "'t2'" not in str(info.value)


@pytest.mark.parametrize("mode", [es.EVAL, es.PREDICT])
def test_embedding_config_inference_accepts_tables_without_optimizer(mode):
  config = es.EmbeddingConfig(_spec_without_global_optimizer(), batch_size=8,
                              mode=mode)
  proto = config.config_proto
  assert proto.mode == proto.INFERENCE
  assert [t.name for t in proto.table_descriptor] == ["t1", "t2", "t3"]


# =============================================================================
# ShardLayout
# =============================================================================


@pytest.mark.parametrize("args,arg,error", [
    ((0, 2, "div"), "vocabulary_size", ValueError),
    ((10.0, 2, "div"), "vocabulary_size", TypeError),
    (("10", 2, "div"), "vocabulary_size", TypeError),
    ((10, 0, "div"), "num_shards", ValueError),
    ((10, -1, "mod"), "num_shards", ValueError),
    ((10, 2.0, "mod"), "num_shards", TypeError),
    ((10, 2, "DIV"), "strategy", ValueError),
    ((10, 2, None), "strategy", ValueError),
])
def test_shard_layout_refuses_bad_argument(args, arg, error):
  with pytest.raises(error, match=names("ShardLayout", f"`{arg}`")):
    es.ShardLayout(*args)


# =============================================================================
# A refusal loses nothing
# =============================================================================


@pytest.mark.parametrize("build", [
    lambda: tec.embedding_column(CAT_A, 0),
    lambda: tec.embedding_column(CAT_A, 4, combiner="max"),
    lambda: tec.embedding_column(CAT_A, 4, use_safe_embedding_lookup=None),
    lambda: tec.embedding_column(SEQ_S, 4, max_sequence_length=0),
    lambda: tec.shared_embedding_columns([CAT_A, CAT_BIG], 4),
    lambda: tec.shared_embedding_columns([CAT_A, CAT_B], 4,
                                         shared_embedding_collection_name=5),
], ids=["dimension", "combiner", "safe_lookup", "sequence_length",
        "num_buckets", "collection_name"])
def test_refused_column_creates_nothing_in_the_graph(build):
  graph = tf.Graph()
  with graph.as_default():
    with pytest.raises((TypeError, ValueError)):
      build()
    assert tf.compat.v1.global_variables() == []
    assert tf.compat.v1.trainable_variables() == []
  assert graph.get_operations() == []
  assert graph.get_all_collection_keys() == []


def test_refused_embedding_config_leaves_spec_usable(spec):
  before = es.EmbeddingConfig(spec, batch_size=16, num_hosts=2,
                              num_cores=4).config_proto
  model = spec.model
  for bad in (dict(batch_size=10, num_cores=4), dict(batch_size=8, mode="x"),
              dict(batch_size=8, num_hosts=3, num_cores=4)):
    with pytest.raises(ValueError):
      es.EmbeddingConfig(spec, **bad)
  assert spec.model is model
  after = es.EmbeddingConfig(spec, batch_size=16, num_hosts=2,
                             num_cores=4).config_proto
  assert after == before


def test_refused_spec_leaves_its_inputs_unchanged_and_usable():
  features = {"f": es.FeatureConfig("t"), "g": es.FeatureConfig("nope")}
  tables = {"t": es.TableConfig(10, 4)}
  features_before, tables_before = dict(features), dict(tables)
  with pytest.raises(ValueError, match="nope"):
    es.EmbeddingConfigSpec(feature_to_config_dict=features,
                           table_to_config_dict=tables,
                           optimization_parameters=adagrad())
  assert features == features_before and tables == tables_before
  del features["g"]
  spec = es.EmbeddingConfigSpec(feature_to_config_dict=features,
                                table_to_config_dict=tables,
                                optimization_parameters=adagrad())
  assert list(spec.model.tables) == ["t"]


def test_refused_spec_leaves_columns_usable():
  column = tec.embedding_column(CAT_A, 4)
  with pytest.raises(TypeError):
    column_spec(column, NUMERIC_X)
  with pytest.raises(ValueError):
    column_spec(column, optimization_parameters=adagrad(), clipping_limit=-1)
  spec = column_spec(column)
  assert list(spec.model.tables) == ["tbl_a"]
  assert spec.feature_columns == [column]


# =============================================================================
# Library bugs found while writing these tests (fixed; kept as regressions)
# =============================================================================


@pytest.mark.parametrize("make_invalid,arg", [
    (lambda: es.TableConfig(10, 4)._replace(vocabulary_size=0),
     "vocabulary_size"),
    (lambda: es.FeatureConfig("t")._replace(max_sequence_length=-1),
     "max_sequence_length"),
    (lambda: dict_spec()._replace(partition_strategy="bad"),
     "partition_strategy"),
], ids=["TableConfig", "FeatureConfig", "EmbeddingConfigSpec"])
def test_replace_cannot_bypass_validation(make_invalid, arg):
  with pytest.raises(ValueError, match=names(f"`{arg}`")):
    make_invalid()


def test_spec_can_be_copied(spec):
  copied = copy.copy(spec)
  assert copied == spec
  assert list(copied.model.tables) == list(spec.model.tables)


def test_spec_refuses_clipping_limit_disjoint_from_gradient_clipping():
  spec_args = dict(
      table_to_config_dict={"t": es.TableConfig(8, 2)},
      feature_to_config_dict={"f": es.FeatureConfig("t")})
  with pytest.raises(ValueError, match=r"(?=.*clipping_limit)(?=.*'t')"):
    es.EmbeddingConfigSpec(
        optimization_parameters=es.AdagradParameters(0.1,
                                                     clip_gradient_min=4.0),
        clipping_limit=0.25, **spec_args)
  with pytest.raises(ValueError, match="clip_gradient_max"):
    es.EmbeddingConfigSpec(
        optimization_parameters=es.AdagradParameters(0.1,
                                                     clip_gradient_max=-4.0),
        clipping_limit=0.25, **spec_args)
  # Overlapping bounds are fine and intersect.
  spec = es.EmbeddingConfigSpec(
      optimization_parameters=es.AdagradParameters(0.1,
                                                   clip_gradient_min=-0.1),
      clipping_limit=0.25, **spec_args)
  limits = es.EmbeddingConfig(spec, batch_size=8).config_proto.table_descriptor[
      0].optimization_parameters.gradient_clipping_limits
  assert (limits.lower.value, limits.upper.value) == pytest.approx((-0.1, 0.25))
