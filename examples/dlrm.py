"""A DLRM-style CTR model's embedding features, as a TPUEstimator user writes
them: 26 categorical features (two shared groups, two sequence features, one
weighted feature, per-table learning-rate schedules) plus 13 numeric ones.

The only TPU-specific lines are the imports of `tpu_embedding_columns` and
`estimator_spec` (formerly `tf.compat.v1.tpu.experimental` and
`tf.compat.v1.estimator.tpu.experimental`).
"""
import numpy as np
import tensorflow as tf

import estimator_spec
import tpu_embedding_columns

fc = tf.feature_column

NUM_NUMERIC = 13
EMBEDDING_DIM = 16

# (feature name, vocabulary size) of the plain categorical features.
_PLAIN = [
    ("user_id", 1_000_000), ("device_id", 500_000), ("publisher_id", 50_000),
    ("site_id", 20_000), ("app_id", 20_000), ("campaign_id", 100_000),
    ("creative_id", 300_000), ("advertiser_id", 40_000), ("hour_of_week", 168),
    ("os", 64), ("browser", 128), ("connection", 8), ("ad_size", 32),
    ("placement", 4_000), ("geo_region", 5_000), ("language", 200),
    ("gender", 4), ("age_bucket", 12),
]


def warmup_then_decay(global_step):
  """Learning rate schedule shared by the large id tables."""
  step = tf.cast(global_step, tf.float32)
  return 0.05 * tf.minimum(1.0, (step + 1.0) / 100.0) * tf.math.rsqrt(
      tf.maximum(step, 100.0) / 100.0)


def build_columns(scale=1.0, api=tpu_embedding_columns):
  """Returns (embedding columns, numeric columns). `scale` shrinks every
  vocabulary (for quick runs) while keeping the structure. `api` is the
  module with `embedding_column`/`shared_embedding_columns` (this project's,
  or TF's `tf.compat.v1.tpu.experimental` for comparisons)."""

  def vocab(size):
    return max(4, int(size * scale))

  columns = []
  for name, size in _PLAIN:
    categorical = fc.categorical_column_with_identity(name, vocab(size))
    big = size >= 100_000
    columns.append(
        api.embedding_column(
            categorical,
            dimension=EMBEDDING_DIM,
            combiner="mean",
            learning_rate_fn=warmup_then_decay if big else None))

  # A hashed string feature and a vocabulary-list feature (strings on input).
  columns.append(
      api.embedding_column(
          fc.categorical_column_with_hash_bucket("url_domain",
                                                 vocab(200_000)),
          dimension=EMBEDDING_DIM))
  columns.append(
      api.embedding_column(
          fc.categorical_column_with_vocabulary_list(
              "day_of_week", ["mon", "tue", "wed", "thu", "fri", "sat",
                              "sun"]),
          dimension=EMBEDDING_DIM))

  # Weighted bag of query terms (weights: tf-idf).
  columns.append(
      api.embedding_column(
          fc.weighted_categorical_column(
              fc.categorical_column_with_identity("query_terms",
                                                  vocab(100_000)),
              "query_term_weights"),
          dimension=EMBEDDING_DIM,
          combiner="sqrtn"))

  # The ad's item and the user's click history share one item table; the
  # history is a sequence feature.
  items = vocab(400_000)
  columns.extend(
      api.shared_embedding_columns(
          [
              fc.categorical_column_with_identity("item_id", items),
              fc.sequence_categorical_column_with_identity(
                  "clicked_items", items),
          ],
          dimension=EMBEDDING_DIM,
          combiner="mean",
          shared_embedding_collection_name="items",
          max_sequence_lengths=[0, 20],
          learning_rate_fn=warmup_then_decay))

  # User and ad category share a table.
  columns.extend(
      api.shared_embedding_columns(
          [
              fc.categorical_column_with_identity("user_category", 1_000),
              fc.categorical_column_with_identity("ad_category", 1_000),
          ],
          dimension=EMBEDDING_DIM,
          combiner="sum"))

  # Recent search queries as a sequence of term ids.
  columns.append(
      api.embedding_column(
          fc.sequence_categorical_column_with_identity(
              "recent_queries", vocab(50_000)),
          dimension=EMBEDDING_DIM,
          max_sequence_length=10))

  numeric = [
      fc.numeric_column(f"num_{i}") for i in range(NUM_NUMERIC)
  ]
  return columns, numeric


def build_spec(scale=1.0, partition_strategy="div", pipelining=False,
               profile_data_directory=None):
  columns, _ = build_columns(scale)
  return estimator_spec.EmbeddingConfigSpec(
      feature_columns=columns,
      optimization_parameters=estimator_spec.AdagradParameters(
          learning_rate=0.05, initial_accumulator=0.1,
          clip_weight_min=-5.0, clip_weight_max=5.0),
      clipping_limit=10.0,
      pipeline_execution_with_tensor_core=pipelining,
      partition_strategy=partition_strategy,
      profile_data_directory=profile_data_directory)


WEIGHT_KEYS = {"query_term_weights": "query_terms"}  # weights: their ids


def as_sparse(features):
  """Padded id arrays as SparseTensors of the present ids (>= 0) and the
  weights at their ids' positions: what `tf.io.VarLenFeature` parsing gives,
  and what a TPU input path takes (dense weights are refused there; in a
  dense id tensor 0 would be padding, not an id)."""
  result = dict(features)
  for name, value in features.items():
    if not value.dtype.is_integer:
      continue
    present = tf.where(value >= 0)
    shape = tf.shape(value, out_type=tf.int64)
    result[name] = tf.SparseTensor(present, tf.gather_nd(value, present),
                                   shape)
    for weight_key, ids_key in WEIGHT_KEYS.items():
      if ids_key == name:
        result[weight_key] = tf.SparseTensor(
            present, tf.gather_nd(features[weight_key], present), shape)
  return result


def input_fn_for(features, labels, shuffle=True, repeat=True):
  """An input_fn over numpy arrays (examples.ctr_data.generate), batched by
  params['batch_size'] with drop_remainder, as a TPUEstimator input_fn is;
  ids and weights arrive as SparseTensors (`as_sparse`). With a
  `params['context']` (a TPU host, or a training task of a cluster), it
  reads only its shard of the examples, as TPU input functions do."""

  def input_fn(params):
    dataset = tf.data.Dataset.from_tensor_slices((features, labels))
    context = params.get("context")
    if context is not None:
      _, index, count, _ = context.current_input_fn_deployment()
      dataset = dataset.shard(count, index)
    if shuffle:
      dataset = dataset.shuffle(10_000, seed=1)
    if repeat:
      dataset = dataset.repeat()
    dataset = dataset.batch(params["batch_size"], drop_remainder=True)
    return dataset.map(lambda x, y: (as_sparse(x), y)).prefetch(2)

  return input_fn


def generator_input_fn_for(features, labels, shuffle=True, repeat=True,
                           seed=1):
  """`input_fn_for`'s input_fn, but the examples stay in Python: a
  generator slices whole batches out of the numpy arrays and
  `tf.data.Dataset.from_generator` feeds them. `input_fn_for` builds its
  dataset with `from_tensor_slices`, which puts the arrays into the graph as
  constants: every graph.pbtxt, .meta file and events file then holds the
  data set (hundreds of MB for the demo's 200,000 examples).

  Batches are params['batch_size'] examples; a last partial batch is
  dropped. `shuffle` draws a new permutation of the examples for every pass
  (from `seed`, so runs repeat); `repeat` makes the passes endless. With a
  `params['context']`, the input_fn reads only its shard of the examples,
  as `input_fn_for` does.
  """
  arrays = dict(features)
  num_examples = len(labels)
  for name, value in arrays.items():
    if len(value) != num_examples:
      raise ValueError(
          f"generator_input_fn_for: feature {name!r} has {len(value)} rows, "
          f"labels have {num_examples}.")

  def input_fn(params):
    batch_size = params["batch_size"]
    rows = np.arange(num_examples)
    context = params.get("context")
    if context is not None:
      _, index, count, _ = context.current_input_fn_deployment()
      rows = rows[index::count]
    if len(rows) < batch_size:
      raise ValueError(
          f"generator_input_fn_for: {len(rows)} examples make no batch of "
          f"{batch_size}.")

    def batches():
      rng = np.random.RandomState(seed)
      while True:
        order = rng.permutation(rows) if shuffle else rows
        for start in range(0, len(order) - batch_size + 1, batch_size):
          take = order[start:start + batch_size]
          yield {k: v[take] for k, v in arrays.items()}, labels[take]
        if not repeat:
          return

    def spec(value):
      value = np.asarray(value)
      dtype = tf.string if value.dtype == object else tf.as_dtype(
          value.dtype)
      return tf.TensorSpec((batch_size,) + value.shape[1:], dtype)

    dataset = tf.data.Dataset.from_generator(
        batches, output_signature=(
            {k: spec(v) for k, v in arrays.items()}, spec(labels)))
    return dataset.map(lambda x, y: (as_sparse(x), y)).prefetch(2)

  return input_fn


def _mlp(x, units, name):
  for i, width in enumerate(units):
    activation = tf.nn.relu if i < len(units) - 1 else None
    x = tf.compat.v1.layers.dense(x, width, activation=activation,
                                  name=f"{name}_{i}")
  return x


def model_fn_for(columns, numeric_columns, learning_rate=0.01,
                 spec_class=None):
  """The DLRM-style model_fn of a TPUEstimator user: a bottom MLP over the
  numeric features, embeddings from the columns (DenseFeatures for single
  values, SequenceFeatures for histories, mean-pooled over their lengths),
  pairwise dot-product interactions, a top MLP, log loss, AUC.

  `spec_class` is the TPUEstimatorSpec class (default: estimator_spec's).
  """
  if spec_class is None:
    from estimator_spec.estimator import TPUEstimatorSpec  # pylint: disable=g-import-not-at-top
    spec_class = TPUEstimatorSpec
  dense_columns = [c for c in columns if not _is_sequence(c)]
  sequence_columns = [c for c in columns if _is_sequence(c)]

  def model_fn(features, labels, mode, params):
    del params
    numeric = tf.compat.v1.feature_column.input_layer(features,
                                                      numeric_columns)
    bottom = _mlp(numeric, [64, EMBEDDING_DIM], "bottom")
    embedded = tf.compat.v1.keras.layers.DenseFeatures(dense_columns)(
        features)
    vectors = [bottom] + tf.split(embedded, len(dense_columns), axis=1)
    for column in sequence_columns:
      sequence, lengths = tf.keras.experimental.SequenceFeatures([column])(
          features)
      count = tf.maximum(tf.cast(lengths, tf.float32), 1.0)[:, None]
      vectors.append(tf.reduce_sum(sequence, axis=1) / count)
    stacked = tf.stack(vectors, axis=1)                   # [B, F, D]
    products = tf.matmul(stacked, stacked, transpose_b=True)  # [B, F, F]
    num = len(vectors)
    upper = [i * num + j for i in range(num) for j in range(i + 1, num)]
    pairs = tf.gather(tf.reshape(products, [-1, num * num]), upper, axis=1)
    logits = _mlp(tf.concat([bottom, pairs], axis=1), [128, 64, 1], "top")
    probabilities = tf.sigmoid(logits)
    if mode == estimator_spec.estimator.ModeKeys.PREDICT:
      return spec_class(
          mode=mode, predictions={"probability": probabilities,
                                  "logit": logits})
    loss = tf.compat.v1.losses.sigmoid_cross_entropy(labels, logits)

    def metric_fn(labels, probabilities):
      return {
          "auc": tf.compat.v1.metrics.auc(labels, probabilities,
                                          num_thresholds=1000),
          "click_rate": tf.compat.v1.metrics.mean(labels),
      }

    train_op = None
    if mode == estimator_spec.estimator.ModeKeys.TRAIN:
      optimizer = tf.compat.v1.tpu.CrossShardOptimizer(
          tf.compat.v1.train.AdamOptimizer(learning_rate))
      train_op = optimizer.minimize(
          loss, global_step=tf.compat.v1.train.get_global_step())
    return spec_class(
        mode=mode, loss=loss, train_op=train_op,
        eval_metrics=(metric_fn, [labels, probabilities]))

  return model_fn


def _is_sequence(column):
  return column.get_max_sequence_length() > 0
