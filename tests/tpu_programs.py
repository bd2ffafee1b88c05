"""Two public TPU embedding programs, rewritten small, run as scripts.

The programs follow, habit for habit, two samples of the tensorflow/tpu
repository (written here in our own words, with tiny sizes and generated
data):

* `ncf_*`: models/experimental/ncf/ncf_main.py, neural collaborative
  filtering. Two `combiner=None` columns fed rank-1 dense ids (a squeeze of
  `[batch, 1]`), labels and masks inside the features dict, a
  `model_fn(features, mode, params)` without labels, Keras
  `Input(tensor=...)` layers on `tf.split`s of the activations,
  `tf.zeros(logits.shape)` (needs a static batch dimension),
  `compute_gradients(loss, tf.trainable_variables(),
  colocate_gradients_with_ops=True)` + `apply_gradients` + UPDATE_OPS under a
  `CrossShardOptimizer`, the embedding tables trained by `AdamParameters`
  (lazy_adam, sum_inside_sqrt, beta1/beta2/epsilon), `params` holding
  'use_tpu', a meta-data JSON file, one training file per cycle, a logging
  hook on the tensor named "cross_entropy", train/evaluate cycles.
* `embedding_*`: models/experimental/embedding/model.py. Shared columns with
  `combiner=None` plus a 'sum' column, `tf.io.VarLenFeature` parsing of
  TFRecord files of `tf.Example`s, an `input_fn(params)` that shards its
  files by `params['context'].current_input_fn_deployment()` and interleaves
  parallel readers, PER_HOST_V2, `pipeline_execution_with_tensor_core` and
  `use_gradient_accumulation` from params, recall@k metrics,
  train/evaluate cycles.

Where the originals build a `TPUClusterResolver`, these use a plain
`tf.estimator.tpu.RunConfig` with `TPUConfig(num_shards=...)` (no TPU here).

The import change: every name the originals take from TF's TPU stack comes
from `api` (`tensorflow_api()` or `our_api()`), nothing else differs. The one
exception is `api.CrossShardOptimizer` of `tensorflow_cpu_reference_api()`:
TF's own CPU path (`TPUEstimator(use_tpu=False)`) cannot run the
`CrossReplicaSum` op `tf.tpu.CrossShardOptimizer` emits, so that reference
drops the wrapper.

Lines marked "observation" only record what the program sees (for the
tests); they change nothing.

Run as `python -m tests.tpu_programs REQUEST.json RESULT.json` (the
originals are scripts that call `tf.disable_v2_behavior()`; so does this
runner, in its own process).
"""
import functools
import json
import os
import sys
import traceback
import types

import numpy as np
import tensorflow.compat.v1 as tf

# --- the import change -------------------------------------------------------


def tensorflow_api():
  """TF 2.15's TPU stack, as the originals import it."""
  return types.SimpleNamespace(
      TPUEstimator=tf.estimator.tpu.TPUEstimator,
      TPUEstimatorSpec=tf.estimator.tpu.TPUEstimatorSpec,
      EmbeddingConfigSpec=tf.estimator.tpu.experimental.EmbeddingConfigSpec,
      RunConfig=tf.estimator.tpu.RunConfig,
      TPUConfig=tf.estimator.tpu.TPUConfig,
      InputPipelineConfig=tf.estimator.tpu.InputPipelineConfig,
      ModeKeys=tf.estimator.ModeKeys,
      AdamParameters=tf.tpu.experimental.AdamParameters,
      AdagradParameters=tf.tpu.experimental.AdagradParameters,
      embedding_column=tf.tpu.experimental.embedding_column,
      shared_embedding_columns=tf.tpu.experimental.shared_embedding_columns,
      CrossShardOptimizer=tf.tpu.CrossShardOptimizer)


def tensorflow_cpu_reference_api():
  """TF's stack for `TPUEstimator(use_tpu=False)`: its CPU path has no
  kernel for CrossReplicaSum, so the optimizer is not wrapped."""
  api = tensorflow_api()
  api.CrossShardOptimizer = lambda optimizer: optimizer
  return api


def our_api():
  """This project's drop-ins."""
  import estimator_spec  # pylint: disable=g-import-not-at-top
  import tpu_embedding_columns  # pylint: disable=g-import-not-at-top
  return types.SimpleNamespace(
      TPUEstimator=estimator_spec.TPUEstimator,
      TPUEstimatorSpec=estimator_spec.TPUEstimatorSpec,
      EmbeddingConfigSpec=estimator_spec.EmbeddingConfigSpec,
      RunConfig=estimator_spec.RunConfig,
      TPUConfig=estimator_spec.TPUConfig,
      InputPipelineConfig=estimator_spec.InputPipelineConfig,
      ModeKeys=estimator_spec.estimator.ModeKeys,
      AdamParameters=estimator_spec.AdamParameters,
      AdagradParameters=estimator_spec.AdagradParameters,
      embedding_column=tpu_embedding_columns.embedding_column,
      shared_embedding_columns=tpu_embedding_columns.shared_embedding_columns,
      CrossShardOptimizer=tf.tpu.CrossShardOptimizer)


APIS = {
    "ours": our_api,
    "tensorflow": tensorflow_api,
    "tensorflow_cpu": tensorflow_cpu_reference_api,
}

# --- observation --------------------------------------------------------------


def _shape(tensor):
  shape = tensor.shape
  if shape.rank is None:
    return None
  return [tf.compat.dimension_value(d) for d in shape]


def _attempt(fn):
  try:
    return fn()
  except Exception as error:  # pylint: disable=broad-except
    return f"error: {type(error).__name__}: {error}"


def _context_fields(context, from_input_fn):
  fields = {
      "type": type(context).__name__,
      "num_hosts": _attempt(lambda: context.num_hosts),
      "num_replicas": _attempt(lambda: context.num_replicas),
      "num_of_replicas_per_host":
          _attempt(lambda: context.num_of_replicas_per_host),
  }
  if from_input_fn:
    deployment = _attempt(context.current_input_fn_deployment)
    fields["deployment"] = (list(deployment) if isinstance(
        deployment, tuple) else deployment)
    fields["current_host"] = _attempt(lambda: context.current_host)
  return fields


class Recorder:
  """What input_fn and model_fn saw, the losses of every training step and
  each cycle's results; written to the result file."""

  def __init__(self):
    self.phase = None
    self.data = {"input_fn": [], "model_fn": [], "steps": [], "cycles": [],
                 "notes": {}}

  def input_fn(self, params):
    self.data["input_fn"].append({
        "phase": self.phase,
        "keys": sorted(params),
        "batch_size": params.get("batch_size"),
        "use_tpu": params.get("use_tpu"),
        "context": (_context_fields(params["context"], True)
                    if "context" in params else None),
    })

  def model_fn(self, mode, params, features):
    self.data["model_fn"].append({
        "phase": self.phase,
        "mode": mode,
        "feature_shapes": {k: _shape(v) for k, v in sorted(features.items())},
        "keys": sorted(params),
        "batch_size": params.get("batch_size"),
        "use_tpu": params.get("use_tpu"),
        "context": (_context_fields(params["context"], False)
                    if "context" in params else None),
        "activations": {},
    })

  def activations(self, tensors):
    """Static shapes of the activations the model_fn built (observation)."""
    if self.data["model_fn"]:
      self.data["model_fn"][-1]["activations"] = {
          name: _shape(t) for name, t in tensors.items()}

  def step_hook(self, loss, features):
    return _StepRecorder(self, loss, features)


class _StepRecorder(tf.train.SessionRunHook):
  """Fetches the loss (and some raw features) with every training step."""

  def __init__(self, recorder, loss, features):
    self._recorder = recorder
    self._fetches = {"loss": loss,
                     "global_step": tf.train.get_global_step()}
    self._fetches.update({f"feature:{k}": v for k, v in features.items()})

  def before_run(self, run_context):
    return tf.train.SessionRunArgs(self._fetches)

  def after_run(self, run_context, run_values):
    results = run_values.results
    entry = {"phase": self._recorder.phase,
             "loss": float(results["loss"]),
             "global_step": int(results["global_step"])}
    for key, value in results.items():
      if key.startswith("feature:"):
        if isinstance(value, tf.SparseTensorValue):
          value = {"indices": np.asarray(value.indices).tolist(),
                   "values": np.asarray(value.values).tolist(),
                   "dense_shape": np.asarray(value.dense_shape).tolist()}
        else:
          value = np.asarray(value).tolist()
        entry[key[len("feature:"):]] = value
    self._recorder.data["steps"].append(entry)


def observed_model_fn(model_fn, recorder, features_to_fetch=()):
  """model_fn with observation: its params, and a hook recording each
  training step's loss (and `features_to_fetch`)."""

  def model_fn_observed(features, mode, params):
    recorder.model_fn(mode, params, features)
    spec = model_fn(features, mode, params)
    if mode == "train":  # ModeKeys.TRAIN
      fetched = {k: features[k] for k in features_to_fetch}
      hooks = tuple(spec.training_hooks or ()) + (
          recorder.step_hook(spec.loss, fetched),)
      spec = spec._replace(training_hooks=hooks)
    return spec

  return model_fn_observed


RECORDER = Recorder()

# --- generated data -----------------------------------------------------------


def _int64_feature(values):
  return tf.train.Feature(int64_list=tf.train.Int64List(
      value=[int(v) for v in values]))


def write_examples(path, rows):
  """rows: list of {key: list of ints}, one tf.Example each."""
  with tf.io.TFRecordWriter(path) as writer:
    for row in rows:
      example = tf.train.Example(features=tf.train.Features(feature={
          key: _int64_feature(values) for key, values in row.items()}))
      writer.write(example.SerializeToString())


# =============================================================================
# Program 1: NCF (neural collaborative filtering) with TPU embedding.
# =============================================================================

NCF_NUM_EVAL_NEGATIVES = 3  # negatives per positive in the eval data
NCF_TRAIN_LABEL_KEY = "labels"
NCF_VALID_POINT_MASK = "valid_point_mask"
NCF_DUPLICATE_MASK = "duplicate_mask"
NCF_RATING_COLUMN = "rating"


def ncf_create_tpu_estimator(api, model_fn, feature_columns, params):
  """The TPUEstimator of the NCF model (tables trained by Adam)."""
  config = api.RunConfig(
      model_dir=params["model_dir"],
      tf_random_seed=params["seed"],
      tpu_config=api.TPUConfig(
          iterations_per_loop=params["iterations_per_loop"],
          num_shards=params["num_tpu_shards"],
          experimental_host_call_every_n_steps=100,
          per_host_input_for_training=(
              api.InputPipelineConfig.PER_HOST_V2)))
  adam = api.AdamParameters(
      learning_rate=params["learning_rate"],
      use_gradient_accumulation=params["use_gradient_accumulation"],
      lazy_adam=params["lazy_adam"],
      sum_inside_sqrt=params["adam_sum_inside_sqrt"],
      beta1=params["beta1"],
      beta2=params["beta2"],
      epsilon=params["epsilon"])
  return api.TPUEstimator(
      use_tpu=params["use_tpu"],
      model_fn=model_fn,
      config=config,
      train_batch_size=params["global_batch_size"],
      eval_batch_size=params["eval_global_batch_size"],
      params=params,
      embedding_config_spec=api.EmbeddingConfigSpec(
          feature_columns=feature_columns, optimization_parameters=adam))


def ncf_create_feature_columns(api, params):
  """One embedding per user and per item; each row holds the MF part and
  the MLP part side by side."""
  initializer = tf.random_normal_initializer(0., 0.01)
  users = tf.feature_column.categorical_column_with_identity(
      key="user_id", num_buckets=params["num_users"])
  items = tf.feature_column.categorical_column_with_identity(
      key="item_id", num_buckets=params["num_items"])
  width = params["mf_dim"] + params["mlp_dim"]
  return [
      api.embedding_column(categorical_column=users, dimension=width,
                           combiner=None, initializer=initializer),
      api.embedding_column(categorical_column=items, dimension=width,
                           combiner=None, initializer=initializer),
  ]


def ncf_dataset_from_files(pattern, batch_size, is_training):
  """Batches of parsed examples: ids as [batch, 1], labels and masks as
  [batch]."""
  files = tf.data.Dataset.list_files(pattern, shuffle=is_training)
  dataset = files.interleave(tf.data.TFRecordDataset, cycle_length=2,
                             num_parallel_calls=tf.data.experimental.AUTOTUNE)
  dataset = dataset.batch(batch_size, drop_remainder=True)
  spec = {
      "user_id": tf.io.FixedLenFeature([1], tf.int64),
      "item_id": tf.io.FixedLenFeature([1], tf.int64),
  }
  if is_training:
    spec[NCF_TRAIN_LABEL_KEY] = tf.io.FixedLenFeature([], tf.int64)
    spec[NCF_VALID_POINT_MASK] = tf.io.FixedLenFeature([], tf.int64)
  else:
    spec[NCF_TRAIN_LABEL_KEY] = tf.io.FixedLenFeature([], tf.int64)
    spec[NCF_DUPLICATE_MASK] = tf.io.FixedLenFeature([], tf.int64)
  dataset = dataset.map(lambda records: tf.io.parse_example(records, spec),
                        num_parallel_calls=tf.data.experimental.AUTOTUNE)
  return dataset.prefetch(tf.data.experimental.AUTOTUNE)


def ncf_logits_fn(features, feature_columns, params):
  """GMF and MLP towers on the two embeddings, one logit per example."""
  input_layer = {col.name: tf.keras.layers.DenseFeatures(col)(features)
                 for col in feature_columns}
  RECORDER.activations(input_layer)  # observation

  user_mf, user_mlp = tf.split(input_layer["user_id_embedding"],
                               [params["mf_dim"], params["mlp_dim"]], axis=1)
  item_mf, item_mlp = tf.split(input_layer["item_id_embedding"],
                               [params["mf_dim"], params["mlp_dim"]], axis=1)
  user_mf_input = tf.keras.layers.Input(tensor=user_mf)
  item_mf_input = tf.keras.layers.Input(tensor=item_mf)
  user_mlp_input = tf.keras.layers.Input(tensor=user_mlp)
  item_mlp_input = tf.keras.layers.Input(tensor=item_mlp)

  layer_sizes = params["model_layers"]
  regularization = params["mlp_reg_layers"]
  if layer_sizes[0] % 2:
    raise ValueError("The first MLP layer size must be even.")

  gmf = tf.keras.layers.multiply([user_mf_input, item_mf_input])
  mlp = tf.keras.layers.concatenate([user_mlp_input, item_mlp_input])
  for index in range(1, len(layer_sizes)):
    mlp = tf.keras.layers.Dense(
        layer_sizes[index],
        kernel_regularizer=tf.keras.regularizers.l2(regularization[index]),
        activation="relu")(mlp)
  both = tf.keras.layers.concatenate([gmf, mlp])
  return tf.keras.layers.Dense(1, activation=None,
                               kernel_initializer="lecun_uniform",
                               name=NCF_RATING_COLUMN)(both)


def ncf_eval_loss_and_metrics(logits, softmax_logits, labels, duplicate_mask):
  """Weighted cross entropy and (metric_fn, tensors); duplicates count 0."""
  weights = 1.0 - duplicate_mask
  cross_entropy = tf.losses.sparse_softmax_cross_entropy(
      labels=labels, logits=softmax_logits, weights=weights)
  probabilities = tf.sigmoid(tf.squeeze(logits, axis=1))

  def metric_fn(labels, probabilities, weights):
    predicted = tf.cast(probabilities > 0.5, tf.int32)
    return {
        "accuracy": tf.metrics.accuracy(labels, predicted, weights=weights),
        "auc": tf.metrics.auc(labels, probabilities, weights=weights),
    }

  return cross_entropy, metric_fn, [labels, probabilities, weights]


def ncf_create_model_fn(api, feature_columns):
  """The NCF model_fn: labels and masks come inside `features`."""

  def _model_fn(features, mode, params):
    logits = ncf_logits_fn(features, feature_columns, params)
    # A zero logit next to the model's: softmax over the pair is a sigmoid.
    softmax_logits = tf.concat(
        [tf.zeros(logits.shape, dtype=logits.dtype), logits], axis=1)

    if mode == api.ModeKeys.EVAL:
      duplicate_mask = tf.cast(features[NCF_DUPLICATE_MASK], tf.float32)
      labels = tf.cast(features[NCF_TRAIN_LABEL_KEY], tf.int32)
      cross_entropy, metric_fn, metric_tensors = ncf_eval_loss_and_metrics(
          logits, softmax_logits, labels, duplicate_mask)
      return api.TPUEstimatorSpec(mode=mode, loss=cross_entropy,
                                  eval_metrics=(metric_fn, metric_tensors))

    elif mode == api.ModeKeys.TRAIN:
      labels = tf.cast(features[NCF_TRAIN_LABEL_KEY], tf.int32)
      valid_points = features[NCF_VALID_POINT_MASK]
      optimizer = tf.train.AdamOptimizer(
          learning_rate=params["learning_rate"], beta1=params["beta1"],
          beta2=params["beta2"], epsilon=params["epsilon"])
      optimizer = api.CrossShardOptimizer(optimizer)

      loss = tf.losses.sparse_softmax_cross_entropy(
          labels=labels, logits=softmax_logits,
          weights=tf.cast(valid_points, tf.float32))
      # Logging hooks find the loss by this name.
      tf.identity(loss, name="cross_entropy")

      global_step = tf.train.get_global_step()
      trainable = tf.trainable_variables()
      gradients = optimizer.compute_gradients(
          loss, trainable, colocate_gradients_with_ops=True)
      minimize = optimizer.apply_gradients(gradients, global_step=global_step,
                                           name="train")
      update_ops = tf.get_collection(tf.GraphKeys.UPDATE_OPS)
      train_op = tf.group(minimize, update_ops)
      return api.TPUEstimatorSpec(mode=mode, loss=loss, train_op=train_op)

    else:
      raise NotImplementedError
  return _model_fn


def ncf_create_params(settings):
  """The run's settings (the original reads them from flags)."""
  shards = settings["num_tpu_shards"]
  eval_divisor = (NCF_NUM_EVAL_NEGATIVES + 1) * shards
  eval_batch_size = settings["eval_batch_size"] or settings["batch_size"]
  eval_batch_size = ((eval_batch_size + eval_divisor - 1) // eval_divisor *
                     eval_divisor)
  layers = [int(size) for size in settings["layers"]]
  params = {
      "adam_sum_inside_sqrt": settings["adam_sum_inside_sqrt"],
      "beta1": 0.78,
      "beta2": 0.9,
      "epsilon": 1.5e-07,
      "eval_global_batch_size": eval_batch_size,
      "iterations_per_loop": settings["iterations_per_loop"],
      "lazy_adam": settings["lazy_adam"],
      "learning_rate": settings["learning_rate"],
      "mf_dim": settings["num_factors"],
      "mf_regularization": 0.,  # not used, as in the original
      "mlp_dim": layers[0] // 2,
      "mlp_reg_layers": [0.] * len(layers),
      "model_dir": settings["model_dir"],
      "model_layers": layers,
      "num_neg": NCF_NUM_EVAL_NEGATIVES,
      "num_tpu_shards": shards,
      "seed": settings.get("seed"),  # the program's --seed flag
      "train_epochs": settings["train_epochs"],
      "global_batch_size": settings["batch_size"],
      "use_gradient_accumulation": True,
      "use_tpu": settings["use_tpu"],
      "train_dataset_path": settings["train_dataset_path"],
      "eval_dataset_path": settings["eval_dataset_path"],
      "input_meta_data_path": settings["input_meta_data_path"],
  }
  tf.logging.info("Params: %s", params)
  return params


def ncf_main(api, settings, observe=True):
  """Trains and evaluates NCF in cycles; returns the estimator."""
  params = ncf_create_params(settings)
  with tf.io.gfile.GFile(params["input_meta_data_path"], "rb") as reader:
    meta = json.loads(reader.read().decode("utf-8"))
    params["num_users"] = meta["num_users"]
    params["num_items"] = meta["num_items"]

  # Under PER_HOST_V2 the meta data counts per-core batches.
  num_train_steps = int(meta["num_train_steps"]) // settings["num_tpu_shards"]
  num_eval_steps = int(meta["num_eval_steps"]) // settings["num_tpu_shards"]

  def resize(x):
    x["user_id"] = tf.squeeze(x["user_id"], axis=[-1])
    x["item_id"] = tf.squeeze(x["item_id"], axis=[-1])
    return x

  def train_input_fn(params, index):
    RECORDER.input_fn(params)  # observation
    dataset = ncf_dataset_from_files(
        params["train_dataset_path"].format(index), params["batch_size"],
        is_training=True)
    return dataset.map(resize)

  def eval_input_fn(params):
    RECORDER.input_fn(params)  # observation
    dataset = ncf_dataset_from_files(params["eval_dataset_path"],
                                     params["batch_size"], is_training=False)
    return dataset.map(resize)

  feature_columns = ncf_create_feature_columns(api, params)
  model_fn = ncf_create_model_fn(api, feature_columns)
  if observe:
    model_fn = observed_model_fn(model_fn, RECORDER)
  estimator = ncf_create_tpu_estimator(api, model_fn, feature_columns, params)

  train_hooks = [tf.train.LoggingTensorHook(
      tensors={"cross_entropy": "cross_entropy"}, every_n_iter=5)]

  for cycle_index in range(params["train_epochs"]):
    tf.logging.info("Training cycle %d/%d", cycle_index + 1,
                    params["train_epochs"])
    RECORDER.phase = f"train {cycle_index}"  # observation
    # pylint: disable=cell-var-from-loop
    estimator.train(input_fn=lambda params: train_input_fn(params,
                                                           cycle_index),
                    hooks=train_hooks, steps=num_train_steps)
    RECORDER.phase = f"eval {cycle_index}"  # observation
    eval_results = estimator.evaluate(eval_input_fn, steps=num_eval_steps)
    accuracy = float(eval_results["accuracy"])
    auc = float(eval_results["auc"])
    loss = float(eval_results["loss"])
    tf.logging.info("Cycle %d: accuracy = %.4f, AUC = %.4f, loss = %.4f",
                    cycle_index + 1, accuracy, auc, loss)
    RECORDER.data["cycles"].append(  # observation
        {k: float(v) for k, v in eval_results.items()})
  return estimator


def ncf_write_data(directory, cycles, steps, batch_size, eval_batch_size,
                   eval_steps, num_tpu_shards, seed=0):
  """Generated interactions: users and items each fall into one of two
  groups and a pair is positive iff the groups agree (learnable by both
  towers). Users >= `SEEN_USERS` and items >= `SEEN_ITEMS` never occur.

  Returns the settings the program needs and, per cycle, the ids used."""
  rng = np.random.RandomState(seed)
  user_group = rng.randint(0, 2, NCF_SIZES["num_users"])
  item_group = rng.randint(0, 2, NCF_SIZES["num_items"])

  def rows(count, mask_key, mask_rate):
    users = rng.randint(0, NCF_SIZES["seen_users"], count)
    items = rng.randint(0, NCF_SIZES["seen_items"], count)
    labels = (user_group[users] == item_group[items]).astype(np.int64)
    masks = (rng.uniform(size=count) < mask_rate).astype(np.int64)
    if mask_key == NCF_VALID_POINT_MASK:
      masks = 1 - masks
    return [{"user_id": [u], "item_id": [i], NCF_TRAIN_LABEL_KEY: [y],
             mask_key: [m]}
            for u, i, y, m in zip(users, items, labels, masks)]

  train_pattern = os.path.join(directory, "train-{}.tfrecord")
  used = []
  for cycle in range(cycles):
    data = rows(steps * batch_size, NCF_VALID_POINT_MASK, 0.1)
    write_examples(train_pattern.format(cycle), data)
    used.append({
        "user_id": sorted({r["user_id"][0] for r in data}),
        "item_id": sorted({r["item_id"][0] for r in data}),
        "valid_user_id": sorted({r["user_id"][0] for r in data
                                 if r[NCF_VALID_POINT_MASK][0]}),
        "valid_item_id": sorted({r["item_id"][0] for r in data
                                 if r[NCF_VALID_POINT_MASK][0]}),
    })
  eval_path = os.path.join(directory, "eval.tfrecord")
  write_examples(eval_path,
                 rows(eval_steps * eval_batch_size, NCF_DUPLICATE_MASK, 0.05))
  meta_path = os.path.join(directory, "meta.json")
  with open(meta_path, "w") as f:
    json.dump({"num_users": NCF_SIZES["num_users"],
               "num_items": NCF_SIZES["num_items"],
               "num_train_steps": steps * num_tpu_shards,
               "num_eval_steps": eval_steps * num_tpu_shards}, f)
  return {"train_dataset_path": train_pattern, "eval_dataset_path": eval_path,
          "input_meta_data_path": meta_path}, used


NCF_SIZES = {"num_users": 48, "num_items": 64, "seen_users": 40,
             "seen_items": 56}

# =============================================================================
# Program 2: the TPU embedding sample (shared tables, VarLen TFRecords).
# =============================================================================


def embedding_create_tpu_estimator(api, model_fn, feature_columns, params):
  """The TPUEstimator, with the lookups of `feature_columns` on the TPU."""
  config = api.RunConfig(
      model_dir=params["model_dir"],
      tpu_config=api.TPUConfig(
          iterations_per_loop=params["iterations_per_loop"],
          num_shards=params["num_shards"],
          experimental_host_call_every_n_steps=100,
          per_host_input_for_training=params["input_pipeline"]))
  return api.TPUEstimator(
      use_tpu=params["use_tpu"],
      model_fn=model_fn,
      config=config,
      train_batch_size=params["global_batch_size"],
      eval_batch_size=params["eval_global_batch_size"],
      params=params,
      embedding_config_spec=api.EmbeddingConfigSpec(
          feature_columns=feature_columns,
          pipeline_execution_with_tensor_core=params["pipeline_execution"],
          optimization_parameters=api.AdagradParameters(
              learning_rate=params["embedding_learning_rate"],
              use_gradient_accumulation=params["use_gradient_accumulation"])))


def embedding_create_feature_columns(api, params):
  """feature_1 and feature_2 share table 1 (one id each); feature_3 sums
  its ids in table 2."""
  initializer = tf.random_normal_initializer(0., 0.01)
  # One categorical column per input feature; the keys are the input's.
  feature_1 = tf.feature_column.categorical_column_with_identity(
      key="feature_1", num_buckets=params["table_1_rows"])
  feature_2 = tf.feature_column.categorical_column_with_identity(
      key="feature_2", num_buckets=params["table_1_rows"])
  feature_3 = tf.feature_column.categorical_column_with_identity(
      key="feature_3", num_buckets=params["table_2_rows"])
  columns = api.shared_embedding_columns(
      [feature_1, feature_2], dimension=params["table_1_dimension"],
      combiner=None, initializer=initializer)
  columns.append(api.embedding_column(
      categorical_column=feature_3, dimension=params["table_2_dimension"],
      combiner="sum", initializer=initializer))
  return columns


def embedding_parse_example(example):
  """One serialized tf.Example: three variable-length id lists, a label."""
  feature_map = {
      "feature_1": tf.io.VarLenFeature(dtype=tf.int64),
      "feature_2": tf.io.VarLenFeature(dtype=tf.int64),
      "feature_3": tf.io.VarLenFeature(dtype=tf.int64),
      "label": tf.io.FixedLenFeature([1], dtype=tf.int64),
  }
  return tf.io.parse_single_example(example, feature_map)


def embedding_input_fn_from_files(file_pattern, repeat=True):
  """An input_fn reading the TFRecord files of `file_pattern`."""

  def input_fn(params):
    RECORDER.input_fn(params)  # observation
    files = tf.data.Dataset.list_files(file_pattern, shuffle=True)
    # Called once per host (TPU task): each reads its share of the files.
    _, call_index, num_calls, _ = (
        params["context"].current_input_fn_deployment())
    files = files.shard(num_calls, call_index)

    def reader(files_dataset, reader_index):
      files_dataset = files_dataset.shard(params["parallel_reads"],
                                          reader_index)
      dataset = files_dataset.interleave(tf.data.TFRecordDataset)
      return dataset.map(embedding_parse_example,
                         num_parallel_calls=tf.data.experimental.AUTOTUNE)

    dataset = tf.data.Dataset.range(params["parallel_reads"])
    dataset = dataset.interleave(
        functools.partial(reader, files),
        cycle_length=params["parallel_reads"],
        num_parallel_calls=tf.data.experimental.AUTOTUNE)
    dataset = dataset.batch(params["batch_size"], drop_remainder=True)
    # The parsed ids are the lookup ids (a vocabulary would map them here).
    if repeat:
      dataset = dataset.repeat()
    return dataset.prefetch(tf.data.experimental.AUTOTUNE)

  return input_fn


def embedding_logits_fn(features, feature_columns, params):
  input_layer = {col.name: tf.keras.layers.DenseFeatures(col)(features)
                 for col in feature_columns}
  RECORDER.activations(input_layer)  # observation
  concatenated = tf.concat(list(input_layer.values()), axis=1)
  model_layer = tf.keras.layers.Input(tensor=concatenated)
  for index, size in enumerate(params["model_layers"]):
    model_layer = tf.keras.layers.Dense(
        size, activation="relu",
        name="Dense_{}_{}".format(index, size))(model_layer)
  return tf.keras.layers.Dense(params["num_categories"],
                               activation=None)(model_layer)


def embedding_create_model_fn(api, feature_columns):

  def _model_fn(features, mode, params):
    logits = embedding_logits_fn(features, feature_columns, params)
    labels = tf.squeeze(features["label"])

    if mode == api.ModeKeys.EVAL:
      loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
          labels=labels, logits=logits))

      def metric_fn(labels, logits):
        labels = tf.cast(labels, tf.int64)
        return {
            "recall@1": tf.metrics.recall_at_k(labels, logits, 1),
            "recall@5": tf.metrics.recall_at_k(labels, logits, 5),
        }

      return api.TPUEstimatorSpec(mode=mode, loss=loss,
                                  eval_metrics=(metric_fn, [labels, logits]))

    elif mode == api.ModeKeys.TRAIN:
      optimizer = tf.train.AdamOptimizer(
          learning_rate=params["learning_rate"], beta1=params["beta1"],
          beta2=params["beta2"], epsilon=params["epsilon"])
      optimizer = api.CrossShardOptimizer(optimizer)
      loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
          labels=labels, logits=logits))
      train_op = optimizer.minimize(loss, tf.train.get_global_step())
      return api.TPUEstimatorSpec(mode=mode, loss=loss, train_op=train_op)

    else:
      raise NotImplementedError
  return _model_fn


def embedding_create_params(api, settings):
  params = {
      # The dense model's Adam.
      "beta1": 0.9,
      "beta2": 0.999,
      "epsilon": 1e-7,
      "learning_rate": 0.01,
      "embedding_learning_rate": 0.5,
      # Input pipeline.
      "parallel_reads": 2,  # file readers per host
      "train_dataset_path": settings["train_dataset_path"],  # glob
      "eval_dataset_path": settings["eval_dataset_path"],  # glob
      # Training.
      "global_batch_size": settings["global_batch_size"],
      "eval_global_batch_size": settings["eval_global_batch_size"],
      "train_epochs": settings["train_epochs"],
      "steps_per_epoch": settings["steps_per_epoch"],
      "num_eval_steps": settings["num_eval_steps"],
      # TPU.
      "iterations_per_loop": 4,
      "num_shards": settings["num_shards"],
      "input_pipeline": getattr(api.InputPipelineConfig,
                                settings["input_pipeline"]),
      "pipeline_execution": settings["pipeline_execution"],
      "use_gradient_accumulation": True,
      "use_tpu": settings["use_tpu"],
      # Model.
      "model_dir": settings["model_dir"],
      "model_layers": [16, 12],
      "num_categories": EMBEDDING_SIZES["num_categories"],
      "table_1_dimension": 8,
      "table_1_rows": EMBEDDING_SIZES["table_1_rows"],
      "table_2_dimension": 4,
      "table_2_rows": EMBEDDING_SIZES["table_2_rows"],
  }
  tf.logging.info("Params: %s", params)
  return params


def embedding_main(api, settings, input_fn_factory=None, observe=True,
                   features_to_fetch=(), evaluate=True):
  """Trains and evaluates in cycles; returns the estimator."""
  params = embedding_create_params(api, settings)
  input_fn_factory = input_fn_factory or embedding_input_fn_from_files
  input_fn = input_fn_factory(params["train_dataset_path"])
  eval_input_fn = input_fn_factory(params["eval_dataset_path"])

  feature_columns = embedding_create_feature_columns(api, params)
  model_fn = embedding_create_model_fn(api, feature_columns)
  if observe:
    model_fn = observed_model_fn(model_fn, RECORDER, features_to_fetch)
  estimator = embedding_create_tpu_estimator(api, model_fn, feature_columns,
                                             params)

  for cycle_index in range(params["train_epochs"]):
    tf.logging.info("Training cycle %d/%d", cycle_index + 1,
                    params["train_epochs"])
    RECORDER.phase = f"train {cycle_index}"  # observation
    estimator.train(input_fn=input_fn, steps=params["steps_per_epoch"])
    if not evaluate:
      continue
    RECORDER.phase = f"eval {cycle_index}"  # observation
    eval_results = estimator.evaluate(eval_input_fn,
                                      steps=params["num_eval_steps"])
    recall_1 = float(eval_results["recall@1"])
    recall_5 = float(eval_results["recall@5"])
    loss = float(eval_results["loss"])
    tf.logging.info("Cycle %d: recall@1 = %.4f, recall@5 = %.4f, loss = %.4f",
                    cycle_index + 1, recall_1, recall_5, loss)
    RECORDER.data["cycles"].append(  # observation
        {k: float(v) for k, v in eval_results.items()})
  return estimator


def embedding_input_fn_without_context(file_pattern, repeat=True):
  """The sample's input_fn with the one change it needs off the TPU: TF's
  CPU path gives input_fn no params['context'], so one call reads all
  files."""

  def input_fn(params):
    RECORDER.input_fn(params)  # observation
    files = tf.data.Dataset.list_files(file_pattern, shuffle=True)
    if "context" in params:
      _, call_index, num_calls, _ = (
          params["context"].current_input_fn_deployment())
      files = files.shard(num_calls, call_index)
    dataset = files.interleave(tf.data.TFRecordDataset,
                               cycle_length=params["parallel_reads"])
    dataset = dataset.map(embedding_parse_example)
    dataset = dataset.batch(params["batch_size"], drop_remainder=True)
    if repeat:
      dataset = dataset.repeat()
    return dataset

  return input_fn


def sharded_input_fn_from_files(file_pattern, repeat=True):
  """A multi-host input_fn in the sample's style, deterministic: the files
  in name order, split between the calls by
  `params['context'].current_input_fn_deployment()`."""

  def input_fn(params):
    RECORDER.input_fn(params)  # observation
    files = tf.data.Dataset.list_files(file_pattern, shuffle=False)
    _, call_index, num_calls, _ = (
        params["context"].current_input_fn_deployment())
    files = files.shard(num_calls, call_index)
    dataset = files.interleave(tf.data.TFRecordDataset, cycle_length=1)
    dataset = dataset.map(embedding_parse_example)
    dataset = dataset.batch(params["batch_size"], drop_remainder=True)
    if repeat:
      dataset = dataset.repeat()
    return dataset

  return input_fn


EMBEDDING_SIZES = {"table_1_rows": 50, "table_2_rows": 100,
                   "num_categories": 10}


def embedding_write_data(directory, name, files, per_file, seed,
                         id_ranges=None, label_is_file=False):
  """`files` TFRecord files `<name>-<k:02d>.tfrecord` of `per_file` examples.

  Label = a fixed category of feature_1's id (learnable), or the file's
  index (modulo the number of categories) with `label_is_file`.
  feature_1: one id; feature_2: at most one id
  (some examples have none); feature_3: 1-3 ids. `id_ranges[k]`: per
  feature, the (low, high) ids of file k (default: table 1 rows < 40 and
  table 2 rows < 80, so the last rows never occur).

  Returns the file pattern and, per file, the ids used per table."""
  rng = np.random.RandomState(seed)
  category = np.random.RandomState(99).randint(
      0, EMBEDDING_SIZES["num_categories"], EMBEDDING_SIZES["table_1_rows"])
  used = []
  for k in range(files):
    ranges = (id_ranges[k] if id_ranges else
              {"table_1": (0, 40), "table_2": (0, 80)})
    rows = []
    for _ in range(per_file):
      f1 = rng.randint(*ranges["table_1"])
      f2 = ([] if rng.uniform() < 0.2 else [rng.randint(*ranges["table_1"])])
      f3 = list(rng.randint(*ranges["table_2"], size=rng.randint(1, 4)))
      label = (k % EMBEDDING_SIZES["num_categories"] if label_is_file else
               category[f1])
      rows.append({"feature_1": [f1], "feature_2": f2, "feature_3": f3,
                   "label": [label]})
    write_examples(os.path.join(directory, f"{name}-{k:02d}.tfrecord"), rows)
    used.append({
        "table_1": sorted({r["feature_1"][0] for r in rows} |
                          {i for r in rows for i in r["feature_2"]}),
        "table_2": sorted({i for r in rows for i in r["feature_3"]}),
    })
  return os.path.join(directory, f"{name}-*.tfrecord"), used


# --- the runner ---------------------------------------------------------------


def _run(request):
  api = APIS[request["api"]]()
  settings = dict(request["settings"])
  program = request["program"]
  if program == "ncf":
    estimator = ncf_main(api, settings)
  elif program == "embedding":
    if request.get("expect_missing_context"):
      # The sample unchanged: its input_fn reads params['context'].
      try:
        embedding_main(api, dict(settings,
                                 model_dir=settings["model_dir"] + "_as_is"))
        RECORDER.data["notes"]["as_is"] = "ran"
      except KeyError as error:
        RECORDER.data["notes"]["as_is"] = f"KeyError: {error}"
      RECORDER.data["notes"]["as_is_input_fn_calls"] = len(
          RECORDER.data["input_fn"])
      RECORDER.data["input_fn"].clear()
      RECORDER.data["model_fn"].clear()
      estimator = embedding_main(
          api, settings, input_fn_factory=embedding_input_fn_without_context)
    else:
      estimator = embedding_main(api, settings)
  elif program == "multihost":
    estimator = embedding_main(
        api, settings, input_fn_factory=sharded_input_fn_from_files,
        features_to_fetch=("feature_1",), evaluate=False)
  else:
    raise ValueError(program)
  notes = RECORDER.data["notes"]
  notes["estimator_class"] = type(estimator).__module__ + "." + type(
      estimator).__name__


def main(argv):
  request_path, result_path = argv[1], argv[2]
  with open(request_path) as f:
    request = json.load(f)
  tf.disable_v2_behavior()
  tf.logging.set_verbosity(tf.logging.WARN)
  status = 0
  try:
    _run(request)
  except BaseException as error:  # pylint: disable=broad-except
    RECORDER.data["error"] = {
        "type": type(error).__name__,
        "message": str(error)[-3000:],
        "traceback": traceback.format_exc()[-6000:],
    }
    status = 1
  with open(result_path, "w") as f:
    json.dump(RECORDER.data, f, default=repr)
  return status


if __name__ == "__main__":
  sys.exit(main(sys.argv))
