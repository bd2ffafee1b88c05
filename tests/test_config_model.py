"""The config model is plain data, and each derived fact has one home.

* `EmbeddingModel` prints, compares by value and survives pickling (the
  cluster work sends it to other processes); column objects stay with the
  spec, joined by feature name;
* the learning-rate precedence (table rate, then `learning_rate_fn`, then
  the optimizer's) is decided by `EmbeddingModel.learning_rate` and read by
  the proto, the engine and the report;
* `ShardLayout.route` is the one row-routing rule: NumPy and the engine's
  TensorFlow routing give the same partitions and local indices;
* every optimizer class carries its whole description (proto message,
  slots with their TF and TF2 names, TF2 counterpart); its update rule
  lives in the engine.
"""
import os
import pickle

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# TensorFlow reads the log level when it loads: the imports come after.

import hypothesis
from hypothesis import strategies as st
import numpy as np
import pytest
import tensorflow as tf

import estimator_spec as es
from estimator_spec.config import model as model_lib
from estimator_spec.config import optimizers
from estimator_spec.config import report
from estimator_spec.engine import storage
import tpu_embedding_columns as tec

fc = tf.feature_column


def decay(step):
  """A module-level learning-rate function (picklable by reference)."""
  return 0.1 / (1.0 + tf.cast(step, tf.float32))


def _columns_spec():
  user = tec.embedding_column(
      fc.categorical_column_with_identity("user", 50), 4,
      learning_rate_fn=decay)
  shared = tec.shared_embedding_columns(
      [fc.categorical_column_with_identity("a", 20),
       fc.sequence_categorical_column_with_identity("b", 20)], 3,
      max_sequence_lengths=[0, 5])
  core = tec.embedding_column(
      fc.categorical_column_with_identity("core", 30), 2,
      embedding_lookup_device="tpu_tensor_core", tensor_core_shape=[None, 3])
  return es.EmbeddingConfigSpec(
      feature_columns=[user, core] + shared,
      optimization_parameters=es.AdagradParameters(0.05),
      partition_strategy="mod")


def _dict_spec():
  return es.EmbeddingConfigSpec(
      table_to_config_dict={
          "fixed": es.TableConfig(10, 2, learning_rate=0.3),
          "scheduled": es.TableConfig(10, 2, learning_rate_fn=decay),
          "own": es.TableConfig(
              10, 2, optimization_parameters=es.FtrlParameters(0.02)),
          "plain": es.TableConfig(10, 2),
      },
      feature_to_config_dict={
          "f_fixed": es.FeatureConfig("fixed"),
          "f_scheduled": es.FeatureConfig("scheduled"),
          "f_own": es.FeatureConfig("own"),
          "f_plain": es.FeatureConfig("plain"),
      },
      optimization_parameters=es.AdagradParameters(0.7))


@pytest.mark.parametrize("make_spec", [_columns_spec, _dict_spec])
def test_model_pickles_to_an_equal_model(make_spec):
  model = make_spec().model
  copy = pickle.loads(pickle.dumps(model))
  assert copy == model
  assert copy.tables == model.tables and copy.features == model.features
  assert repr(copy) == repr(model)
  # Every table prints with its initializer's configuration, not an address.
  for table in model.tables.values():
    assert "object at 0x" not in repr(table)


def test_models_of_different_specs_differ():
  spec = _dict_spec()
  other = es.EmbeddingConfigSpec(
      table_to_config_dict={"fixed": es.TableConfig(10, 2, learning_rate=0.4)},
      feature_to_config_dict={"f_fixed": es.FeatureConfig("fixed")},
      optimization_parameters=es.AdagradParameters(0.7))
  assert spec.model != other.model
  assert spec.model.tables["fixed"] != other.model.tables["fixed"]


def test_features_name_their_columns_and_the_spec_joins_them_by_name():
  spec = _columns_spec()
  model = spec.model
  for name, feature in model.features.items():
    column = spec.column_for(name)
    assert column.name == feature.column_name
    assert column.feature_key == name
  assert model.uses_columns
  assert not _dict_spec().model.uses_columns
  assert _dict_spec().column_for("f_fixed") is None
  # Tensor-core columns are described by plain data.
  assert model.tensor_core_features == (model_lib.TensorCoreFeature(
      "core_embedding", (None, 3), "core__TENSOR_CORE_MASK"),)


def test_sequence_length_key_is_the_columns_key():
  spec = _columns_spec()
  feature = spec.model.features["b"]
  assert feature.length_key == "b_seq_length_"
  assert feature.length_key == spec.column_for(
      "b").sequence_length_feature_key


def test_learning_rate_precedence():
  model = _dict_spec().model
  assert model.learning_rate("fixed") == model_lib.LearningRate(0.3)
  scheduled = model.learning_rate("scheduled")
  assert scheduled.fn is decay and scheduled.tag == 0
  assert scheduled.constant is None
  assert model.learning_rate("own") == model_lib.LearningRate(0.02)
  assert model.learning_rate("plain") == model_lib.LearningRate(0.7)
  # An explicit optimizer (the TPU's inference placeholder) replaces only
  # the optimizer's own rate.
  sgd = es.StochasticGradientDescentParameters(1.0)
  assert model.learning_rate("plain", sgd) == model_lib.LearningRate(1.0)
  assert model.learning_rate("fixed", sgd) == model_lib.LearningRate(0.3)
  assert model.learning_rate("scheduled", sgd).fn is decay


def test_proto_and_report_read_the_same_learning_rates():
  config = es.EmbeddingConfig(_dict_spec(), batch_size=4)
  by_name = {t.name: t.optimization_parameters.learning_rate
             for t in config.config_proto.table_descriptor}
  assert by_name["fixed"].constant == pytest.approx(0.3)
  assert by_name["scheduled"].dynamic.tag == 0
  assert by_name["own"].constant == pytest.approx(0.02)
  assert by_name["plain"].constant == pytest.approx(0.7)
  text = report.describe(config)
  for label in ("0.3", "fn#0", "0.02", "0.7"):
    assert label in text


@hypothesis.given(vocab=st.integers(1, 60), shards=st.integers(1, 9),
                  strategy=st.sampled_from(["div", "mod"]))
def test_route_is_the_same_rule_in_numpy_and_in_the_engine(vocab, shards,
                                                            strategy):
  layout = es.ShardLayout(vocab, shards, strategy)
  ids = np.arange(vocab, dtype=np.int64)
  partition, local = layout.locate(ids)
  for p in range(layout.num_partitions):
    np.testing.assert_array_equal(ids[partition == p], layout.row_ids(p))
    np.testing.assert_array_equal(local[partition == p],
                                  np.arange(layout.sizes[p]))
  # The engine's partitions hold, row for row, the ids NumPy's rule puts
  # there; the engine's gather (TF routing) must find every id at itself.
  with tf.Graph().as_default():
    rows = storage.PartitionedRows("t", layout, 1,
                                   tf.compat.v1.zeros_initializer(), None)
    fill = [part.assign(layout.row_ids(p)[:, None].astype(np.float32))
            for p, part in enumerate(rows.partitions)]
    shuffled = np.random.default_rng(vocab).permutation(ids)
    gathered = rows.gather(tf.constant(shuffled))
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      sess.run(fill)
      got = sess.run(gathered)
  np.testing.assert_array_equal(got[:, 0], shuffled.astype(np.float32))


@pytest.mark.parametrize("cls", optimizers.ALL_OPTIMIZERS)
def test_each_optimizer_describes_itself_whole(cls):
  required = {name for name, p in __import__("inspect").signature(
      cls.__init__).parameters.items()
              if name != "self" and p.default is p.empty}
  args = {name: 0.1 for name in required}
  optimizer = cls(**args)
  slots = optimizer.slot_specs()
  assert len({s.name for s in slots}) == len(slots)
  assert len({s.suffix for s in slots}) == len(slots)
  if cls.mid_level_class is None:
    assert all(s.mid_level is None for s in slots)
  else:
    # TF2 has this optimizer: every slot has its TF2 name, and the TF2
    # class accepts the optimizer's own arguments.
    assert all(s.mid_level for s in slots)
    tf2 = getattr(tf.tpu.experimental.embedding, cls.mid_level_class)
    tf2(learning_rate=0.1, **optimizer.mid_level_arguments())
  proto = __import__(
      "tensorflow.core.protobuf.tpu.optimization_parameters_pb2",
      fromlist=["x"]).OptimizationParameters()
  optimizer.fill_proto(proto)
  assert proto.WhichOneof("parameters") is not None
