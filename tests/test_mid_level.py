"""The spec as TF2's mid-level API (`estimator_spec.interop.to_mid_level`)
and TPUEstimator checkpoints for it (`export_mid_level_checkpoint`).

* Every optimizer TF 2.15's mid-level API has maps with all its settings:
  TF2's own optimizer fills the same `OptimizationParameters` proto as our
  EmbeddingConfig for the same table (TF2 as the oracle), clipping_limit
  included; per-table optimizers and learning rates; learning_rate_fn
  through a global step variable.
* What TF2 lacks is refused with the table/optimizer/argument named.
* End to end (slow): a model with columns of every kind (plain, weighted,
  shared with a sequence column, sequence; input_layer, DenseFeatures,
  SequenceFeatures) trained by our TPUEstimator with Adagrad over 3 `div` or
  `mod` shards, exported, restored into `TPUEmbeddingForServing`: its
  lookups of sparse and ragged inputs equal our estimator's activations,
  and its tables and slots equal the checkpoint's rows put back in row
  order (by an independent NumPy permutation).
* Errors write nothing.
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # pylint: disable=g-import-not-at-top
import pytest
import tensorflow as tf

import estimator_spec as es
import tpu_embedding_columns as tec
from estimator_spec import interop
from tests.test_estimator_interop import as_sparse
from tests.test_estimator_interop import padded_ids
from tensorflow.core.protobuf.tpu import optimization_parameters_pb2

fc = tf.feature_column
v1 = tf.compat.v1
TF2 = tf.tpu.experimental.embedding
# TF's own TPUEstimator namespace, the oracle: TF 2.15 only (None elsewhere,
# where the tests that use it are `tf215`).
TF_EST_TPU = (tf.compat.v1.estimator.tpu
              if hasattr(tf.compat.v1, "estimator") else None)
PREDICT = es.estimator.ModeKeys.PREDICT

V = 20  # three tables of this size: found by name, not by shape
VH = 17
D = 3
DH = 2
L = 3
BATCH = 48  # multiple of 24 and 16 cores (3 and 2 hosts: table shards)
N = 2 * BATCH


# ---------------------------------------------------------------------------
# to_mid_level: optimizers.


def _table_proto(spec, table):
  config = es.EmbeddingConfig(spec, batch_size=8)
  for descriptor in config.config_proto.table_descriptor:
    if descriptor.name == table:
      return descriptor.optimization_parameters
  raise AssertionError(f"no table {table}")


def _tf2_proto(optimizer):
  proto = optimization_parameters_pb2.OptimizationParameters()
  optimizer._set_optimization_parameters(proto)  # TF2 as the oracle
  return proto


def _without_learning_rate(proto):
  proto = type(proto).FromString(proto.SerializeToString())
  proto.ClearField("learning_rate")
  proto.ClearField("hot_id_replication_configuration")
  return proto


def _columns_spec(optimizer, **kwargs):
  column = tec.embedding_column(
      fc.categorical_column_with_identity("a", V), D, combiner="sqrtn")
  return es.EmbeddingConfigSpec(feature_columns=[column],
                                optimization_parameters=optimizer, **kwargs)


COMMON = dict(use_gradient_accumulation=True, clip_weight_min=-2.0,
              clip_weight_max=3.0, weight_decay_factor=0.01,
              multiply_weight_decay_factor_by_learning_rate=True,
              clip_gradient_min=-0.5, clip_gradient_max=0.75)

CONVERTIBLE = {
    "sgd": (lambda: es.StochasticGradientDescentParameters(0.3, **COMMON),
            TF2.SGD),
    "adagrad": (lambda: es.AdagradParameters(0.3, initial_accumulator=0.25,
                                             **COMMON), TF2.Adagrad),
    "adagrad_momentum": (lambda: es.AdagradMomentumParameters(
        0.3, momentum=0.8, use_nesterov=True, exponent=3.0, beta2=0.9,
        epsilon=1e-5, **COMMON), TF2.AdagradMomentum),
    "adam": (lambda: es.AdamParameters(0.3, beta1=0.8, beta2=0.95,
                                       epsilon=1e-6, lazy_adam=False,
                                       sum_inside_sqrt=False, **COMMON),
             TF2.Adam),
    "ftrl": (lambda: es.FtrlParameters(
        0.3, learning_rate_power=-0.25, initial_accumulator_value=0.2,
        l1_regularization_strength=0.1, l2_regularization_strength=0.2,
        multiply_linear_by_learning_rate=True, beta=0.3,
        allow_zero_accumulator=True, **COMMON), TF2.FTRL),
}


@pytest.mark.parametrize("name", sorted(CONVERTIBLE))
def test_optimizer_settings_reach_tf2(name):
  make, tf2_class = CONVERTIBLE[name]
  spec = _columns_spec(make())
  feature_config, optimizer = interop.to_mid_level(spec)
  assert type(optimizer) is tf2_class
  assert optimizer.learning_rate == pytest.approx(0.3)
  assert feature_config["a"].table.optimizer is None  # the spec-wide one
  ours = _without_learning_rate(_table_proto(spec, "tbl_a"))
  theirs = _without_learning_rate(_tf2_proto(optimizer))
  assert theirs == ours, (theirs, ours)
  # The slots TF2 creates start where ours do.
  slot_inits = [i(shape=[1], dtype=tf.float32).numpy()[0]
                for i in optimizer._slot_initializers()]
  assert slot_inits == [np.float32(s.initial_value)
                        for s in make().slot_specs()]


def test_clipping_limit_and_one_sided_clipping_become_clipvalue():
  spec = _columns_spec(es.AdagradParameters(0.1, clip_gradient_max=0.5),
                       clipping_limit=2.0)
  _, optimizer = interop.to_mid_level(spec)
  assert (optimizer.clip_gradient_min, optimizer.clip_gradient_max) == (-2.0,
                                                                        0.5)
  assert _without_learning_rate(_tf2_proto(optimizer)) == (
      _without_learning_rate(_table_proto(spec, "tbl_a")))
  spec = _columns_spec(es.AdagradParameters(0.1, clip_gradient_min=-0.25))
  _, optimizer = interop.to_mid_level(spec)
  assert (optimizer.clip_gradient_min, optimizer.clip_gradient_max) == (-0.25,
                                                                        None)
  _, optimizer = interop.to_mid_level(_columns_spec(es.AdagradParameters(0.1)))
  assert (optimizer.clip_gradient_min, optimizer.clip_gradient_max) == (None,
                                                                        None)


def _dict_spec(**kwargs):
  tables = {
      "t_plain": es.TableConfig(V, D, combiner=None),
      "t_rate": es.TableConfig(V, D, combiner="sqrtn", learning_rate=0.05),
      "t_own": es.TableConfig(
          VH, DH, optimization_parameters=es.AdamParameters(0.02)),
  }
  features = {
      "p": es.FeatureConfig("t_plain"),
      "r": es.FeatureConfig("t_rate", weight_key="r_w"),
      "o": es.FeatureConfig("t_own", max_sequence_length=L),
      "o2": es.FeatureConfig("t_own"),
  }
  return es.EmbeddingConfigSpec(
      table_to_config_dict=tables, feature_to_config_dict=features,
      optimization_parameters=es.AdagradParameters(0.1), **kwargs)


def test_dict_form_tables_features_and_per_table_optimizers():
  spec = _dict_spec(pipeline_execution_with_tensor_core=True)
  config = interop.to_mid_level(spec)
  feature_config, optimizer = config
  assert sorted(feature_config) == ["o", "o2", "p", "r"]
  assert list(config.tables) == ["t_own", "t_plain", "t_rate"]
  for name, feature in feature_config.items():
    assert feature.name == name
    ours = spec.model.features[name]
    assert feature.table is config.tables[ours.table]
    assert feature.max_sequence_length == ours.max_sequence_length
  assert feature_config["o"].table is feature_config["o2"].table
  plain, rate, own = (config.tables[t] for t in ("t_plain", "t_rate", "t_own"))
  assert (plain.vocabulary_size, plain.dim) == (V, D)
  assert (own.vocabulary_size, own.dim) == (VH, DH)
  assert plain.combiner == "sum"  # None: one id per example
  assert rate.combiner == "sqrtn" and own.combiner == "mean"
  table_configs = spec.table_to_config_dict
  assert plain.initializer is table_configs["t_plain"].initializer
  assert type(optimizer) is TF2.Adagrad and optimizer.learning_rate == 0.1
  assert plain.optimizer is None
  assert type(rate.optimizer) is TF2.Adagrad
  assert rate.optimizer.learning_rate == 0.05
  assert type(own.optimizer) is TF2.Adam and own.optimizer.learning_rate == 0.02
  assert config.pipeline_execution_with_tensor_core is True
  assert config.weight_keys == {"r": "r_w"}
  embedding = TF2.TPUEmbedding(**config.tpu_embedding_kwargs())
  assert embedding is not None


def test_learning_rate_fn_is_called_with_the_global_step():

  def decay(step):
    return 0.5 / (1.0 + tf.cast(step, tf.float32))

  ident = fc.categorical_column_with_identity
  a = tec.embedding_column(ident("a", V), D, learning_rate_fn=decay)
  b = tec.embedding_column(ident("b", V), D, learning_rate_fn=decay)
  c = tec.embedding_column(ident("c", V), D)
  spec = es.EmbeddingConfigSpec(feature_columns=[a, b, c],
                                optimization_parameters=es.AdagradParameters(
                                    0.1))
  with pytest.raises(ValueError, match=r"tbl_a.*tbl_b.*global_step"):
    interop.to_mid_level(spec)
  step = tf.Variable(3, dtype=tf.int64)
  config = interop.to_mid_level(spec, global_step=step)
  rate_a = config.tables["tbl_a"].optimizer.learning_rate
  # One callable per distinct function (one dynamic learning-rate tag).
  assert config.tables["tbl_b"].optimizer is config.tables["tbl_a"].optimizer
  assert config.tables["tbl_c"].optimizer is None
  assert float(rate_a()) == pytest.approx(0.5 / 4)
  step.assign(7)
  assert float(rate_a()) == pytest.approx(0.5 / 8)
  # For serving, learning rates do not matter: the constant one is used.
  served = interop.to_mid_level(spec, for_serving=True)
  assert served.tables["tbl_a"].optimizer is None
  with pytest.raises(ValueError, match="for_serving"):
    interop.to_mid_level(spec, global_step=step, for_serving=True)
  with pytest.raises(TypeError, match="global_step"):
    interop.to_mid_level(spec, global_step=3)
  with pytest.raises(ValueError, match="no\\s+table of this spec has one"):
    interop.to_mid_level(_columns_spec(es.AdagradParameters(0.1)),
                         global_step=step)


# ---------------------------------------------------------------------------
# to_mid_level: refusals.

UNCONVERTIBLE = {
    "MomentumParameters": lambda: es.MomentumParameters(0.1, 0.9),
    "RMSPropParameters": lambda: es.RMSPropParameters(0.1, 0.9, 0.1, 1e-6),
    "ProximalAdagradParameters": lambda: es.ProximalAdagradParameters(0.1),
    "ProximalYogiParameters": lambda: es.ProximalYogiParameters(0.1),
}


@pytest.mark.parametrize("name", sorted(UNCONVERTIBLE))
@pytest.mark.parametrize("for_serving", [False, True])
def test_optimizers_tf2_lacks_are_refused(name, for_serving):
  spec = _columns_spec(UNCONVERTIBLE[name]())
  with pytest.raises(ValueError, match=f"{name}.*tf.tpu.experimental"):
    interop.to_mid_level(spec, for_serving=for_serving)
  # Also as a table's own optimizer in the dict form, naming the table.
  spec = es.EmbeddingConfigSpec(
      table_to_config_dict={
          "t": es.TableConfig(V, D),
          "u": es.TableConfig(V, D,
                              optimization_parameters=UNCONVERTIBLE[name]())},
      feature_to_config_dict={"x": es.FeatureConfig("t"),
                              "y": es.FeatureConfig("u")},
      optimization_parameters=es.StochasticGradientDescentParameters(0.1))
  with pytest.raises(ValueError, match=f"table 'u' uses {name}"):
    interop.to_mid_level(spec, for_serving=for_serving)


def test_training_settings_tf2_lacks_are_refused_unless_for_serving():
  multiplier = _columns_spec(es.AdagradParameters(0.1),
                             experimental_gradient_multiplier_fn=(
                                 lambda step: 2.0))
  with pytest.raises(ValueError, match="experimental_gradient_multiplier_fn"):
    interop.to_mid_level(multiplier)
  assert interop.to_mid_level(multiplier, for_serving=True).optimizer
  hot = es.EmbeddingConfigSpec(
      table_to_config_dict={"t": es.TableConfig(V, D,
                                                hot_id_replication=True)},
      feature_to_config_dict={"x": es.FeatureConfig("t")},
      optimization_parameters=es.AdagradParameters(0.1))
  with pytest.raises(ValueError, match=r"\['t'\].*hot_id_replication"):
    interop.to_mid_level(hot)
  assert interop.to_mid_level(hot, for_serving=True).tables["t"]
  profiled = _columns_spec(es.AdagradParameters(0.1),
                           profile_data_directory="/tmp/profile")
  with pytest.raises(ValueError, match="profile_data_directory"):
    interop.to_mid_level(profiled)
  inference = es.EmbeddingConfigSpec(
      table_to_config_dict={"t": es.TableConfig(V, D)},
      feature_to_config_dict={"x": es.FeatureConfig("t")},
      optimization_parameters=None)
  with pytest.raises(ValueError, match=r"\['t'\] have no optimizer"):
    interop.to_mid_level(inference)
  assert interop.to_mid_level(inference, for_serving=True).optimizer is None
  with pytest.raises(ValueError, match="initial_accumulator_value=0"):
    interop.to_mid_level(_columns_spec(
        es.FtrlParameters(0.1, initial_accumulator_value=0.0)))
  with pytest.raises(TypeError, match="EmbeddingConfigSpec"):
    interop.to_mid_level({"tbl_a": 1})
  with pytest.raises(TypeError, match="for_serving"):
    interop.to_mid_level(inference, for_serving="yes")


# ---------------------------------------------------------------------------
# The model of the end-to-end tests.


def model_columns():
  ident = fc.categorical_column_with_identity
  seq = fc.sequence_categorical_column_with_identity
  a = tec.embedding_column(ident("a", V), D, combiner="mean")
  w = tec.embedding_column(
      fc.weighted_categorical_column(ident("w", V), "w_weight"), D,
      combiner="sqrtn")
  b, s = tec.shared_embedding_columns([ident("b", V), seq("s", V)], D,
                                      combiner="sum",
                                      max_sequence_lengths=[0, L])
  h = tec.embedding_column(seq("h", VH), DH, max_sequence_length=L)
  return {"a": a, "w": w, "b": b, "s": s, "h": h}


def build_spec(strategy="div", optimizer=None):
  """The spec of the end-to-end model (also loaded by the CLI tests)."""
  return es.EmbeddingConfigSpec(
      feature_columns=list(model_columns().values()),
      optimization_parameters=optimizer or es.AdagradParameters(0.1),
      partition_strategy=strategy)


def build_mod_spec():
  return build_spec("mod")


def model_fn(columns):

  def fn(features, labels, mode):
    acts = {
        "a": v1.feature_column.input_layer(features, [columns["a"]]),
        "w": v1.keras.layers.DenseFeatures([columns["w"]])(features),
        "b": v1.keras.layers.DenseFeatures([columns["b"]])(features),
    }
    for name in ("s", "h"):
      acts[name], _ = tf.keras.experimental.SequenceFeatures(
          [columns[name]])(features)
    widths = {"a": D, "w": D, "b": D, "s": L * D, "h": L * DH}
    x = tf.concat([tf.reshape(acts[k], [-1, widths[k]])
                   for k in sorted(acts)], axis=1)
    logits = v1.layers.dense(x, 1, name="out")
    if mode == PREDICT:
      return es.TPUEstimatorSpec(mode, predictions=acts)
    loss = v1.losses.mean_squared_error(labels, logits)
    train_op = v1.train.GradientDescentOptimizer(0.1).minimize(
        loss, global_step=v1.train.get_global_step())
    return es.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)

  return fn


def model_data(n=N, seed=0):
  rng = np.random.RandomState(seed)
  features = {
      "a": padded_ids(rng, n, 3, V, 0),
      "w": padded_ids(rng, n, 3, V, 1),
      "b": padded_ids(rng, n, 2, V, 1),
      "s": padded_ids(rng, n, L + 1, V, 0),  # longer than L: truncated
      "h": padded_ids(rng, n, L + 2, VH, 0),
  }
  features["w_weight"] = np.where(
      features["w"] >= 0, rng.uniform(0.5, 2.0, features["w"].shape),
      0.0).astype(np.float32)
  return features, rng.randn(n, 1).astype(np.float32)


def estimator(model_dir, strategy, num_shards=24, optimizer=None):
  columns = model_columns()
  spec = es.EmbeddingConfigSpec(
      feature_columns=list(columns.values()),
      optimization_parameters=optimizer or es.AdagradParameters(0.1),
      partition_strategy=strategy)
  config = es.RunConfig(
      model_dir=str(model_dir),
      tpu_config=es.TPUConfig(num_shards=num_shards))
  return es.TPUEstimator(model_fn=model_fn(columns), config=config,
                         use_tpu=False, train_batch_size=BATCH,
                         predict_batch_size=8, embedding_config_spec=spec)


def train(model_dir, strategy, steps=2, num_shards=24):
  features, labels = model_data()

  def input_fn(params):
    data = tf.data.Dataset.from_tensor_slices((features, labels))
    return data.repeat().batch(params["batch_size"],
                               drop_remainder=True).map(
                                   lambda f, y: (as_sparse(f), y))

  est = estimator(model_dir, strategy, num_shards)
  est.train(input_fn, max_steps=steps)
  return est


def predict_all(est, features):

  def input_fn(params):
    data = tf.data.Dataset.from_tensor_slices(features)
    return data.batch(params["batch_size"]).map(as_sparse)

  batches = list(est.predict(input_fn, yield_single_examples=False))
  return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """{strategy: (model_dir, estimator)} trained over 3 shards."""
  result = {}
  for strategy in ("div", "mod"):
    model_dir = tmp_path_factory.mktemp(f"model_{strategy}")
    result[strategy] = (model_dir, train(model_dir, strategy))
  return result


# ---------------------------------------------------------------------------
# export_mid_level_checkpoint, end to end.


def row_order(stored, partitions, strategy):
  """Rows in row order from a stored tensor of `partitions` partitions
  (independent of ShardLayout: mod stores rows p, p+n, p+2n, ... per
  partition p)."""
  if strategy == "div" or partitions == 1:
    return stored
  order = np.concatenate([np.arange(p, len(stored), partitions)
                          for p in range(partitions)])
  rows = np.empty_like(stored)
  rows[order] = stored
  return rows


def tf2_inputs(features, kind):
  """Padded id arrays as SparseTensors or RaggedTensors (and weights)."""
  inputs, weights = {}, {}
  for name in ("a", "w", "b", "s", "h"):
    ids = features[name]
    present = ids >= 0
    if kind == "sparse":
      where = tf.where(present)
      inputs[name] = tf.SparseTensor(where, tf.gather_nd(ids, where),
                                     ids.shape)
      if name == "w":
        weights[name] = tf.SparseTensor(
            where, tf.gather_nd(features["w_weight"], where), ids.shape)
    else:
      lengths = present.sum(axis=1)
      inputs[name] = tf.RaggedTensor.from_tensor(ids, lengths=lengths)
      if name == "w":
        weights[name] = tf.RaggedTensor.from_tensor(features["w_weight"],
                                                    lengths=lengths)
    weights.setdefault(name, None)
  return inputs, weights


def saved_values(embedding, directory):
  """Every variable of a TPUEmbeddingForServing, by checkpoint key (saved
  through TF's own tf.train.Checkpoint)."""
  path = tf.train.Checkpoint(embedding=embedding).save(
      os.path.join(directory, "resaved"))
  reader = tf.train.load_checkpoint(path)
  return {k: reader.get_tensor(k) for k in reader.get_variable_to_shape_map()
          if k.startswith("embedding/")}


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["div", "mod"])
def test_exported_checkpoint_serves_what_the_estimator_predicts(
    trained, tmp_path, strategy):
  model_dir, est = trained[strategy]
  spec = build_spec(strategy)
  progress = _Stream()
  path = interop.export_mid_level_checkpoint(
      str(model_dir), spec, str(tmp_path / "tf2" / "embedding"),
      progress=progress)
  assert path == str(tmp_path / "tf2" / "embedding")
  assert "tbl_h [" in progress.text and f"{VH * 2:,}/{VH * 2:,} rows" in (
      progress.text)

  config = interop.to_mid_level(spec, for_serving=True)
  embedding = TF2.TPUEmbeddingForServing(config.feature_config,
                                         config.optimizer)
  status = tf.train.Checkpoint(embedding=embedding).restore(path)
  features, _ = model_data(16, seed=5)
  expected = predict_all(est, features)
  for kind in ("sparse", "ragged"):
    inputs, weights = tf2_inputs(features, kind)
    got = embedding(inputs, weights=weights)
    status.assert_consumed()
    for name in ("a", "w", "b", "s", "h"):
      np.testing.assert_allclose(got[name].numpy(), expected[name],
                                 rtol=1e-6, atol=1e-6,
                                 err_msg=f"{kind} {name}")

  # Tables and Adagrad slots: the checkpoint's rows in row order.
  reader = tf.train.load_checkpoint(str(model_dir))
  restored = saved_values(embedding, str(tmp_path))
  sources = {
      "tbl_a": "input_layer/a_embedding/embedding_weights",
      "tbl_w_weighted_by_w_weight":
          "dense_features/w_weighted_by_w_weight_embedding/embedding_weights",
      "tbl_b_s_shared_embedding": "b_s_shared_embedding",
      "tbl_h": "sequence_features_1/h_embedding/embedding_weights",
  }
  assert set(sources) == set(spec.model.tables)
  shapes = reader.get_variable_to_shape_map()
  for table, source in sources.items():
    assert source in shapes, sorted(shapes)
    for suffix, key in (("", f"embedding/{table}"),
                        ("/Adagrad", f"embedding/{table}.Saccumulators")):
      stored = reader.get_tensor(source + suffix)
      rows = row_order(stored, 3, strategy)
      np.testing.assert_array_equal(
          restored[f"{key}/.ATTRIBUTES/VARIABLE_VALUE"], rows)
    if strategy == "mod":
      assert not np.array_equal(stored, rows)  # really permuted
  # Adagrad moved away from the initial accumulator on trained rows.
  assert (restored["embedding/tbl_a.Saccumulators/.ATTRIBUTES/VARIABLE_VALUE"]
          > 0.1 + 1e-7).any()


class _Stream:
  """A text stream that is not a terminal."""

  def __init__(self):
    self.text = ""

  def write(self, text):
    self.text += text

  def flush(self):
    pass


# ---------------------------------------------------------------------------
# export_mid_level_checkpoint: refusals on hand-written checkpoints.


def write_checkpoint(prefix, tensors):
  """A TF1-style checkpoint of {name: array or [partition arrays]}."""
  names, slices, values = [], [], []
  for name, value in tensors.items():
    if isinstance(value, list):
      full = [sum(p.shape[0] for p in value)] + list(value[0].shape[1:])
      start = 0
      for part in value:
        names.append(name)
        slices.append(" ".join(map(str, full)) +
                      f" {start},{part.shape[0]}:-")
        values.append(part)
        start += part.shape[0]
    else:
      names.append(name)
      slices.append("")
      values.append(value)
  tf.raw_ops.SaveV2(prefix=str(prefix), tensor_names=names,
                    shape_and_slices=slices, tensors=values)
  tf.compat.v1.train.update_checkpoint_state(
      os.path.dirname(str(prefix)), os.path.basename(str(prefix)))
  return str(prefix)


def small_spec(optimizer=None, strategy="div"):
  ident = fc.categorical_column_with_identity
  a = tec.embedding_column(ident("a", V), D)
  b = tec.embedding_column(ident("b", V), D)
  return es.EmbeddingConfigSpec(
      feature_columns=[a, b],
      optimization_parameters=optimizer or es.AdagradParameters(0.1),
      partition_strategy=strategy)


def momentum_spec():
  return small_spec(es.MomentumParameters(0.1, 0.9))


def small_checkpoint(directory, with_slots=True, extra=None):
  rng = np.random.RandomState(0)
  tensors = {"global_step": np.int64(5)}
  for name in ("a", "b"):
    var = f"dense_features/{name}_embedding/embedding_weights"
    tensors[var] = rng.randn(V, D).astype(np.float32)
    if with_slots:
      tensors[var + "/Adagrad"] = rng.uniform(0.1, 1, (V, D)).astype(
          np.float32)
  tensors.update(extra or {})
  os.makedirs(directory, exist_ok=True)
  return write_checkpoint(os.path.join(directory, "model.ckpt-5"), tensors)


def listing(directory):
  return sorted(
      os.path.relpath(os.path.join(root, f), directory)
      for root, _, files in os.walk(directory) for f in files)


def test_export_small_checkpoint_and_slots_missing(tmp_path):
  small_checkpoint(tmp_path / "model")
  path = interop.export_mid_level_checkpoint(
      tmp_path / "model", small_spec(), tmp_path / "out" / "emb")
  reader = tf.train.load_checkpoint(path)
  source = tf.train.load_checkpoint(str(tmp_path / "model"))
  np.testing.assert_array_equal(
      reader.get_tensor("embedding/tbl_b.Saccumulators/.ATTRIBUTES/"
                        "VARIABLE_VALUE"),
      source.get_tensor("dense_features/b_embedding/embedding_weights/"
                        "Adagrad"))
  assert tf.train.latest_checkpoint(str(tmp_path / "out")) == path

  small_checkpoint(tmp_path / "noslots", with_slots=False)
  with pytest.raises(ValueError, match=r"Adagrad.*allow_missing_slots"):
    interop.export_mid_level_checkpoint(tmp_path / "noslots", small_spec(),
                                        tmp_path / "out2" / "emb")
  assert not (tmp_path / "out2").exists()
  path = interop.export_mid_level_checkpoint(
      tmp_path / "noslots", small_spec(), tmp_path / "out2" / "emb",
      allow_missing_slots=True, attribute="tables")
  config = interop.to_mid_level(small_spec(), for_serving=True)
  embedding = TF2.TPUEmbeddingForServing(config.feature_config,
                                         config.optimizer)
  embedding.build()
  tf.train.Checkpoint(tables=embedding).restore(path).assert_consumed()
  values = saved_values(embedding, str(tmp_path))
  np.testing.assert_array_equal(
      values["embedding/tbl_a.Saccumulators/.ATTRIBUTES/VARIABLE_VALUE"],
      np.full((V, D), 0.1, np.float32))


@pytest.mark.parametrize("case", [
    "no_checkpoint", "unconvertible", "output_exists", "table_missing",
    "ambiguous", "bad_variable_name", "bad_progress",
])
def test_export_refusals_write_nothing(tmp_path, case):
  small_checkpoint(tmp_path / "model")
  out = tmp_path / "out"
  kwargs = {}
  spec = small_spec()
  model_dir = tmp_path / "model"
  error, words = ValueError, None
  if case == "no_checkpoint":
    model_dir = tmp_path / "empty"
    model_dir.mkdir()
    error, words = FileNotFoundError, "no checkpoint in directory"
  elif case == "unconvertible":
    spec = small_spec(es.MomentumParameters(0.1, 0.9))
    words = "MomentumParameters"
  elif case == "output_exists":
    out.mkdir()
    (out / "emb.index").write_text("keep me")
    error, words = FileExistsError, "already exists"
  elif case == "table_missing":
    spec = es.EmbeddingConfigSpec(
        feature_columns=[tec.embedding_column(
            fc.categorical_column_with_identity("zz", V), D)],
        optimization_parameters=es.AdagradParameters(0.1))
    words = r"no tensor.*tbl_zz.*dense_features/a_embedding"
  elif case == "ambiguous":
    small_checkpoint(model_dir, extra={
        "dense_features_1/a_embedding/embedding_weights":
            np.zeros((V, D), np.float32)})
    words = (r"several tensors.*'dense_features/a_embedding/embedding_weights"
             r"', 'dense_features_1/a_embedding.*variable_names")
  elif case == "bad_variable_name":
    kwargs["variable_names"] = {"tbl_a": "global_step"}
    words = r"variable_names\['tbl_a'\].*float32 \[20, 3\]"
  elif case == "bad_progress":
    kwargs["progress"] = 3
    error, words = TypeError, "progress"
  before = listing(tmp_path)
  with pytest.raises(error, match=words):
    interop.export_mid_level_checkpoint(model_dir, spec, out / "emb",
                                        **kwargs)
  assert listing(tmp_path) == before
  if case == "output_exists":
    assert (out / "emb.index").read_text() == "keep me"
  if case == "ambiguous":  # the mapping settles it
    path = interop.export_mid_level_checkpoint(
        model_dir, spec, out / "emb",
        variable_names={"tbl_a": "dense_features_1/a_embedding/"
                                 "embedding_weights"},
        allow_missing_slots=True)
    table = tf.train.load_checkpoint(path).get_tensor(
        "embedding/tbl_a/.ATTRIBUTES/VARIABLE_VALUE")
    assert not table.any()


def test_export_dict_form_mod_checkpoint_with_adam_slots(tmp_path):
  """Dict form: tensors named by table; `mod` over 2 partitions; Adam's m
  and v land in TF2's `momenta` and `velocities`, Adagrad's accumulator in
  `accumulators`."""
  spec = _dict_spec(partition_strategy="mod")
  rng = np.random.RandomState(4)
  rows = {}
  tensors = {"global_step": np.int64(9)}
  slot_suffixes = {"t_plain": ["Adagrad"], "t_rate": ["Adagrad"],
                   "t_own": ["Adam/m", "Adam/v"]}
  for table, suffixes in slot_suffixes.items():
    shape = (VH, DH) if table == "t_own" else (V, D)
    for suffix in [""] + suffixes:
      name = table + ("/" + suffix if suffix else "")
      rows[name] = rng.randn(*shape).astype(np.float32)
      order = np.concatenate([np.arange(p, shape[0], 2) for p in range(2)])
      stored = rows[name][order]
      tensors[name] = [stored[:(shape[0] + 1) // 2],
                       stored[(shape[0] + 1) // 2:]]
  ml_dir = tmp_path / "model"
  ml_dir.mkdir()
  write_checkpoint(ml_dir / "model.ckpt-9", tensors)
  path = interop.export_mid_level_checkpoint(ml_dir, spec,
                                             tmp_path / "out" / "emb")
  config = interop.to_mid_level(spec, for_serving=True)
  embedding = TF2.TPUEmbeddingForServing(config.feature_config,
                                         config.optimizer)
  embedding.build()
  tf.train.Checkpoint(embedding=embedding).restore(path).assert_consumed()
  values = saved_values(embedding, str(tmp_path))
  expected_keys = {
      "t_plain": "t_plain", "t_plain/Adagrad": "t_plain.Saccumulators",
      "t_rate": "t_rate", "t_rate/Adagrad": "t_rate.Saccumulators",
      "t_own": "t_own", "t_own/Adam/m": "t_own.Smomenta",
      "t_own/Adam/v": "t_own.Svelocities",
  }
  assert len(values) == len(expected_keys)
  for source, key in expected_keys.items():
    np.testing.assert_array_equal(
        values[f"embedding/{key}/.ATTRIBUTES/VARIABLE_VALUE"], rows[source],
        err_msg=source)
  # Lookups: p has combiner None (one id per example: its row).
  ids = np.array([3, 0, 19], np.int64)
  got = embedding({"p": tf.constant(ids), "r": tf.ragged.constant([[1, 2]]),
                   "o": tf.ragged.constant([[5]]), "o2": tf.ragged.constant(
                       [[4, 6]])})
  np.testing.assert_array_equal(got["p"].numpy(), rows["t_plain"][ids])
  np.testing.assert_allclose(
      got["r"].numpy()[0], rows["t_rate"][[1, 2]].sum(0) / np.sqrt(2),
      rtol=1e-6)
