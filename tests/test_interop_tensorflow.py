"""`estimator_spec.interop`: our spec as TF 2.15's own classes and back, and
`TPUEstimator(use_tpu=True)` delegating to TF's TPUEstimator.

The recipes of `test_config_proto_oracle` describe one configuration for
both sides. Properties:
* to_tensorflow(our spec), fed to TF's own EmbeddingConfig / TPUEmbedding,
  gives our proto: in TRAIN exactly (clipping_limit folded into the
  optimizers; only dynamic-tag numbering and FTRL message presence are
  adjusted), in inference with the clipping_limit adjustment as well (TF
  builds the inference optimizer itself);
* from_tensorflow(TF's spec of the recipe) gives the proto our recipe gives;
* round trips keep every column / table / optimizer argument.
TF is only an oracle here.
"""
import dataclasses
import importlib
import inspect
import re
import socket
import time
from unittest import mock

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given
from hypothesis import settings
from tensorflow.python.tpu import feature_column as tf_tpu_fc
from tensorflow.python.tpu import feature_column_v2 as tf_tpu_fc_v2
from tensorflow.python.tpu import tpu_function
from tensorflow.python.tpu import tpu_embedding as te
from tensorflow_estimator.python.estimator.tpu import _tpu_estimator_embedding as tee

import estimator_spec as es
import tpu_embedding_columns as tec
from estimator_spec import interop
from estimator_spec.interop import _tensorflow
from estimator_spec.interop import _tpu
from tests import test_config_proto_oracle as oracle
from tpu_embedding_columns import errors

fc = tf.feature_column
TPUConfig = tf.compat.v1.estimator.tpu.TPUConfig
TPURunConfig = tf.compat.v1.estimator.tpu.RunConfig
TFSpec = tf.compat.v1.estimator.tpu.experimental.EmbeddingConfigSpec
TPU_MASTER = "grpc://10.0.0.2:8470"


# --- helpers -----------------------------------------------------------------


def tf_embedding(tf_spec, *, mode, batch_size, num_hosts, num_cores):
  """TF's own per-mode TPUEmbedding for `tf_spec`, built by TF's
  `_tpu_estimator_embedding.EmbeddingConfig` (as TF's TPUEstimator does),
  with the device topology given instead of asking a TPU master."""
  real = te.TPUEmbedding
  masters = []

  def with_devices(t2c, f2c, batch, tpu_mode, master, optimizer, cluster_def,
                   **kwargs):
    masters.append(master)
    del cluster_def
    return real(t2c, f2c, batch, tpu_mode, None, optimizer,
                device_config=te.DeviceConfig(num_hosts, num_cores, "worker"),
                **kwargs)

  run_config = TPURunConfig(master=TPU_MASTER,
                            tpu_config=TPUConfig(num_shards=num_cores))
  with mock.patch.object(te, "TPUEmbedding", with_devices):
    config = tee.EmbeddingConfig(tf_spec, batch_size, batch_size, num_hosts,
                                 num_cores, run_config)
    emb = config.get_tpu_embedding(mode)
  assert masters == [TPU_MASTER]  # TF would have asked this master
  return emb


@dataclasses.dataclass
class _Limit:
  clipping_limit: object


@dataclasses.dataclass
class _CaseLike:
  """What `oracle.adjusted_tf_proto` reads of a case."""
  recipe: _Limit


def expected_proto(emb, config, clipping_limit):
  return oracle.adjusted_tf_proto(_CaseLike(_Limit(clipping_limit)), emb,
                                  config)


def column_fields(column):
  """Every column argument, read through the accessors both sides have."""
  device = getattr(column, "embedding_lookup_device", None)
  if device is None:
    raw = getattr(column, "_embedding_lookup_device", None)
    device = None if raw is None else {
        tf_tpu_fc_v2.EmbeddingDevice.CPU: "cpu",
        tf_tpu_fc_v2.EmbeddingDevice.TPU_TENSOR_CORE: "tpu_tensor_core",
        tf_tpu_fc_v2.EmbeddingDevice.TPU_EMBEDDING_CORE: "tpu_embedding_core",
    }[raw]
  shape = getattr(column, "tensor_core_shape", None)
  if shape is None:
    shape = getattr(column, "_tensor_core_shape", None)
  return dict(
      name=column.name,
      categorical_column=id(column.categorical_column),
      table_size=tuple(column.get_embedding_table_size()),
      var_name=column.get_embedding_var_name(),
      combiner=column.get_combiner(),
      initializer=id(column.get_initializer()),
      max_sequence_length=column.get_max_sequence_length(),
      learning_rate_fn=column.get_learning_rate_fn(),
      device=device,
      tensor_core_shape=None if shape is None else list(shape),
      use_safe=column.use_safe_embedding_lookup)


def all_columns(spec):
  return list(interop.columns_by_name(spec).values())


def folded(optimizer_config, limit):
  config = dict(optimizer_config)
  if limit is not None:
    low, high = config["clip_gradient_min"], config["clip_gradient_max"]
    config["clip_gradient_min"] = -limit if low is None else max(low, -limit)
    config["clip_gradient_max"] = limit if high is None else min(high, limit)
  return config


def tf_optimizer_config(optimizer):
  ours = getattr(es, type(optimizer).__name__)
  return {k: getattr(optimizer, k)
          for k in inspect.signature(ours.__init__).parameters
          if k != "self"}


def tf_spec_of(recipe):
  """TF's EmbeddingConfigSpec of a recipe (TF's columns or TF's dicts)."""
  optimizer = None if recipe.optimizer is None else recipe.optimizer.build(
      oracle.TF)
  settings_ = dict(
      optimization_parameters=optimizer,
      clipping_limit=recipe.clipping_limit,
      pipeline_execution_with_tensor_core=recipe.pipelining,
      experimental_gradient_multiplier_fn=recipe.gradient_multiplier_fn,
      partition_strategy=recipe.partition_strategy,
      profile_data_directory=recipe.profile_data_directory)
  if recipe.form == "columns":
    return TFSpec(feature_columns=oracle._ordered_columns(recipe, oracle.TF),
                  **settings_)
  return TFSpec(
      table_to_config_dict={n: t.build(oracle.TF) for n, t in recipe.tables},
      feature_to_config_dict={n: f.build(oracle.TF)
                              for n, f in recipe.features},
      **settings_)


TF_SPEC_REFUSED = ("AdagradMomentumParameters", "ProximalYogiParameters")


# --- properties over the oracle's recipes ------------------------------------


def check_to_tensorflow(case):
  r = case.recipe
  config = case.ours()
  spec = config.spec
  if r.form == "columns" and r.optimizer.name in TF_SPEC_REFUSED:
    with pytest.raises(ValueError, match="dict form"):
      interop.to_tensorflow(spec)
    return
  tf_spec = interop.to_tensorflow(spec)
  assert isinstance(tf_spec, TFSpec)
  emb = tf_embedding(tf_spec, mode=r.mode, batch_size=r.batch_size,
                     num_hosts=r.num_hosts, num_cores=r.num_cores)
  # In TRAIN the folded clipping makes TF's own proto ours; in inference TF
  # picks the optimizer itself, so clipping_limit is adjusted as well.
  limit = None if r.mode == es.TRAIN else r.clipping_limit
  expected = expected_proto(emb, config, limit)
  assert config.config_proto == expected, oracle._diff_message(
      config.config_proto, expected)

  # Columns: same names, same categorical columns, every argument carried.
  if r.form == "columns":
    assert [column_fields(c) for c in all_columns(tf_spec)] == [
        column_fields(c) for c in all_columns(spec)]
    assert len(tf_spec.tensor_core_feature_columns) == len(
        spec.tensor_core_feature_columns)
  # Optimizers: TF's classes, every argument, clipping_limit folded in.
  pairs = [(spec.optimization_parameters, tf_spec.optimization_parameters)]
  if r.form == "dicts":
    assert set(tf_spec.table_to_config_dict) == set(spec.table_to_config_dict)
    for name, table in spec.table_to_config_dict.items():
      theirs = tf_spec.table_to_config_dict[name]
      assert isinstance(theirs, te.TableConfig)
      assert (theirs.vocabulary_size, theirs.dimension, theirs.combiner,
              theirs.hot_id_replication, theirs.learning_rate,
              theirs.learning_rate_fn) == (
                  table.vocabulary_size, table.dimension, table.combiner,
                  table.hot_id_replication, table.learning_rate,
                  table.learning_rate_fn)
      assert theirs.initializer is table.initializer
      pairs.append((table.optimization_parameters,
                    theirs.optimization_parameters))
    assert {n: tuple(f) for n, f in tf_spec.feature_to_config_dict.items()} == {
        n: tuple(f) for n, f in spec.feature_to_config_dict.items()}
  for ours, theirs in pairs:
    if ours is None:
      assert theirs is None
      continue
    assert type(theirs) is getattr(te, type(ours).__name__)
    assert tf_optimizer_config(theirs) == folded(ours.get_config(),
                                                 r.clipping_limit)
  # Settings.
  assert (tf_spec.clipping_limit, tf_spec.pipeline_execution_with_tensor_core,
          tf_spec.experimental_gradient_multiplier_fn,
          tf_spec.partition_strategy, tf_spec.profile_data_directory) == (
              spec.clipping_limit, spec.pipeline_execution_with_tensor_core,
              spec.experimental_gradient_multiplier_fn,
              spec.partition_strategy, spec.profile_data_directory)

  # Round trip: back to ours, the same proto and columns.
  back = interop.from_tensorflow(tf_spec)
  again = es.EmbeddingConfig(back, batch_size=r.batch_size,
                             num_hosts=r.num_hosts, num_cores=r.num_cores,
                             mode=r.mode)
  assert again.config_proto == config.config_proto
  if r.form == "columns":
    assert [column_fields(c) for c in all_columns(back)] == [
        column_fields(c) for c in all_columns(spec)]


def check_from_tensorflow(case):
  r = case.recipe
  try:
    tf_spec = tf_spec_of(r)
  except ValueError:
    # TF's spec refuses these two as the global optimizer of columns only.
    assert r.form == "columns" and r.optimizer.name in TF_SPEC_REFUSED
    return
  config = case.ours()
  ours = interop.from_tensorflow(tf_spec)
  assert isinstance(ours, es.EmbeddingConfigSpec)
  converted = es.EmbeddingConfig(ours, batch_size=r.batch_size,
                                 num_hosts=r.num_hosts, num_cores=r.num_cores,
                                 mode=r.mode)
  assert converted.config_proto == config.config_proto, oracle._diff_message(
      converted.config_proto, config.config_proto)
  if r.form == "columns":
    assert [column_fields(c) for c in all_columns(ours)] == [
        column_fields(c) for c in all_columns(tf_spec)]
    # Round trip to TF again: TF's columns come back with every argument.
    again = interop.to_tensorflow(ours)
    assert [column_fields(c) for c in all_columns(again)] == [
        column_fields(c) for c in all_columns(tf_spec)]


@settings(max_examples=40)
@given(case=oracle.valid_cases(form="columns"))
def test_columns_form_both_directions_keep_the_proto(case):
  check_to_tensorflow(case)
  check_from_tensorflow(case)


@settings(max_examples=30)
@given(case=oracle.valid_cases(form="dicts"))
def test_dicts_form_both_directions_keep_the_proto(case):
  check_to_tensorflow(case)
  check_from_tensorflow(case)


# --- deterministic cases -----------------------------------------------------

# Non-default values for every argument of every optimizer class.
OPTIMIZER_ARGS = {
    "AdagradParameters": dict(initial_accumulator=0.25),
    "AdagradMomentumParameters": dict(momentum=0.5, use_nesterov=True,
                                      exponent=4.0, beta2=0.5, epsilon=1e-3),
    "AdamParameters": dict(beta1=0.5, beta2=0.875, epsilon=1e-3,
                           lazy_adam=False, sum_inside_sqrt=False),
    "FtrlParameters": dict(learning_rate_power=-0.25,
                           initial_accumulator_value=0.5,
                           l1_regularization_strength=0.125,
                           l2_regularization_strength=0.25,
                           multiply_linear_by_learning_rate=True, beta=0.5,
                           allow_zero_accumulator=True),
    "MomentumParameters": dict(momentum=0.875, use_nesterov=True),
    "ProximalAdagradParameters": dict(initial_accumulator=0.5,
                                      l1_regularization_strength=0.125,
                                      l2_regularization_strength=0.25),
    "ProximalYogiParameters": dict(beta1=0.5, beta2=0.875, epsilon=0.5,
                                   l1_regularization_strength=0.125,
                                   l2_regularization_strength=0.25,
                                   initial_accumulator_value=0.5),
    "RMSPropParameters": dict(rho=0.5, momentum=0.25, epsilon=1e-3),
    "StochasticGradientDescentParameters": dict(),
}
COMMON_ARGS = dict(learning_rate=0.5, use_gradient_accumulation=True,
                   clip_weight_min=-2.0, clip_weight_max=3.0,
                   weight_decay_factor=0.01,
                   multiply_weight_decay_factor_by_learning_rate=True,
                   clip_gradient_min=-4.0, clip_gradient_max=0.5)


def _dict_spec(optimizer, clipping_limit=None):
  return es.EmbeddingConfigSpec(
      table_to_config_dict={
          "t": es.TableConfig(7, 3, optimization_parameters=optimizer),
          "u": es.TableConfig(5, 2, learning_rate=0.25),
      },
      feature_to_config_dict={
          "f": es.FeatureConfig("t", max_sequence_length=4),
          "g": es.FeatureConfig("u", weight_key="g_w"),
      },
      optimization_parameters=es.StochasticGradientDescentParameters(0.125),
      clipping_limit=clipping_limit)


@pytest.mark.parametrize("name", sorted(OPTIMIZER_ARGS))
def test_every_optimizer_class_converts_with_every_argument(name):
  args = dict(COMMON_ARGS, **OPTIMIZER_ARGS[name])
  ours = getattr(es, name)(**args)
  assert sorted(args) == sorted(ours.get_config())  # every argument set
  tf_spec = interop.to_tensorflow(_dict_spec(ours, clipping_limit=1.0))
  theirs = tf_spec.table_to_config_dict["t"].optimization_parameters
  assert type(theirs) is getattr(te, name)
  expected = dict(args, clip_gradient_min=-1.0, clip_gradient_max=0.5)
  assert tf_optimizer_config(theirs) == expected
  # TF's object with TF's own construction converts back to ours exactly.
  direct = getattr(te, name)(**args)
  table = te.TableConfig(7, 3, optimization_parameters=direct)
  back = interop.from_tensorflow(TFSpec(
      table_to_config_dict={"t": table},
      feature_to_config_dict={"f": te.FeatureConfig("t")}))
  assert back.table_to_config_dict["t"].optimization_parameters == ours
  for mode in (es.TRAIN, es.EVAL):
    spec = _dict_spec(ours, clipping_limit=1.0)
    config = es.EmbeddingConfig(spec, batch_size=8, num_hosts=2,
                                num_cores=4, mode=mode)
    emb = tf_embedding(tf_spec, mode=mode, batch_size=8, num_hosts=2,
                       num_cores=4)
    limit = None if mode == es.TRAIN else 1.0
    assert config.config_proto == expected_proto(emb, config, limit)


def test_shared_groups_sequence_weighted_and_tensor_core_columns():
  a = fc.categorical_column_with_identity("a", 10)
  s = fc.sequence_categorical_column_with_identity("s", 10)
  b = fc.categorical_column_with_identity("b", 10)
  c = fc.categorical_column_with_hash_bucket("c", 6)
  d = fc.categorical_column_with_identity("d", 6)
  w = fc.weighted_categorical_column(
      fc.categorical_column_with_identity("w", 7), "w_weights")
  t = fc.categorical_column_with_identity("t", 5)
  group1 = tec.shared_embedding_columns(
      [a, s, b], 4, combiner="sqrtn", max_sequence_lengths=[0, 3, 0],
      learning_rate_fn=oracle.lr_decay, use_safe_embedding_lookup=False)
  group2 = tec.shared_embedding_columns(
      [c, d], 2, shared_embedding_collection_name="cd_table",
      embedding_lookup_device="tpu_tensor_core", tensor_core_shape=[None, 2])
  weighted = tec.embedding_column(w, 3, combiner="sum",
                                  embedding_lookup_device="cpu")
  tensor_core = tec.embedding_column(t, 2, embedding_lookup_device=(
      "tpu_tensor_core"), tensor_core_shape=[8, 3])
  # Only two members of group1 are in the spec, not in group order.
  columns = [group1[2], weighted, group2[0], tensor_core, group1[1], group2[1]]
  spec = es.EmbeddingConfigSpec(
      feature_columns=columns,
      optimization_parameters=es.FtrlParameters(0.5))
  tf_spec = interop.to_tensorflow(spec)
  tf_columns = interop.columns_by_name(tf_spec)
  ours = interop.columns_by_name(spec)
  assert list(tf_columns) == list(ours) == [
      "b_shared_embedding", "w_weighted_by_w_weights_embedding",
      "s_shared_embedding", "c_shared_embedding", "t_embedding",
      "d_shared_embedding"]
  # One TF group per shared group, under the same collection name.
  creator = tf_columns["b_shared_embedding"].shared_embedding_column_creator
  assert tf_columns["s_shared_embedding"].shared_embedding_column_creator is (
      creator)
  assert tf_columns["c_shared_embedding"].shared_embedding_column_creator is (
      tf_columns["d_shared_embedding"].shared_embedding_column_creator)
  cd_creator = tf_columns["c_shared_embedding"].shared_embedding_column_creator
  assert cd_creator is not creator
  assert tf_columns["b_shared_embedding"].get_embedding_var_name() == (
      "a_b_s_shared_embedding")
  assert tf_columns["d_shared_embedding"].get_embedding_var_name() == (
      "cd_table")
  for name, column in ours.items():
    assert column_fields(tf_columns[name]) == column_fields(column)
  assert {c.name for c in tf_spec.tensor_core_feature_columns} == {
      "c_shared_embedding", "d_shared_embedding", "t_embedding"}
  back = interop.from_tensorflow(tf_spec)
  assert [column_fields(c) for c in all_columns(back)] == [
      column_fields(c) for c in all_columns(spec)]
  shared_back = interop.columns_by_name(back)
  assert shared_back["b_shared_embedding"].shared_table is (
      shared_back["s_shared_embedding"].shared_table)
  for mode in (es.TRAIN, es.PREDICT):
    config = es.EmbeddingConfig(spec, batch_size=16, num_hosts=2,
                                num_cores=8, mode=mode)
    emb = tf_embedding(tf_spec, mode=mode, batch_size=16, num_hosts=2,
                       num_cores=8)
    assert config.config_proto == expected_proto(emb, config, None)
    assert es.EmbeddingConfig(back, batch_size=16, num_hosts=2, num_cores=8,
                              mode=mode).config_proto == config.config_proto


def test_dict_form_per_table_optimizers_round_trip():
  spec = es.EmbeddingConfigSpec(
      table_to_config_dict={
          "t": es.TableConfig(9, 4, combiner="sum", hot_id_replication=True,
                              learning_rate_fn=oracle.lr_staircase,
                              optimization_parameters=es.AdamParameters(
                                  0.5, clip_gradient_max=4.0)),
          "u": es.TableConfig(3, 2, combiner=None,
                              optimization_parameters=(
                                  es.ProximalYogiParameters(0.25))),
          "v": es.TableConfig(5, 1, learning_rate=0.5),
      },
      feature_to_config_dict={
          "f": es.FeatureConfig("t", max_sequence_length=2, weight_key="fw"),
          "t": es.FeatureConfig("t"),
          "g": es.FeatureConfig("u"),
          "h": es.FeatureConfig("v"),
      },
      optimization_parameters=es.MomentumParameters(0.125, 0.5),
      clipping_limit=2.0, pipeline_execution_with_tensor_core=True,
      experimental_gradient_multiplier_fn=oracle.grad_multiplier,
      partition_strategy="mod", profile_data_directory="/tmp/prof")
  tf_spec = interop.to_tensorflow(spec)
  assert interop.columns_by_name(tf_spec) == {}
  tables = tf_spec.table_to_config_dict
  assert tables["t"].optimization_parameters.clip_gradient_min == -2.0
  assert tables["t"].optimization_parameters.clip_gradient_max == 2.0
  assert isinstance(tables["u"].optimization_parameters,
                    te.ProximalYogiParameters)
  assert tables["v"].optimization_parameters is None
  assert tf_spec.optimization_parameters.clip_gradient_max == 2.0
  back = interop.from_tensorflow(tf_spec)
  assert back.feature_to_config_dict == spec.feature_to_config_dict
  for mode in (es.TRAIN, es.EVAL):
    config = es.EmbeddingConfig(spec, batch_size=4, num_hosts=1, num_cores=2,
                                mode=mode)
    emb = tf_embedding(tf_spec, mode=mode, batch_size=4, num_hosts=1,
                       num_cores=2)
    limit = None if mode == es.TRAIN else 2.0
    assert config.config_proto == expected_proto(emb, config, limit)
    assert es.EmbeddingConfig(back, batch_size=4, num_hosts=1, num_cores=2,
                              mode=mode).config_proto == config.config_proto


# --- refusals ----------------------------------------------------------------


def _spec():
  column = tec.embedding_column(fc.categorical_column_with_identity("a", 4), 2)
  return es.EmbeddingConfigSpec(
      feature_columns=[column],
      optimization_parameters=es.AdagradParameters(0.5))


def test_wrong_types_are_refused_clearly():
  spec = _spec()
  tf_spec = interop.to_tensorflow(spec)
  with pytest.raises(TypeError, match="from_tensorflow converts the other"):
    interop.to_tensorflow(tf_spec)
  with pytest.raises(TypeError, match="already is an estimator_spec spec"):
    interop.from_tensorflow(spec)
  for bad in (None, {"feature_columns": []}, "spec"):
    with pytest.raises(TypeError, match="to_tensorflow"):
      interop.to_tensorflow(bad)
    with pytest.raises(TypeError, match="from_tensorflow"):
      interop.from_tensorflow(bad)
    with pytest.raises(TypeError, match="columns_by_name"):
      interop.columns_by_name(bad)
  # TF's spec accepts numeric and plain embedding columns; ours does not.
  numeric = fc.numeric_column("x")
  with_numeric = TFSpec(
      feature_columns=list(tf_spec.feature_columns) + [numeric],
      optimization_parameters=te.AdagradParameters(0.5))
  with pytest.raises(TypeError, match="'x'.*belong to the dense model"):
    interop.from_tensorflow(with_numeric)
  # Our optimizer inside TF's spec (dict form: TF does not check it).
  wrong_optimizer = TFSpec(
      table_to_config_dict={"t": te.TableConfig(4, 2)},
      feature_to_config_dict={"f": te.FeatureConfig("t")},
      optimization_parameters=es.AdagradParameters(0.5))
  with pytest.raises(TypeError, match="`optimization_parameters`.*"
                     "TensorFlow's TPU embedding optimizers"):
    interop.from_tensorflow(wrong_optimizer)


def test_unconvertible_values_are_refused_clearly():
  a = fc.categorical_column_with_identity("a", 4)
  yogi = es.EmbeddingConfigSpec(
      feature_columns=[tec.embedding_column(a, 2)],
      optimization_parameters=es.ProximalYogiParameters(0.5))
  with pytest.raises(ValueError, match="ProximalYogiParameters.*dict form"):
    interop.to_tensorflow(yogi)
  column = tf.compat.v1.tpu.experimental.embedding_column(a, 2)
  for field, value in (("max_norm", 1.0), ("trainable", False),
                       ("ckpt_to_load_from", "/tmp/ckpt")):
    changed = column._replace(**{field: value})
    tf_spec = TFSpec(feature_columns=[changed],
                     optimization_parameters=te.AdagradParameters(0.5))
    with pytest.raises(ValueError, match=f"'a_embedding'.*{field}="):
      interop.from_tensorflow(tf_spec)
  # Our stricter validation names the value (TF accepts learning_rate=0).
  zero_rate = TFSpec(
      table_to_config_dict={"t": te.TableConfig(4, 2, learning_rate=0.0)},
      feature_to_config_dict={"f": te.FeatureConfig("t")},
      optimization_parameters=te.AdagradParameters(0.5))
  with pytest.raises(ValueError, match="learning_rate"):
    interop.from_tensorflow(zero_rate)


def test_an_optimizer_tensorflow_lacks_is_refused_only_when_converted(
    monkeypatch):
  # Each optimizer class names its TF counterpart (`tf1_class`), which the
  # conversion looks up when it runs: the module loads without it.
  monkeypatch.setattr(es.AdagradParameters, "tf1_class", "NoSuchParameters")
  module = importlib.reload(_tensorflow)
  with pytest.raises(
      ValueError,
      match=r"to_tensorflow: AdagradParameters converts to TensorFlow's "
      r"NoSuchParameters, which TensorFlow " + re.escape(tf.__version__) +
      " does not have"):
    module.to_tensorflow(_dict_spec(es.AdagradParameters(0.5)))
  tf_spec = module.to_tensorflow(_dict_spec(es.AdamParameters(0.5)))
  assert type(tf_spec.table_to_config_dict["t"].optimization_parameters) is (
      te.AdamParameters)


def test_a_subclass_does_not_convert_as_its_base_class():
  class SignAdagrad(es.AdagradParameters):
    pass

  with pytest.raises(ValueError, match="to_tensorflow: SignAdagrad has no "
                     "counterpart.*declares no `tf1_class`"):
    interop.to_tensorflow(_dict_spec(SignAdagrad(0.5)))


def test_a_column_kind_tensorflow_lacks_is_refused_not_converted_as_its_base():
  """A subclass of our column (a kind that may change ids or rows) has no
  TF counterpart: converting it as TF's plain column would drop what it
  changes."""

  class ModuloColumn(tec.columns.EmbeddingColumn):
    pass

  plain = tec.embedding_column(fc.categorical_column_with_identity("a", 10),
                               4)
  column = ModuloColumn.__new__(ModuloColumn)
  column.__dict__.update(plain.__dict__)
  spec = es.EmbeddingConfigSpec(
      feature_columns=[column],
      optimization_parameters=es.StochasticGradientDescentParameters(0.1))
  with pytest.raises(ValueError, match="'a_embedding' is a ModuloColumn, "
                     "which TensorFlow's TPU embedding columns cannot "
                     "express"):
    interop.to_tensorflow(spec)


# --- TPUEstimator(use_tpu=True) delegation -----------------------------------


def _columns():
  a = fc.categorical_column_with_identity("a", 10)
  s = fc.sequence_categorical_column_with_identity("s", 10)
  b = fc.categorical_column_with_identity("b", 10)
  t = fc.categorical_column_with_identity("t", 6)
  plain = tec.embedding_column(a, 4, learning_rate_fn=oracle.lr_decay)
  seq, other = tec.shared_embedding_columns([s, b], 3,
                                            max_sequence_lengths=[2, 0])
  tensor_core = tec.embedding_column(t, 2, combiner="sum",
                                     embedding_lookup_device="tpu_tensor_core",
                                     tensor_core_shape=[None, 3])
  return plain, seq, other, tensor_core


def _delegating_spec(columns):
  return es.EmbeddingConfigSpec(
      feature_columns=list(columns),
      optimization_parameters=es.AdagradParameters(0.5),
      clipping_limit=1.0, partition_strategy="mod")


def _model_fn(columns, seen):
  plain, seq, other, tensor_core = columns

  def model_fn(features, labels, mode, params):
    seen.append(dict(features=features, params=params))
    dense = tf.compat.v1.keras.layers.DenseFeatures([plain, other])(features)
    sequence, lengths = tf.keras.experimental.SequenceFeatures([seq])(
        features)
    seen[-1].update(dense=dense, sequence=sequence, lengths=lengths)
    if tensor_core.feature_key in features and isinstance(
        features[tensor_core.feature_key], tf.SparseTensor):
      seen[-1]["tensor_core_ids"] = features[tensor_core.feature_key]
    logits = tf.reduce_sum(
        tf.concat([dense, tf.reduce_sum(sequence, 1)], 1), 1, keepdims=True)
    loss = tf.compat.v1.losses.mean_squared_error(labels, logits)
    return es.TPUEstimatorSpec(mode, loss=loss, train_op=tf.no_op())

  return model_fn


@pytest.mark.parametrize("how", ["master", "cluster"])
def test_use_tpu_with_a_named_tpu_delegates_to_tensorflow(tmp_path, how):
  columns = _columns()
  spec = _delegating_spec(columns)
  if how == "master":
    run_config = TPURunConfig(master=TPU_MASTER, model_dir=str(tmp_path),
                              tpu_config=TPUConfig(num_shards=16))
  else:
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(TPU_MASTER)
    run_config = TPURunConfig(cluster=resolver, model_dir=str(tmp_path),
                              tpu_config=TPUConfig(num_shards=16))
  estimator = es.TPUEstimator(
      model_fn=_model_fn(columns, []), config=run_config, use_tpu=True,
      train_batch_size=32, eval_batch_size=16,
      embedding_config_spec=spec)
  assert isinstance(estimator, tf.compat.v1.estimator.tpu.TPUEstimator)
  assert isinstance(estimator, interop.DelegatedTPUEstimator)
  assert estimator.estimator_spec_embedding_config is spec
  tf_spec = estimator._ctx._embedding_config_spec  # what TF's TPU path uses
  assert isinstance(tf_spec, TFSpec)
  back = interop.from_tensorflow(tf_spec)
  for mode, batch in ((es.TRAIN, 32), (es.EVAL, 16)):
    ours = es.EmbeddingConfig(spec, batch_size=batch, num_hosts=2,
                              num_cores=16, mode=mode)
    assert es.EmbeddingConfig(back, batch_size=batch, num_hosts=2,
                              num_cores=16, mode=mode).config_proto == (
                                  ours.config_proto)
    emb = tf_embedding(tf_spec, mode=mode, batch_size=batch, num_hosts=2,
                       num_cores=16)
    # TF's table/feature configs are ours (tables named tbl_<var name>).
    assert sorted(emb.table_to_config_dict) == sorted(ours.model.tables)
    for name, table in emb.table_to_config_dict.items():
      mine = ours.model.tables[name]
      assert (table.vocabulary_size, table.dimension, table.combiner,
              table.learning_rate_fn) == (mine.vocabulary_size,
                                          mine.dimension, mine.combiner,
                                          mine.learning_rate_fn)
    assert {n: (f.table_id, f.max_sequence_length, f.weight_key)
            for n, f in emb.feature_to_config_dict.items()} == {
                n: (f.table, f.max_sequence_length, f.weight_key)
                for n, f in ours.model.features.items()}
    limit = None if mode == es.TRAIN else 1.0
    assert ours.config_proto == expected_proto(emb, ours, limit)
  assert [c.name for c in tf_spec.tensor_core_feature_columns] == [
      "t_embedding"]


def test_delegation_checks_arguments_first(tmp_path):
  columns = _columns()
  config = TPURunConfig(master=TPU_MASTER, model_dir=str(tmp_path / "m"),
                        tpu_config=TPUConfig(num_shards=16))
  model_fn = _model_fn(columns, [])
  with pytest.raises(ValueError, match="'batch_size'"):
    es.TPUEstimator(model_fn=model_fn, config=config, params={"batch_size": 2},
                    use_tpu=True, train_batch_size=32,
                    embedding_config_spec=_delegating_spec(columns))
  with pytest.raises(ValueError, match="multiple of `num_cores`"):
    es.TPUEstimator(model_fn=model_fn, config=config, use_tpu=True,
                    train_batch_size=8,
                    embedding_config_spec=_delegating_spec(columns))
  with pytest.raises(ValueError, match="dict form"):
    es.TPUEstimator(model_fn=model_fn, config=config, use_tpu=True,
                    train_batch_size=32,
                    embedding_config_spec=es.EmbeddingConfigSpec(
                        feature_columns=list(columns),
                        optimization_parameters=es.ProximalYogiParameters()))
  assert not (tmp_path / "m").exists()


def test_wrapped_model_fn_reads_tensorflows_activations():
  """Inside TF's TPU computation our columns return features[key]; their
  tables are recorded under the names our CPU lookups use."""
  columns = _columns()
  plain, seq, other, tensor_core = columns
  spec = _delegating_spec(columns)
  seen = []
  wrapped = _tpu.wrap_model_fn(_model_fn(columns, seen), spec)
  batch = 4
  rng = np.random.RandomState(0)
  values = {
      "a": rng.randn(batch, 4).astype(np.float32),
      "b": rng.randn(batch, 3).astype(np.float32),
      "s": rng.randn(batch, 2, 3).astype(np.float32),
      "s_seq_length_": np.array([2, 1, 0, 2], np.int32),
  }
  with tf.Graph().as_default() as graph:
    features = {k: tf.constant(v) for k, v in values.items()}
    # TF's padded tensor-core ids and their mask.
    features["t"] = tf.constant([[3, 0, 0], [1, 5, 0], [0, 0, 0], [2, 2, 4]],
                                tf.int64)
    features["t__TENSOR_CORE_MASK"] = tf.constant(
        [[1, 0, 0], [1, 1, 0], [0, 0, 0], [1, 1, 1]], tf.int32)
    labels = tf.zeros([batch, 1])
    with tpu_function.tpu_shard_context(16):
      result = wrapped(features, labels, tf.estimator.ModeKeys.TRAIN,
                       {"batch_size": batch}, None)
    assert isinstance(result, tf.compat.v1.estimator.tpu.TPUEstimatorSpec)
    # No table variable was created: the TPU holds the tables.
    names = [v.op.name for v in tf.compat.v1.global_variables()]
    assert not [n for n in names if "embedding" in n], names
    recorded = graph.get_collection(tf_tpu_fc._TPU_FC_TO_SCOPE)[0]
    tf_spec = interop.to_tensorflow(spec)
    t2c, _ = tee.get_configs_from_feature_columns(tf_spec.feature_columns)
    table_names, slot_names = tee.get_full_variable_names(
        graph, t2c, te.AdagradParameters(0.5))
    with tf.compat.v1.Session() as session:
      dense, sequence, lengths, ids = session.run(
          [seen[0]["dense"], seen[0]["sequence"], seen[0]["lengths"],
           seen[0]["tensor_core_ids"]])
  assert set(recorded) == {"a", "b_s_shared_embedding"}
  assert table_names == {
      "tbl_a": "dense_features/a_embedding/embedding_weights",
      "tbl_b_s_shared_embedding": "b_s_shared_embedding",
  }
  assert slot_names["tbl_a"].accumulator == (
      "dense_features/a_embedding/embedding_weights/Adagrad")
  # DenseFeatures orders columns by name: a_embedding, b_shared_embedding.
  np.testing.assert_array_equal(dense,
                                np.concatenate([values["a"], values["b"]], 1))
  np.testing.assert_array_equal(sequence, values["s"])
  np.testing.assert_array_equal(lengths, values["s_seq_length_"])
  np.testing.assert_array_equal(ids.values, [3, 1, 5, 2, 2, 4])
  np.testing.assert_array_equal(ids.indices, [[0, 0], [1, 0], [1, 1], [3, 0],
                                              [3, 1], [3, 2]])
  assert "t__TENSOR_CORE_MASK" not in seen[0]["features"]


def test_wrapped_model_fn_off_the_tpu_does_its_own_lookups():
  """Outside TF's TPU computation (CPU evaluation, CPU export), the columns
  look up their own tables; an unconfigured column is named on the TPU."""
  columns = _columns()
  plain = columns[0]
  spec = _delegating_spec(columns)
  seen = []
  wrapped = _tpu.wrap_model_fn(_model_fn(columns, seen), spec)
  with tf.Graph().as_default():
    features = {
        "a": tf.constant([[1], [2]], tf.int64),
        "b": tf.constant([[3], [4]], tf.int64),
        "s": tf.sparse.from_dense(tf.constant([[1, 2], [3, 0]], tf.int64)),
    }
    wrapped(features, tf.zeros([2, 1]), tf.estimator.ModeKeys.EVAL, {}, None)
    names = {v.op.name for v in tf.compat.v1.global_variables()}
  assert "dense_features/a_embedding/embedding_weights" in names
  assert "b_s_shared_embedding" in names

  unconfigured = tec.embedding_column(
      fc.categorical_column_with_identity("z", 3), 2)

  def uses_other(features, labels, mode, params):
    del labels, mode, params
    tf.compat.v1.keras.layers.DenseFeatures([unconfigured, plain])(features)

  with tf.Graph().as_default():
    features = {"a": tf.zeros([2, 4]), "z": tf.zeros([2, 2])}
    with tpu_function.tpu_shard_context(8):
      with pytest.raises(ValueError, match="'z_embedding'.*not in the"):
        _tpu.wrap_model_fn(uses_other, spec)(features, None, "train", {},
                                             None)


def _closed_port():
  with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0))
    return sock.getsockname()[1]


def test_unreachable_tpu_fails_fast_and_says_what_to_do(tmp_path, monkeypatch):
  columns = _columns()
  master = f"grpc://127.0.0.1:{_closed_port()}"
  estimator = es.TPUEstimator(
      model_fn=_model_fn(columns, []), use_tpu=True, train_batch_size=32,
      config=TPURunConfig(master=master, model_dir=str(tmp_path),
                          tpu_config=TPUConfig(num_shards=16)),
      embedding_config_spec=_delegating_spec(columns))
  start = time.monotonic()
  for call in (lambda: estimator.train(lambda params: None, max_steps=1),
               lambda: estimator.evaluate(lambda params: None, steps=1),
               lambda: estimator.predict(lambda params: None)):
    with pytest.raises(errors.TPUNotReachableError) as error:
      call()
    assert master in str(error.value) and "use_tpu=False" in str(error.value)
    assert "RunConfig's master" in str(error.value)
  # A master that does not answer in time (or, behind a proxy that accepts
  # every connection, answers without a TPU): the probe gives up quickly.
  monkeypatch.setattr(_tpu, "REACHABILITY_TIMEOUT_SECONDS", 0.3)
  resolver = tf.distribute.cluster_resolver.TPUClusterResolver(
      "grpc://10.255.255.1:8470")
  silent = es.TPUEstimator(
      model_fn=_model_fn(columns, []), use_tpu=True, train_batch_size=32,
      config=TPURunConfig(cluster=resolver, model_dir=str(tmp_path),
                          tpu_config=TPUConfig(num_shards=16)),
      embedding_config_spec=_delegating_spec(columns))
  with pytest.raises(errors.TPUNotReachableError,
                     match="10.255.255.1:8470.*TPUClusterResolver"):
    silent.train(lambda params: None, max_steps=1)
  assert time.monotonic() - start < 10
  assert not list(tmp_path.iterdir())
